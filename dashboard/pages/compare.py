"""Compare page: several runs overlaid (e.g. `all` vs `fork` vs `ict`), colour by strategy."""
from __future__ import annotations

import dash
from dash import Input, Output, dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard import data
from forksight.dashboard.compare_figures import COMPARE_PANELS, compare_figure
from forksight.dashboard.figures import pass_keys

REFRESH_MS = 5000
MAX_RUNS = 12


def compare_runs(reader: Reader, run_ids: list[str], smoothing: float = 0.0,
                 max_points: int = 1000) -> dict:
    """The overlay figure for these runs (unknown ids are skipped)."""
    runs = reader.list_runs().set_index("run_id")
    picked = []
    for rid in run_ids[:MAX_RUNS]:
        if rid not in runs.index:
            continue
        keys = reader.scalar_keys(rid)
        wanted = [k for k in COMPARE_PANELS if k != "gap"] + pass_keys(keys)
        picked.append({"run_id": rid, "label": runs.at[rid, "name"],
                       "strategy": runs.at[rid, "strategy"],
                       "scalars": reader.read_scalars(rid, keys=wanted, downsample=max_points)})
    return compare_figure(picked, smoothing=smoothing)


def layout(runs: str | None = None, **_query) -> html.Div:
    table = data.reader().list_runs()
    options = [{"label": f"{r['name']} · {r.get('strategy') or '–'}", "value": r["run_id"]}
               for r in table.to_dict("records")]
    chosen = [r for r in (runs or "").split(",") if r] or [o["value"] for o in options[:3]]
    return html.Div([
        html.H2("Compare runs"),
        html.Div(className="controls", children=[
            html.Div([html.Label("runs"), dcc.Dropdown(id="cmp-runs", options=options,
                                                       value=chosen, multi=True)],
                     className="control control-wide"),
            html.Div([html.Label("smoothing (EMA)"),
                      dcc.Slider(id="cmp-smoothing", min=0, max=0.99, step=0.01, value=0.6,
                                 marks={0: "0", 0.6: "0.6", 0.99: ".99"})],
                     className="control control-wide"),
        ]),
        dcc.Graph(id="cmp-figure", config={"displaylogo": False}),
        dcc.Interval(id="cmp-tick", interval=REFRESH_MS),
    ])


def register(app: dash.Dash) -> None:
    """The page and its callback on `app`."""
    dash.register_page(__name__, path="/compare", name="Compare", title="forksight · compare",
                       layout=layout)

    @app.callback(Output("cmp-figure", "figure"), Input("cmp-runs", "value"),
                  Input("cmp-smoothing", "value"), Input("cmp-tick", "n_intervals"))
    def draw(run_ids, smoothing, _n):
        return compare_runs(data.reader(), list(run_ids or []), float(smoothing or 0))
