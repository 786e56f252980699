"""The tokens page's colour scale (`TokenScale`: one per run and metric, 0 → a top read from the
run's first token steps, the same at every step, so a collapsed step looks pale beside a
healthy one; the mismatch log ratio and the value probes' Δ diverge around 0 instead) and its
pure figure, the position × step heatmap on that same scale."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from forksight.base.constants import FORK_ENTROPY, MISMATCH_BANDS, MISMATCH_LIMIT
from forksight.dashboard.figures import base_layout, clean, empty_figure

TV_DELTA = 0.15             # DPPO's TV region (hooks/metrics/trust.py DEFAULT_DELTA["tv"]; torch-free here)

METRICS = {"entropy": "entropy H", "renyi2": "Rényi-2 H2", "js": "JS to group",
           "logp": "surprise −log p", "mismatch": "mismatch log r", "delta": "value Δ",
           "tv": "binary TV"}
# the reference page's own: H now minus H at the base, the same text (docs/algorithms.md §15)
REFERENCE_METRICS = {"entropy": "entropy H", "dh": "ΔH from the base"}
UNITS = {"entropy": "nats", "renyi2": "nats", "js": "nats", "logp": "nats", "mismatch": "nats",
         "delta": "reward", "tv": "probability", "dh": "nats"}
HUES = {"entropy": (232, 89, 12), "renyi2": (95, 61, 196), "js": (11, 114, 133),
        "logp": (201, 42, 42), "mismatch": (178, 24, 43), "delta": (43, 138, 62),
        "tv": (156, 54, 181), "dh": (232, 89, 12)}
# the mismatch scale diverges: r > 1 (the trainer's p above the sampler's) in HUES' red, r < 1 in blue
BELOW_HUE = (33, 102, 172)
# value Δ diverges too: a token that raised the expected reward in HUES' green, lowered it in red
BELOW = {"delta": (201, 42, 42)}
DIVERGING = ("mismatch", "delta", "dh")      # ΔH: gained entropy in H's orange, lost it in blue
# metrics known for some tokens only: an unknown one is greyed, never drawn as "0" (no sampler
# log p; not probed; not trained, or the batch trained once: no π_old to move from)
PARTIAL = (*DIVERGING, "tv")
PIVOT_DELTA = 0.2          # a pivotal token's least |Δ| (docs/algorithms.md §12): the Δ scale's floor
# the token columns a metric is computed from (the others are columns of their own)
SOURCES = {"mismatch": ("logp", "sampler_logp")}
MAX_ALPHA = 0.85            # full colour: the text stays readable on it
EARLY_STEPS = 3             # a run's scale is read from its first token steps...
TOP_QUANTILE = 0.95         # ...as this quantile, so one outlier does not pale the rest
# the least top: a run that starts collapsed stays pale instead of being stretched to full colour
FLOOR = {"entropy": 1.0, "renyi2": 1.0, "js": 0.05, "logp": 1.0,
         "mismatch": math.log(MISMATCH_BANDS[0]),   # ±log 2: the 2x band always fits on the scale
         "delta": PIVOT_DELTA,                       # ±0.2: a pivotal Δ is always strongly coloured
         "tv": TV_DELTA,                             # DPPO's δ: a token outside its region is full colour
         "dh": 0.1}                                  # ±0.1 nats: a small move stays pale
BAND_MARKS = tuple((sign * math.log(b), f"{b:g}×" if sign > 0 else f"1/{b:g}×")
                   for b in MISMATCH_BANDS for sign in (-1, 1))


def with_log_ratio(tokens: pd.DataFrame) -> pd.DataFrame:
    """The token rows with a `mismatch` column, log r = logp − sampler_logp per token (NaN where
    the sampler's log p is unknown): what the mismatch colour shows. Only a difference for the
    display; every mismatch statistic comes from hooks/metrics/mismatch.py at ingest."""
    if "sampler_logp" not in tokens or "logp" not in tokens:
        return tokens.assign(mismatch=np.full(len(tokens), np.nan))
    return tokens.assign(mismatch=tokens["logp"].to_numpy(np.float64)
                         - tokens["sampler_logp"].to_numpy(np.float64))


@dataclass(frozen=True)
class TokenScale:
    """Colour = the metric's hue with opacity growing linearly from 0 to `top` (log p: by
    surprise −log p); the mismatch log r diverges, from −top (blue) through 0 (clear) to +top
    (red). `marks` are values named on the legend (the fork threshold, the 2×/5× bands); `empty`:
    the steps the scale was read from held no value (a run without sampler log p)."""

    metric: str
    top: float
    source: str
    marks: tuple[tuple[float, str], ...] = ()
    empty: bool = False

    @property
    def diverging(self) -> bool:
        """Whether the scale runs from −top to +top around 0 (the mismatch log ratio, value Δ)."""
        return self.metric in DIVERGING

    @property
    def low(self) -> float:
        """The scale's lower end: 0, or −top when diverging."""
        return -self.top if self.diverging else 0.0

    def shown(self, value: float | None) -> float | None:
        """The number the colour encodes: the value, or −log p for log p; None when unknown."""
        if value is None or not math.isfinite(value):
            return None
        return -value if self.metric == "logp" else value

    def strength(self, value: float | None) -> float:
        """Where a value sits on the scale, 0..1 (−1..1 when diverging; past the ends saturate)."""
        shown = self.shown(value)
        return 0.0 if shown is None else min(max(shown / self.top, self.low / self.top), 1.0)

    def fill(self, strength: float) -> str:
        """The CSS colour at a point of the scale, 0..1 (−1..1 when diverging: below 0 in blue)."""
        r, g, b = BELOW.get(self.metric, BELOW_HUE) if strength < 0 else HUES[self.metric]
        return f"rgba({r},{g},{b},{MAX_ALPHA * abs(strength):.3f})"

    def color(self, value: float | None) -> str:
        """The CSS background of a token with this value."""
        return "transparent" if self.shown(value) is None else self.fill(self.strength(value))

    def colorscale(self) -> list:
        """The same colours as a plotly colorscale over [low, top]."""
        if self.diverging:      # clear at 0 on both sides: no grey passing through the middle
            return [[0.0, self.fill(-1.0)], [0.5, self.fill(-0.0001)], [0.5, self.fill(0.0)],
                    [1.0, self.fill(1.0)]]
        return [[0.0, self.fill(0.0)], [1.0, self.fill(1.0)]]

    def ticks(self) -> list[tuple[float, str]]:
        """(value, label) along the scale: the ends, 0 and the marks between them (a diverging
        end also names its ratio, e⁺ᵗᵒᵖ×)."""
        inner = [(v, name if self.diverging else f"{v:.3g} {name}") for v, name in self.marks
                 if self.low < v < self.top]
        if not self.diverging:
            return [(0.0, "0"), *inner, (self.top, f"{self.top:.3g}")]
        if self.metric in ("delta", "dh"):
            return sorted([(self.low, f"−{self.top:.3g}"), *inner, (0.0, "0"), (self.top, f"+{self.top:.3g}")])
        ends = [(self.low, f"−{self.top:.3g} ({math.exp(self.low):.2g}×)"),
                (self.top, f"+{self.top:.3g} ({math.exp(self.top):.3g}×)")]
        return sorted([ends[0], *inner, (0.0, "0 (1×)"), ends[1]])


