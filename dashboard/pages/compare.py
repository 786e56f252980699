"""Compare page: several runs overlaid (e.g. `all` vs `fork` vs `ict`), colour by strategy,
each run's health in the legend, its alerts and forecast drawn; pick the metrics, log y, step
or wall-time axis; panels that are zero in every run are hidden and named. The "grouped" view
draws runs grouped by strategy or a config key as a mean with a band over each group's runs
(?view=grouped&group=seed&band=ci95 opens it)."""
from __future__ import annotations

import dash
from dash import Input, Output, dcc, html

from forksight.dashboard import data
from forksight.dashboard.alerts_view import read_verdicts, verdict_chip
from forksight.dashboard.compare_figures import COMPARE_PANELS, GAP, compare_figure
from forksight.dashboard.figures import pass_keys
from forksight.dashboard.group_figures import BANDS, group_keys, grouped_figure
from forksight.dashboard.run_options import run_options, searchable
from forksight.dashboard.wire import wire_figure

REFRESH_MS = 5000
MAX_RUNS = 12
MAX_GROUPED_RUNS = 36     # grouped: one read for all runs, and 5 strategies x 3 seeds x 2 lrs fit
VIEWS = ("runs", "grouped")
MAX_PANELS = 8
START_SMOOTHING = 0.6     # as the page opens


def compare_runs(reader, run_ids: list[str], smoothing: float = 0.0, max_points: int = 1000,
                 panels=COMPARE_PANELS, log_y: bool = False, x_axis: str = "step",
                 verdicts: dict | None = None) -> dict:
    """The overlay figure for these runs (unknown ids are skipped), with their verdicts."""
    runs = {rid: reader.run(rid) for rid in dict.fromkeys(run_ids[:MAX_RUNS])}
    ids = [rid for rid, run in runs.items() if run is not None]
    if verdicts is None:
        verdicts = read_verdicts(reader, ids) if ids else {}
    picked = []
    for rid in ids:
        keys = reader.scalar_keys(rid)
        wanted = [k for k in panels if k != GAP] + (pass_keys(keys) if GAP in panels else [])
        picked.append({"run_id": rid, "label": runs[rid]["name"],
                       "strategy": runs[rid]["strategy"], "verdict": verdicts.get(rid),
                       "alerts": reader.read_alerts(rid),
                       "scalars": reader.read_scalars(rid, keys=wanted, downsample=max_points)})
    return compare_figure(picked, panels=list(panels) or COMPARE_PANELS, smoothing=smoothing,
                          log_y=log_y, x_axis=x_axis)


def grouped_runs(reader, run_ids: list[str], group_by: str = "strategy", band: str = "minmax",
                 smoothing: float = 0.0, max_points: int = 1000, panels=COMPARE_PANELS,
                 log_y: bool = False, verdicts: dict | None = None) -> dict:
    """The grouped figure for these runs (unknown ids skipped): every run's scalars in one
    bounded read (≤ max_points per run and key), each group drawn as a mean with a band."""
    runs = {rid: reader.run(rid) for rid in dict.fromkeys(run_ids[:MAX_GROUPED_RUNS])}
    ids = [rid for rid, run in runs.items() if run is not None]
    wanted = {k for k in panels if k != GAP}
    if GAP in panels:
        wanted |= {k for rid in ids for k in pass_keys(reader.scalar_keys(rid))}
    frame = reader.read_scalars_of_runs(sorted(wanted), downsample=max_points, run_ids=ids) \
        if ids and wanted else None
    parts = dict(tuple(frame.groupby("run_id"))) if frame is not None and len(frame) else {}
    empty = frame.iloc[:0] if frame is not None else None
    picked = [{"run_id": rid, "label": runs[rid]["name"], "strategy": runs[rid]["strategy"],
               "config": runs[rid].get("config"), "verdict": (verdicts or {}).get(rid),
               "scalars": parts.get(rid, empty)} for rid in ids]
    return grouped_figure(picked, group_by=group_by, band=band, smoothing=smoothing,
                          log_y=log_y, panels=list(panels) or COMPARE_PANELS)


