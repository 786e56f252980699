"""Reference page: how training reshaped the forks of a fixed text (docs/algorithms.md §15). One completion of
the run's reference set at its base and at a chosen re-scored step, one above the other on the same
colour scale (H, or ΔH from the base), the set's |ΔH| by base-entropy decile and its base-vs-now
scatter, and its words — sortable, each linked to the completions it occurs in."""
from __future__ import annotations

import dash
from dash import Input, Output, State, dash_table, dcc, html, no_update

from forksight.dashboard import data
from forksight.dashboard.figures import empty_figure
from forksight.dashboard.reference_view import WORD_COLUMNS, holder_links, training_words, view
from forksight.dashboard.run_options import run_options, searchable
from forksight.dashboard.run_view import vocab_size
from forksight.dashboard.token_figures import REFERENCE_METRICS
from forksight.dashboard.tokens_view import legend

_CONFIG = {"displaylogo": False, "responsive": True}
HEADERS = {"token": "token", "count": "count", "fork_share_base": "fork share (base)",
           "fork_share_now": "fork share (now)", "entropy_base": "H base", "entropy_now": "H now", "dh": "ΔH"}


def _int(value) -> int | None:
    return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else \
        value if isinstance(value, int) else None


def layout(run: str | None = None, step: str | None = None, sample: str | None = None, metric: str | None = None,
           word: str | None = None, **_query) -> html.Div:
    options = run_options(data.reader(), [run] if run else [])
    if run is None and options:
        run = options[0]["value"]
    return html.Div([
        html.H2("Reference set"),
        html.P("The same completions, kept at the run's start, scored teacher-forced by the policy at each "
               "re-scored step: a change here is the policy's, not a change of what was sampled.",
               className="page-note"),
        html.Div(className="controls", children=[
            html.Div([html.Label("run"), dcc.Dropdown(id="ref-run", options=options, value=run, clearable=False)],
                     className="control"),
            html.Div([html.Label("step"), dcc.Dropdown(id="ref-step", clearable=False, value=_int(step))],
                     className="control"),
            html.Div([html.Label("completion"), dcc.Dropdown(id="ref-sample", clearable=False, value=_int(sample))],
                     className="control"),
            html.Div([html.Label("colour the step by"),
                      dcc.RadioItems(id="ref-metric", inline=True,
                                     value=metric if metric in REFERENCE_METRICS else "entropy",
                                     options=[{"label": f" {v}", "value": k} for k, v in REFERENCE_METRICS.items()])],
                     className="control"),
        ]),
        dcc.Store(id="ref-word", data=word),
        # the URL's step and sample: a dropdown drops a value its (still empty) options lack when it
        # mounts, so the wish is kept here until the run's options exist
        dcc.Store(id="ref-want", data={"step": _int(step), "sample": _int(sample)}),
        html.Div(id="ref-note"),
        html.Div(id="ref-legend"),
        html.Div(className="prompt", children=[html.Strong("prompt "), html.Span(id="ref-prompt")]),
        html.Div(className="rollout main", children=[html.Div(id="ref-top-head", className="rollout-head"),
                                                     html.Div(id="ref-top", className="tokens")]),
        html.Div(className="rollout main", children=[html.Div(id="ref-bottom-head", className="rollout-head"),
                                                     html.Div(id="ref-bottom", className="tokens")]),
        html.Div(className="mismatch-row", children=[
            html.Div(dcc.Graph(id="ref-deciles", config=_CONFIG, figure=empty_figure("", 40))),
            html.Div(dcc.Graph(id="ref-scatter", config=_CONFIG, figure=empty_figure("", 40)))]),
        html.Div(className="controls", children=[html.Div([
            html.Label("words of"),
            dcc.RadioItems(id="ref-words-of", inline=True, value="reference",
                           options=[{"label": " the reference set (click a word: its completions)", "value": "reference"},
                                    {"label": " the training tokens, the first steps against those up to this step",
                                     "value": "training"}])], className="control")]),
        html.P(id="ref-words-caption", className="page-note"),
        html.Div(id="ref-holders", className="word-holders"),
        dash_table.DataTable(id="ref-words", columns=[{"name": HEADERS[c], "id": c} for c in WORD_COLUMNS],
                             data=[], sort_action="native", page_size=25, style_table={"overflowX": "auto"},
                             style_cell={"fontFamily": "monospace", "fontSize": 13, "whiteSpace": "pre"}),
    ])


def register(app: dash.Dash) -> None:
    """The page and its callbacks on `app`."""
    dash.register_page(__name__, path="/reference", name="Reference", title="forksight · reference", layout=layout)
    searchable(app, "ref-run")

    @app.callback(Output("ref-word", "data"), Input("ref-words", "active_cell"), State("ref-words", "derived_viewport_data"),
                  prevent_initial_call=True)
    def pick_word(cell, rows):
        if not cell or not rows or cell.get("row") is None or cell["row"] >= len(rows):
            return no_update
        return rows[cell["row"]]["token"]

    @app.callback(Output("ref-step", "options"), Output("ref-step", "value"), Output("ref-sample", "options"),
                  Output("ref-sample", "value"), Output("ref-prompt", "children"), Output("ref-top-head", "children"),
                  Output("ref-top", "children"), Output("ref-bottom-head", "children"), Output("ref-bottom", "children"),
                  Output("ref-legend", "children"), Output("ref-deciles", "figure"), Output("ref-scatter", "figure"),
                  Output("ref-words", "data"), Output("ref-holders", "children"), Output("ref-note", "children"),
                  Output("ref-words-caption", "children"),
                  Input("ref-run", "value"), Input("ref-step", "value"), Input("ref-sample", "value"),
                  Input("ref-metric", "value"), Input("ref-word", "data"), Input("ref-words-of", "value"),
                  State("ref-want", "data"))
    def show(run_id, step, sample, metric, word, words_of, want):
        want = want if isinstance(want, dict) else {}
        step = want.get("step") if step is None else step
        sample = want.get("sample") if sample is None else sample
        reader = data.reader()
        if not isinstance(run_id, str) or not reader.has_run(run_id):
            return ([], None, [], None, "", "", [], "", [], [], empty_figure("", 40), empty_figure("", 40), [], [],
                    html.P("pick a run above", className="notice"), "")
        out = view(reader, run_id, _int(step), _int(sample), metric if metric in REFERENCE_METRICS else "entropy",
                   word if isinstance(word, str) else None, vocab_size(reader.run(run_id)))
        if not out["steps"]:
            return ([], None, [], None, "", "", [], "", [], [], empty_figure("", 40), empty_figure("", 40), [], [],
                    html.P(out["note"], className="notice"), "")
        steps = [{"label": f"step {s}" + (" (base)" if s == out["base"] else ""), "value": s} for s in out["steps"]]
        samples = [{"label": f"#{s}", "value": s} for s in out["samples"]]
        href = dash.get_relative_path
        words, caption = (out["words"], "the reference set: 'base' at the base step, 'now' at this step")
        if words_of == "training":
            words, caption = training_words(reader, run_id, out["step"])
        return (steps, out["step"], samples, out["sample"], out["prompt"], f"at the base (step {out['base']})",
                out["top"], f"at step {out['step']}" + (" — ΔH from the base" if metric == "dh" else ""),
                out["bottom"], legend(out["scale"], "fork under the run's rule at that step"), out["deciles"],
                out["scatter"], words, holder_links(out["holders"], run_id, out["step"], word, href)
                if isinstance(word, str) and words_of != "training" else [], None, caption)