def metric_bound(metric: str, vocab_size: int | None) -> float:
    """The largest value a metric can take: ln|V| for H, H2 and surprise (inf when |V| is
    unknown for H and H2), ln 2 for the Jensen–Shannon divergence in nats; the mismatch |log r|
    is capped at the end of the mismatch histogram (MISMATCH_LIMIT)."""
    if metric == "js":
        return math.log(2.0)
    if metric == "mismatch":        # the mismatch histogram's end: a ratio of e⁴ ≈ 55×
        return MISMATCH_LIMIT
    if metric == "delta":           # a reward's range is the run's own: no bound
        return math.inf
    if metric == "tv":              # a difference of two probabilities
        return 1.0
    return math.log(vocab_size) if vocab_size and vocab_size > 1 else math.inf


def token_scale(early_values: Sequence[float] | np.ndarray, metric: str, *,
                vocab_size: int | None = None, steps: Sequence[int] = ()) -> TokenScale:
    """A run's fixed scale for `metric` from its early steps' values (`steps` names them); the
    mismatch scale is ± the quantile of |log r|, at least ±log 2; value Δ's ± the quantile of
    |Δ| over the run's first probed steps, at least ±0.2 (the pivot threshold)."""
    if metric not in METRICS and metric not in REFERENCE_METRICS:
        raise ValueError(f"metric must be one of {sorted({**METRICS, **REFERENCE_METRICS})}, got {metric!r}")
    vals = np.asarray(early_values, dtype=np.float64)
    vals = -vals if metric == "logp" else np.abs(vals) if metric in DIVERGING else vals
    vals = vals[np.isfinite(vals)]
    quantile = float(np.quantile(vals, TOP_QUANTILE)) if len(vals) else 0.0
    where = (f"steps {steps[0]}–{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}") \
        if len(steps) else "the first steps"
    top, source = quantile, f"{TOP_QUANTILE:.0%} quantile of {where}"
    if metric == "mismatch":
        source = f"± the {TOP_QUANTILE:.0%} quantile of |log r| in {where}" if len(vals) \
            else f"no sampler log p in {where}"
    if metric == "dh":
        source = f"± the {TOP_QUANTILE:.0%} quantile of |ΔH| in {where}"
    if metric == "delta":
        where = where.replace("step", "probed step")
        source = f"± the {TOP_QUANTILE:.0%} quantile of |Δ| in {where}" if len(vals) \
            else "no value probes in this run yet"
    if metric == "tv" and not len(vals):
        source = f"no π_old in {where}"
    if top < FLOOR[metric]:
        top = FLOOR[metric]
        if metric == "tv":
            source = (f"DPPO's δ {TV_DELTA:g} ({TOP_QUANTILE:.0%} of {where} lie inside its region)"
                      if len(vals) else source)
        elif metric not in DIVERGING:
            source = f"floor ({where} stay below it)"
        elif metric == "dh":
            source = f"±{FLOOR['dh']:g} nats, the floor ({where} moved less)"
        elif len(vals) and metric == "mismatch":
            source = f"±log 2, the 2× band ({TOP_QUANTILE:.0%} of {where} lie inside it)"
        elif len(vals):
            source = f"±{PIVOT_DELTA:g}, the pivot threshold ({TOP_QUANTILE:.0%} of |Δ| in {where} lie inside it)"
    bound = metric_bound(metric, vocab_size)
    if top > bound:
        top, source = bound, {"js": "ln 2, the largest JS", "mismatch": "±4, the histogram's end",
                              "tv": "1, the largest TV"}.get(metric, "ln|V|, uniform")
    marks = {"entropy": ((FORK_ENTROPY, "fork"),), "mismatch": BAND_MARKS,
             "delta": ((-PIVOT_DELTA, "pivot"), (PIVOT_DELTA, "pivot")),
             "tv": ((TV_DELTA, "DPPO δ"),)}.get(metric, ())
    return TokenScale(metric, float(top), source, marks, empty=not len(vals))


