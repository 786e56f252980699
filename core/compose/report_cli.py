"""`forksight report --db FILE|--url URL --run NAME [-o run.html]`: a run as one self-contained HTML file
(dashboard/report_html.py) to send to a colleague or attach to an issue; it opens from disk offline.
Written to a temporary file beside the target and renamed into place: nothing half-written."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from forksight.compose.probe_source import add_run_source


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="A run as one self-contained HTML file (charts, alerts, tokens).",
                              description="Write a run's verdict, charts, alerts with their fixes, coloured "
                                          "completions of a few steps and config into one HTML file that opens "
                                          "offline (plotly.js inlined).")
    add_run_source(p)
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="where to write (default: RUN.html)")
    p.add_argument("--max-points", type=int, default=500, help="points per series (default 500)")
    p.add_argument("--token-steps", type=int, default=3, help="token steps shown: first, middle, last (default 3)")
    p.add_argument("--completions", type=int, default=4, help="completions shown per token step (default 4)")
    p.set_defaults(func=run_report)


def _fail(message: str) -> int:
    print(f"forksight report: {message}", file=sys.stderr)
    return 2


def output_problem(out: Path) -> str | None:
    """Why `out` cannot be written (its folder missing or read-only), else None."""
    if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        return f"cannot write {out}: {out.parent} is not a writable folder; pass -o in one"
    return None


def write_atomically(text: str, out: Path) -> str | None:
    """Write `text` to `out` through a temporary file renamed into place (a failure leaves no half
    file and an earlier one as it was); a problem as one line, else None."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)      # as an ordinary file, not mkstemp's owner-only mode
        os.replace(tmp, out)
    except OSError as exc:
        os.unlink(tmp)
        return f"cannot write {out}: {exc}"
    return None


def run_report(args: argparse.Namespace) -> int:
    for flag, value in (("--max-points", args.max_points), ("--token-steps", args.token_steps),
                        ("--completions", args.completions)):
        if value < 1:
            return _fail(f"{flag} must be >= 1, got {value}")
    if args.db and not os.path.exists(args.db):
        return _fail(f"--db: no DuckDB file at {args.db}")
    out = Path(args.output or f"{args.run}.html")
    if (problem := output_problem(out)) is not None:
        return _fail(problem)
    from forksight.compose.notebook import open_reader
    from forksight.dashboard.report_html import render_report

    try:
        with open_reader(args.db, args.url, args.token) as reader:
            text = render_report(reader, args.run, max_points=args.max_points,
                                 token_steps=args.token_steps, completions=args.completions)
    except ValueError as exc:
        where = f"`forksight serve --db {args.db}`" if args.db else f"{args.url}/api/runs"
        return _fail(f"{exc}; {where} lists its runs")
    except (RuntimeError, ConnectionError, PermissionError) as exc:   # a file another process holds, no collector
        return _fail(str(exc))
    if (problem := write_atomically(text, out)) is not None:
        return _fail(problem)
    print(f"forksight report: {out} ({len(text.encode()) / 1e6:.1f} MB)", file=sys.stderr)
    return 0
