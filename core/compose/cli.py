"""The `forksight` command: one dispatcher; each subcommand lives with the code it runs and
registers itself through its module's `add_parser(subparsers)`, which sets `func`."""
# Those modules stay light (no torch/Dash at module top) so `forksight --help` answers at once;
# heavy imports happen inside `func` (tests/test_cli.py checks it).
from __future__ import annotations

import argparse
import sys

from forksight.compose import (
    alerts_cli, compact_cli, doctor, lake_cli, probe_cli, report_cli, rescore_cli, serve_cli,
)
from forksight.trainer import cli as train_cli
from forksight.compose import demo

# each module's add_parser registers its subcommand(s); order is the order in `forksight --help`
SUBCOMMANDS = (
    serve_cli.add_parser,     # serve, export
    compact_cli.add_parser,   # compact
    lake_cli.add_parser,      # lake compact, lake expire
    train_cli.add_parser,     # train
    alerts_cli.add_parser,    # alerts replay
    probe_cli.add_parser,     # probe
    rescore_cli.add_parser,   # rescore
    doctor.add_parser,        # doctor, import
    report_cli.add_parser,    # report
    demo.add_parser,          # demo
)


def build_parser() -> argparse.ArgumentParser:
    """The `forksight` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="forksight",
        description="Token-level training diagnostics and a live dashboard for RLVR (GRPO/DAPO).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add_parser in SUBCOMMANDS:
        add_parser(sub)
    return parser


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def interruptible() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so every command's clean-shutdown path runs
    (checkpoint, flush, close the DuckDB file) even when started in the background, where a
    shell leaves SIGINT ignored, or stopped by `docker stop` / a supervisor (SIGTERM)."""
    import signal

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command == "train":   # serve: uvicorn handles its own; demo: a stop flag
        interruptible()
    result = args.func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
