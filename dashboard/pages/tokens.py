"""Tokens page: one step's completion token by token (colour = entropy, Rényi-2, JS or
log-prob; fork tokens outlined; trained-on tokens underlined; hover = every number), the
group's other rollouts beside it, and a position × step heatmap for that prompt."""
from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, State, dcc, html

from forksight.dashboard import data
from forksight.dashboard.data import LRU
from forksight.dashboard.figures import downsample_indices
from forksight.dashboard.token_figures import position_step_heatmap
from forksight.dashboard.tokens_view import (METRICS, legend, metric_scale, pick_sample,
                                             sample_label, token_spans)

HISTORY_STEPS = 24      # columns of the position × step heatmap (one read per step, cached)


def _step_rows(reader, run_id: str, step: int, cache: LRU | None = None
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    def read():
        return reader.read_tokens(run_id, step), reader.read_samples(run_id, step=step)
    # a past step's rows never change: the app caches them so the heatmap and slider stay fast
    return read() if cache is None else cache.get_or_compute((run_id, step), read)


def sample_options(tokens: pd.DataFrame, samples: pd.DataFrame) -> list[dict]:
    """Picker entries: every sample with token rows, then lowest/highest reward per group."""
    with_tokens = sorted(set(tokens["sample_id"].astype(int))) if not tokens.empty else []
    by_id = {int(r["sample_id"]): r for r in samples.to_dict("records")}
    options = [{"label": sample_label(by_id[s]) if s in by_id else f"#{s}", "value": str(s)}
               for s in with_tokens]
    if not samples.empty and samples["group_id"].notna().any():
        for g in sorted(samples["group_id"].dropna().astype(int).unique()):
            options += [{"label": f"group {g}: lowest reward", "value": f"low:{g}"},
                        {"label": f"group {g}: highest reward", "value": f"high:{g}"}]
    return options


def _rollout(row: dict, tokens: pd.DataFrame, metric: str, scale: float, main: bool) -> html.Div:
    mine = tokens[tokens["sample_id"] == row["sample_id"]] if not tokens.empty else tokens
    body = token_spans(mine, metric, scale) if not mine.empty else \
        [html.Span(row.get("completion") or "", className="plain")]
    return html.Div(className="rollout main" if main else "rollout", children=[
        html.Div(sample_label(row), className="rollout-head"),
        html.Div(body, className="tokens" if not mine.empty else "tokens plain-text",
                 **({"id": "tok-main"} if main else {})),
    ])


def render_step(reader, run_id: str, step: int, choice: str | None, metric: str,
                cache: LRU | None = None) -> dict:
    """Everything the page shows for one step and pick: options, prompt, the chosen
    completion as token spans, and the group's other rollouts."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    tokens, samples = _step_rows(reader, run_id, int(step), cache)
    options = sample_options(tokens, samples)
    values = [o["value"] for o in options]
    if choice not in values:
        choice = values[0] if values else None
    sid = pick_sample(samples, choice) if samples is not None and not samples.empty else None
    if sid is None and choice and choice.isdigit():
        sid = int(choice)
    if sid is None:
        return {"options": options, "choice": choice, "prompt": "", "main": [],
                "group": [], "sample_id": None}
    scale = metric_scale(tokens, metric)
    row = next((r for r in samples.to_dict("records") if int(r["sample_id"]) == sid),
               {"sample_id": sid, "group_id": None, "reward": None, "correct": None,
                "prompt": None, "completion": None})
    group = []
    if row.get("group_id") is not None and not pd.isna(row.get("group_id")):
        mates = samples[(samples["group_id"] == row["group_id"]) & (samples["sample_id"] != sid)]
        group = [_rollout(r, tokens, metric, scale, False) for r in mates.to_dict("records")]
    return {"options": options, "choice": choice, "prompt": row.get("prompt") or "",
            "main": [_rollout(row, tokens, metric, scale, True)], "group": group,
            "sample_id": sid}


MIN_PROMPT_STEPS = 3    # fewer steps with this prompt: show every sampled rollout instead


def prompt_history(reader, run_id: str, prompt: str | None, metric: str,
                   max_steps: int = HISTORY_STEPS, cache: LRU | None = None
                   ) -> tuple[pd.DataFrame, bool]:
    """Token rows (step, pos, metric) of this prompt's rollouts over up to max_steps token
    steps, and whether they are this prompt's (False: every sampled rollout, because the
    prompt is unknown or recurs at fewer than MIN_PROMPT_STEPS steps)."""
    steps = reader.token_steps(run_id)
    steps = [steps[i] for i in downsample_indices(len(steps), max_steps)]
    parts, matched = [], 0
    for step in steps:
        tokens, samples = _step_rows(reader, run_id, int(step), cache)
        if tokens.empty:
            continue
        if prompt and not samples.empty:
            ids = samples.loc[samples["prompt"] == prompt, "sample_id"]
            tokens = tokens[tokens["sample_id"].isin(ids)]
            matched += int(not tokens.empty)
        parts.append(tokens[["step", "pos", metric]])
    if prompt and matched < MIN_PROMPT_STEPS:
        return prompt_history(reader, run_id, None, metric, max_steps, cache)
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"step": [], "pos": [], metric: []})
    return rows, bool(prompt)


def _runs(reader) -> list[dict]:
    return [{"label": f"{r['name']} · {r.get('strategy') or '–'}", "value": r["run_id"]}
            for r in reader.list_runs().to_dict("records")]


def layout(run: str | None = None, step: str | None = None, sample: str | None = None,
           **_query) -> html.Div:
    options = _runs(data.reader())
    if run is None and options:
        run = options[0]["value"]
    return html.Div([
        html.H2("Tokens"),
        html.Div(className="controls", children=[
            html.Div([html.Label("run"), dcc.Dropdown(id="tok-run", options=options, value=run,
                                                      clearable=False)], className="control"),
            html.Div([html.Label(id="tok-step-label", children="step"),
                      dcc.Slider(id="tok-step", min=0, max=0, step=1, value=0, marks=None,
                                 tooltip={"placement": "bottom"})],
                     className="control control-wide"),
            html.Div([html.Label("sample"), dcc.Dropdown(id="tok-sample", clearable=False,
                                                         value=sample)], className="control"),
            html.Div([html.Label("colour by"),
                      dcc.RadioItems(id="tok-metric", value="entropy", inline=True,
                                     options=[{"label": f" {v}", "value": k}
                                              for k, v in METRICS.items()])],
                     className="control"),
        ]),
        dcc.Store(id="tok-steps"), dcc.Store(id="tok-want-step", data=step),
        html.Div(id="tok-legend"),
        html.Div(className="prompt", children=[html.Strong("prompt "),
                                               html.Span(id="tok-prompt")]),
        html.Div(className="token-columns", children=[
            html.Div(id="tok-main-wrap", className="token-main"),
            html.Div([html.H4("the group's other rollouts"), html.Div(id="tok-group")],
                     className="token-group"),
        ]),
        dcc.Graph(id="tok-history", config={"displaylogo": False}),
    ])


def register(app: dash.Dash) -> None:
    """The page and its callbacks on `app`."""
    dash.register_page(__name__, path="/tokens", name="Tokens", title="forksight · tokens",
                       layout=layout)

    @app.callback(Output("tok-steps", "data"), Output("tok-step", "max"),
                  Output("tok-step", "value"), Output("tok-step", "marks"),
                  Input("tok-run", "value"), State("tok-want-step", "data"))
    def load_steps(run_id, wanted):
        steps = data.reader().token_steps(run_id) if run_id else []
        if not steps:
            return [], 0, 0, None
        index = len(steps) - 1
        if wanted is not None and str(wanted).isdigit() and int(wanted) in steps:
            index = steps.index(int(wanted))
        ticks = downsample_indices(len(steps), 8)
        return steps, len(steps) - 1, index, {int(i): str(steps[i]) for i in ticks}

    @app.callback(Output("tok-sample", "options"), Output("tok-sample", "value"),
                  Output("tok-prompt", "children"), Output("tok-main-wrap", "children"),
                  Output("tok-group", "children"), Output("tok-legend", "children"),
                  Output("tok-step-label", "children"),
                  Input("tok-step", "value"), Input("tok-sample", "value"),
                  Input("tok-metric", "value"), State("tok-steps", "data"),
                  State("tok-run", "value"))
    def show(index, choice, metric, steps, run_id):
        if not steps or run_id is None:
            return [], None, "", html.P("no token rows logged for this run yet"), [], [], "step"
        step = steps[min(int(index or 0), len(steps) - 1)]
        app_state = data.current()
        out = render_step(app_state.reader, run_id, step, choice, metric, app_state.token_rows)
        return (out["options"], out["choice"], out["prompt"], out["main"], out["group"],
                legend(metric), f"step {step}")

    @app.callback(Output("tok-history", "figure"), Input("tok-prompt", "children"),
                  Input("tok-metric", "value"), State("tok-run", "value"))
    def history(prompt, metric, run_id):
        if not run_id:
            return position_step_heatmap(None)
        app_state = data.current()
        rows, mine = prompt_history(app_state.reader, run_id, prompt or None, metric,
                                    cache=app_state.token_rows)
        title = f"{metric} by position across training: this prompt's rollouts" if mine \
            else f"{metric} by position across training: every sampled rollout"
        return position_step_heatmap(rows, metric, title=title)



