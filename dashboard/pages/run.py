"""Run page, live: entropy (band, Rényi-2, JS, reference lines, alerts, forecast), the entropy
distribution heatmap, the training–inference mismatch (when the run logs it: KL, out-of-band
fractions, fork split, the ratio histogram), reward/pass@k/gap, held-out pass@k against the base
model (when the run logs eval/pass@k), value probes, the trust region (when a batch trains more than once:
the ratio clip against DPPO's TV by entropy quartile), training signals and any other scalar. New steps
arrive as Patches every 750 ms (live.TICK_MS); the whole page redraws only when a control changes."""
from __future__ import annotations

from urllib.parse import urlencode

import dash
from dash import Input, Output, State, dcc, html, no_update

from forksight.base.interfaces import Reader
from forksight.dashboard import data
from forksight.dashboard.alerts_view import verdict_chip
from forksight.dashboard.figures import empty_figure, with_focus
from forksight.dashboard.live import TICK_MS
from forksight.dashboard.run_options import run_options, searchable
from forksight.dashboard.run_view import Controls, draw_run, heatmap_kept, status_line, tick_run
from forksight.dashboard.wire import wire_figure

GRAPHS = ("entropy", "heatmap", "mismatch", "ratios", "passk", "signals", "custom", "heldout", "probes",
          "trust", "pattern")
WRAPPED = ("mismatch", "heldout", "probes", "trust", "pattern")    # panels shown only for runs that log them
HIDDEN = {"display": "none"}
_CONFIG = {"displaylogo": False, "responsive": True}
START = Controls()      # the controls as a page opens (the layout's first draw uses them)


def missing_note(reader: Reader, run: str | None, options: list[dict]) -> str | None:
    """What the page says instead of charts: no runs at all, or no run by the asked id."""
    if not options:
        return "no runs yet: start `forksight train` (or `make demo`) and they appear here"
    if run is not None and not reader.has_run(run):
        return f"no run named {run!r} in this database: pick one above or see the Runs page"
    return None


def _step(step) -> int | None:
    return int(step) if isinstance(step, str) and step.isdigit() else None


