"""The tokens page's pure figure: a metric by completion position across training steps."""
from __future__ import annotations

import numpy as np
import pandas as pd

from forksight.dashboard.figures import base_layout, clean, empty_figure

TOKEN_SCALE = [[0, "#fff7ec"], [0.35, "#fdbb84"], [0.7, "#e34a33"], [1, "#7f0000"]]


def position_step_heatmap(tokens: pd.DataFrame | None, metric: str = "entropy",
                          title: str = "") -> dict:
    """Mean `metric` at each completion position (y) across training steps (x)."""
    if tokens is None or tokens.empty:
        return empty_figure("no token rows for this prompt", height=280)
    table = tokens.pivot_table(index="pos", columns="step", values=metric, aggfunc="mean")
    z = table.to_numpy(np.float64)
    trace = {"type": "heatmap", "x": [str(int(s)) for s in table.columns],
             "y": [int(p) for p in table.index], "z": [clean(r) for r in z],
             "colorscale": TOKEN_SCALE, "reversescale": metric == "logp",
             "colorbar": {"title": {"text": metric}, "thickness": 10},
             "hovertemplate": "step %{x}<br>position %{y}<br>" + metric +
                              " %{z:.3f}<extra></extra>"}
    layout = base_layout(title or f"{metric} by position across training", height=300,
                         uirevision="tokens", hovermode="closest",
                         xaxis={"type": "category", "title": {"text": "step"}},
                         yaxis={"autorange": "reversed", "title": {"text": "position"}})
    return {"data": [trace], "layout": layout}
