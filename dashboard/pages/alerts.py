"""Alerts view: every alert of every run, newest first, filtered by run, severity and detector,
each row linking to the run page and the tokens page at its step."""
from __future__ import annotations

import time

import dash
from dash import Input, Output, State, ctx, dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard import data
from forksight.dashboard.alerts_view import alert_rows, read_verdicts, verdict_chip
from forksight.dashboard.run_options import run_options, searchable

PAGE_SIZE = 50
REFRESH_MS = 5000
SEVERITIES = ("critical", "warning")


def _split(value: str | None) -> list[str]:
    return [v for v in (value or "").split(",") if v]


def layout(run: str | None = None, severity: str | None = None, detector: str | None = None,
           **_query) -> html.Div:
    reader = data.reader()
    wanted = _split(run)
    options = run_options(reader, wanted)
    known = {o["value"] for o in options}
    unknown = [r for r in wanted if r not in known]
    runs_shown = [r for r in wanted if r in known]
    severities = [s for s in _split(severity) if s in SEVERITIES] or list(SEVERITIES)
    # the first page of rows goes in the layout itself: they show with the page, no callback first
    table, count, label, _ = page_of(runs_shown, severities, _split(detector), 0)
    return html.Div([
        html.H2("Alerts"),
        html.P(f"no run named {', '.join(unknown)!s}: showing the runs that exist",
               className="notice", id="alerts-unknown") if unknown else None,
        html.Div(className="controls", children=[
            html.Div([html.Label("run"), dcc.Dropdown(
                id="alerts-run", options=options, value=runs_shown,
                multi=True, placeholder="every run")], className="control control-wide"),
            html.Div([html.Label("severity"), dcc.Checklist(
                id="alerts-severity", inline=True, options=[
                    {"label": f" {s}", "value": s} for s in SEVERITIES],
                value=severities)],
                className="control"),
            html.Div([html.Label("detector"), dcc.Dropdown(
                id="alerts-detector", options=reader.alert_detectors(), multi=True,
                value=_split(detector), placeholder="every detector")],
                className="control control-wide"),
        ]),
        html.Div(count, id="alerts-count", className="alerts-count"),
        html.Div(table, id="alerts-table"),
        html.Div(className="pager", children=[
            html.Button("← newer", id="alerts-prev", className="btn", n_clicks=0),
            html.Span(label, id="alerts-page-label", className="pager-label"),
            html.Button("older →", id="alerts-next", className="btn", n_clicks=0)]),
        dcc.Store(id="alerts-offset", data=0),
        dcc.Interval(id="alerts-tick", interval=REFRESH_MS),
    ])


def alerts_table(rows: list[dict], chips: dict) -> html.Table | html.P:
    """The page's table: one row per alert (text children: escaped)."""
    if not rows:
        return html.P("no alerts match: no run has raised one yet, or the filters exclude them",
                      className="empty-note")
    head = html.Tr([html.Th(h) for h in ("when", "run", "health", "step", "severity",
                                         "detector", "what was seen", "fix", "open")])
    body = []
    for r in rows:
        chip = chips.get(r["run_id"])
        body.append(html.Tr(className=f"alert-row alert-row-{r['severity']}", children=[
            html.Td(r.get("when", "")), html.Td(r["run"]),
            html.Td(verdict_chip(chip) if chip else ""),
            html.Td(dcc.Link(str(r["step"]), href=r["run_link"], className="alert-step")),
            html.Td(r["severity"], className=f"sev sev-{r['severity']}"),
            html.Td(r["detector"]), html.Td(r["message"], className="alert-msg"),
            html.Td(r["fix"], className="alert-fix"),
            html.Td([dcc.Link("run", href=r["run_link"], className="alert-run-link"), " · ",
                     dcc.Link("tokens", href=r["tokens_link"], className="alert-tokens-link")]),
        ]))
    return html.Table(className="alerts-table", children=[html.Thead(head), html.Tbody(body)])


def render(reader: Reader, run_ids, severities, detectors, offset: int, prefix: str = "/") -> dict:
    """The table, the count line and the pager label for one set of filters and one page."""
    page, total = reader.read_alerts_page(run_ids=run_ids or (), severities=severities or (),
                                          detectors=detectors or (), limit=PAGE_SIZE,
                                          offset=offset)
    rows = alert_rows(page, prefix)
    for r, wall in zip(rows, page["wall_time"].tolist()):
        r["when"] = "" if wall is None or wall != wall else \
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))
    chips = read_verdicts(reader, {r["run_id"] for r in rows}) if rows else {}
    last = min(offset + PAGE_SIZE, total)
    return {"table": alerts_table(rows, chips), "total": total,
            "count": f"{total} alert{'s' if total != 1 else ''}, newest first",
            "label": f"{offset + 1}–{last} of {total}" if total else ""}


def register(app: dash.Dash) -> None:
    """The page and its callback on `app`."""
    dash.register_page(__name__, path="/alerts", name="Alerts", title="forksight · alerts",
                       layout=layout)
    searchable(app, "alerts-run")

    @app.callback(Output("alerts-table", "children"), Output("alerts-count", "children"),
                  Output("alerts-page-label", "children"), Output("alerts-offset", "data"),
                  Input("alerts-run", "value"), Input("alerts-severity", "value"),
                  Input("alerts-detector", "value"), Input("alerts-prev", "n_clicks"),
                  Input("alerts-next", "n_clicks"), Input("alerts-tick", "n_intervals"),
                  State("alerts-offset", "data"), prevent_initial_call=True)   # the layout holds page one
    def show(run_ids, severities, detectors, _prev, _next, _tick, offset):
        offset = max(0, int(offset or 0))
        trigger = ctx.triggered_id
        if trigger == "alerts-next":
            offset += PAGE_SIZE
        elif trigger == "alerts-prev":
            offset = max(0, offset - PAGE_SIZE)
        elif trigger != "alerts-tick":
            offset = 0                      # new filters: back to the newest
        return page_of(run_ids, severities, detectors, offset)


def page_of(run_ids, severities, detectors, offset: int) -> tuple:
    """(table, count line, pager label, offset) for these filters from `offset` (the layout's
    first page and the callback's); past the last page: the last page."""
    if not severities:                  # nothing ticked shows nothing, not everything
        return alerts_table([], {}), "0 alerts (no severity ticked)", "", 0
    out = render(data.reader(), list(run_ids or []), list(severities), list(detectors or []),
                 offset, dash.get_relative_path("/"))
    if offset and offset >= out["total"]:
        offset = max(0, out["total"] - 1) // PAGE_SIZE * PAGE_SIZE
        out = render(data.reader(), list(run_ids or []), list(severities),
                     list(detectors or []), offset, dash.get_relative_path("/"))
    return out["table"], out["count"], out["label"], offset
