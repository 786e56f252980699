"""The run pickers' choices (run, tokens, compare and alerts pages): the newest runs, or those
whose name holds what the user types, read one page at a time in SQL (Reader.runs_page), plus the
runs already picked. Never every run: at 10,000 runs each page's layout carried ~1 MB of options
and the browser's dropdown froze the page for tens of seconds."""
from __future__ import annotations

from typing import Iterable

import dash
from dash import Input, Output, State, no_update

from forksight.base.interfaces import Reader
from forksight.dashboard import data

PICK_RUNS = 50          # choices a picker holds at once; typing searches every run by name


def run_label(run: dict, status: bool = False) -> str:
    """"name · strategy" (· status): how a picker names a run."""
    parts = [run.get("name") or run["run_id"], run.get("strategy") or "–"]
    return " · ".join(parts + ([run.get("status") or "?"] if status else []))


def run_options(reader: Reader, chosen: Iterable[str] = (), search: str | None = None,
                status: bool = False, limit: int = PICK_RUNS) -> list[dict]:
    """Picker entries, newest first: the `limit` newest runs (or those whose name contains
    `search`, any case), then each `chosen` run not among them (a dropdown drops a value its
    options lack). Unknown chosen ids are left out."""
    where = [("name", "contains", search)] if search else []
    rows = reader.runs_page(where=where, limit=limit)[0].to_dict("records")
    have = {r["run_id"] for r in rows}
    for run_id in chosen:
        if isinstance(run_id, str) and run_id not in have:
            row = reader.run(run_id)
            if row is not None:
                rows.append(row)
                have.add(run_id)
    return [{"label": run_label(r, status), "value": r["run_id"]} for r in rows]


def searchable(app: dash.Dash, dropdown_id: str, status: bool = False) -> None:
    """Typing into the picker `dropdown_id` searches every run by name (Dash's search_value)."""

    @app.callback(Output(dropdown_id, "options"), Input(dropdown_id, "search_value"),
                  State(dropdown_id, "value"), prevent_initial_call=True)
    def search(text, value):
        if text is None:
            return no_update
        chosen = value if isinstance(value, list) else [value] if value else []
        return run_options(data.reader(), chosen, text.strip() or None, status)
