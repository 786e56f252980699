"""A completion rendered token by token as Dash components (never raw HTML: model text goes
into `children`, which React escapes, so `<script>` in a completion is shown, not run).

Colour = the chosen per-token metric; fork tokens are outlined, trained-on (selected) tokens
underlined; the hover title lists every number of the token.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from dash import html

METRICS = {"entropy": "entropy H", "renyi2": "Rényi-2 H2", "js": "JS to group",
           "logp": "log-prob"}
_RGB = {"entropy": (232, 89, 12), "renyi2": (95, 61, 196), "js": (11, 114, 133),
        "logp": (201, 42, 42)}


def metric_scale(tokens: pd.DataFrame, metric: str) -> float:
    """The value that gets full colour: a high quantile, so one outlier does not pale the rest.
    For log-prob the colour grows with surprise (-log p)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if tokens.empty or metric not in tokens:
        return 1.0
    vals = tokens[metric].to_numpy(np.float64)
    vals = -vals if metric == "logp" else vals
    vals = vals[np.isfinite(vals)]
    return max(float(np.quantile(vals, 0.98)) if len(vals) else 0.0, 1e-6)


def token_color(value: float | None, metric: str, scale: float) -> str:
    """Background colour: transparent at 0, the metric's hue at `scale` and beyond."""
    if value is None or not math.isfinite(value):
        return "transparent"
    strength = min(max((-value if metric == "logp" else value) / scale, 0.0), 1.0)
    r, g, b = _RGB[metric]
    return f"rgba({r},{g},{b},{0.08 + 0.77 * strength:.3f})" if strength > 0 else "transparent"


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    return f"{value:.{digits}f}" if isinstance(value, (float, np.floating)) else str(value)


def token_title(row: dict) -> str:
    """Hover text with every number of one token (plain text in a title attribute)."""
    p = math.exp(row["logp"]) if row.get("logp") is not None and math.isfinite(row["logp"]) \
        else None
    return "\n".join([
        f"token {row.get('token')!r}  id {row.get('token_id')}  position {row.get('pos')}",
        f"entropy H {_fmt(row.get('entropy'))}   Rényi-2 H2 {_fmt(row.get('renyi2'))}",
        f"JS to group {_fmt(row.get('js'))}   log p {_fmt(row.get('logp'))}   p {_fmt(p)}",
        f"top-1 p {_fmt(row.get('top1'))}   fork {_fmt(row.get('fork'))}   "
        f"trained on {_fmt(row.get('selected'))}",
    ])


def token_spans(tokens: pd.DataFrame, metric: str = "entropy", scale: float | None = None
                ) -> list[html.Span]:
    """One html.Span per token row (ordered by position): text as children, colour by metric,
    class `fork` (outlined) and `sel` (underlined) where the data says so."""
    scale = metric_scale(tokens, metric) if scale is None else scale
    spans = []
    for row in tokens.sort_values("pos", kind="stable").to_dict("records"):
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        classes = ["tok"]
        if row.get("fork"):
            classes.append("fork")
        if row.get("selected"):
            classes.append("sel")
        text = row.get("token")
        spans.append(html.Span(
            children="∅" if text is None or text == "" else str(text),
            className=" ".join(classes), title=token_title(row),
            style={"backgroundColor": token_color(row.get(metric), metric, scale)},
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


def legend(metric: str) -> html.Div:
    """What the colours and marks mean, next to the completion."""
    return html.Div(className="tok-legend", children=[
        html.Span("low", className="tok", style={"backgroundColor":
                                                 token_color(0.05, metric, 1.0)}),
        html.Span(" → ", style={"margin": "0 4px"}),
        html.Span("high " + METRICS[metric], className="tok",
                  style={"backgroundColor": token_color(1.0 if metric != "logp" else -1.0,
                                                        metric, 1.0)}),
        html.Span("fork token (H ≥ threshold)", className="tok fork", style={"marginLeft": "14px"}),
        html.Span("trained on", className="tok sel", style={"marginLeft": "10px"}),
    ])
