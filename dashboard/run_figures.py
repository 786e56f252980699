"""The run page's pure figures: entropy with alerts and forecast, the entropy-distribution
heatmap, reward/pass@k with the diversity gap, and small multiples of any scalar."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from forksight.dashboard.alert_figures import alert_layers, escape_markup, latest_forecast
from forksight.base.constants import ENTROPY_EDGES
from forksight.base.fork_rule import recorded
from forksight.dashboard.figures import (DIAGNOSTIC_KEYS, ENTROPY_COLOR, FORK_THRESHOLD, JS_COLOR,
                                         PASS_COLORS, RENYI_COLOR, SEVERITY_COLOR, X_TITLES,
                                         base_layout, clean, log_annotations, steps_x, y_scale,
                                         downsample_indices, empty_figure,
                                         epoch_seconds, flat_range, grid_axes, hline, keys_of,
                                         line_trace, pass_keys, raw_and_smooth, series,
                                         smoothed, use_webgl, wall_strings, x_values)

HEAT_SCALE = [[0, "#ffffff"], [0.02, "#fff3bf"], [0.1, "#ffa94d"], [0.35, "#e8590c"],
              [1, "#5c0a0a"]]
# heatmap ticks: bin edges at these values (every whole nat: the 0.25-nat bins above 4 must not
# read as 0.1-nat ones), the top drawn bin always labelled with its range
_TICK_EDGES = (0.0, 1e-3, 1e-2, 0.1, FORK_THRESHOLD, *map(float, range(1, 13)))
OVERFLOW_FROM = float(ENTROPY_EDGES[-2])
_TICK_GAP = 3                                 # categories kept clear under the top bin's tick      # the last bin also holds every value past the end


# ---------------------------------------------------------------- run page: entropy
def entropy_figure(scalars: pd.DataFrame, *, alerts: pd.DataFrame | None = None,
                   vocab_size: int | None = None, smoothing: float = 0.0, x_axis: str = "step",
                   log_y: bool = False, max_points: int | None = None,
                   uirevision: str = "run", fork_rule: str | None = None) -> dict:
    """Entropy mean with its p20–p80 band, Rényi-2, JS (right axis), the fork threshold of the run's
    rule (`fork_rule`, its config's: a line at τ, or under `top:q` the step's stored `fork/threshold`) and
    log|V|,
    the forecasted collapse step drawn ahead of the curve, and the alerts routed here: an
    entropy alert's marker, threshold and forecast lines, any other alert as a marker."""
    mean = series(scalars, "entropy/mean", max_points)
    lo, hi = series(scalars, "entropy/p20", max_points), series(scalars, "entropy/p80", max_points)
    renyi, js = series(scalars, "renyi2/mean", max_points), series(scalars, "js/mean", max_points)
    gl = use_webgl(sum(map(len, (mean, lo, hi, renyi, js))))
    data = []
    for rows, key, fill in ((lo, "entropy/p20", "none"), (hi, "entropy/p80", "tonexty")):
        y, meta = clean(rows["value"].to_numpy(np.float64)), {"key": key, "role": "raw"}
        if smoothing > 0:
            y, meta = smoothed(rows["value"].to_numpy(np.float64), smoothing, key)
        data.append(line_trace(x_values(rows, x_axis), y, name="entropy p20–p80", gl=gl,
                               color="rgba(217,72,15,0.35)", width=0.5, fill=fill, meta=meta,
                               fillcolor="rgba(217,72,15,0.13)", showlegend=fill != "none",
                               legendgroup="band", hoverinfo="skip"))
    data += raw_and_smooth(mean, "entropy/mean", name="entropy H (mean)", color=ENTROPY_COLOR,
                           smoothing=smoothing, x_axis=x_axis, gl=gl)
    data += raw_and_smooth(renyi, "renyi2/mean", name="Rényi-2 H2", color=RENYI_COLOR,
                           smoothing=smoothing, x_axis=x_axis, gl=gl)
    js_traces = raw_and_smooth(js, "js/mean", name="JS to group (right axis)", color=JS_COLOR,
                               smoothing=smoothing, x_axis=x_axis, gl=gl, yaxis="y2")
    for trace in js_traces:                 # secondary: dotted, so H stays the eye's anchor
        trace["line"].update(dash="dot", width=1.5)
    data += js_traces
    shapes, notes = [], []
    rule = recorded(fork_rule)
    threshold = series(scalars, "fork/threshold", max_points) if rule.relative else None
    if threshold is not None and not threshold.empty:       # the step's top-q threshold moves with H
        line = line_trace(x_values(threshold, x_axis), clean(threshold["value"].to_numpy(np.float64)),
                          name=f"fork threshold ({rule})", gl=gl, color="#495057", width=1, dash="dot",
                          meta={"key": "fork/threshold", "role": "raw"})
        data.append(line)
        level = threshold["value"].dropna().tolist()
    else:
        tau = rule.value if not rule.relative else FORK_THRESHOLD
        shape, note = hline(tau, f"fork threshold {tau:g}", "#495057", "dot")
        shapes.append(shape)
        notes.append(note)
        level = [tau]
    top = [*level, *hi["value"].dropna().tolist(), *mean["value"].dropna().tolist()]
    if vocab_size:
        log_v = math.log(vocab_size)
        # log|V| is the ceiling; draw it when near the data, else say where it is
        if log_v <= 1.6 * max(top):
            shape, note = hline(log_v, f"log|V| = {log_v:.2f} (uniform)", "#868e96", "dash")
            shapes.append(shape)
            notes.append(note)
        else:
            notes.append({"text": f"log|V| = {log_v:.2f} ↑ (max entropy, off scale)",
                          "xref": "paper", "yref": "paper", "x": 0.0, "y": 1.0,
                          "xanchor": "left", "yanchor": "top", "showarrow": False,
                          "font": {"size": 10, "color": "#868e96"}})
    forecast = forecast_pieces(alerts, mean, x_axis)
    if forecast:
        data.append(forecast["trace"])
        shapes.append(forecast["shape"])
        notes.append(forecast["note"])
    # alerts on an entropy signal explain themselves here; any other routed here (its signal
    # on no chart) is a marker on the mean curve
    layers = alert_layers(alerts, {key: (rows, "x", "y") for key, rows in (
        ("entropy/mean", mean), ("renyi2/mean", renyi), ("entropy/p20", lo),
        ("entropy/p80", hi))}, x_axis, fallback=(mean, "x", "y"), log_y=log_y,
        drawn_forecasts=[forecast["trace"]["meta"]["step"]] if forecast else [])
    data += layers["data"]
    shapes += layers["shapes"]
    notes += layers["annotations"]
    layout = base_layout("Token entropy", height=380, x_axis=x_axis, log_y=log_y,
                         margin={"r": 70},
                         uirevision=uirevision, shapes=shapes, annotations=notes,
                         yaxis={"title": {"text": "nats"}, "rangemode": "tozero"},
                         yaxis2={"title": {"text": "JS (nats)"}, "overlaying": "y",
                                 "side": "right", "rangemode": "tozero", "showgrid": False,
                                 # its own round ticks (synced ones read 0.0466, 0.0931)
                                 "tickmode": "auto", "nticks": 5, **y_scale(log_y),
                                 **_js_range(js, log_y)})
    if log_y:
        layout = log_annotations(layout, {"y", "y2"})
    return {"data": data, "layout": layout}


