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


def validation_message(errors: list[dict], root: str = "body", model: type | None = None) -> str:
    """Pydantic errors -> one line per field: 'scalars[0].value: Input should be a finite number'.

    root names what an error without a location is about (a request body, a config file). With
    `model` (the pydantic class validated), an unknown key says which known one it is close to and
    lists the valid fields: "config.lr_rate: unknown field; did you mean 'lr'? Valid fields: ...".
    """
    def message(e: dict) -> str:
        loc = tuple(e.get("loc", ()))
        if model is not None and e.get("type") == "extra_forbidden" and loc:
            return unknown_field(str(loc[-1]), _fields_at(model, loc[:-1]))
        return str(e.get("msg"))

    return "; ".join(f"{_where(tuple(e.get('loc', ())), root)}: {message(e)}" for e in errors[:20])


def unknown_field(name: str, valid: list[str]) -> str:
    """'unknown field; did you mean …? Valid fields: …' (difflib's close matches)."""
    import difflib

    if not valid:
        return "unknown field"
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown field{hint} Valid fields: {', '.join(valid)}"


def _fields_at(model: type, path: tuple) -> list[str]:
    """Field names of the (nested) pydantic model at `path` below `model`; [] if not a model."""
    for part in path:
        info = getattr(model, "model_fields", {}).get(str(part))
        if info is None or not hasattr(info.annotation, "model_fields"):
            return []
        model = info.annotation
    return list(getattr(model, "model_fields", {}))


def unknown_run(run_id: str) -> ApiError:
    """The one answer for a run id the store does not hold (every route that takes one)."""
    return ApiError(404, f"unknown run {run_id!r}: GET /api/runs lists the stored run ids; "
                         "a producer creates its run first with POST /api/runs")
