"""The run page's held-out chart, the cost of collapse (pure): train pass@1 and reward beside the
held-out eval/pass@1, and the held-out pass@k at the largest k against its base value (the run's
first evaluation). Where held-out pass@k falls below that line is what the run lost on problems
it never trains on (Yue et al. 2025): shaded and labelled."""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from forksight.dashboard.alert_figures import alert_layers
from forksight.dashboard.figures import (X_TITLES, base_layout, clean, empty_figure, epoch_seconds,
                                         grid_axes, line_trace, pass_keys, raw_and_smooth, series,
                                         use_webgl, wall_strings, x_values)

EVAL_PATTERN = re.compile(r"eval/pass@(\d+)")
TRAIN_COLOR, HELDOUT_COLOR, REWARD_COLOR = "#1864ab", "#2b8a3e", "#868e96"
BASE_COLOR, COST_COLOR = "#495057", "#c92a2a"
COST_FILL = "rgba(201,42,42,0.22)"


def eval_pass_keys(keys: Sequence[str]) -> list[str]:
    """The held-out eval/pass@k keys present, ordered by k."""
    found = [(int(m.group(1)), k) for k in keys if (m := EVAL_PATTERN.fullmatch(k))]
    return [k for _, k in sorted(found)]


def has_heldout(keys: Sequence[str]) -> bool:
    """Whether a run logs held-out pass@k (any eval/pass@k scalar)."""
    return bool(eval_pass_keys(keys))


def base_point(rows: pd.DataFrame) -> tuple[int, float] | None:
    """(step, value) of the first finite evaluation: the base model's score when it is step 0."""
    ok = rows[np.isfinite(rows["value"].to_numpy(np.float64))] if len(rows) else rows
    return None if ok.empty else (int(ok["step"].iloc[0]), float(ok["value"].iloc[0]))


def base_label(step: int) -> str:
    """The reference line's name: the base model at step 0, else the first evaluation's step
    (a run evaluated first after training began has no base-model score to show)."""
    return "base model (step 0)" if step == 0 else f"first eval (step {step})"