def _js_range(js: pd.DataFrame, log_y: bool) -> dict:
    # JS is small next to H: keep it in the lower half of the chart so the entropy curve
    # stays what the eye reads first
    top = js["value"].max() if len(js) else None
    if log_y or top is None or not np.isfinite(top) or top <= 0:
        return {}
    return {"range": [0, 2.2 * float(top)], "autorange": False}


def forecast_pieces(alerts: pd.DataFrame | None, mean: pd.DataFrame, x_axis: str) -> dict | None:
    """The forecasted collapse drawn ahead of the curve: a dotted path from the last point
    down to the forecast step and a labelled vertical line there (None when no forecast)."""
    forecast = latest_forecast(alerts)
    if forecast is None or mean.empty or forecast <= int(mean["step"].iloc[-1]):
        return None
    if x_axis == "wall":
        steps, wall = mean["step"].to_numpy(np.float64), epoch_seconds(mean["wall_time"])
        rate = (wall[-1] - wall[0]) / max(steps[-1] - steps[0], 1.0)   # seconds per step
        x_last, x_fc = wall_strings(pd.Series([wall[-1], wall[-1] + rate * (forecast - steps[-1])]))
    else:
        x_last, x_fc = int(mean["step"].iloc[-1]), forecast
    color = SEVERITY_COLOR["critical"]
    return {
        "trace": {"type": "scatter", "x": [x_last, x_fc],
                  "y": [float(mean["value"].iloc[-1]), 0.0], "mode": "lines",
                  "name": f"forecast: collapse ≈ step {forecast}",
                  "line": {"dash": "dot", "color": color, "width": 2},
                  "meta": {"key": "forecast", "role": "forecast", "step": forecast}},
        "shape": {"type": "line", "xref": "x", "x0": x_fc, "x1": x_fc, "yref": "paper",
                  "y0": 0, "y1": 1, "line": {"dash": "dash", "color": color, "width": 1}},
        "note": {"text": f"collapse forecast: step {forecast}", "xref": "x", "x": x_fc,
                 "yref": "paper", "y": 1, "xanchor": "right", "yanchor": "top",
                 "showarrow": False, "font": {"size": 11, "color": color}},
    }


