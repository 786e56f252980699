"""Tokens page: one step's completion token by token on the run's fixed colour scale, the
group's other rollouts beside it, and a position × step heatmap for that prompt on the same
scale; the step slider follows new steps while the run trains."""
from __future__ import annotations

from dataclasses import replace

import dash
import pandas as pd
from dash import Input, Output, State, ctx, dcc, html, no_update

from forksight.base.limits import MAX_READ_TOKEN_ROWS
from forksight.base.interfaces import Reader
from forksight.dashboard import data
from forksight.dashboard.data import LRU
from forksight.dashboard.figures import downsample_indices
from forksight.dashboard.live import TICK_MS
from forksight.dashboard.probe_figures import probe_history, with_probes
from forksight.dashboard.run_options import run_options, searchable
from forksight.dashboard.run_view import vocab_size
from forksight.dashboard.token_figures import (EARLY_STEPS, METRICS, SOURCES, TokenScale,
                                               position_step_heatmap, token_scale, with_log_ratio)
from forksight.dashboard.tokens_view import fork_note, legend, pick_sample, sample_label, token_spans

HISTORY_STEPS = 24      # columns of the position × step heatmap (one read per step, cached)


def _step_rows(reader: Reader, run_id: str, step: int, cache: LRU | None = None,
               newest: int | None = None, fork_rule=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    def read():      # with the mismatch log ratio beside the stored columns (the mismatch colour)
        return with_log_ratio(refork(reader.read_tokens(run_id, step), fork_rule)), \
            reader.read_samples(run_id, step=step)
    # a past step's rows never change: the app caches them so the heatmap and slider stay
    # fast; the newest step may still get rows from other ranks, so it is read again
    if cache is None or (newest is not None and step >= newest):
        return read()
    return cache.get_or_compute((run_id, step), read)


def refork(tokens: pd.DataFrame, rule) -> pd.DataFrame:
    """The step's rows with `fork` under `rule` (`serve --fork-rule`: from the stored H, the threshold over
    the step's stored rows), or as stored (None)."""
    if rule is None or tokens.empty or "entropy" not in tokens:
        return tokens
    threshold = rule.threshold(tokens["entropy"].to_numpy(dtype="float64", na_value=float("nan")))
    return tokens.assign(fork=tokens["entropy"] >= threshold)


def scale_steps(reader: Reader, run_id: str, metric: str) -> list[int]:
    """The steps a run's scale is read from: its first EARLY_STEPS token steps (value Δ: probed
    steps)."""
    if metric == "delta":
        return reader.probe_steps(run_id)[:EARLY_STEPS]
    return reader.first_token_steps(run_id, EARLY_STEPS)


def run_scale(reader: Reader, run_id: str, metric: str, steps: list[int] | None = None,
              cache: LRU | None = None) -> TokenScale:
    """The run's fixed colour scale for `metric`, read from its first EARLY_STEPS token steps
    (`steps`: those steps, ascending, else read from the token_steps index); value Δ from the
    probe rows of its first probed steps."""
    early = [int(s) for s in (scale_steps(reader, run_id, metric) if steps is None
                              else steps)[:EARLY_STEPS]]
    if metric == "delta":
        deltas = [reader.read_probes(run_id, s)["delta"] for s in early]
        return token_scale(pd.concat(deltas) if deltas else [], metric, steps=early)
    # the scale's steps are cached only once EARLY_STEPS exist (a newer step may gain rows)
    newest = early[-1] + (len(early) < EARLY_STEPS) if early else None
    parts = [_step_rows(reader, run_id, s, cache, newest=newest)[0] for s in early]
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
                newest: int | None = None, fork_rule=None) -> dict:
    """Everything the page shows for one step and pick: options, prompt, the chosen
    completion as token spans on the run's scale, and the group's other rollouts."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if scale is None:
        scale = run_scale(reader, run_id, metric, None, cache)
    tokens, samples = _step_rows(reader, run_id, int(step), cache, newest, fork_rule)
    if metric == "delta":       # the step's probe rows beside its tokens (a few hundred rows)
        tokens = with_probes(tokens, reader.read_probes(run_id, int(step)))
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


def history_steps(reader: Reader, run_id: str, max_steps: int = HISTORY_STEPS) -> list[int]:
    """Up to max_steps token steps spread over the run (the first token step of each of
    max_steps - 1 equal parts of its span, and the last), ascending: one read."""
    return reader.spread_token_steps(run_id, max(2, max_steps) - 1)


def prompt_history(reader: Reader, run_id: str, prompt: str | None, metric: str,
                   max_steps: int = HISTORY_STEPS, all_steps: list[int] | None = None
                   ) -> tuple[pd.DataFrame, bool]:
    """Token rows (step, pos, metric) of this prompt's rollouts over up to max_steps token steps
    spread over the run (`all_steps`: the run's token steps to pick them from, else
    history_steps reads them), in one read, and whether they are this prompt's (False: every
    sampled rollout: the prompt is unknown or recurs at fewer than MIN_PROMPT_STEPS steps)."""
    if metric == "delta":        # the probed steps' rows: every probed completion
        probed = reader.probe_steps(run_id)
        picked = [probed[i] for i in downsample_indices(len(probed), max_steps)]
        return probe_history([reader.read_probes(run_id, s) for s in picked]), False
    steps = history_steps(reader, run_id, max_steps) if all_steps is None else \
        [all_steps[i] for i in downsample_indices(len(all_steps), max_steps)]
    columns = SOURCES.get(metric, (metric,))         # mismatch: from logp and sampler_logp

    def read(*mine) -> pd.DataFrame:
        rows = reader.read_token_history(run_id, steps, columns, *mine).reset_index(drop=True)
        return with_log_ratio(rows) if metric == "mismatch" else rows
    if steps and prompt:
        rows = read(prompt)
        if rows["step"].nunique() >= MIN_PROMPT_STEPS:
            return rows, True
    if not steps:
        return pd.DataFrame({"step": [], "pos": [], metric: []}), False
    return read(), False


def cached_history(app_state: data.AppState, run_id: str, prompt: str | None, metric: str
                   ) -> tuple[pd.DataFrame, bool]:
    """prompt_history, kept by the app for a run that is not live: its spread steps and their rows
    never change, so a page opened again on a long finished run reads no token rows for the heatmap
    (its first read scans up to HISTORY_STEPS row groups of samples, one per spread step)."""
    run = app_state.reader.run(run_id)
    if run is None or run.get("status") == "live":
        return prompt_history(app_state.reader, run_id, prompt, metric)
    key = (run_id, prompt, metric, run.get("last_step"), app_state.reader.token_step_span(run_id))
    return app_state.token_history.get_or_compute(
        key, lambda: prompt_history(app_state.reader, run_id, prompt, metric))


MARKS = 8               # labelled steps under the slider


def step_picker(reader: Reader, run_id: str | None, wanted=None) -> dict:
    """The slider for a run: {'span': the small state the page keeps ({run, count, first,
    last}), 'min', 'max', 'value' (the token step nearest `wanted`, else the newest), 'marks'}.
    The slider's values are steps; its ends come from the token_steps index in one small read
    (two with `wanted`), so neither the page nor the browser ever holds the run's step list."""
    n, first, last = reader.token_step_span(run_id) if run_id else (0, None, None)
    if not n:
        return {"span": {"run": run_id, "count": 0}, "min": 0, "max": 0, "value": 0, "marks": None}
    value = last if wanted is None or not str(wanted).isdigit() else \
        reader.nearest_token_steps(run_id, [int(wanted)])[0]
    # marks are places on the axis, labelled with their step (a pick lands on the nearest token step)
    marks = sorted({first + round(i * (last - first) / (MARKS - 1)) for i in range(MARKS)})
    return {"span": {"run": run_id, "count": n, "first": first, "last": last}, "min": first,
            "max": last, "value": value, "marks": {int(m): f"{m:,}" for m in marks}}


