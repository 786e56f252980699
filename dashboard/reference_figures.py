"""The reference set's figures (pure; docs/algorithms.md §15): the run page's entropy-pattern panel — how
much of the base's pattern the policy keeps over steps (fork overlap, Jaccard, Spearman ρ) and which
tokens it changes (mean |ΔH| per base-entropy decile over steps) — and, for one re-scored step, |ΔH| by
base decile against the first re-scoring after the base, and H at the base against H now, position by
position (the reference page). Drawn only for a run that logs `ref/*`."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from forksight.base.rank_bins import rank_bins
from forksight.dashboard.figures import (X_TITLES, base_layout, clean, empty_figure, grid_axes, panel_notes, series,
                                         spec_lines, use_webgl)

DECILES = 10
KEEP = (("ref/fork_overlap", "base forks still forks", "#c2255c", "solid"),
        ("ref/fork_jaccard", "fork Jaccard index", "#e64980", "dot"),
        ("ref/spearman", "Spearman ρ of H", "#1c7ed6", "solid"))
# d1 (lowest base H) pale ... d10 (the base's forks, mostly) dark
DECILE_COLORS = tuple(f"rgba(232,89,12,{0.15 + 0.85 * d / (DECILES - 1):.2f})" for d in range(DECILES))
BY_DECILE = tuple((f"ref/dh/d{d + 1}", f"d{d + 1}", DECILE_COLORS[d], "solid") for d in range(DECILES))
PANEL_KEYS = tuple(k for k, *_ in KEEP + BY_DECILE)


def has_reference(keys: Sequence[str]) -> bool:
    """Whether a run logs the reference set's scalars the panel draws."""
    return "ref/fork_overlap" in keys or "ref/spearman" in keys


def pattern_figure(scalars: dict[str, pd.DataFrame], *, x_axis: str = "step", max_points: int | None = None,
                   uirevision: str = "run") -> dict:
    """Two panels over the steps the set was re-scored at: how much of the base's entropy pattern is
    kept, and mean |ΔH| from the base within each base-entropy decile."""
    rows = {k: series(scalars, k, max_points) for k in PANEL_KEYS}
    if all(r.empty for r in rows.values()):
        return empty_figure("no reference set in this run: --reference-every N (or forksight rescore) keeps one",
                            height=90)
    gl = use_webgl(sum(map(len, rows.values())))
    (x1, y1, xa1, ya1), (x2, y2, xa2, ya2) = grid_axes(2, 2, hgap=0.1)
    xa1, xa2 = {**xa1, "domain": [0.0, 0.33]}, {**xa2, "domain": [0.5, 0.83]}
    data = spec_lines(rows, KEEP, x_axis=x_axis, xref=x1, yref=y1, gl=gl, legend="legend", hover=".3f",
                      mode="lines+markers") + \
        spec_lines(rows, BY_DECILE, x_axis=x_axis, xref=x2, yref=y2, gl=gl, legend="legend2", hover=".4f",
                   mode="lines+markers")
    notes = panel_notes([("the base's pattern kept (1 = unchanged)", xa1),
                         ("mean |ΔH| from the base, by base-H decile (d10 highest)", xa2)])
    layout = base_layout("Entropy pattern: the reference set re-scored, teacher-forced (the same text at every step)",
                         height=360, x_axis=x_axis, uirevision=uirevision, hovermode="closest", annotations=notes)
    axis = {"type": "date" if x_axis == "wall" else "linear", "title": {"text": X_TITLES[x_axis], "standoff": 2}}
    layout.update({"xaxis": {**xa1, **axis}, "yaxis": {**ya1, "domain": [0.0, 0.9]},   # ρ may go below 0
                   "xaxis2": {**xa2, **axis}, "yaxis2": {**ya2, "rangemode": "tozero", "domain": [0.0, 0.9],
                                                         "title": {"text": "nats"}},
                   "margin": {"l": 55, "r": 10, "t": 60, "b": 48}})
    for name, xa in (("legend", xa1), ("legend2", xa2)):
        layout[name] = {"orientation": "v", "x": xa["domain"][1] + 0.01, "xanchor": "left", "y": 0.9,
                        "yanchor": "top", "font": {"size": 10}, "bgcolor": "rgba(255,255,255,0)", "tracegroupgap": 0}
    return {"data": data, "layout": layout}


