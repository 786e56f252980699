"""The collector's error type and its one pydantic-error formatter (used by routes and ingest)."""
from __future__ import annotations


class ApiError(Exception):
    """An HTTP error with a message that says what was wrong and what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _where(loc: tuple, root: str) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or root


def validation_message(errors: list[dict], root: str = "body") -> str:
    """Pydantic errors -> one line per field: 'scalars[0].value: Input should be a finite number'.

    root names what an error without a location is about (a request body, a config file).
    """
    return "; ".join(f"{_where(tuple(e.get('loc', ())), root)}: {e.get('msg')}" for e in errors[:20])


def unknown_run(run_id: str) -> ApiError:
    """The one answer for a run id the store does not hold (every route that takes one)."""
    return ApiError(404, f"unknown run {run_id!r}: GET /api/runs lists the stored run ids; "
                         "a producer creates its run first with POST /api/runs")