# ---------------------------------------------------------------- run page: histogram heatmap
def histogram_matrix(hist: pd.DataFrame | None, columns: int | None = None
                     ) -> tuple[list[int], list[float], list[float], np.ndarray]:
    """Per-step histograms as (steps, bin_lo, bin_hi, share[step, bin]); each row sums to 1.
    columns: at most this many, consecutive steps merged (their counts summed, each column at its
    last step, as a rollup bucket) into equal runs of columns — so a heatmap's cell count is the
    same on a run of 10,000 steps as on one of 100,000, whatever rollup width it was read at."""
    if hist is None or hist.empty:
        return [], [], [], np.zeros((0, 0))
    # numpy, not pivot_table: 10x faster on 600 steps x 104 bins
    steps, step_idx = np.unique(hist["step"].to_numpy(np.int64), return_inverse=True)
    lo_in, hi_in = (hist[c].to_numpy(np.float64) for c in ("bin_lo", "bin_hi"))
    los = np.unique(lo_in)
    at = np.clip(np.searchsorted(ENTROPY_EDGES, lo_in), 0, len(ENTROPY_EDGES) - 2)
    if np.array_equal(ENTROPY_EDGES[at], lo_in) and np.array_equal(ENTROPY_EDGES[at + 1], hi_in):
        # the shared edges: every bin from the lowest to the highest stored one gets a row, so
        # the axis's spacing is the edges' (a bin never stored is an empty row, not a skipped one)
        first, last = int(at.min()), int(at.max())
        los = ENTROPY_EDGES[first:last + 1]
    bin_idx = np.searchsorted(los, lo_in)
    his = np.zeros(len(los))
    if len(los) > len(np.unique(lo_in)):
        his = ENTROPY_EDGES[int(at.min()) + 1:int(at.max()) + 2].astype(np.float64)
    his[bin_idx] = hi_in
    counts = np.zeros((len(steps), len(los)))
    np.add.at(counts, (step_idx, bin_idx), hist["count"].to_numpy(np.float64))
    if columns is not None and len(steps) > columns:
        # group g holds the steps whose index i has i * columns // n == g: sizes differ by one at most
        group = np.arange(len(steps)) * columns // len(steps)
        ends = np.flatnonzero(np.diff(group, append=columns))
        counts = np.add.reduceat(counts, np.r_[0, ends[:-1] + 1], axis=0)
        steps = steps[ends]
    totals = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    return steps.tolist(), los.tolist(), his.tolist(), share