def decile_figure(base_h: np.ndarray, now_h: np.ndarray, step: int, first_h: np.ndarray | None = None,
                  first_step: int | None = None) -> dict:
    """Mean |ΔH| from the base in each base-entropy decile at `step`, beside the first re-scoring after the
    base (`first_h` at `first_step`): which tokens training changes, and how that grew."""
    if not len(base_h):
        return empty_figure("no reference tokens", height=90)
    d = rank_bins(base_h, DECILES)                 # as the ref/dh/d* scalars
    names = [f"d{i + 1}" for i in range(DECILES)]

    def bars(h: np.ndarray, label: str, color: str) -> dict:
        means = [float(np.nanmean(np.abs(h[d == i] - base_h[d == i]))) if (d == i).any() else None
                 for i in range(DECILES)]
        # lines over the deciles (the dashboard's plotly bundle draws scatter, scattergl and heatmap only)
        return {"type": "scatter", "mode": "lines+markers", "x": names, "y": clean(np.asarray(means, dtype=np.float64)),
                "name": label, "line": {"color": color, "width": 2}, "marker": {"color": color, "size": 8},
                "hovertemplate": f"{label}<br>%{{x}}: %{{y:.4f}} nats<extra></extra>"}
    data = ([bars(first_h, f"step {first_step}", "rgba(232,89,12,0.35)")] if first_h is not None else []) + \
        [bars(now_h, f"step {step}", "rgba(232,89,12,0.9)")]
    layout = base_layout(f"|ΔH| from the base by base-entropy decile (d1 lowest H … d10 highest): step {step}",
                         height=300, uirevision="decile")
    layout.update({"xaxis": {"title": {"text": "decile of H at the base"}},
                   "yaxis": {"title": {"text": "mean |ΔH| (nats)"}, "rangemode": "tozero"}})
    return {"data": data, "layout": layout}


def scatter_figure(base_h: np.ndarray, now_h: np.ndarray, base_fork: np.ndarray, now_fork: np.ndarray,
                   tokens: Sequence[str], step: int, base_step: int) -> dict:
    """H at the base against H at `step`, one point per reference position, coloured by whether it was a
    fork then and now; the diagonal is "unchanged"."""
    if not len(base_h):
        return empty_figure("no reference tokens", height=90)
    groups = (("fork then and now", base_fork & now_fork, "#c2255c"), ("fork at the base only", base_fork & ~now_fork,
              "#fab005"), ("fork now only", ~base_fork & now_fork, "#1c7ed6"),
              ("neither", ~base_fork & ~now_fork, "rgba(134,142,150,0.6)"))
    text = np.asarray([repr(t)[1:-1] if isinstance(t, str) else "" for t in tokens], dtype=object)
    data = [{"type": "scattergl" if len(base_h) > 5000 else "scatter", "mode": "markers", "name": name,
             "x": clean(base_h[m]), "y": clean(now_h[m]), "text": text[m].tolist(),
             "marker": {"color": color, "size": 6}, "hovertemplate": "%{text}<br>base %{x:.3f} → %{y:.3f}<extra></extra>"}
            for name, m, color in groups if m.any()]
    top = float(np.nanmax(np.r_[base_h, now_h, 0.1]))
    data.append({"type": "scatter", "mode": "lines", "x": [0, top], "y": [0, top], "name": "unchanged",
                 "line": {"color": "#868e96", "dash": "dot", "width": 1}, "hoverinfo": "skip"})
    layout = base_layout(f"H at the base (step {base_step}) vs H at step {step}, each reference position",
                         height=360, uirevision="scatter", hovermode="closest")
    layout.update({"xaxis": {"title": {"text": f"H at step {base_step} (nats)"}, "rangemode": "tozero"},
                   "yaxis": {"title": {"text": f"H at step {step} (nats)"}, "rangemode": "tozero"},
                   "legend": {"orientation": "h", "x": 0, "y": -0.22, "font": {"size": 10}},
                   "margin": {"l": 55, "r": 10, "t": 40, "b": 90}})
    return {"data": data, "layout": layout}
