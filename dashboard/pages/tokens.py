"""Tokens page: one step's completion token by token on the run's fixed colour scale, the
group's other rollouts beside it, and a position × step heatmap for that prompt on the same
scale; the step slider follows new steps while the run trains."""
from __future__ import annotations

import dash
import pandas as pd
from dash import Input, Output, State, ctx, dcc, html, no_update

from forksight.base.limits import MAX_READ_TOKEN_ROWS
from forksight.base.interfaces import Reader
from forksight.dashboard import data
from forksight.dashboard.data import LRU
from forksight.dashboard.figures import downsample_indices
from forksight.dashboard.run_view import vocab_size
from forksight.dashboard.token_figures import (EARLY_STEPS, METRICS, TokenScale,
                                               position_step_heatmap, token_scale)
from forksight.dashboard.tokens_view import legend, pick_sample, sample_label, token_spans

HISTORY_STEPS = 24      # columns of the position × step heatmap (one read per step, cached)
TICK_MS = 1000          # how often an open page looks for new steps (as the run page does)


def _step_rows(reader: Reader, run_id: str, step: int, cache: LRU | None = None,
               newest: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    def read():
        return reader.read_tokens(run_id, step), reader.read_samples(run_id, step=step)
    # a past step's rows never change: the app caches them so the heatmap and slider stay
    # fast; the newest step may still get rows from other ranks, so it is read again
    if cache is None or (newest is not None and step >= newest):
        return read()
    return cache.get_or_compute((run_id, step), read)


def run_scale(reader: Reader, run_id: str, metric: str, steps: list[int],
              cache: LRU | None = None) -> TokenScale:
    """The run's fixed colour scale for `metric`, read from its first EARLY_STEPS token steps
    (`steps`: the run's token steps, ascending)."""
    early = [int(s) for s in steps[:EARLY_STEPS]]
    parts = [_step_rows(reader, run_id, s, cache, newest=steps[-1])[0] for s in early]
    values = pd.concat([p[metric] for p in parts if metric in p]) if parts else []
    return token_scale(values, metric, vocab_size=vocab_size(reader.run(run_id)), steps=early)


def sample_options(tokens: pd.DataFrame, samples: pd.DataFrame) -> list[dict]:
    """Picker entries: every sample with token rows, then lowest/highest reward per group."""
    with_tokens = sorted(set(tokens["sample_id"].astype(int))) if not tokens.empty else []
    by_id = {int(r["sample_id"]): r for r in samples.to_dict("records")}
    options = [{"label": sample_label(by_id[s]) if s in by_id else f"#{s}", "value": str(s)}
               for s in with_tokens]
    if len(tokens) >= MAX_READ_TOKEN_ROWS:     # said, not dropped in silence
        options.append({"label": f"(this step holds over {MAX_READ_TOKEN_ROWS:,} token rows: the page read the "
                                 f"first {MAX_READ_TOKEN_ROWS:,}; GET /api/runs/<id>/tokens pages through all)",
                        "value": "truncated", "disabled": True})
    if not samples.empty and samples["group_id"].notna().any():
        for g in sorted(samples["group_id"].dropna().astype(int).unique()):
            options += [{"label": f"group {g}: lowest reward", "value": f"low:{g}"},
                        {"label": f"group {g}: highest reward", "value": f"high:{g}"}]
    return options


def _rollout(row: dict, tokens: pd.DataFrame, metric: str, scale: TokenScale,
             main: bool) -> html.Div:
    mine = tokens[tokens["sample_id"] == row["sample_id"]] if not tokens.empty else tokens
    body = token_spans(mine, metric, scale) if not mine.empty else \
        [html.Span(row.get("completion") or "", className="plain")]
    return html.Div(className="rollout main" if main else "rollout", children=[
        html.Div(sample_label(row), className="rollout-head"),
        html.Div(body, className="tokens" if not mine.empty else "tokens plain-text",
                 **({"id": "tok-main"} if main else {})),
    ])


def render_step(reader: Reader, run_id: str, step: int, choice: str | None, metric: str,
                cache: LRU | None = None, scale: TokenScale | None = None,
                newest: int | None = None) -> dict:
    """Everything the page shows for one step and pick: options, prompt, the chosen
    completion as token spans on the run's scale, and the group's other rollouts."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if scale is None:
        scale = run_scale(reader, run_id, metric, reader.token_steps(run_id), cache)
    tokens, samples = _step_rows(reader, run_id, int(step), cache, newest)
    options = sample_options(tokens, samples)
    values = [o["value"] for o in options]
    if choice not in values:
        choice = values[0] if values else None
    sid = pick_sample(samples, choice) if samples is not None and not samples.empty else None
    if sid is None and choice and choice.isdigit():
        sid = int(choice)
    if sid is None:
        return {"options": options, "choice": choice, "prompt": "", "main": [],
                "group": [], "sample_id": None, "scale": scale}
    row = next((r for r in samples.to_dict("records") if int(r["sample_id"]) == sid),
               {"sample_id": sid, "group_id": None, "reward": None, "correct": None,
                "prompt": None, "completion": None})
    group = []
    if row.get("group_id") is not None and not pd.isna(row.get("group_id")):
        mates = samples[(samples["group_id"] == row["group_id"]) & (samples["sample_id"] != sid)]
        group = [_rollout(r, tokens, metric, scale, False) for r in mates.to_dict("records")]
    return {"options": options, "choice": choice, "prompt": row.get("prompt") or "",
            "main": [_rollout(row, tokens, metric, scale, True)], "group": group,
            "sample_id": sid, "scale": scale}


MIN_PROMPT_STEPS = 3    # fewer steps with this prompt: show every sampled rollout instead


def prompt_history(reader: Reader, run_id: str, prompt: str | None, metric: str,
                   max_steps: int = HISTORY_STEPS, cache: LRU | None = None,
                   all_steps: list[int] | None = None) -> tuple[pd.DataFrame, bool]:
    """Token rows (step, pos, metric) of this prompt's rollouts over up to max_steps of the
    run's token steps (`all_steps`, else read), and whether they are this prompt's (False: every
    sampled rollout: the prompt is unknown or recurs at fewer than MIN_PROMPT_STEPS steps)."""
    all_steps = reader.token_steps(run_id) if all_steps is None else all_steps
    steps = [all_steps[i] for i in downsample_indices(len(all_steps), max_steps)]
    parts, matched = [], 0
    for step in steps:
        tokens, samples = _step_rows(reader, run_id, int(step), cache, newest=all_steps[-1])
        if tokens.empty:
            continue
        if prompt and not samples.empty:
            ids = samples.loc[samples["prompt"] == prompt, "sample_id"]
            tokens = tokens[tokens["sample_id"].isin(ids)]
            matched += int(not tokens.empty)
        parts.append(tokens[["step", "pos", metric]])
    if prompt and matched < MIN_PROMPT_STEPS:
        return prompt_history(reader, run_id, None, metric, max_steps, cache, all_steps)
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"step": [], "pos": [], metric: []})
    return rows, bool(prompt)


def _runs(reader: Reader) -> list[dict]:
    return [{"label": f"{r['name']} · {r.get('strategy') or '–'}", "value": r["run_id"]}
            for r in reader.list_runs().to_dict("records")]


def _marks(steps: list[int]) -> dict | None:
    return {int(i): str(steps[i]) for i in downsample_indices(len(steps), 8)} if steps else None


def nearest_step(steps: list[int], wanted: int) -> int:
    """The index of the token step closest to `wanted` (an alert's step may have no token
    rows: tokens are sampled every few steps), the earlier one on a tie."""
    return min(range(len(steps)), key=lambda i: (abs(steps[i] - wanted), steps[i]))


def follow_index(old: list[int], new: list[int], index: int | None) -> int | None:
    """Where the slider goes when the run's steps grow from `old` to `new`: to the newest step
    when it was on the newest (or nothing was shown), else stays on the step the user picked."""
    if not new:
        return None
    if not old or index is None or int(index) >= len(old) - 1:
        return len(new) - 1
    picked = old[int(index)]
    return new.index(picked) if picked in new else int(index)


def layout(run: str | None = None, step: str | None = None, sample: str | None = None,
           **_query) -> html.Div:
    run_asked = run
    options = _runs(data.reader())
    unknown = run is not None and run not in {o["value"] for o in options}
    if (run is None or unknown) and options:
        run = None if unknown else options[0]["value"]
    return html.Div([
        html.H2("Tokens"),
        html.P(f"no run named {run_asked!r} in this database: pick one below or see the Runs page"
               if unknown else "no runs yet: start `forksight train` (or `make demo`)",
               className="notice", id="tok-missing") if unknown or not options else None,
        html.Div(className="controls", children=[
            html.Div([html.Label("run"), dcc.Dropdown(id="tok-run", options=options, value=run,
                                                      clearable=False)], className="control"),
            html.Div([html.Label(id="tok-step-label", children="step"),
                      # the value is an index into the run's token steps: no number box or
                      # tooltip showing it; the marks and the label name the step
                      dcc.Slider(id="tok-step", min=0, max=0, step=1, value=0, marks=None,
                                 allow_direct_input=False)],
                     className="control control-wide"),
            html.Div([html.Label("sample"), dcc.Dropdown(id="tok-sample", clearable=False,
                                                         value=sample)], className="control"),
            html.Div([html.Label("colour by"),
                      dcc.RadioItems(id="tok-metric", value="entropy", inline=True,
                                     options=[{"label": f" {v}", "value": k}
                                              for k, v in METRICS.items()])],
                     className="control"),
        ]),
        # the URL's step and sample: the dropdown drops a value its (still empty) options
        # lack when it mounts, so the wish is kept here until the step's options exist
        dcc.Store(id="tok-steps"), dcc.Store(id="tok-want-step", data=step),
        dcc.Store(id="tok-want-sample", data=sample), dcc.Store(id="tok-shown"),
        html.Div(id="tok-legend"),
        html.Div(className="prompt", children=[html.Strong("prompt "),
                                               html.Span(id="tok-prompt")]),
        html.Div(className="token-columns", children=[
            html.Div(id="tok-main-wrap", className="token-main"),
            html.Div([html.H4("the group's other rollouts"), html.Div(id="tok-group")],
                     className="token-group"),
        ]),
        dcc.Graph(id="tok-history", config={"displaylogo": False}),
        dcc.Interval(id="tok-tick", interval=TICK_MS),
    ])


def register(app: dash.Dash) -> None:
    """The page and its callbacks on `app`."""
    dash.register_page(__name__, path="/tokens", name="Tokens", title="forksight · tokens",
                       layout=layout)
    slider = (Output("tok-steps", "data"), Output("tok-step", "max"),
              Output("tok-step", "value"), Output("tok-step", "marks"))

    @app.callback(*slider, Input("tok-run", "value"), State("tok-want-step", "data"))
    def load_steps(run_id, wanted):
        steps = data.reader().token_steps(run_id) if run_id else []
        if not steps:
            return [], 0, 0, None
        index = len(steps) - 1
        if wanted is not None and str(wanted).isdigit():
            index = nearest_step(steps, int(wanted))
        return steps, len(steps) - 1, index, _marks(steps)

    @app.callback(*[Output(o.component_id, o.component_property, allow_duplicate=True)
                    for o in slider],
                  Input("tok-tick", "n_intervals"), State("tok-run", "value"),
                  State("tok-steps", "data"), State("tok-step", "value"),
                  prevent_initial_call=True)
    def follow(_n, run_id, steps, index):
        if not run_id:
            return (no_update,) * 4
        # only steps past the newest known: a full list costs 75 ms a tick on 10M token rows
        old = steps or []
        added = data.reader().token_steps(run_id, since_step=old[-1] + 1 if old else None)
        if not added:
            return (no_update,) * 4
        new = old + added
        moved = follow_index(old, new, index)
        return new, len(new) - 1, no_update if moved == index else moved, _marks(new)

    @app.callback(Output("tok-sample", "options"), Output("tok-sample", "value"),
                  Output("tok-prompt", "children"), Output("tok-main-wrap", "children"),
                  Output("tok-group", "children"), Output("tok-legend", "children"),
                  Output("tok-step-label", "children"), Output("tok-shown", "data"),
                  Input("tok-step", "value"), Input("tok-sample", "value"),
                  Input("tok-metric", "value"), Input("tok-steps", "data"),
                  State("tok-run", "value"), State("tok-shown", "data"),
                  State("tok-want-sample", "data"))
    def show(index, choice, metric, steps, run_id, shown, wanted):
        if not steps or run_id is None:
            note = "pick a run above" if run_id is None else \
                "waiting for the first step with token rows (none logged for this run yet)"
            return ([], None, "", html.P(note, className="empty-note"), [], [],
                    "step", None)
        step = steps[min(int(index or 0), len(steps) - 1)]
        if set(ctx.triggered_prop_ids) == {"tok-steps.data"} and shown == [run_id, step]:
            return (no_update,) * 8     # new steps arrived, the shown one is unchanged
        app_state = data.current()
        scale = _scale(app_state, run_id, metric, steps)
        out = render_step(app_state.reader, run_id, step, choice or wanted, metric,
                          app_state.token_rows, scale, newest=steps[-1])
        return (out["options"], out["choice"], out["prompt"], out["main"], out["group"],
                legend(scale), f"step {step}", [run_id, step])

    @app.callback(Output("tok-history", "figure"), Input("tok-prompt", "children"),
                  Input("tok-metric", "value"), Input("tok-steps", "data"),
                  State("tok-run", "value"))
    def history(prompt, metric, steps, run_id):
        if not run_id or not steps:
            return position_step_heatmap(None)
        app_state = data.current()
        rows, mine = prompt_history(app_state.reader, run_id, prompt or None, metric,
                                    cache=app_state.token_rows, all_steps=steps)
        which = "this prompt's rollouts" if mine else "every sampled rollout"
        return position_step_heatmap(rows, _scale(app_state, run_id, metric, steps),
                                     title=f"{METRICS[metric]} by position across training "
                                           f"(same colours as the tokens): {which}")


def _scale(app_state: data.AppState, run_id: str, metric: str, steps: list[int]) -> TokenScale:
    # fixed once the run has its first EARLY_STEPS token steps: kept for the app's lifetime
    key = (run_id, metric)
    scale = app_state.token_scales.get(key)
    if scale is None:
        scale = run_scale(app_state.reader, run_id, metric, steps, app_state.token_rows)
        if len(steps) >= EARLY_STEPS:
            app_state.token_scales.put(key, scale)
    return scale
