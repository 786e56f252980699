"""The run page's trust-region panel (pure; docs/algorithms.md §14): where the PPO ratio clip binds
against where the policy really moved (DPPO's binary TV beyond δ), by entropy quartile over steps,
and how often the two disagree — clipped tokens that barely moved, unclipped ones that left the
region. Drawn only for a run that logs `trust/*` (a batch trained more than once, or a DPPO region)."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from forksight.dashboard.figures import (X_TITLES, base_layout, empty_figure, grid_axes, series, use_webgl, spec_lines, panel_notes)

PREFIX = "trust/"
# entropy quartiles, lowest to highest: one colour each, darker as H grows
QUARTILE_COLORS = {1: "#a5d8ff", 2: "#4dabf7", 3: "#1c7ed6", 4: "#0b3d91"}
# left panel: per quartile, the clip's share (solid) and the share with TV > δ (dotted)
BY_QUARTILE = tuple((f"trust/{metric}/q{q}", f"{what} q{q}", QUARTILE_COLORS[q], dash)
                    for metric, what, dash in (("clip_frac", "clipped", "solid"),
                                               ("tv_outside_frac", "TV > δ", "dot"))
                    for q in range(1, 5))
# right panel: the disagreement, the overall shares, and DPPO's mask when a region trains
DISAGREEMENT = (("trust/clipped_inside_frac", "clipped, yet TV ≤ δ (moved little)", "#c92a2a", "solid"),
                ("trust/unclipped_outside_frac", "unclipped, yet TV > δ (left the region)", "#e67700", "solid"),
                ("trust/clip_frac", "all tokens: ratio clip bound", "#495057", "dash"),
                ("trust/tv_outside_frac", "all tokens: TV > δ", "#868e96", "dot"),
                ("trust/masked_frac", "DPPO's region masked", "#2b8a3e", "solid"))
PANEL_KEYS = tuple(k for k, *_ in BY_QUARTILE + DISAGREEMENT)
READ_KEYS = (*PANEL_KEYS, "trust/tv_delta")     # δ names the panel


def has_trust(keys: Sequence[str]) -> bool:
    """Whether a run logs the trust-region scalars the panel draws."""
    return "trust/clip_frac" in keys


def trust_figure(scalars: dict[str, pd.DataFrame], *, x_axis: str = "step",
                 max_points: int | None = None, uirevision: str = "run") -> dict:
    """Two panels over steps: the ratio clip's share against the share beyond DPPO's TV δ in each
    entropy quartile (if the clip binds mostly in the top quartile where TV stays small, it is the
    asymmetry DPPO describes), and the disagreement between the two."""
    rows = {k: series(scalars, k, max_points) for k in PANEL_KEYS}
    if all(r.empty for r in rows.values()):
        return empty_figure("no trust-region scalars in this run: they need a batch trained more than "
                            "once (--updates-per-batch, TRL num_iterations > 1) or a DPPO --trust-region",
                            height=90)
    delta = series(scalars, "trust/tv_delta", None)
    delta_text = f"{float(delta['value'].iloc[-1]):g}" if delta is not None and not delta.empty else "δ"
    gl = use_webgl(sum(map(len, rows.values())))
    (x1, y1, xa1, ya1), (x2, y2, xa2, ya2) = grid_axes(2, 2, hgap=0.1)
    # each plot with its legend to its right (one entry a line)
    xa1, xa2 = {**xa1, "domain": [0.0, 0.33]}, {**xa2, "domain": [0.5, 0.78]}
    data = spec_lines(rows, BY_QUARTILE, x_axis=x_axis, xref=x1, yref=y1, gl=gl, legend="legend", hover=".1%") + \
        spec_lines(rows, DISAGREEMENT, x_axis=x_axis, xref=x2, yref=y2, gl=gl, legend="legend2", hover=".1%")
    notes = panel_notes([("ratio clip (solid) vs TV beyond δ (dotted), by H quartile (q1 lowest … q4 highest)", xa1),
                         ("where the clip and TV disagree", xa2)])
    layout = base_layout(f"Trust region (DPPO's binary TV, δ = {delta_text}; share of trained tokens)",
                         height=360, x_axis=x_axis, uirevision=uirevision, hovermode="closest",
                         annotations=notes)
    axis = {"type": "date" if x_axis == "wall" else "linear", "title": {"text": X_TITLES[x_axis], "standoff": 2}}
    share = {"rangemode": "tozero", "tickformat": ".0%", "zeroline": False}
    layout.update({"xaxis": {**xa1, **axis}, "yaxis": {**ya1, **share, "domain": [0.0, 0.9]},
                   "xaxis2": {**xa2, **axis}, "yaxis2": {**ya2, **share, "domain": [0.0, 0.9]},
                   "margin": {"l": 55, "r": 10, "t": 60, "b": 48}})
    for name, xa in (("legend", xa1), ("legend2", xa2)):
        layout[name] = {"orientation": "v", "x": xa["domain"][1] + 0.01, "xanchor": "left", "y": 0.9,
                        "yanchor": "top", "font": {"size": 10}, "bgcolor": "rgba(255,255,255,0)",
                        "tracegroupgap": 0}
    return {"data": data, "layout": layout}
