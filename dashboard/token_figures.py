"""The tokens page's colour scale (`TokenScale`: one per run and metric, 0 → a top read from the
run's first token steps, the same at every step, so a collapsed step looks pale beside a
healthy one) and its pure figure, the position × step heatmap on that same scale."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forksight.base.constants import FORK_ENTROPY
from forksight.dashboard.figures import base_layout, clean, empty_figure

METRICS = {"entropy": "entropy H", "renyi2": "Rényi-2 H2", "js": "JS to group",
           "logp": "surprise −log p"}
UNITS = {"entropy": "nats", "renyi2": "nats", "js": "nats", "logp": "nats"}
HUES = {"entropy": (232, 89, 12), "renyi2": (95, 61, 196), "js": (11, 114, 133),
        "logp": (201, 42, 42)}
MAX_ALPHA = 0.85            # full colour: the text stays readable on it
EARLY_STEPS = 3             # a run's scale is read from its first token steps...
TOP_QUANTILE = 0.95         # ...as this quantile, so one outlier does not pale the rest
# the least top: a run that starts collapsed stays pale instead of being stretched to full colour
FLOOR = {"entropy": 1.0, "renyi2": 1.0, "js": 0.05, "logp": 1.0}


@dataclass(frozen=True)
class TokenScale:
    """Colour = the metric's hue with opacity growing linearly from 0 to `top` (log p: by
    surprise −log p); `marks` are values named on the legend (the fork threshold)."""

    metric: str
    top: float
    source: str
    marks: tuple[tuple[float, str], ...] = ()

    def shown(self, value: float | None) -> float | None:
        """The number the colour encodes: the value, or −log p for log p; None when unknown."""
        if value is None or not math.isfinite(value):
            return None
        return -value if self.metric == "logp" else value

    def strength(self, value: float | None) -> float:
        """Where a value sits on the scale, 0..1 (values past the top saturate)."""
        shown = self.shown(value)
        return 0.0 if shown is None else min(max(shown / self.top, 0.0), 1.0)

    def fill(self, strength: float) -> str:
        """The CSS colour at a point of the scale, 0..1."""
        r, g, b = HUES[self.metric]
        return f"rgba({r},{g},{b},{MAX_ALPHA * strength:.3f})"

    def color(self, value: float | None) -> str:
        """The CSS background of a token with this value."""
        return "transparent" if self.shown(value) is None else self.fill(self.strength(value))

    def colorscale(self) -> list:
        """The same colours as a plotly colorscale over [0, top]."""
        return [[0.0, self.fill(0.0)], [1.0, self.fill(1.0)]]

    def ticks(self) -> list[tuple[float, str]]:
        """(value, label) along the scale: 0, the marks, the top."""
        inner = [(v, f"{v:.3g} {name}") for v, name in self.marks if 0 < v < self.top]
        return [(0.0, "0"), *inner, (self.top, f"{self.top:.3g}")]


def metric_bound(metric: str, vocab_size: int | None) -> float:
    """The largest value a metric can take: ln|V| for H, H2 and surprise (inf when |V| is
    unknown for H and H2), ln 2 for the Jensen–Shannon divergence in nats."""
    if metric == "js":
        return math.log(2.0)
    return math.log(vocab_size) if vocab_size and vocab_size > 1 else math.inf


def token_scale(early_values: Sequence[float] | np.ndarray, metric: str, *,
                vocab_size: int | None = None, steps: Sequence[int] = ()) -> TokenScale:
    """A run's fixed scale for `metric` from its early steps' values (`steps` names them)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    vals = np.asarray(early_values, dtype=np.float64)
    vals = -vals if metric == "logp" else vals
    vals = vals[np.isfinite(vals)]
    quantile = float(np.quantile(vals, TOP_QUANTILE)) if len(vals) else 0.0
    where = (f"steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}") \
        if len(steps) else "the first steps"
    top, source = quantile, f"{TOP_QUANTILE:.0%} quantile of {where}"
    if top < FLOOR[metric]:
        top, source = FLOOR[metric], f"floor ({where} stay below it)"
    bound = metric_bound(metric, vocab_size)
    if top > bound:
        top, source = bound, "ln 2, the largest JS" if metric == "js" else "ln|V|, uniform"
    marks = ((FORK_ENTROPY, "fork"),) if metric == "entropy" else ()
    return TokenScale(metric, float(top), source, marks)


def position_step_heatmap(tokens: pd.DataFrame | None, scale: TokenScale | str = "entropy",
                          title: str = "") -> dict:
    """Mean metric at each completion position (y) across training steps (x), coloured on
    the tokens' scale (a metric name: a scale from these rows, for a quick look)."""
    if isinstance(scale, str):
        values = tokens[scale] if tokens is not None and scale in tokens else []
        scale = token_scale(values, scale)
    metric = scale.metric
    if tokens is None or tokens.empty:
        return empty_figure("no token rows for this prompt", height=280)
    shown = tokens.assign(value=-tokens[metric] if metric == "logp" else tokens[metric])
    table = shown.pivot_table(index="pos", columns="step", values="value", aggfunc="mean")
    ticks = scale.ticks()
    trace = {"type": "heatmap", "x": [str(int(s)) for s in table.columns],
             "y": [int(p) for p in table.index],
             "z": [clean(r) for r in table.to_numpy(np.float64)],
             "zmin": 0.0, "zmax": scale.top, "colorscale": scale.colorscale(),
             "colorbar": {"title": {"text": f"{METRICS[metric]} ({UNITS[metric]})"},
                          "thickness": 10, "tickmode": "array",
                          "tickvals": [v for v, _ in ticks], "ticktext": [t for _, t in ticks]},
             "meta": {"key": metric, "role": "tokens", "top": scale.top},
             "hovertemplate": "step %{x}<br>position %{y}<br>" + METRICS[metric] +
                              " %{z:.4g}<extra></extra>"}
    layout = base_layout(title or f"{METRICS[metric]} by position across training", height=300,
                         uirevision="tokens", hovermode="closest",
                         plot_bgcolor="#ffffff",
                         xaxis={"type": "category", "title": {"text": "step"}},
                         yaxis={"autorange": "reversed", "title": {"text": "position"},
                                "zeroline": False})
    return {"data": [trace], "layout": layout}
