"""A completion as Dash components, one span per token: colour on the run's TokenScale, fork
outlined, trained-on underlined, every number in the hover. Never raw HTML: model text goes
into `children`, which React escapes, so `<script>` in a completion is shown, not run."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from dash import html

from forksight.dashboard.probe_figures import probe_lines
from forksight.dashboard.token_figures import (METRICS, PARTIAL, REFERENCE_METRICS, UNITS, TokenScale,
                                               token_scale, with_log_ratio)

def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    return f"{value:.{digits}f}" if isinstance(value, (float, np.floating)) else str(value)


def _exp(value) -> float | None:
    return math.exp(value) if value is not None and math.isfinite(value) else None


def mismatch_line(row: dict) -> list[str]:
    """The hover's line on the sampler: p_train and p_sampler as probabilities, their ratio and
    log r; nothing when the sampler's log p is unknown."""
    if _exp(row.get("sampler_logp")) is None or _exp(row.get("logp")) is None:
        return []
    log_r = row["logp"] - row["sampler_logp"] if row.get("mismatch") is None else row["mismatch"]
    return [f"p_train {_fmt(_exp(row['logp']))}   p_sampler {_fmt(_exp(row['sampler_logp']))}   "
            f"ratio p_train/p_sampler {_exp(log_r):.4g}   log r {log_r:+.4f}"]


def trust_line(row: dict) -> list[str]:
    """The hover's line on the trust region: the ratio to the policy that sampled the batch, DPPO's
    binary TV and whether the ratio clip bound the token; nothing when π_old is unknown."""
    if row.get("tv") is None or row.get("ratio") is None:
        return []
    return [f"ratio π/π_old {row['ratio']:.4g}   binary TV {row['tv']:.4f}   "
            f"ratio clip bound it {_fmt(row.get('clipped'))}"]


def token_title(row: dict) -> str:
    """Hover text with every number of one token (plain text in a title attribute)."""
    p = _exp(row.get("logp"))
    return "\n".join([
        f"token {row.get('token')!r}  id {row.get('token_id')}  position {row.get('pos')}",
        f"entropy H {_fmt(row.get('entropy'))}   Rényi-2 H2 {_fmt(row.get('renyi2'))}",
        f"JS to group {_fmt(row.get('js'))}   log p {_fmt(row.get('logp'))}   p {_fmt(p)}",
        f"top-1 p {_fmt(row.get('top1'))}   fork {_fmt(row.get('fork'))}   "
        f"trained on {_fmt(row.get('selected'))}",
        *mismatch_line(row),
        *trust_line(row),
        *probe_lines(row),
        *(["environment text (tool output): not sampled from the policy, not scored"] if row.get("env") else []),
    ])


def token_spans(tokens: pd.DataFrame, metric: str = "entropy", scale: TokenScale | None = None
                ) -> list[html.Span]:
    """One html.Span per token row (ordered by position): text as children, colour by metric
    on `scale` (default: a scale read from these rows), class `fork` (outlined) and `sel`
    (underlined) where the data says so, `nolr` (greyed) for a token a mode that knows only some
    tokens cannot colour (no sampler log p; not probed; not trained from a π_old), `pivot` (marked)
    for a pivotal token in value Δ, `clip` (marked) for a token the ratio clip bound in binary TV."""
    if metric == "mismatch" and "mismatch" not in tokens:
        tokens = with_log_ratio(tokens)
    if scale is None:
        scale = token_scale(tokens[metric] if metric in tokens else [], metric)
    spans = []
    for row in tokens.sort_values("pos", kind="stable").to_dict("records"):
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        classes = ["tok"]
        if row.get("fork"):
            classes.append("fork")
        if row.get("selected"):
            classes.append("sel")
        if scale.metric == "delta" and row.get("pivotal") is not None and bool(row["pivotal"]):
            classes.append("pivot")
        if scale.metric == "tv" and row.get("clipped") is not None and bool(row["clipped"]):
            classes.append("clip")
        if row.get("env"):       # a tool's or environment's text: shown in place, never scored
            classes.append("env")
        elif scale.metric in PARTIAL and scale.shown(row.get(scale.metric)) is None:
            classes.append("nolr")   # unknown, not "the engines agree" (which is clear too)
        text = row.get("token")
        spans.append(html.Span(
            children="∅" if text is None or text == "" else str(text),
            className=" ".join(classes), title=token_title(row),
            style={"backgroundColor": scale.color(row.get(scale.metric))},
            **{"data-pos": str(row.get("pos"))}))
    return spans


def pick_sample(samples: pd.DataFrame, choice: str) -> int | None:
    """The sample_id a picker value means: "12" (that sample), "low:G" / "high:G" (the
    lowest- / highest-reward rollout of group G). None when nothing matches."""
    if samples.empty or not choice:
        return None
    kind, _, group = str(choice).partition(":")
    if kind in ("low", "high"):
        rows = samples[samples["group_id"] == int(group)].dropna(subset=["reward"])
        if rows.empty:
            return None
        rows = rows.sort_values(["reward", "sample_id"], ascending=[kind == "low", True])
        return int(rows["sample_id"].iloc[0])
    sid = int(choice)
    return sid if sid in set(samples["sample_id"].astype(int)) else None


def sample_label(row: dict) -> str:
    """"#3 · group 0 · reward 1.00 ✓" for pickers and rollout headers."""
    reward = row.get("reward")
    mark = {True: " ✓", False: " ✗"}.get(None if row.get("correct") is None
                                          or pd.isna(row.get("correct"))
                                          else bool(row.get("correct")), "")
    reward_text = "–" if reward is None or pd.isna(reward) else f"{reward:.2f}"
    group = row.get("group_id")
    group_text = "–" if group is None or pd.isna(group) else int(group)
    return f"#{int(row['sample_id'])} · group {group_text} · reward {reward_text}{mark}"


