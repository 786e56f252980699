"""`forksight compact`: thin a long run's token rows so its DuckDB file stays bounded."""
from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers) -> None:
    """Register `compact`."""
    compact = subparsers.add_parser(
        "compact", help="thin a run's token rows to N steps and shrink the file",
        description="Keep a run's token rows at N evenly spaced steps plus the newest; its scalars, "
        "histograms, samples and alerts stay whole. The file is then rewritten, so the space comes "
        "back to the disk. Stop `forksight serve` on the file first (it holds the file).")
    compact.add_argument("--db", required=True, help="DuckDB file (not held by a running collector)")
    compact.add_argument("--run", required=True, help="run id")
    compact.add_argument("--keep-token-steps", type=int, required=True, metavar="N",
                         help="token rows kept at N evenly spaced steps, plus the newest")
    compact.set_defaults(func=run_compact)


def run_compact(args: argparse.Namespace) -> int:
    from forksight.monitor.collector.compact import compact_file

    try:
        done = compact_file(args.db, args.run, args.keep_token_steps)
    except (RuntimeError, LookupError, FileNotFoundError, ValueError, OSError) as exc:
        print(f"forksight compact: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(done))
    return 0
