"""The collector's error type and its one pydantic-error formatter (used by routes and ingest)."""
from __future__ import annotations


class ApiError(Exception):
    """An HTTP error with a message that says what was wrong and what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _where(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


def validation_message(errors: list[dict]) -> str:
    """Pydantic errors -> one line per field: 'scalars[0].value: Input should be a finite number'."""
    return "; ".join(f"{_where(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in errors[:20])