def fork_note(config: dict | None, threshold: float | None) -> str:
    """What the outline means for a run: its fork rule (its config's `fork_rule`; a run that records
    none was stored under abs:0.672) and, under a quantile rule, the step's threshold in nats."""
    from forksight.base.fork_rule import recorded

    return recorded((config or {}).get("fork_rule")).describe(threshold)


def legend(scale: TokenScale, fork: str = "fork token (H ≥ threshold)") -> html.Div:
    """The colour scale with its numbers (0, the fork threshold, the top), where the top comes
    from, and what the outline and underline mean."""
    def at(value: float) -> dict:
        where = 100 * (value - scale.low) / (scale.top - scale.low)
        # the end labels sit inside the bar's ends, the others centred on their value
        shift = {0.0: "none", 100.0: "translateX(-100%)"}.get(round(where, 2), "translateX(-50%)")
        return {"left": f"{where:.2f}%", "transform": shift}
    ticks = scale.ticks()
    # the ends' numbers (and a diverging scale's 0) under the bar, the marks' (fork threshold,
    # the 2×/5× bands) above: they never overlap
    ends = [t for t in ticks if t in (ticks[0], ticks[-1]) or (scale.diverging and t[0] == 0.0)]
    inner = [t for t in ticks if t not in ends]
    ticks = [html.Span(label, className="scale-tick", style=at(v)) for v, label in ends] + \
        [html.Span(label, className="scale-tick above", style=at(v)) for v, label in inner]
    marks = [html.Span(className="scale-mark", style=at(v)) for v, _ in inner]
    stops = (-1.0, 0.0, 1.0) if scale.diverging else (0.0, 1.0)
    gradient = f"linear-gradient(to right, {', '.join(scale.fill(v) for v in stops)})"
    return html.Div(className="tok-legend", children=[
        html.Span(f"{METRICS.get(scale.metric) or REFERENCE_METRICS[scale.metric]}, fixed for this run: ",
                  className="scale-name"),
        *mismatch_notes(scale),
        html.Div(className="scale", id="tok-scale", **{"data-top": f"{scale.top:.6g}",
                                                       "data-low": f"{scale.low:.6g}"},
                 children=[html.Div(className="scale-bar", style={"background": gradient}),
                           *marks, *ticks]),
        html.Span(f"{UNITS[scale.metric]} · {'ends' if scale.diverging else 'top'} = {scale.source}",
                  className="scale-source"),
        html.Span(fork, className="tok fork", id="tok-fork-rule", style={"marginLeft": "14px"}),
        html.Span("trained on", className="tok sel", style={"marginLeft": "10px"}),
        html.Span("environment text", className="tok env", style={"marginLeft": "10px"}),
        *([html.Span("pivotal", className="tok pivot", style={"marginLeft": "10px"})]
          if scale.metric == "delta" else []),
        *([html.Span("ratio clip bound it", className="tok clip", style={"marginLeft": "10px"})]
          if scale.metric == "tv" else []),
    ])


def mismatch_notes(scale: TokenScale) -> list:
    """What the mismatch legend says beside its bar: that a run has no sampler log p at all, or
    which way the colours go."""
    if scale.metric == "tv":
        return trust_notes(scale)
    if not scale.diverging:
        return []
    if scale.metric == "delta":
        return probe_notes(scale)
    if scale.metric == "dh":
        return [html.Span("ΔH = H at this step − H at the base, the same token of the same text: orange, the "
                          "policy is less sure here than it was; blue, surer; grey text: no entropy",
                          className="scale-source", style={"flexBasis": "100%", "order": 9})]
    if scale.empty:
        return [html.Span("no sampler log p: tokens stay uncoloured (log it: README, "
                          "training–inference mismatch)", className="notice", id="tok-no-sampler")]
    return [html.Span("log r = log p_train − log p_sampler: blue, the trainer's p lower than "
                      "the sampler's; red, higher; grey text: the sampler's log p unknown",
                      className="scale-source", style={"flexBasis": "100%", "order": 9})]


def probe_notes(scale: TokenScale) -> list:
    """What the value Δ legend says beside its bar: that the run has no probes, or what the
    colours and the mark mean."""
    if scale.empty:
        return [html.Span("no value probes in this run: tokens stay uncoloured (forksight train "
                          "--probe-every N, or forksight probe on a stored run)", className="notice",
                          id="tok-no-probes")]
    return [html.Span("Δ = V after − V before the token (mean reward of K sampled continuations): "
                      "green, the token raised the expected reward; red, lowered it; grey text: not "
                      "probed; ◆ pivotal (|Δ| ≥ 0.2 and > 2 SE)",
                      className="scale-source", style={"flexBasis": "100%", "order": 9})]


def trust_notes(scale: TokenScale) -> list:
    """What the binary TV legend says beside its bar: that the run has no π_old, or what it shows."""
    if scale.empty:
        return [html.Span("no π_old in this run: TV is known where a batch is trained more than once "
                          "(forksight train --updates-per-batch N or a DPPO --trust-region; TRL "
                          "num_iterations > 1): tokens stay uncoloured", className="notice", id="tok-no-trust")]
    return [html.Span("binary TV = |π(y) − π_old(y)| at the batch's last update, π_old the policy that "
                      "sampled it (DPPO's divergence); ▲ the PPO ratio clip bound the token; grey text: "
                      "not trained, or π_old unknown",
                      className="scale-source", style={"flexBasis": "100%", "order": 9})]
