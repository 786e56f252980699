"""Runs page: the runs with their status, strategy, model, last step, current entropy with a
sparkline, pass@1 and alerts, one page at a time (paged, filtered and sorted in SQL: the browser
never holds every run); filter, open one, or select several to compare."""
from __future__ import annotations

from urllib.parse import quote

import dash
from dash import Input, Output, State, dash_table, dcc, html

from forksight.dashboard import data
from forksight.dashboard.runs_table import (
    PAGE_SIZE, SPARK_POINTS, SQL_COLUMNS, parse_filter, runs_rows, runs_table,
)
from forksight.dashboard.text import store_note
from forksight.dashboard.verdict import CHIP_COLORS, STATES

__all__ = ["SPARK_POINTS", "layout", "register", "runs_rows", "runs_table"]

REFRESH_MS = 3000
COLUMNS = [("name", "run"), ("health", "health"), ("status", "status"),
           ("strategy", "strategy"), ("model", "model"), ("last_step", "last step"),
           ("entropy", "entropy H"), ("trend", "H trend"), ("pass1", "pass@1"),
           ("alerts", "alerts")]
MARKDOWN = {"alerts"}        # a link to the alerts view (its text: counts, its URL: a quoted id)
# the columns drawn per page cannot be sorted or filtered in SQL: no sort arrow, no filter box
_PER_PAGE = [i for i, (cid, _) in enumerate(COLUMNS) if cid not in SQL_COLUMNS]
_CSS = [{"selector": f"th.dash-header.column-{i + 1} .column-header--sort", "rule": "display: none"}
        for i in _PER_PAGE] + [{"selector": f"th.dash-filter.column-{i + 1} input",
                                "rule": "display: none"} for i in _PER_PAGE]


def layout(**_query) -> html.Div:
    first, total = runs_table(data.reader(), dash.get_relative_path("/"))
    return html.Div([
        html.H2("Runs"),
        html.Div(_store_note(data.reader()), id="runs-store-note", className="store-note", role="alert"),
        html.Div(className="controls", children=[
            html.Span("Filter: type in the row under the headers (e.g. fork, live, > 100). "
                      "Click a run to open it; tick rows to compare them."),
            html.Span(_count(total), id="runs-count", className="muted"),
            html.Button("Compare selected", id="runs-compare", className="btn"),
        ]),
        dash_table.DataTable(
            id="runs-table", columns=[{"name": label, "id": cid,
                                       **({"presentation": "markdown"} if cid in MARKDOWN else {})}
                                      for cid, label in COLUMNS],
            markdown_options={"link_target": "_self"},
            data=first, row_selectable="multi", selected_rows=[],
            # paged, filtered and sorted in SQL: the browser holds one page, never every run
            page_action="custom", page_current=0, page_size=PAGE_SIZE,
            page_count=max(1, -(-total // PAGE_SIZE)), filter_action="custom", filter_query="",
            sort_action="custom", sort_mode="multi", sort_by=[], css=_CSS,
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
                  Input("runs-table", "page_current"), Input("runs-table", "page_size"),
                  Input("runs-table", "sort_by"), Input("runs-table", "filter_query"),
                  prevent_initial_call=True)
    def refresh(_n, page, size, sort_by, filter_query):
        return runs_table(data.reader(), dash.get_relative_path("/"), *_paging(page, size),
                          sort_by if isinstance(sort_by, list) else None,
                          filter_query if isinstance(filter_query, str) else None)[0]

    @app.callback(Output("runs-table", "page_count"), Output("runs-count", "children"),
                  Input("runs-tick", "n_intervals"), Input("runs-table", "page_size"),
                  Input("runs-table", "filter_query"), prevent_initial_call=True)
    def count(_n, size, filter_query):
        size = _paging(0, size)[1]
        total = data.reader().runs_page(
            where=parse_filter(filter_query if isinstance(filter_query, str) else None), limit=0)[1]
        return max(1, -(-total // size)), _count(total)

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


def _paging(page, size) -> tuple[int, int]:
    """(page, size) as the table sent them, or the first page of PAGE_SIZE when not numbers."""
    size = size if isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 500 else PAGE_SIZE
    page = page if isinstance(page, int) and not isinstance(page, bool) and 0 <= page < 1 << 31 else 0
    return page, size


def _count(total: int) -> str:
    return f"{total:,} run{'s' if total != 1 else ''}"


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