def layout(run: str | None = None, step: str | None = None, **_query) -> html.Div:
    reader = data.reader()
    options = run_options(reader, [run] if run else [], status=True)
    missing = missing_note(reader, run, options)
    if run is None and options:
        run = options[0]["value"]          # newest run
    focus = _step(step)
    # the first draw goes in the layout itself: the charts show with the page, no callback first
    first = None if missing or not run else drawn(run, START, focus)
    figure = (lambda g: first["figures"][g]) if first else (lambda g: empty_figure("", height=40))
    return html.Div([
        html.Div(className="run-head", children=[
            dcc.Dropdown(id="run-select", options=options, value=None if missing else run,
                         clearable=False, placeholder="pick a run", className="run-select"),
            html.Span(first["health"] if first else None, id="run-health"),
            html.Span(first["status"] if first else None, id="run-status", className="run-status"),
            html.Button("Pause", id="run-pause", className="btn", n_clicks=0),
        ]),
        html.P(missing, id="run-missing", className="notice") if missing else None,
        dcc.Store(id="run-focus", data=focus),
        html.Div(first["banner"] if first else None, id="run-banner", className="banner"),
        html.Div(id="run-charts", style={"display": "none"} if not first else None, children=[
            html.Div(className="controls", children=[
                html.Div([html.Label("smoothing (EMA)"),
                          dcc.Slider(id="run-smoothing", min=0, max=0.99, step=0.01, value=START.smoothing,
                                     marks={0: "0", 0.6: "0.6", 0.9: "0.9", 0.99: ".99"},
                                     tooltip={"placement": "bottom"})],
                         className="control control-wide"),
                html.Div([html.Label("x axis"),
                          dcc.RadioItems(id="run-xaxis", inline=True, value=START.x_axis,
                                         options=[{"label": " step", "value": "step"},
                                                  {"label": " wall time", "value": "wall"}])],
                         className="control"),
                html.Div([html.Label("y scale"),
                          dcc.Checklist(id="run-logy", options=[{"label": " log y", "value": "log"}],
                                        value=["log"] if START.log_y else [], inline=True)],
                         className="control"),
                html.Div([html.Label("points per series"),
                          dcc.Dropdown(id="run-points", clearable=False, value=START.max_points,
                                       options=[{"label": str(n), "value": n}
                                                for n in (500, 1000, 5000, 20000)]
                                       + [{"label": "all", "value": "all"}])],
                         className="control"),
            ]),
            *[dcc.Graph(id=f"run-{g}", config=_CONFIG, figure=figure(g)) for g in GRAPHS[:2]],
            # shown only for a run that logs the sampler's log p (mismatch/* scalars)
            html.Div(id="run-mismatch-wrap", className="mismatch-row",
                     style=None if first and first["mismatch"] else HIDDEN,
                     # each graph in a block of its own: a grid item's 100% height made the
                     # responsive graphs grow past their figures' height
                     children=[html.Div(dcc.Graph(id=f"run-{g}", config=_CONFIG, figure=figure(g)))
                               for g in ("mismatch", "ratios")]),
            dcc.Graph(id="run-passk", config=_CONFIG, figure=figure("passk")),
            # shown only for a run that logs held-out eval/pass@k
            html.Div(dcc.Graph(id="run-heldout", config=_CONFIG, figure=figure("heldout")),
                     id="run-heldout-wrap",
                     style=None if first and first["heldout"] else HIDDEN),
            # shown only for a run that logs value probes (probe/* scalars)
            html.Div(dcc.Graph(id="run-probes", config=_CONFIG, figure=figure("probes")),
                     id="run-probes-wrap", style=None if first and first["probes"] else HIDDEN),
            # shown only for a run that logs trust/* (a batch trained more than once, or DPPO's region)
            html.Div(dcc.Graph(id="run-trust", config=_CONFIG, figure=figure("trust")),
                     id="run-trust-wrap", style=None if first and first["trust"] else HIDDEN),
            # shown only for a run that keeps a reference set (ref/*): its base-vs-step view links below
            html.Div([dcc.Graph(id="run-pattern", config=_CONFIG, figure=figure("pattern")),
                      dcc.Link("the reference set token by token, base against any step →", id="run-pattern-link",
                               href=dash.get_relative_path("/reference?" + urlencode({"run": run})) if run else "#",
                               className="panel-link")],
                     id="run-pattern-wrap", style=None if first and first["pattern"] else HIDDEN),
            dcc.Graph(id="run-signals", config=_CONFIG, figure=figure("signals")),
            html.Div(className="controls", children=[
                html.Label("other scalars by name"),
                dcc.Dropdown(id="run-custom-keys", multi=True, value=[],
                             options=first["other_keys"] if first else [],
                             placeholder="e.g. lr, tokens/count, groups/zero_var_frac",
                             className="custom-keys")]),
            dcc.Graph(id="run-custom", config=_CONFIG, figure=figure("custom")),
        ]),
        dcc.Store(id="run-state", data=first["state"] if first else None),
        dcc.Interval(id="run-tick", interval=TICK_MS),
    ])


def drawn(run_id: str, controls: Controls, focus: int | None) -> dict:
    """Everything the page shows for a run drawn in full with these controls (the layout's first
    draw and the draw callback's): figures, live state, banner, status line, chip, other keys."""
    app_state = data.current()
    out = draw_run(app_state.reader, run_id, controls, app_state.run_frames,
                   dash.get_relative_path("/"), focus=focus)
    return {"figures": {g: shown(g, out["figures"][g], focus, controls.x_axis) for g in GRAPHS},
            "state": out["state"], "banner": out["banner"], "mismatch": out["mismatch"],
            "heldout": out["heldout"], "probes": out["probes"], "trust": out["trust"], "pattern": out["pattern"],
            "status": status_line(out["run"], out["state"]), "other_keys": out["other_keys"],
            "health": verdict_chip(out["verdict"], id="run-verdict")}


def shown(graph: str, figure: dict, focus: int | None, x_axis: str) -> dict:
    """A figure as it travels: the focus step marked on every chart over steps (not on the
    ratio histogram, whose x is a ratio)."""
    return wire_figure(figure if graph == "ratios" else with_focus(figure, focus, x_axis))


def wraps(out: dict) -> list:
    """Each optional panel's wrapper style: shown where the run logs its scalars."""
    return [None if out[w] else HIDDEN for w in WRAPPED]