def follows(span: dict | None, value) -> bool:
    """Whether the slider should move to the newest step when new steps arrive: it was on the
    newest (or showed nothing yet); a user who picked an earlier step stays there."""
    last = span.get("last") if isinstance(span, dict) else None
    return last is None or not isinstance(value, (int, float)) or value >= last


def _span(span) -> tuple[str | None, int | None]:
    """(run, last step) of the page's small step state, whatever the browser sent."""
    if not isinstance(span, dict) or not isinstance(span.get("last"), int):
        return None, None
    return span.get("run"), span["last"]


def layout(run: str | None = None, step: str | None = None, sample: str | None = None,
           metric: str | None = None, **_query) -> html.Div:
    run_asked = run
    options = run_options(data.reader(), [run] if run else [])   # a page of runs; typing searches
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
                      # the value is a step (shown: the token step nearest it): no number
                      # box or tooltip; the marks and the label name the step
                      dcc.Slider(id="tok-step", min=0, max=0, step=1, value=0, marks=None,
                                 allow_direct_input=False, updatemode="mouseup")],
                     className="control control-wide"),
            html.Div([html.Label("sample"), dcc.Dropdown(id="tok-sample", clearable=False,
                                                         value=sample)], className="control"),
            html.Div([html.Label("colour by"),
                      dcc.RadioItems(id="tok-metric", value=metric if metric in METRICS else "entropy",
                                     inline=True,
                                     options=[{"label": f" {v}", "value": k}
                                              for k, v in METRICS.items()])],
                     className="control"),
        ]),
        # the URL's step and sample: the dropdown drops a value its (still empty) options
        # lack when it mounts, so the wish is kept here until the step's options exist
        dcc.Store(id="tok-span"), dcc.Store(id="tok-want-step", data=step),
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
    searchable(app, "tok-run")
    slider = (Output("tok-span", "data"), Output("tok-step", "min"), Output("tok-step", "max"),
              Output("tok-step", "value"), Output("tok-step", "marks"))

    def outputs(picker: dict) -> tuple:
        return tuple(picker[k] for k in ("span", "min", "max", "value", "marks"))

    @app.callback(*slider, Input("tok-run", "value"), State("tok-want-step", "data"))
    def load_steps(run_id, wanted):
        return outputs(step_picker(data.reader(), run_id if isinstance(run_id, str) else None, wanted))

    @app.callback(*[Output(o.component_id, o.component_property, allow_duplicate=True)
                    for o in slider],
                  Input("tok-tick", "n_intervals"), State("tok-run", "value"),
                  State("tok-span", "data"), State("tok-step", "value"),
                  prevent_initial_call=True)
    def follow(_n, run_id, span, value):
        if not isinstance(run_id, str):
            return (no_update,) * 5
        # the span only (one small read a tick); the slider moves when the newest step changed
        shown_run, last = _span(span)
        now = data.reader().token_step_span(run_id)[2]
        if now is None or (shown_run == run_id and now == last):
            return (no_update,) * 5
        stay = isinstance(value, int) and not follows(span, value) and shown_run == run_id
        picker = step_picker(data.reader(), run_id, value if stay else None)
        out = outputs(picker)
        return out[:3] + (no_update if picker["value"] == value else out[3],) + out[4:]

    @app.callback(Output("tok-sample", "options"), Output("tok-sample", "value"),
                  Output("tok-prompt", "children"), Output("tok-main-wrap", "children"),
                  Output("tok-group", "children"), Output("tok-legend", "children"),
                  Output("tok-step-label", "children"), Output("tok-shown", "data"),
                  Input("tok-step", "value"), Input("tok-sample", "value"),
                  Input("tok-metric", "value"), Input("tok-span", "data"),
                  State("tok-run", "value"), State("tok-shown", "data"),
                  State("tok-want-sample", "data"))
    def show(value, choice, metric, span, run_id, shown, wanted):
        shown_run, last = _span(span)
        if last is None or run_id is None or shown_run != run_id:
            note = "pick a run above" if run_id is None else \
                "waiting for the first step with token rows (none logged for this run yet)"
            return ([], None, "", html.P(note, className="empty-note"), [], [],
                    "step", None)
        app_state = data.current()
        wanted_step = int(value) if isinstance(value, (int, float)) and abs(value) < 1 << 62 else last
        step = app_state.reader.nearest_token_steps(run_id, [wanted_step])[0]
        if set(ctx.triggered_prop_ids) == {"tok-span.data"} and shown == [run_id, step]:
            return (no_update,) * 8     # new steps arrived, the shown one is unchanged
        scale = _scale(app_state, run_id, metric)
        rule = app_state.fork_rule
        out = render_step(app_state.reader, run_id, step, choice or wanted, metric,
                          app_state.token_rows, scale, newest=last, fork_rule=rule)
        run = app_state.reader.run(run_id) or {}
        threshold = app_state.reader.steps_scalars(run_id, [step]).get(step, {}).get("fork/threshold")
        note = fork_note(run.get("config"), threshold)
        if rule is not None:          # serve --fork-rule: this rule over the step's stored rows, not the run's
            stored = _step_rows(app_state.reader, run_id, step, app_state.token_rows, last, rule)[0]
            threshold = rule.threshold(stored["entropy"].to_numpy(dtype="float64", na_value=float("nan"))) \
                if len(stored) else None
            note = f"{rule.describe(threshold)}, redrawn from the stored H (serve --fork-rule; the run's own: " \
                   f"{fork_note(run.get('config'), None)})"
        shown = replace(scale, marks=((threshold, "fork"),)) if metric == "entropy" and threshold is not None \
            else scale                   # the bar marks this step's fork threshold under the run's rule
        return (out["options"], out["choice"], out["prompt"], out["main"], out["group"],
                legend(shown, note), f"step {step}", [run_id, step])

    @app.callback(Output("tok-history", "figure"), Input("tok-prompt", "children"),
                  Input("tok-metric", "value"), Input("tok-span", "data"),
                  State("tok-run", "value"))
    def history(prompt, metric, span, run_id):
        shown_run, last = _span(span)
        if not run_id or last is None or shown_run != run_id or metric not in METRICS:
            return position_step_heatmap(None)
        app_state = data.current()
        rows, mine = cached_history(app_state, run_id, prompt if isinstance(prompt, str) and prompt else None,
                                    metric)
        which = "this prompt's rollouts" if mine else \
            "every probed completion" if metric == "delta" else "every sampled rollout"
        return position_step_heatmap(rows, _scale(app_state, run_id, metric),
                                     title=f"{METRICS[metric]} by position across training "
                                           f"(same colours as the tokens): {which}")


def _scale(app_state: data.AppState, run_id: str, metric: str) -> TokenScale:
    # fixed once the run has its first EARLY_STEPS token steps: kept for the app's lifetime
    key = (run_id, metric)
    scale = app_state.token_scales.get(key)
    if scale is None:
        early = scale_steps(app_state.reader, run_id, metric)
        scale = run_scale(app_state.reader, run_id, metric, early, app_state.token_rows)
        if len(early) >= EARLY_STEPS:
            app_state.token_scales.put(key, scale)
    return scale
