"""A guard in front of Dash's callback route: anything but a well-formed call of one of this
dashboard's callbacks, or values a callback cannot use, gets a 400 saying why (Dash: a 500)."""
# a callback that fails on the values sent logs its traceback, so a real bug stays visible
from __future__ import annotations

import logging
from typing import Any

from flask import jsonify, request
from werkzeug.exceptions import HTTPException

log = logging.getLogger("forksight.dashboard")
CALLBACK_ROUTE = "_dash-update-component"


def _declared(item) -> tuple[Any, str]:
    # Output/Input objects or their dict form; a duplicate output's property carries '@hash'
    if isinstance(item, dict):
        return item.get("id"), str(item.get("property", "")).split("@")[0]
    return item.component_id, str(item.component_property).split("@")[0]


def _matches(got: Any, want) -> bool:
    want_id, want_prop = _declared(want)
    if isinstance(want_id, dict):        # pattern-matching ids: one dict or a list of them
        return isinstance(got, (dict, list))
    return (isinstance(got, dict) and got.get("id") == want_id
            and str(got.get("property", "")).split("@")[0] == want_prop)


def callback_problem(body: Any, callback_map: dict) -> str | None:
    """What makes `body` not a call of a registered callback (None when it is one)."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    output = body.get("output")
    if not isinstance(output, str) or output not in callback_map:
        return "output: not a callback of this dashboard (reload the page)"
    spec = callback_map[output]
    for name in ("inputs", "state"):
        items, declared = body.get(name, []), spec.get(name, [])
        if not isinstance(items, list) or len(items) != len(declared) or \
                not all(_matches(got, want) for got, want in zip(items, declared)):
            return f"{name}: must list the callback's {len(declared)} {name} as {{id, property, value}}"
    outputs, declared = body.get("outputs"), spec.get("output")
    if isinstance(declared, (list, tuple)):
        ok = isinstance(outputs, list) and len(outputs) == len(declared) and \
            all(_matches(got, want) for got, want in zip(outputs, declared))
    else:
        ok = declared is None or _matches(outputs, declared)
    if not ok:
        return "outputs: must name the callback's outputs as {id, property}"
    changed = body.get("changedPropIds", [])
    if not (isinstance(changed, list) and all(isinstance(c, str) for c in changed)):
        return "changedPropIds: must be a list of strings"
    return None


def guard_callbacks(dash_app) -> None:
    """Check every callback request of `dash_app` before Dash handles it."""

    @dash_app.server.before_request
    def _check_callback():
        if request.method != "POST" or not request.path.endswith(CALLBACK_ROUTE):
            return None
        try:
            body = request.get_json(silent=True)     # cached: Dash reuses the parsed body
        except RecursionError:
            body = None
        if body is None and request.get_data(cache=True).strip() not in (b"null",):
            problem = "the body is not JSON: send the callback request as Dash's renderer does"
        else:
            problem = callback_problem(body, dash_app.callback_map)
        if problem is None:
            return None
        log.warning("refused a dashboard callback request: %s", problem)
        return jsonify(detail=f"not a dashboard callback request: {problem}"), 400

    @dash_app.server.errorhandler(Exception)
    def _callback_failed(exc: Exception):
        if isinstance(exc, HTTPException) or not request.path.endswith(CALLBACK_ROUTE):
            return exc if isinstance(exc, HTTPException) else _reraise(exc)
        log.warning("a dashboard callback failed on the values it was sent", exc_info=exc)
        return jsonify(detail=f"the dashboard could not answer this callback with the values sent "
                              f"({type(exc).__name__}); reload the page"), 400


def _reraise(exc: Exception):
    raise exc
