"""The run page's training–inference mismatch figures (pure): the mismatch KL, the out-of-band
fractions, the fork vs non-fork split and the sequence ESS over steps, and one step's histogram of
the per-token ratio p_train / p_sampler on a log axis with the 2×/5× bands marked, like the
published diagnostic plot. Every number is read, never recomputed: the math lives in
hooks/metrics/mismatch.py and arrives as `mismatch/*` scalars and the `mismatch_log_ratio`
histogram."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from forksight.base.constants import MISMATCH_BANDS, MISMATCH_EDGES, MISMATCH_LIMIT
from forksight.dashboard.alert_figures import alert_layers
from forksight.dashboard.figures import (X_TITLES, base_layout, empty_figure, grid_axes,
                                         log_annotations, raw_and_smooth, series, use_webgl,
                                         y_scale)

PREFIX = "mismatch/"
HISTOGRAM_KEY = "mismatch_log_ratio"
BAND_COLORS = {MISMATCH_BANDS[0]: "#e67700", MISMATCH_BANDS[1]: "#c92a2a"}   # 2× amber, 5× red
# one panel per question, each drawn when the run logs one of its keys: (title, lines, y axis)
PANELS = (
    ("mismatch KL(sampler ‖ trainer)",
     (("mismatch/kl_k3", "KL k3", "#1864ab", "solid"), ("mismatch/kl_k1", "KL k1", "#74c0fc", "dot")),
     {}),
    ("tokens outside the ratio bands",
     (("mismatch/frac_outside_2x", "outside 2×", BAND_COLORS[MISMATCH_BANDS[0]], "solid"),
      ("mismatch/frac_outside_5x", "outside 5×", BAND_COLORS[MISMATCH_BANDS[1]], "solid")),
     {"tickformat": ".2~%", "hoverformat": ".3~%", "rangemode": "tozero"}),
    ("where it sits: KL k3 on fork vs non-fork tokens",
     (("mismatch/kl_k3/fork", "k3, fork tokens", "#7048e8", "solid"),
      ("mismatch/kl_k3/nonfork", "k3, non-fork tokens", "#495057", "dash")),
     {}),
    ("sequence weights: normalised ESS (1 = even)",
     (("mismatch/seq_ess", "sequence ESS", "#0b7285", "solid"),),
     {"range": [0, 1.05], "autorange": False}),
)
DRAWN_KEYS = tuple(key for _, lines, _ in PANELS for key, *_ in lines)
RATIO_TICKS = (1 / 50, 1 / 20, 1 / 10, 1 / 5, 1 / 2, 1, 2, 5, 10, 20, 50)


def has_mismatch(keys: Sequence[str]) -> bool:
    """Whether a run logs training–inference mismatch (any `mismatch/*` scalar)."""
    return any(k.startswith(PREFIX) for k in keys)


# ---------------------------------------------------------------- over steps
def mismatch_figure(scalars, *, alerts: pd.DataFrame | None = None, smoothing: float = 0.0,
                    x_axis: str = "step", log_y: bool = False, max_points: int | None = None,
                    uirevision: str = "run") -> dict:
    """KL (k3, k1), the fractions outside the 2× and 5× bands, k3 on fork vs non-fork tokens and
    the sequence ESS, one panel each (those the run logs), with the alerts on those keys."""
    rows = {key: series(scalars, key, max_points) for key in DRAWN_KEYS}
    panels = [(title, [line for line in lines if not rows[line[0]].empty], axis)
              for title, lines, axis in PANELS]
    panels = [p for p in panels if p[1]]
    if not panels:
        return empty_figure("training–inference mismatch: not logged by this run", height=60)
    gl = use_webgl(sum(map(len, rows.values())))
    data, notes, axes_layout, at = [], [], {}, {}
    for (title, lines, axis), (xref, yref, xa, ya) in zip(panels, grid_axes(len(panels), 2,
                                                                               vgap=0.2)):
        for key, name, color, dash in lines:
            at[key] = (rows[key], xref, yref)
            data += raw_and_smooth(rows[key], key, name=name, color=color, smoothing=smoothing,
                                   x_axis=x_axis, gl=gl, dash=dash, xaxis=xref, yaxis=yref)
        axes_layout["xaxis" + xref[1:]] = {**xa, "type": "date" if x_axis == "wall" else "linear",
                                           "title": {"text": X_TITLES[x_axis], "standoff": 2}}
        axes_layout["yaxis" + yref[1:]] = {**ya, **y_scale(log_y), **({} if log_y else axis)}
        notes.append({"text": title, "xref": "paper", "yref": "paper", "showarrow": False,
                      "x": sum(xa["domain"]) / 2, "y": ya["domain"][1], "xanchor": "center",
                      "yanchor": "bottom", "font": {"size": 12}})
    layers = alert_layers(alerts, at, x_axis, log_y=log_y)
    data += layers["data"]
    layout = base_layout("Training–inference mismatch (trainer vs sampler log p)",
                         height=520 if len(panels) > 2 else 300, x_axis=x_axis, log_y=log_y,
                         uirevision=uirevision, hovermode="x unified", margin={"t": 84},
                         annotations=notes + layers["annotations"], shapes=layers["shapes"])
    layout["title"].update(y=0.985, yanchor="top")
    layout.update(axes_layout)
    if log_y:
        layout = log_annotations(layout, {v[2] for v in at.values()})
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------- one step's ratio histogram
def _bins(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bin_lo, bin_hi, share of the step's tokens, share per nat) of one step, by bin."""
    rows = rows.groupby(["bin_lo", "bin_hi"], as_index=False)["count"].sum().sort_values("bin_lo")
    lo, hi, count = (rows[c].to_numpy(np.float64) for c in ("bin_lo", "bin_hi", "count"))
    share = count / count.sum() if count.sum() > 0 else np.zeros_like(count)
    return lo, hi, share, share / np.maximum(hi - lo, 1e-300)