def register(app: dash.Dash) -> None:
    """The page and its callbacks on `app`."""
    dash.register_page(__name__, path="/run", name="Run", title="forksight · run", layout=layout)
    searchable(app, "run-select", status=True)
    graphs = [Output(f"run-{g}", "figure") for g in GRAPHS]
    controls = [Input("run-smoothing", "value"), Input("run-xaxis", "value"),
                Input("run-logy", "value"), Input("run-points", "value"),
                Input("run-custom-keys", "value")]

    # the layout holds the first draw: this runs when a control or the run changes
    @app.callback(*graphs, Output("run-state", "data"), Output("run-banner", "children"),
                  Output("run-status", "children"), Output("run-custom-keys", "options"),
                  Output("run-health", "children"), Output("run-charts", "style"),
                  *[Output(f"run-{w}-wrap", "style") for w in WRAPPED],
                  Input("run-select", "value"), *controls, State("run-focus", "data"),
                  State("run-state", "data"), prevent_initial_call=True)
    def draw(run_id, smoothing, x_axis, log_y, points, custom, focus, previous):
        if not run_id:             # nothing picked: the notice above says why, no empty axes
            empty = empty_figure("", height=40)
            return (*[empty] * len(GRAPHS), None, [], "", [], None, HIDDEN, *[HIDDEN] * len(WRAPPED))
        out = drawn(run_id, Controls.from_inputs(smoothing, x_axis, log_y, points, custom), focus)
        figures, state = [out["figures"][g] for g in GRAPHS], out["state"]
        kept = heatmap_kept(previous, state)
        if kept is not None:       # e.g. the smoothing slider moved: the heatmap stays as drawn
            figures[GRAPHS.index("heatmap")], state = no_update, kept
        return (*figures, state, out["banner"], out["status"], out["other_keys"], out["health"],
                None, *wraps(out))

    @app.callback(*[Output(f"run-{g}", "figure", allow_duplicate=True) for g in GRAPHS],
                  Output("run-state", "data", allow_duplicate=True),
                  Output("run-banner", "children", allow_duplicate=True),
                  Output("run-status", "children", allow_duplicate=True),
                  Output("run-health", "children", allow_duplicate=True),
                  *[Output(f"run-{w}-wrap", "style", allow_duplicate=True) for w in WRAPPED],
                  Input("run-tick", "n_intervals"), State("run-state", "data"),
                  *[State(c.component_id, c.component_property) for c in controls],
                  State("run-focus", "data"), prevent_initial_call=True)
    def tick(_n, state, smoothing, x_axis, log_y, points, custom, focus):
        if not state:
            return (no_update,) * (len(GRAPHS) + 4 + len(WRAPPED))
        app_state = data.current()
        reader = app_state.reader
        ctl = Controls.from_inputs(smoothing, x_axis, log_y, points, custom)
        if state.get("controls") != ctl.key():  # a redraw for new controls is in flight
            return (no_update,) * (len(GRAPHS) + 4 + len(WRAPPED))
        prefix = dash.get_relative_path("/")
        out = tick_run(reader, state, ctl, prefix, focus=focus)
        if out["redraw"]:                       # a new forecast or the first step: redraw once
            full = draw_run(reader, state["run_id"], ctl, app_state.run_frames, prefix, focus=focus)
            return (*[shown(g, full["figures"][g], focus, x_axis) for g in GRAPHS],
                    full["state"], full["banner"], status_line(full["run"], full["state"]),
                    verdict_chip(full["verdict"], id="run-verdict"), *wraps(full))
        chip = no_update if out["verdict"] is None else verdict_chip(out["verdict"],
                                                                     id="run-verdict")
        if all(p is None for p in out["figures"].values()) and out["banner"] is None:
            new_state = out["state"] if out["state"] != state else no_update
            return (no_update,) * len(GRAPHS) + (new_state, no_update, no_update, chip) \
                + (no_update,) * len(WRAPPED)
        figures = [out["figures"].get(g) for g in GRAPHS]
        return (*[no_update if f is None else shown(g, f, focus, x_axis) if isinstance(f, dict)
                  else f for g, f in zip(GRAPHS, figures)], out["state"],
                out["banner"] if out["banner"] is not None else no_update,
                status_line(reader.run(state["run_id"]), out["state"]), chip, *(no_update,) * len(WRAPPED))

    @app.callback(Output("run-pattern-link", "href"), Input("run-select", "value"), prevent_initial_call=True)
    def pattern_link(run_id):
        return dash.get_relative_path("/reference?" + urlencode({"run": run_id})) if run_id else "#"

    @app.callback(Output("run-tick", "disabled"), Output("run-pause", "children"),
                  Input("run-pause", "n_clicks"), prevent_initial_call=True)
    def pause(clicks):
        paused = bool(clicks) and clicks % 2 == 1
        return paused, ("Resume live" if paused else "Pause")
