"""The OpenAPI document declares the errors the collector really answers: 400/401/403/404/409/
413/415/422/503/507, each {"detail": "text"} (FastAPI declared only its list-shaped 422, so
generated clients misparsed every error)."""
from __future__ import annotations

from fastapi import FastAPI

ERROR_SCHEMA = {"title": "Error", "type": "object", "required": ["detail"],
                "properties": {"detail": {"type": "string", "description": "what was wrong and what to do"}}}
ERRORS = {
    400: "malformed request: the body is not JSON / not an Arrow IPC stream, or has no Content-Type",
    401: "missing or wrong token (collectors started with --token)",
    403: "Host or Origin is not this collector (tokenless loopback collectors)",
    404: "unknown run",
    409: "the batch id was stored before with other content",
    413: "the body is over the size limit (see /api/health limits)",
    415: "wrong Content-Type for this route",
    422: "a field or query parameter breaks a rule (named in detail)",
    503: "the store cannot write now (its file is being reopened; see /api/health)",
    507: "disk full: detail says how much space the write needs",
}


def declare_errors(app: FastAPI) -> None:
    """Replace app.openapi with one that declares ERRORS on every operation."""
    plain = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = plain()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["Error"] = ERROR_SCHEMA
        ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                responses = operation.setdefault("responses", {})
                for status, description in ERRORS.items():
                    if path == "/api/health" and str(status) in responses:
                        continue            # its 503 carries the store's state, not an Error
                    responses[str(status)] = {"description": description, "content": ref}
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