def _outline(lo: np.ndarray, hi: np.ndarray, density: np.ndarray, base: float
             ) -> tuple[list[float], list[float]]:
    """The histogram's outline as one path along the bins (down to `base`, the log axis's floor,
    where a bin is empty or bins are not adjacent): a bin narrower than a pixel still shows as
    the path's vertical stroke (a bar that thin would not be drawn)."""
    xs: list[float] = []
    ys: list[float] = []
    for left, right, d in zip(lo.tolist(), hi.tolist(), density.tolist()):
        if not xs or not math.isclose(left, xs[-1], abs_tol=1e-12):
            if xs:
                xs.append(xs[-1])
                ys.append(base)
            xs.append(left)
            ys.append(base)
        level = d if d > 0 else base
        xs += [left, right]
        ys += [level, level]
    return xs + [xs[-1]], ys + [base]


def bin_text(lo: float, hi: float) -> str:
    """"log r −0.1 … −0.05 (ratio 0.905–0.951×)"; the end bins also hold every value past them."""
    if lo <= float(MISMATCH_EDGES[0]) + 1e-12:
        return f"log r ≤ {hi:+.3g} (ratio ≤ {math.exp(hi):.3g}×, every token past it)"
    if hi >= float(MISMATCH_EDGES[-1]) - 1e-12:
        return f"log r ≥ {lo:+.3g} (ratio ≥ {math.exp(lo):.3g}×, every token past it)"
    return f"log r {lo:+.3g} … {hi:+.3g} (ratio {math.exp(lo):.3g}–{math.exp(hi):.3g}×)"


def _band_layers(reach: float) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): the 2× band shaded, a dashed line at ±log b for each band b."""
    inner = math.log(MISMATCH_BANDS[0])
    shapes = [{"type": "rect", "xref": "x", "x0": -inner, "x1": inner, "yref": "paper", "y0": 0,
               "y1": 1, "fillcolor": "rgba(47,158,68,0.08)", "line": {"width": 0},
               "layer": "below", "name": "band"}]
    notes = []
    for band in MISMATCH_BANDS:
        for sign in (-1, 1):
            x = sign * math.log(band)
            if abs(x) > reach:
                continue
            color = BAND_COLORS.get(band, "#495057")
            shapes.append({"type": "line", "xref": "x", "x0": x, "x1": x, "yref": "paper",
                           "y0": 0, "y1": 1, "name": f"band {band:g}",
                           "line": {"color": color, "width": 1.5, "dash": "dash"}})
            notes.append({"text": f"{band:g}×" if sign > 0 else f"1/{band:g}×", "x": x,
                          "xref": "x", "y": 1, "yref": "paper", "yanchor": "top",
                          "xanchor": "left" if sign > 0 else "right", "showarrow": False,
                          "font": {"size": 11, "color": color}})
    return shapes, notes


def step_summary(step: int, values: Mapping[str, float] | None) -> str:
    """The shown step's numbers from its stored scalars ("step 40 · 1,024 tokens · outside 2×:
    0.52% · …"): read, not recomputed from the histogram."""
    values = values or {}
    parts = [f"step {step}"]
    if values.get(f"{PREFIX}tokens") is not None:
        parts.append(f"{int(values[f'{PREFIX}tokens']):,} tokens")
    for band in MISMATCH_BANDS:
        value = values.get(f"{PREFIX}frac_outside_{band:g}x")
        if value is not None and math.isfinite(value):
            parts.append(f"outside {band:g}×: {value:.2%}")
    k3 = values.get(f"{PREFIX}kl_k3")
    if k3 is not None and math.isfinite(k3):
        parts.append(f"KL k3 {k3:.3g}")
    return " · ".join(parts)


