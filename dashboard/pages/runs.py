"""Runs page: every run with its status, strategy, model, last step, current entropy with a
sparkline, pass@1 and alerts; filter, open one, or select several to compare."""
from __future__ import annotations

import math
from urllib.parse import quote

import dash
import pandas as pd
from dash import Input, Output, State, dash_table, dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard import data
from forksight.dashboard.figures import sparkline
from forksight.dashboard.text import store_note, visible
from forksight.dashboard.verdict import CHIP_COLORS, STATES, verdicts_of_runs

REFRESH_MS = 3000
SPARK_POINTS = 24
COLUMNS = [("name", "run"), ("health", "health"), ("status", "status"),
           ("strategy", "strategy"), ("model", "model"), ("last_step", "last step"),
           ("entropy", "entropy H"), ("trend", "H trend"), ("pass1", "pass@1"),
           ("alerts", "alerts")]
MARKDOWN = {"alerts"}        # a link to the alerts view (its text: counts, its URL: a quoted id)


def _num(value, digits: int = 3):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else round(float(value), digits)


def runs_rows(reader: Reader, prefix: str = "/") -> list[dict]:
    """One table row per run (plain values: DataTable renders them as text; the alerts cell is
    a markdown link to the alerts view filtered to the run, built from numbers and a quoted id)."""
    runs = reader.list_runs()
    alerts = reader.read_alerts()
    counts = alerts.groupby(["run_id", "severity"]).size().to_dict() if not alerts.empty else {}
    # every run's sparkline in one query: one query per run took 23 s at 1,861 runs
    trends = reader.read_scalars_of_runs(["entropy/mean", "pass@1"], downsample=SPARK_POINTS)
    values = trends.groupby(["run_id", "key"], sort=False)["value"].agg(list).to_dict() \
        if not trends.empty else {}
    steps = {r["run_id"]: None if pd.isna(r["last_step"]) else int(r["last_step"])
             for r in runs.to_dict("records")}
    latest = {rid: {"entropy/mean": ent[-1]} for (rid, key), ent in values.items()
              if key == "entropy/mean" and ent}
    health = verdicts_of_runs(alerts, latest, steps)
    rows = []
    for run in runs.to_dict("records"):
        rid = run["run_id"]
        ent, p1 = values.get((rid, "entropy/mean"), []), values.get((rid, "pass@1"), [])
        crit, warn = int(counts.get((rid, "critical"), 0)), int(counts.get((rid, "warning"), 0))
        counts_text = " · ".join(t for t in (f"{crit} critical" if crit else "",
                                             f"{warn} warning" if warn else "") if t)
        rows.append({
            "id": rid, "name": visible(run.get("name") or rid), "health": health[rid].label,
            "health_why": health[rid].why, "status": run.get("status") or "?",
            "strategy": visible(run.get("strategy")), "model": visible(run.get("model")),
            "last_step": None if pd.isna(run.get("last_step")) else int(run["last_step"]),
            "entropy": _num(ent[-1]) if ent else None, "trend": sparkline(ent),
            "pass1": _num(p1[-1]) if p1 else None,
            "alerts": f"[{counts_text}]({prefix}alerts?run={quote(rid, safe='')})"
            if counts_text else "",
        })
    return rows


def layout(**_query) -> html.Div:
    return html.Div([
        html.H2("Runs"),
        html.Div(_store_note(data.reader()), id="runs-store-note", className="store-note", role="alert"),
        html.Div(className="controls", children=[
            html.Span("Filter: type in the row under the headers (e.g. fork, live). "
                      "Click a run to open it; tick rows to compare them."),
            html.Button("Compare selected", id="runs-compare", className="btn"),
        ]),
        dash_table.DataTable(
            id="runs-table", columns=[{"name": label, "id": cid,
                                       **({"presentation": "markdown"} if cid in MARKDOWN else {})}
                                      for cid, label in COLUMNS],
            markdown_options={"link_target": "_self"},
            data=runs_rows(data.reader(), dash.get_relative_path("/")), row_selectable="multi",
            selected_rows=[],
            filter_action="native", sort_action="native", page_size=50,
            style_as_list_view=True, style_cell={"fontFamily": "inherit", "padding": "6px 10px",
                                                 "textAlign": "left", "fontSize": "14px"},
            style_header={"fontWeight": "600", "backgroundColor": "#f1f3f5"},
            style_cell_conditional=[{"if": {"column_id": "trend"},
                                     "fontFamily": "monospace", "color": "#d9480f"},
                                    {"if": {"column_id": "name"}, "cursor": "pointer",
                                     "color": "#1c7ed6", "fontWeight": "600"}],
            style_data_conditional=[
                {"if": {"filter_query": '{status} = "live"', "column_id": "status"},
                 "color": "#2b8a3e", "fontWeight": "600"},
                {"if": {"filter_query": '{status} = "crashed"', "column_id": "status"},
                 "color": "#c92a2a", "fontWeight": "600"},
                *[{"if": {"filter_query": f'{{health}} contains "{state}"',
                          "column_id": "health"},
                   "color": CHIP_COLORS[state], "fontWeight": "600"} for state in STATES]]),
        dcc.Interval(id="runs-tick", interval=REFRESH_MS),
    ])


def register(app: dash.Dash) -> None:
    """The page and its callbacks on `app`."""
    dash.register_page(__name__, path="/", name="Runs", title="forksight · runs",
                       layout=layout)

    @app.callback(Output("runs-table", "data"), Input("runs-tick", "n_intervals"),
                  prevent_initial_call=True)
    def refresh(_n):
        return runs_rows(data.reader(), dash.get_relative_path("/"))

    @app.callback(Output("runs-store-note", "children"), Input("runs-tick", "n_intervals"),
                  prevent_initial_call=True)
    def store_state(_n):
        return _store_note(data.reader())

    @app.callback(Output("nav-location", "href", allow_duplicate=True),
                  Input("runs-table", "active_cell"), State("runs-table", "derived_viewport_data"),
                  prevent_initial_call=True)
    def open_run(cell, rows):
        # the table can refresh between the render and the click: a row it no longer has is no click
        row = _row(rows, cell.get("row")) if cell and cell.get("column_id") == "name" else None
        if row is None:
            return dash.no_update
        return dash.get_relative_path(f"/run?run={quote(row['id'])}")

    @app.callback(Output("nav-location", "href", allow_duplicate=True),
                  Input("runs-compare", "n_clicks"), State("runs-table", "derived_virtual_data"),
                  State("runs-table", "derived_virtual_selected_rows"),
                  prevent_initial_call=True)
    def compare(clicks, rows, selected):
        if not clicks:          # the button is re-created with each page visit: not a click
            return dash.no_update
        ids = [row["id"] for row in (_row(rows, i) for i in selected or []) if row is not None]
        query = quote(",".join(ids)) if ids else ""
        return dash.get_relative_path(f"/compare?runs={query}")


def _store_note(reader) -> str:
    """Rows lost from the file (until acknowledged) or why the store cannot write; "" if none."""
    health = getattr(reader, "store_health", None)
    return store_note(health(wait=0.0)) if callable(health) else ""


def _row(rows: list[dict] | None, index) -> dict | None:
    """rows[index] when the table still holds that row (and it names a run), else None."""
    if not rows or not isinstance(index, int) or not 0 <= index < len(rows):
        return None
    row = rows[index]
    return row if isinstance(row, dict) and isinstance(row.get("id"), str) else None