def below_base(x: np.ndarray, y: np.ndarray, base: float) -> tuple[np.ndarray, np.ndarray]:
    """The outline of the area between y and the base line where y < base: the points of
    min(y, base), with the points where the straight segments cross the base line inserted
    (so the shading starts and ends exactly at the crossings). x numeric; NaNs dropped."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    xs, ys = [], []
    for i in range(len(x)):
        if i and (y[i - 1] - base) * (y[i] - base) < 0:       # a segment crossing the line
            t = (base - y[i - 1]) / (y[i] - y[i - 1])
            xs.append(x[i - 1] + t * (x[i] - x[i - 1]))
            ys.append(base)
        xs.append(x[i])
        ys.append(min(y[i], base))
    return np.asarray(xs, np.float64), np.asarray(ys, np.float64)


def _x_numeric(rows: pd.DataFrame, x_axis: str) -> np.ndarray:
    return rows["step"].to_numpy(np.float64) if x_axis == "step" else epoch_seconds(rows["wall_time"])


def _x_out(values: np.ndarray, x_axis: str) -> list:
    if x_axis == "step":        # crossings fall between steps: keep whole steps whole
        return [int(v) if float(v).is_integer() else float(v) for v in values]
    return wall_strings(pd.Series(values))


def cost_traces(rows: pd.DataFrame, base: float, key: str, x_axis: str, xaxis: str, yaxis: str
                ) -> tuple[list[dict], dict | None]:
    """(traces, note): the shaded area where the held-out curve is below its base value, and a
    note at its deepest point ("−0.25 below base at step 120"); none when it never is."""
    x, y = _x_numeric(rows, x_axis), rows["value"].to_numpy(np.float64)
    xs, ys = below_base(x, y, base)
    if not len(ys) or not (ys < base).any():
        return [], None
    xo = _x_out(xs, x_axis)
    meta = {"key": key, "role": "cost", "base": base}
    edge = line_trace(xo, [base] * len(xo), name="base", color="rgba(0,0,0,0)", gl=False,
                      meta=meta, width=0, showlegend=False, legendgroup="cost",
                      hoverinfo="skip", xaxis=xaxis, yaxis=yaxis)
    area = line_trace(xo, clean(ys), name="below base: cost of collapse", color=COST_COLOR,
                      gl=False, meta=meta, width=0.8, fill="tonexty", fillcolor=COST_FILL,
                      legendgroup="cost", hoverinfo="skip", xaxis=xaxis, yaxis=yaxis)
    deepest = int(np.nanargmax(base - y))
    step = int(rows["step"].iloc[deepest])
    note = {"text": f"<b>cost of collapse</b>: {y[deepest] - base:+.2f} vs base at step {step}",
            "xref": xaxis, "yref": yaxis, "x": x_values(rows.iloc[[deepest]], x_axis)[0],
            "y": float(y[deepest]), "ax": 0, "ay": 28, "showarrow": True, "arrowhead": 2,
            # the text toward the panel's middle: past the last step it stretched the x axis
            "xanchor": "right" if deepest > len(rows) / 2 else "left",
            "arrowcolor": COST_COLOR, "font": {"size": 11, "color": COST_COLOR},
            "bgcolor": "rgba(255,255,255,0.85)", "name": "cost"}
    return [edge, area], note


def base_line(base: tuple[int, float], key: str, xref: str, yref: str) -> tuple[dict, dict]:
    """The base value as a dashed horizontal line across the panel, labelled on its right end."""
    step, value = base
    shape = {"type": "line", "xref": f"{xref} domain", "x0": 0, "x1": 1, "yref": yref,
             "y0": value, "y1": value, "name": f"base:{key}",
             "line": {"color": BASE_COLOR, "width": 1.5, "dash": "dash"}}
    note = {"text": f"{base_label(step)}: {value:.2f}", "xref": f"{xref} domain", "x": 0.995,
            "xanchor": "right", "yref": yref, "y": value, "yanchor": "bottom",
            "showarrow": False, "font": {"size": 10, "color": BASE_COLOR}, "name": f"base:{key}"}
    return shape, note


def _heldout_trace(rows: pd.DataFrame, key: str, x_axis: str, xaxis: str, yaxis: str,
                   showlegend: bool) -> dict:
    # evaluations are sparse (every eval_every steps): points joined by lines, never smoothed
    return line_trace(x_values(rows, x_axis), clean(rows["value"].to_numpy(np.float64)),
                      name=f"held-out {key.removeprefix('eval/')}", color=HELDOUT_COLOR,
                      gl=False, meta={"key": key, "role": "raw"}, width=2.4, mode="lines+markers",
                      marker={"size": 6}, showlegend=showlegend, xaxis=xaxis, yaxis=yaxis)


def _unit_range(data: list[dict], yref: str) -> dict:
    # pass@k lives in [0, 1]: a fixed 0–1 axis keeps a drop to 0.6 from reading as a fall to 0;
    # a reward outside [0, 1] (TRL's can be any scale) gets plotly's own range
    ys = np.asarray([v for t in data if t.get("yaxis") == yref for v in t["y"] if v is not None],
                    np.float64)
    inside = not len(ys) or (ys.min() >= 0 and ys.max() <= 1)
    return {"range": [-0.03, 1.05], "autorange": False} if inside else {}


def heldout_figure(scalars, *, alerts: pd.DataFrame | None = None, smoothing: float = 0.0,
                   x_axis: str = "step", max_points: int | None = None,
                   uirevision: str = "run") -> dict:
    """Left: train reward and pass@1 with held-out pass@1 and its base line. Right: held-out
    pass@k at the largest k (train pass@G faint behind it) against its base line, the area
    below the line shaded as the cost of collapse."""
    keys = eval_pass_keys(list(scalars) if isinstance(scalars, dict) else
                          ([] if scalars is None or scalars.empty else scalars["key"].unique()))
    if not keys:
        return empty_figure("held-out pass@k: not logged by this run", height=60)
    train_keys = pass_keys(list(scalars) if isinstance(scalars, dict) else scalars["key"].unique())
    low, high = keys[0], keys[-1]
    (x1, y1, xa1, ya1), (x2, y2, xa2, ya2) = grid_axes(2, 2, hgap=0.08)
    data, shapes, notes, panels = [], [], [], {}
    reward = series(scalars, "reward/mean", max_points)
    train1, top = (series(scalars, k, max_points) if k else series(None, "")
                   for k in (train_keys[0] if train_keys else None,
                             train_keys[-1] if len(train_keys) > 1 else None))
    gl = use_webgl(len(reward) + len(train1) + len(top))    # train curves: one point per step
    data += raw_and_smooth(reward, "reward/mean", name="train reward", color=REWARD_COLOR,
                           smoothing=smoothing, x_axis=x_axis, gl=gl, xaxis=x1, yaxis=y1)
    if train_keys:
        data += raw_and_smooth(train1, train_keys[0], name=f"train {train_keys[0]}",
                               color=TRAIN_COLOR, smoothing=smoothing, x_axis=x_axis, gl=gl,
                               xaxis=x1, yaxis=y1)
    if len(train_keys) > 1:
        faint = raw_and_smooth(top, train_keys[-1], name=f"train {train_keys[-1]}",
                               color=TRAIN_COLOR, smoothing=smoothing, x_axis=x_axis, gl=gl,
                               xaxis=x2, yaxis=y2)
        for trace in faint:
            trace["line"].update(dash="dot", width=1.4)
        data += faint
    for key, xref, yref in ((low, x1, y1), (high, x2, y2)):
        rows = series(scalars, key, max_points)
        panels[key] = (rows, xref, yref)
        base = base_point(rows)
        if base is not None:
            shape, note = base_line(base, key, xref, yref)
            shapes.append(shape)
            notes.append(note)
            if xref == x2:
                traces, cost = cost_traces(rows, base[1], key, x_axis, xref, yref)
                data += traces
                notes += [cost] if cost else []
        data.append(_heldout_trace(rows, key, x_axis, xref, yref, showlegend=xref == x1 or
                                   high != low))
    layers = alert_layers(alerts, panels, x_axis)
    data += layers["data"]
    titles = (f"train {train_keys[0] if train_keys else 'reward'} vs held-out "
              f"{low.removeprefix('eval/')}",
              f"held-out {high.removeprefix('eval/')} vs "
              + ("the base model" if (base_point(series(scalars, high)) or (0,))[0] == 0
                 else "its first evaluation"))
    for text, xa, ya in zip(titles, (xa1, xa2), (ya1, ya2)):
        notes.append({"text": text, "xref": "paper", "yref": "paper", "x": sum(xa["domain"]) / 2,
                      "y": ya["domain"][1], "xanchor": "center", "yanchor": "bottom",
                      "showarrow": False, "font": {"size": 12}})
    layout = base_layout("Held-out pass@k: below the base line = the cost of collapse",
                         height=400, x_axis=x_axis, uirevision=uirevision,
                         shapes=shapes + layers["shapes"], annotations=notes + layers["annotations"],
                         margin={"t": 100},
                         # above the panel titles, not on them
                         legend={"y": 1.1, "yanchor": "bottom"})
    layout["title"].update(y=0.985, yanchor="top")
    for xref, yref, xa, ya in ((x1, y1, xa1, ya1), (x2, y2, xa2, ya2)):
        layout["xaxis" + xref[1:]] = {**layout.get("xaxis" + xref[1:], {}), **xa,
                                      "type": "date" if x_axis == "wall" else "linear",
                                      "title": {"text": X_TITLES[x_axis], "standoff": 2}}
        layout["yaxis" + yref[1:]] = {**layout.get("yaxis" + yref[1:], {}), **ya,
                                      "hoverformat": ".3~r", **_unit_range(data, yref)}
    return {"data": data, "layout": layout}