def bin_labels(los: Sequence[float], his: Sequence[float]) -> list[str]:
    """Bin names ("0.01–0.0126") for the heatmap's categorical y-axis (hover shows them); the
    last bin of ENTROPY_EDGES, which also counts every value past its end, is "≥ 11.75"."""
    return [f"≥ {lo:g}" if lo >= OVERFLOW_FROM else f"{lo:.3g}–{hi:.3g}"
            for lo, hi in zip(los, his)]


def heatmap_ticks(los: Sequence[float], labels: Sequence[str]) -> tuple[list[str], list[str]]:
    """(tick categories, tick texts): each bin starting exactly at a _TICK_EDGES value, named by
    that value, and the top drawn bin named by its whole range, so the axis reaches the data."""
    vals, texts, at = [], [], []
    for edge in _TICK_EDGES:
        hit = [i for i, lo in enumerate(los) if abs(lo - edge) < 1e-9]
        if hit and labels[hit[0]] not in vals:
            vals.append(labels[hit[0]])
            texts.append(f"{edge:g}")
            at.append(hit[0])
    if labels and labels[-1] not in vals:
        # the top bin by its range; whole-nat ticks just under it would print on top of it
        keep = [k for k, i in enumerate(at) if i < len(labels) - 1 - _TICK_GAP]
        vals, texts = [vals[k] for k in keep] + [labels[-1]], [texts[k] for k in keep] + \
            [labels[-1]]
    return vals, texts


def entropy_heatmap(hist: pd.DataFrame | None, *, max_steps: int | None = None,
                    uirevision: str = "run", x_axis: str = "step",
                    walls: pd.DataFrame | None = None) -> dict:
    """Entropy distribution of all tokens per step (share per bin, one column per step, at
    most max_steps: consecutive steps merged): a collapse shows as the mass sliding into the lowest
    bins, an explosion as it rising. walls: (step, wall_time) rows placing the columns on the
    wall-time axis."""
    steps, los, his, share = histogram_matrix(hist, columns=max_steps)
    if not steps:
        return empty_figure("no entropy histograms logged yet", height=320)
    share = share.round(4)            # a share to 0.01%: a third of the bytes of full floats
    used = np.flatnonzero(share.sum(axis=0) > 0)
    top = int(used.max()) + 2 if len(used) else len(los)      # drop the empty bins above
    los, his, share = los[:top], his[:top], share[:, :top]
    labels = bin_labels(los, his)
    tick_vals, tick_text = heatmap_ticks(los, labels)
    xs = steps_x(steps, walls, x_axis)
    trace = {"type": "heatmap", "x": xs, "y": labels, "z": share.tolist(), "transpose": True,
             "zmin": 0, "zmax": float(max(share.max(), 1e-9)), "colorscale": HEAT_SCALE,
             "colorbar": {"title": {"text": "share"}, "thickness": 10, "tickformat": ".0%"},
             "meta": {"key": "histogram", "role": "heatmap", "bins": los},
             "hovertemplate": "%{x}<br>entropy %{y} nats<br>share %{z:.1%}<extra></extra>"}
    median = {"type": "scatter", "x": list(xs), "y": median_labels(share, labels),
              "mode": "lines", "line": {"color": "#1864ab", "width": 2, "shape": "hv"},
              "name": "median token", "hoverinfo": "skip", "showlegend": True,
              "meta": {"key": "histogram", "role": "median", "bins": los}}
    layout = base_layout("Entropy distribution of all tokens per step "
                         "(mass sliding to 0 = collapse)", height=380, uirevision=uirevision,
                         hovermode="closest", x_axis=x_axis,
                         yaxis={"type": "category", "title": {"text": "entropy (nats)"},
                                "tickmode": "array", "tickvals": tick_vals,
                                "ticktext": tick_text})
    return {"data": [trace, median], "layout": layout}


