"""The compare page's pure figure: several runs overlaid, colour by strategy."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from forksight.dashboard.figures import (FORK_THRESHOLD, base_layout, clean, ema_debiased,
                                         empty_figure, grid_axes, hline, keys_of, line_trace,
                                         pass_keys, series, strategy_color, x_values)
from forksight.dashboard.run_figures import diversity_gap

COMPARE_PANELS = ("entropy/mean", "pass@1", "reward/mean", "gap")


def compare_figure(runs: Sequence[dict], *, panels: Sequence[str] = COMPARE_PANELS,
                   smoothing: float = 0.0, max_points: int | None = None) -> dict:
    """Several runs overlaid, one panel per key, colour by strategy, dash style per run.

    runs: dicts with run_id, label, strategy, scalars (the Reader's DataFrame).
    """
    if not runs:
        return empty_figure("select runs to compare", height=400)
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    axes = grid_axes(len(panels), 2, hgap=0.08, vgap=0.14)
    data, seen = [], {}
    for run in runs:
        strategy = run.get("strategy") or "?"
        dash = dashes[seen.get(strategy, 0) % len(dashes)]
        seen[strategy] = seen.get(strategy, 0) + 1
        scal = run["scalars"]
        for i, (panel, (xref, yref, _, _)) in enumerate(zip(panels, axes)):
            keys = pass_keys(keys_of(scal))
            if panel == "gap":
                rows = diversity_gap(scal, keys[-1], keys[0], max_points) if len(keys) > 1 \
                    else series(None, panel)
            else:
                rows = series(scal, panel, max_points)
            y = rows["value"].to_numpy(np.float64)
            y = ema_debiased(y, smoothing)[0] if smoothing > 0 else y
            data.append(line_trace(x_values(rows, "step"), clean(y), gl=False, dash=dash,
                                   name=f"{run['label']} ({strategy})",
                                   color=strategy_color(strategy),
                                   meta={"key": panel, "role": "compare", "run": run["run_id"]},
                                   showlegend=i == 0, legendgroup=run["run_id"], xaxis=xref,
                                   yaxis=yref))
    notes = [{"text": "pass@G − pass@1 (diversity gap)" if p == "gap" else p, "xref": "paper",
              "yref": "paper", "x": sum(xa["domain"]) / 2, "y": ya["domain"][1],
              "xanchor": "center", "yanchor": "bottom", "showarrow": False}
             for p, (_, _, xa, ya) in zip(panels, axes)]
    shape, _ = hline(FORK_THRESHOLD, "", "#adb5bd", "dot")
    layout = base_layout("Runs compared (colour = strategy)",
                         height=300 * math.ceil(len(panels) / 2) + 80, uirevision="compare",
                         hovermode="closest", annotations=notes,
                         shapes=[shape] if panels and panels[0] == "entropy/mean" else [])
    for xref, yref, xa, ya in axes:
        layout["xaxis" + xref[1:]] = {**layout.get("xaxis" + xref[1:], {}), **xa}
        layout["yaxis" + yref[1:]] = {**layout.get("yaxis" + yref[1:], {}), **ya}
    return {"data": data, "layout": layout}