def position_step_heatmap(tokens: pd.DataFrame | None, scale: TokenScale | str = "entropy",
                          title: str = "") -> dict:
    """Mean metric at each completion position (y) across training steps (x), coloured on
    the tokens' scale (a metric name: a scale from these rows, for a quick look)."""
    if isinstance(scale, str):
        values = tokens[scale] if tokens is not None and scale in tokens else []
        scale = token_scale(values, scale)
    metric = scale.metric
    if tokens is None or tokens.empty:
        return empty_figure("no value probes in this run yet" if metric == "delta"
                            else "no token rows for this prompt", height=280 if metric != "delta" else 120)
    if metric not in tokens or not tokens[metric].notna().any():
        return empty_figure(f"no {METRICS[metric]} in these token rows"
                            + {"mismatch": " (no sampler log p)",
                               "tv": " (each batch trained once: no π_old to move from)"}.get(metric, ""),
                            height=120)
    shown = tokens.assign(value=-tokens[metric] if metric == "logp" else tokens[metric])
    table = shown.pivot_table(index="pos", columns="step", values="value", aggfunc="mean")
    ticks = scale.ticks()
    trace = {"type": "heatmap", "x": [str(int(s)) for s in table.columns],
             "y": [int(p) for p in table.index],
             "z": [clean(r) for r in table.to_numpy(np.float64)],
             "zmin": scale.low, "zmax": scale.top, "colorscale": scale.colorscale(),
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
