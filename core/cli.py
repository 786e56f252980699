"""The `forksight` command: one dispatcher, each subcommand lives with the code it runs.

Every module below exposes `add_parser(subparsers)` that registers its subcommand(s) and
sets `func` on the parser. `add_parser` must stay light (no torch/dash import at module
top) so `forksight --help` answers instantly; heavy imports happen inside `func`.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# module -> its subcommands; order is the order in `forksight --help`
SUBCOMMAND_MODULES = (
    "forksight.monitor.serve_cli",    # serve, export
    "forksight.trainer.cli",          # train
    "forksight.monitor.alerts_cli",   # alerts replay
    "forksight.trainer.demo",         # demo
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forksight",
        description="Token-level training diagnostics and a live dashboard for RLVR (GRPO/DAPO).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency inside the module: say so
                raise
            continue
        module.add_parser(sub)
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