def group_options(reader, run_ids: list[str]) -> list[dict]:
    """What the chosen runs can be grouped by: strategy, then their config keys."""
    runs = [r for r in (reader.run(rid) for rid in run_ids[:MAX_GROUPED_RUNS]) if r is not None]
    return [{"label": k, "value": k} for k in group_keys(runs)]


def metric_options(reader, run_ids: list[str]) -> list[dict]:
    """Every scalar key of the chosen runs, plus the diversity gap."""
    keys = sorted({k for rid in run_ids[:MAX_GROUPED_RUNS] for k in reader.scalar_keys(rid)})
    return [{"label": "pass@G − pass@1 (gap)", "value": GAP}] + \
        [{"label": k, "value": k} for k in keys]


def overlay(reader, run_ids, smoothing, panels, log_y, x_axis, view="runs",
            group_by="strategy", band="minmax") -> tuple[dict, list]:
    """The page's figure and its health chips for raw control values (the layout's first draw
    and the draw callback's): unknown runs and panels are left out."""
    ids = [r for r in (run_ids or []) if isinstance(r, str)]
    panels = [p for p in (panels or []) if isinstance(p, str)][:MAX_PANELS] or list(COMPARE_PANELS)
    x_axis = x_axis if x_axis in ("step", "wall") else "step"
    grouped = view == "grouped"
    runs = {rid: reader.run(rid) for rid in dict.fromkeys(ids)}
    ids = [rid for rid, run in runs.items() if run is not None][
        :MAX_GROUPED_RUNS if grouped else MAX_RUNS]
    verdicts = read_verdicts(reader, ids) if ids else {}
    if grouped:
        fig = grouped_runs(reader, ids, group_by if isinstance(group_by, str) and group_by
                           else "strategy", band if band in BANDS else "minmax",
                           float(smoothing or 0), panels=panels, log_y=bool(log_y),
                           verdicts=verdicts)
    else:
        fig = compare_runs(reader, ids, float(smoothing or 0), panels=panels,
                           log_y=bool(log_y), x_axis=x_axis, verdicts=verdicts)
    names = {rid: runs[rid]["name"] for rid in ids}
    chips = [html.Span([html.Strong(names.get(rid, rid)), " ", verdict_chip(verdicts[rid])],
                       className="verdict-item") for rid in ids if rid in verdicts]
    return wire_figure(fig), chips          # redrawn whole every REFRESH_MS: ship it light