def ratio_histogram(hist: pd.DataFrame | None, *, step: int | None = None,
                    scalars_at: Mapping[str, float] | None = None, uirevision: str = "run") -> dict:
    """The per-token ratio p_train / p_sampler of one step (`step`, else the newest in `hist`) on
    a log axis, as share of its tokens per nat of log r (log y, so the tails show), the run's
    first step outlined beside it, the 2× band shaded and the 2×/5× bands as dashed lines.
    hist: (step, bin_lo, bin_hi, count) rows of the `mismatch_log_ratio` histogram."""
    if hist is None or hist.empty:
        return empty_figure("no mismatch histogram logged yet", height=120)
    steps = sorted(int(s) for s in hist["step"].unique())
    shown = steps[-1] if step is None or step not in steps else int(step)
    drawn = [(shown, f"step {shown}", True)] + \
        [(steps[0], f"step {steps[0]} (the run's first)", False)] * (steps[0] != shown)
    bins = {s: _bins(hist[hist["step"] == s]) for s, _, _ in drawn}
    positive = np.concatenate([d[d > 0] for _, _, _, d in bins.values()])
    if not len(positive):
        return empty_figure(f"step {shown}: no token with a sampler log p", height=120)
    base = float(positive.min()) / 4
    edges = np.concatenate([np.abs(np.concatenate([lo[d > 0], hi[d > 0]]))
                            for lo, hi, _, d in bins.values()])
    reach = min(max(1.15 * math.log(MISMATCH_BANDS[-1]), float(edges.max())), MISMATCH_LIMIT) + 0.05
    data = []
    for s, name, main in drawn:
        lo, hi, share, density = bins[s]
        xs, ys = _outline(lo, hi, density, base)
        data.append({"type": "scatter", "x": xs, "y": ys, "mode": "lines", "name": name,
                     "fill": "toself" if main else "none", "fillcolor": "rgba(28,126,214,0.35)",
                     "line": {"color": "#1864ab" if main else "#868e96", "width": 1.5,
                              "dash": "solid" if main else "dash"},
                     "hoverinfo": "skip", "meta": {"key": HISTOGRAM_KEY, "role": "ratio",
                                                   "step": s}})
        if main:                       # hover: one invisible point per bin that holds tokens
            kept = density > 0
            data.append({"type": "scatter", "mode": "markers", "showlegend": False,
                         "x": ((lo + hi) / 2)[kept].tolist(), "y": density[kept].tolist(),
                         "marker": {"size": 8, "opacity": 0, "color": "#1864ab"},
                         "hovertext": [f"{bin_text(a, b)}<br>{p:.3%} of the step's tokens"
                                       for a, b, p in zip(lo[kept], hi[kept], share[kept])],
                         "hoverinfo": "text", "meta": {"key": HISTOGRAM_KEY, "role": "bins",
                                                       "step": s}})
    shapes, notes = _band_layers(reach)
    notes.append({"text": step_summary(shown, scalars_at), "xref": "paper", "yref": "paper",
                  "x": 0, "y": 1.0, "yanchor": "bottom", "xanchor": "left", "showarrow": False,
                  "font": {"size": 11, "color": "#495057"}})
    ticks = [r for r in RATIO_TICKS if abs(math.log(r)) <= reach]
    top = float(positive.max())
    layout = base_layout("Per-token ratio p_train / p_sampler", height=520, uirevision=uirevision,
                         hovermode="closest", shapes=shapes, annotations=notes,
                         margin={"t": 64, "r": 20, "b": 64},
                         # inside, top left, under the band labels: a log-y histogram's tails
                         # seldom reach up there
                         legend={"x": 0.01, "xanchor": "left", "y": 0.92, "yanchor": "top",
                                 "orientation": "v", "bgcolor": "rgba(255,255,255,0.85)"},
                         xaxis={"type": "linear", "range": [-reach, reach], "showspikes": False,
                                "tickmode": "array", "tickvals": [math.log(r) for r in ticks],
                                "ticktext": [f"1/{1 / r:g}" if r < 1 else f"{r:g}" for r in ticks],
                                "title": {"text": "ratio p_train / p_sampler (log axis)"},
                                "zeroline": False},
                         yaxis={"type": "log", "exponentformat": "power", "dtick": 1,
                                "range": [math.log10(base), math.log10(top) + 0.3],
                                "title": {"text": "share of tokens per nat of log r"}})
    return {"data": data, "layout": layout}
