"""A generated block inside a hand-written page, between a BEGIN and an END marker line: read it,
or replace it with a script's output (README's demo paragraph, the strategy tables)."""
from __future__ import annotations

import re
from pathlib import Path


def block(content: str, begin: str, end: str) -> str | None:
    """What lies between the markers (None: not there once each, in order)."""
    if content.count(begin) != 1 or content.count(end) != 1 or content.index(begin) > content.index(end):
        return None
    return content[content.index(begin) + len(begin):content.index(end)].removeprefix("\n")


def rewrite(page: Path, text: str, begin: str, end: str) -> None:
    """Replace the marked block's content with `text`; the markers must be there, once each."""
    content = page.read_text()
    if block(content, begin, end) is None:
        raise SystemExit(f"{page}: needs one {begin} line and, after it, one {end} line")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    page.write_text(pattern.sub(lambda _: f"{begin}\n{text}{end}", content))
