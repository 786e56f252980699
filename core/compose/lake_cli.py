"""`forksight lake compact|expire`: keep the Iceberg lake's small files and old snapshots bounded
(docs/lake.md). Safe while collectors write: a partition they wrote to meanwhile is left for next time."""
from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime, timedelta, timezone

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
OPTION_EXAMPLE = "e.g. --lake-option s3.endpoint=http://127.0.0.1:9000"


def lake_option(text: str) -> tuple[str, str]:
    """One `--lake-option KEY=VALUE` as (key, value); the value is never echoed (it may be a secret)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"no '=' in it (value not shown: it may be a secret); give KEY=VALUE, "
                                         f"{OPTION_EXAMPLE}")
    if not key.strip():
        raise argparse.ArgumentTypeError(f"the key before '=' is empty; give KEY=VALUE, {OPTION_EXAMPLE}")
    return key.strip(), value


def add_lake_option(parser) -> None:
    """Register the repeatable `--lake-option KEY=VALUE` (pyiceberg catalog and FileIO properties)."""
    parser.add_argument("--lake-option", metavar="KEY=VALUE", type=lake_option, action="append", default=[],
                        help="a catalog property for pyiceberg (repeatable), e.g. s3.endpoint=URL, "
                        "s3.access-key-id=ID, s3.secret-access-key=KEY, s3.region=us-east-1 (docs/lake.md)")


def add_parser(subparsers) -> None:
    """Register `lake compact` and `lake expire`."""
    lake = subparsers.add_parser("lake", help="maintain the Iceberg lake (compact, expire)",
                                 description="Maintain the lake `forksight serve --lake-catalog` writes.")
    sub = lake.add_subparsers(dest="lake_command", metavar="ACTION", required=True)
    for name, help_text in (("compact", "rewrite each partition's small files as one (same rows)"),
                            ("expire", "drop snapshots older than --older-than and the files only they use")):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--lake-catalog", metavar="URI", required=True, help="as given to forksight serve")
        p.add_argument("--lake-warehouse", metavar="LOCATION", required=True, help="as given to forksight serve")
        add_lake_option(p)
        p.add_argument("--table", action="append", default=None,
                       help="only this table (repeatable; default all: runs scalars tokens samples histograms alerts)")
        if name == "compact":
            p.add_argument("--min-files", type=int, default=2, help="compact partitions with at least this many files")
        else:
            p.add_argument("--older-than", required=True, metavar="AGE",
                           help="an age (90s, 30m, 12h, 7d, 2w) or an ISO time (2026-01-31T00:00:00+00:00)")
        p.set_defaults(func=run_lake)


def parse_older_than(text: str, now: datetime | None = None) -> datetime:
    """An age ('7d') or an ISO time as an aware datetime; ValueError saying the accepted forms."""
    now = now or datetime.now(timezone.utc)
    age = _AGE.match(text)
    if age:
        return now - timedelta(seconds=float(age[1]) * _UNIT_S[age[2].lower()])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--older-than {text!r}: give an age such as 90s, 30m, 12h, 7d, 2w, or an ISO time "
                         "such as 2026-01-31T00:00:00+00:00") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def run_lake(args: argparse.Namespace) -> int:
    from forksight.monitor.lake.errors import LakeError
    from forksight.monitor.lake.maintenance import run_maintenance
    from forksight.monitor.lake.settings import LakeSettings

    settings = None
    try:
        older = parse_older_than(args.older_than) if args.lake_command == "expire" else None
        if args.lake_command == "compact" and args.min_files < 2:
            raise ValueError(f"--min-files must be >= 2 (got {args.min_files})")
        settings = LakeSettings.of(catalog=args.lake_catalog, warehouse=args.lake_warehouse,
                                   options=dict(args.lake_option))
        catalog = settings.open_catalog(check=False)
        done = run_maintenance(catalog, args.lake_command, tables=args.table,
                               min_files=getattr(args, "min_files", 2), older_than=older)
    except (LakeError, ValueError) as exc:
        print(f"forksight lake {args.lake_command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - e.g. the catalog went away: said (its secrets ***), not a traceback
        said = f"{type(exc).__name__}: {exc}"
        print(f"forksight lake {args.lake_command}: {settings.scrub(said) if settings else said}", file=sys.stderr)
        return 1
    print(json.dumps(done))
    return 0