def median_labels(share: np.ndarray, labels: Sequence[str]) -> list[str]:
    """Per step, the label of the bin holding the median token: a line that falls with the
    collapse, so the heatmap reads at a glance."""
    if share.size == 0:
        return []
    idx = (np.cumsum(share, axis=1) >= 0.5).argmax(axis=1)
    return [labels[i] for i in idx]


# ---------------------------------------------------------------- run page: reward and pass@k
def diversity_gap(scalars: pd.DataFrame, hi_key: str, lo_key: str,
                  max_points: int | None = None) -> pd.DataFrame:
    """pass@G − pass@1 per step where both exist (shrinks as entropy collapses)."""
    hi, lo = series(scalars, hi_key), series(scalars, lo_key)
    # numpy's sorted intersection, not DataFrame.merge: 0.2 ms instead of 3.5 ms per draw
    _, at_hi, at_lo = np.intersect1d(hi["step"].to_numpy(np.int64), lo["step"].to_numpy(np.int64),
                                     return_indices=True)
    both = hi.iloc[at_hi].assign(value=hi["value"].to_numpy(np.float64)[at_hi]
                                 - lo["value"].to_numpy(np.float64)[at_lo])
    return both.iloc[downsample_indices(len(both), max_points)].reset_index(drop=True)


def gap_key(keys: Sequence[str]) -> str | None:
    """The diversity gap's signal name as the detectors write it ("pass@8-pass@1")."""
    found = pass_keys(keys)
    return f"{found[-1]}-{found[0]}" if len(found) >= 2 else None


def passk_signals(keys: Sequence[str]) -> list[str]:
    """The signals the reward/pass@k chart shows: reward, every pass@k and their gap."""
    return ["reward/mean", *pass_keys(keys), *filter(None, [gap_key(keys)])]


