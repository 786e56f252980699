"""What the bench scripts that render a docs page share: their --out/--markdown/--render options,
rendering a page from a stored JSON only, writing the JSON and the page, and the commit measured."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]


def add_page_options(parser, page: str) -> None:
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--markdown", default=None, help=f"also write the docs page ({page}) here")
    parser.add_argument("--render", default=None, metavar="JSON", help="only render --markdown from this JSON")


def rendered_only(args, markdown: Callable[[dict], str]) -> bool:
    """--render: the page written from the stored JSON, nothing measured (True); else False."""
    if args.render:
        Path(args.markdown).write_text(markdown(json.loads(Path(args.render).read_text())))
    return bool(args.render)


def write_outputs(out: dict, args, markdown: Callable[[dict], str], *, echo: bool = True) -> None:
    """The JSON to --out (and to stdout when `echo`), the page to --markdown."""
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if echo:
        print(text)
    if args.markdown:
        Path(args.markdown).write_text(markdown(out))


def commit(short: bool = False) -> str:
    """The checked-out commit ('' when git cannot say)."""
    try:
        return subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], cwd=REPO,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return ""
