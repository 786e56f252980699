"""`forksight compact`: thin a long run's token rows so its DuckDB file stays bounded."""
from __future__ import annotations

import argparse
import json
import sys

from forksight.compose.lake_cli import add_lake_option


def add_parser(subparsers) -> None:
    """Register `compact`."""
    compact = subparsers.add_parser(
        "compact", help="thin a run's token rows to N steps and shrink the file",
        description="Keep a run's token rows at N evenly spaced steps plus the newest; its scalars, "
        "histograms, samples and alerts stay whole. The file is then rewritten, so the space comes "
        "back to the disk. Stop `forksight serve` on the file first (it holds the file).")
    compact.add_argument("--db", required=True, help="DuckDB file (not held by a running collector)")
    compact.add_argument("--run", required=True, help="run id")
    compact.add_argument("--keep-token-steps", type=int, default=None, metavar="N",
                         help="token rows kept at N evenly spaced steps, plus the newest")
    compact.add_argument("--to-lake", action="store_true",
                         help="instead move the run's token rows the lake holds out of the file; the dashboard "
                         "of a serve with --lake-catalog reads them from the lake (docs/lake.md, Reads)")
    compact.add_argument("--lake-catalog", metavar="URI", default=None, help="the lake's catalog (with --to-lake)")
    compact.add_argument("--lake-warehouse", metavar="LOCATION", default=None,
                         help="the lake's warehouse (with --to-lake)")
    add_lake_option(compact)
    compact.set_defaults(func=run_compact)


def run_compact(args: argparse.Namespace) -> int:
    from forksight.monitor.collector.compact import compact_file
    from forksight.monitor.lake.outbox import refuse_thinning_unsent

    try:
        if args.to_lake == (args.keep_token_steps is not None):
            raise ValueError("give one of --keep-token-steps N (thin the run's token rows) or --to-lake "
                             "--lake-catalog URI --lake-warehouse LOCATION (move them to the lake)")
        if args.to_lake:
            done = compact_to_lake(args.db, args.run, args.lake_catalog, args.lake_warehouse,
                                   dict(args.lake_option))
        else:
            done = compact_file(args.db, args.run, args.keep_token_steps, check=refuse_thinning_unsent)
    except (RuntimeError, LookupError, FileNotFoundError, ValueError, OSError) as exc:
        print(f"forksight compact: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(done))
    return 0


def compact_to_lake(db: str, run_id: str, uri: str | None, warehouse: str | None,
                    options: dict[str, str] | None = None) -> dict:
    """Move the run's committed token rows out of `db` (monitor/lake/move_tokens.py), then shrink the file."""
    import os

    from forksight.monitor.collector.compact import open_run_file, rewrite_file
    from forksight.monitor.lake.catalog import open_catalog
    from forksight.monitor.lake.move_tokens import move_tokens

    if not uri or not warehouse:
        raise ValueError("--to-lake needs --lake-catalog URI and --lake-warehouse LOCATION (those serve wrote with)")
    if not os.path.exists(db):
        raise FileNotFoundError(f"no DuckDB file at {db}")
    # LakeError is a RuntimeError: said by run_compact
    catalog = open_catalog(uri, warehouse, check=False, properties=options)
    conn, size_before = open_run_file(db, run_id)
    try:
        done = move_tokens(conn, catalog, run_id)
        conn.execute("CHECKPOINT")
        rewrite_file(conn, db)
    except BaseException:
        conn.close()
        raise
    return {**done, "bytes_before": size_before, "bytes_after": os.path.getsize(db)}