def passk_figure(scalars: pd.DataFrame, *, alerts: pd.DataFrame | None = None,
                 smoothing: float = 0.0, x_axis: str = "step", max_points: int | None = None,
                 uirevision: str = "run") -> dict:
    """Reward and pass@1…pass@G on top, the diversity gap pass@G − pass@1 below, and the
    alerts on those signals (a stagnation alert as its fitted reward trend)."""
    keys = pass_keys(keys_of(scalars))
    reward = series(scalars, "reward/mean", max_points)
    rows = {k: series(scalars, k, max_points) for k in keys}
    if reward.empty and not any(len(r) for r in rows.values()):
        return empty_figure("reward and pass@k: not logged by this run", height=60)
    gl = use_webgl(len(reward) + sum(map(len, rows.values())))
    data = raw_and_smooth(reward, "reward/mean", name="reward", color="#343a40",
                          smoothing=smoothing, x_axis=x_axis, gl=gl)
    for n, key in enumerate(keys):
        data += raw_and_smooth(rows[key], key, name=key, color=PASS_COLORS[n % len(PASS_COLORS)],
                               smoothing=smoothing, x_axis=x_axis, gl=gl)
    panels = {"reward/mean": (reward, "x", "y"), **{k: (rows[k], "x", "y") for k in keys}}
    if len(keys) >= 2:
        gap = diversity_gap(scalars, keys[-1], keys[0], max_points)
        y, meta = clean(gap["value"].to_numpy(np.float64)), {"key": "gap", "role": "raw"}
        if smoothing > 0:
            y, meta = smoothed(gap["value"].to_numpy(np.float64), smoothing, "gap")
        meta["gap"] = [keys[-1], keys[0]]
        data.append(line_trace(x_values(gap, x_axis), y, gl=gl, color="#2b8a3e", yaxis="y2",
                               name=f"diversity gap {keys[-1]} − {keys[0]}", fill="tozeroy",
                               fillcolor="rgba(43,138,62,0.15)", meta=meta))
        panels[gap_key(keys)] = (gap, "x", "y2")
    layers = alert_layers(alerts, panels, x_axis)
    data += layers["data"]
    # pass@1…pass@G, reward, gap and alert entries wrap the legend to two rows: room above the plot
    layout = base_layout("Reward and pass@k; below, the diversity gap", height=420,
                         x_axis=x_axis, uirevision=uirevision, shapes=layers["shapes"],
                         margin={"t": 84},
                         annotations=layers["annotations"],
                         yaxis={"domain": [0.36, 1.0], "title": {"text": "reward / pass@k"}},
                         yaxis2={"domain": [0.0, 0.28], "anchor": "x", "rangemode": "tozero",
                                 "title": {"text": "gap"}})
    layout["title"].update(y=0.985, yanchor="top")      # the title on top, the legend rows below it
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------- run page: small multiples
def scalar_grid(scalars: pd.DataFrame, keys: Sequence[str] = DIAGNOSTIC_KEYS, *,
                smoothing: float = 0.0, x_axis: str = "step", log_y: bool = False,
                max_points: int | None = None, cols: int = 4, title: str = "Training signals",
                alerts: pd.DataFrame | None = None, uirevision: str = "run") -> dict:
    """Small multiples, one panel per key (fork/selected fraction, cov, loss, KL, …), each with
    the alerts on its key."""
    keys = list(keys)
    if not keys:
        return empty_figure("pick scalars by name above", height=90)
    rows = {k: series(scalars, k, max_points) for k in keys}
    # a signal the run does not log gets no panel (empty axes say nothing); the title names it
    missing = [k for k in keys if rows[k].empty]
    keys = [k for k in keys if not rows[k].empty]
    if not keys:
        return empty_figure(escape_markup(f"{title}: none logged by this run yet "
                                          f"({', '.join(missing)})"), height=60)
    if missing:
        title = f"{title} <span style='font-size:11px;color:#868e96'>(not logged: " \
                f"{escape_markup(', '.join(missing))})</span>"
    cols = min(cols, len(keys))
    gl = use_webgl(sum(map(len, rows.values())))
    data, layout_axes, notes, panels = [], {}, [], {}
    for key, (xref, yref, xa, ya) in zip(keys, grid_axes(len(keys), cols)):
        panels[key] = (rows[key], xref, yref)
        data += raw_and_smooth(rows[key], key, name=key, color="#1c7ed6", smoothing=smoothing,
                               x_axis=x_axis, gl=gl, showlegend=False, xaxis=xref, yaxis=yref)
        layout_axes["xaxis" + xref[1:]] = {**xa, "type": "date" if x_axis == "wall" else "linear"}
        layout_axes["yaxis" + yref[1:]] = {**ya, **y_scale(log_y),
                                           **flat_range(rows[key]["value"], log_y)}
        notes.append({"text": escape_markup(key), "xref": "paper", "yref": "paper",
                      "x": sum(xa["domain"]) / 2, "y": ya["domain"][1], "xanchor": "center", "yanchor": "bottom",
                      "showarrow": False, "font": {"size": 12}})
    layers = alert_layers(alerts, panels, x_axis, log_y=log_y)
    data += layers["data"]
    nrows = math.ceil(len(keys) / cols)
    layout = base_layout(title, height=190 * nrows + 70, x_axis=x_axis, log_y=log_y,
                         uirevision=uirevision, hovermode="closest",
                         annotations=notes + layers["annotations"], shapes=layers["shapes"])
    layout.update(layout_axes)
    for i, (xref, _, _, _) in enumerate(grid_axes(len(keys), cols)):    # x title: bottom row
        if i >= len(keys) - cols:
            layout["xaxis" + xref[1:]]["title"] = {"text": X_TITLES[x_axis], "standoff": 2}
    if log_y:
        layout = log_annotations(layout, {yref for _, yref, _, _ in grid_axes(len(keys), cols)})
    return {"data": data, "layout": layout}