def layout(runs: str | None = None, view: str | None = None, group: str | None = None,
           band: str | None = None, **_query) -> html.Div:
    reader = data.reader()
    view = view if view in VIEWS else "runs"
    band = band if band in BANDS else "minmax"
    group = group or "strategy"
    asked = [r for r in (runs or "").split(",") if r]
    options = run_options(reader, asked)
    known = {o["value"] for o in options}
    unknown = [r for r in asked if r not in known]
    chosen = [r for r in asked if r in known] or [o["value"] for o in options[:3]]
    # the first draw goes in the layout itself: the overlay shows with the page, no callback first
    figure, chips = overlay(reader, chosen, START_SMOOTHING, list(COMPARE_PANELS), [], "step",
                            view, group, band)
    groups = group_options(reader, chosen)
    if group not in {o["value"] for o in groups}:    # asked by URL: keep it, say it groups nothing
        groups.append({"label": group, "value": group})
    return html.Div([
        html.H2("Compare runs"),
        html.P(f"no run named {', '.join(map(repr, unknown))}: left out", className="notice",
               id="cmp-unknown") if unknown else None,
        html.Div(className="controls", children=[
            html.Div([html.Label("runs"), dcc.Dropdown(id="cmp-runs", options=options,
                                                       value=chosen, multi=True)],
                     className="control control-wide"),
            html.Div([html.Label("metrics"), dcc.Dropdown(
                id="cmp-panels", multi=True, value=list(COMPARE_PANELS),
                options=metric_options(reader, chosen))], className="control control-wide"),
        ]),
        html.Div(className="controls", children=[
            html.Div([html.Label("smoothing (EMA)"),
                      dcc.Slider(id="cmp-smoothing", min=0, max=0.99, step=0.01,
                                 value=START_SMOOTHING,
                                 marks={0: "0", 0.6: "0.6", 0.99: ".99"})],
                     className="control control-wide"),
            html.Div([html.Label("x axis"), dcc.RadioItems(
                id="cmp-xaxis", inline=True, value="step",
                options=[{"label": " step", "value": "step"},
                         {"label": " wall time", "value": "wall"}])], className="control"),
            html.Div([html.Label("y scale"), dcc.Checklist(
                id="cmp-logy", options=[{"label": " log y", "value": "log"}], value=[],
                inline=True)], className="control"),
        ]),
        html.Div(className="controls", children=[
            html.Div([html.Label("view"), dcc.RadioItems(
                id="cmp-view", inline=True, value=view,
                options=[{"label": " runs", "value": "runs"},
                         {"label": " grouped (mean and band)", "value": "grouped"}])],
                className="control"),
            html.Div([html.Label("group by"), dcc.Dropdown(
                id="cmp-group", clearable=False, value=group, options=groups)],
                id="cmp-group-wrap", className="control",
                style=None if view == "grouped" else {"display": "none"}),
            html.Div([html.Label("band"), dcc.RadioItems(
                id="cmp-band", inline=True, value=band,
                options=[{"label": " min–max", "value": "minmax"},
                         {"label": " 95% interval of the mean", "value": "ci95"}])],
                id="cmp-band-wrap", className="control",
                style=None if view == "grouped" else {"display": "none"}),
        ]),
        html.Div(chips, id="cmp-verdicts", className="verdicts"),
        dcc.Graph(id="cmp-figure", config={"displaylogo": False}, figure=figure),
        dcc.Interval(id="cmp-tick", interval=REFRESH_MS),
    ])


def register(app: dash.Dash) -> None:
    """The page and its callbacks on `app`."""
    dash.register_page(__name__, path="/compare", name="Compare", title="forksight · compare",
                       layout=layout)
    searchable(app, "cmp-runs")

    @app.callback(Output("cmp-figure", "figure"), Output("cmp-verdicts", "children"),
                  Input("cmp-runs", "value"), Input("cmp-smoothing", "value"),
                  Input("cmp-tick", "n_intervals"), Input("cmp-panels", "value"),
                  Input("cmp-logy", "value"), Input("cmp-xaxis", "value"),
                  Input("cmp-view", "value"), Input("cmp-group", "value"),
                  Input("cmp-band", "value"),
                  prevent_initial_call=True)       # the layout holds the first draw
    def draw(run_ids, smoothing, _n, panels, log_y, x_axis, view, group_by, band):
        return overlay(data.reader(), run_ids, smoothing, panels, log_y, x_axis, view,
                       group_by, band)

    @app.callback(Output("cmp-group-wrap", "style"), Output("cmp-band-wrap", "style"),
                  Input("cmp-view", "value"), prevent_initial_call=True)
    def grouping_controls(view):
        style = None if view == "grouped" else {"display": "none"}
        return style, style

    @app.callback(Output("cmp-group", "options"), Input("cmp-runs", "value"),
                  prevent_initial_call=True)
    def groupings(run_ids):
        return group_options(data.reader(), [r for r in (run_ids or []) if isinstance(r, str)])

    @app.callback(Output("cmp-panels", "options"), Input("cmp-runs", "value"),
                  prevent_initial_call=True)       # the layout holds the first options
    def metrics(run_ids):
        return metric_options(data.reader(), [r for r in (run_ids or []) if isinstance(r, str)])
