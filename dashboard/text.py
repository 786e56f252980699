"""Text from runs (strategy, model, names) made visible: bidi controls and zero-width characters
would reorder or hide what the table shows ("ict" + U+202E + "gnp.exe" reads as "ictexe.png"),
so each format or control character is shown as its escape, e.g. \\u202e."""
from __future__ import annotations

import unicodedata


def visible(text) -> str:
    """`text` with every format (Cf: bidi, zero-width) and control (Cc) character escaped."""
    if text is None:
        return ""
    text = str(text)
    if text.isprintable() and text.isascii():
        return text
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in ("Cf", "Cc") else c for c in text)


def store_note(health: dict | None) -> str:
    """One line about the store for the runs page: rows found lost (until acknowledged), or why
    it cannot write; "" when all is well."""
    if not health:
        return ""
    parts = []
    lost = health.get("lost_rows") or {}
    if lost:
        rows = ", ".join(f"{n} {table}" for table, n in sorted(lost.items()))
        parts.append(f"Rows lost: {rows} row(s) acknowledged earlier are not in the file (its .wal was damaged "
                     "or truncated before they reached it). Acknowledge with POST /api/lost_rows/acknowledge.")
    if not health.get("writable", True):
        parts.append(f"The store cannot write now: {health.get('error') or 'see /api/health'}")
    return " ".join(parts)
