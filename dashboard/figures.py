"""Pure figure builders: the Reader's DataFrames in, plotly figure dicts out.

No Dash and no Reader here, so every chart is unit-tested on a DataFrame. Figures are plain
dicts (plotly's JSON), not `go.Figure`: building the validated objects cost 0.2–0.5 s per
chart on the CI machine, more than the whole 300 ms callback budget (tests still validate
them with go.Figure). Every growing trace carries `meta={"key", "role"}` so the live tick
appends new steps with a Patch (dashboard/live.py) instead of redrawing.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

FORK_THRESHOLD = 0.672          # 80th-percentile entropy of Wang et al. (ALGORITHMS.md §3)
SCATTERGL_AFTER = 15_000        # SVG gets sluggish past this many points per figure
DIAGNOSTIC_KEYS = ("fork/frac", "selected/frac", "cov/logp_adv", "loss", "kl", "grad_norm",
                   "length/mean", "top1/mean")
STRATEGY_COLORS = {"all": "#1f77b4", "fork": "#d62728", "ict": "#2ca02c", "random": "#7f7f7f",
                   "stapo": "#9467bd", "maxtok": "#ff7f0e", "mintok": "#8c564b",
                   "rand1tok": "#e377c2", "trl": "#17becf"}
_FALLBACK_COLORS = ("#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39")
ENTROPY_COLOR, RENYI_COLOR, JS_COLOR = "#d9480f", "#5f3dc4", "#0b7285"
SEVERITY_SYMBOL = {"critical": "x", "warning": "triangle-up"}
SEVERITY_COLOR = {"critical": "#c92a2a", "warning": "#e67700"}
SPARK_CHARS = "▁▂▃▄▅▆▇█"
HEAT_SCALE = [[0, "#ffffff"], [0.02, "#fff3bf"], [0.1, "#ffa94d"], [0.35, "#e8590c"],
              [1, "#5c0a0a"]]
TOKEN_SCALE = [[0, "#fff7ec"], [0.35, "#fdbb84"], [0.7, "#e34a33"], [1, "#7f0000"]]
_TICK_EDGES = (0.0, 1e-3, 1e-2, 0.1, FORK_THRESHOLD, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0)


# ---------------------------------------------------------------- numeric helpers
def ema_debiased(values: Sequence[float], beta: float, acc: float = 0.0, count: int = 0
                 ) -> tuple[np.ndarray, float, int]:
    """nanochat's debiased EMA `acc_t / (1 - beta^t)`; returns (smoothed, acc, count) so a
    later call resumes it. NaNs pass through without touching the accumulator; beta=0 is
    the identity."""
    vals = np.asarray(values, dtype=np.float64)
    ok = ~np.isnan(vals)
    if count == 0 and 0 < beta < 1 and ok.any():
        # a fresh curve: pandas' adjusted EWM is this same debiased mean, in compiled code
        # (the Python loop below cost ~10 ms per 2,000-point series)
        smoothed = pd.Series(vals).ewm(alpha=1.0 - beta, adjust=True,
                                       ignore_na=True).mean().to_numpy(copy=True)
        smoothed[~ok] = np.nan
        count = int(ok.sum())
        return smoothed, float(smoothed[ok][-1] * (1.0 - beta ** count)), count
    out = np.full(vals.shape, np.nan)
    for i, x in enumerate(vals):        # resuming a live curve: a handful of new points
        if math.isnan(x):
            continue
        acc = beta * acc + (1.0 - beta) * x
        count += 1
        out[i] = acc / (1.0 - beta ** count) if beta > 0 else x
    return out, float(acc), int(count)


def downsample_indices(n: int, max_points: int | None) -> np.ndarray:
    """Evenly spaced indices into n points, at most max_points, always keeping first and last."""
    if max_points is None or n <= max_points:
        return np.arange(n)
    if max_points < 2:
        raise ValueError(f"max_points must be >= 2 to keep both endpoints, got {max_points}")
    return np.unique(np.round(np.linspace(0, n - 1, max_points)).astype(np.int64))


def use_webgl(n_points: int) -> bool:
    """True when a figure holds enough points that WebGL (scattergl) beats SVG."""
    return n_points > SCATTERGL_AFTER


Scalars = "pd.DataFrame | dict[str, pd.DataFrame]"   # the Reader's frame, or by_key() of it


def by_key(scalars: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """Split the Reader's long frame once into {key: rows sorted by step}: filtering the long
    frame per key per chart cost more than the whole query on a 10,000-step run."""
    if scalars is None or scalars.empty:
        return {}
    out = {}
    for key, rows in scalars.groupby("key", sort=False):
        out[key] = rows if rows["step"].is_monotonic_increasing else \
            rows.sort_values("step", kind="stable")
    return out


def keys_of(scalars) -> list[str]:
    """The keys present in a Reader frame or a by_key() dict."""
    if isinstance(scalars, dict):
        return list(scalars)
    return [] if scalars is None or scalars.empty else scalars["key"].unique().tolist()


_EMPTY = pd.DataFrame({"step": pd.Series([], dtype="int64"),
                       "value": pd.Series([], dtype="float64"),
                       "wall_time": pd.Series([], dtype="float64")})


def series(scalars, key: str, max_points: int | None = None) -> pd.DataFrame:
    """One key's rows sorted by step (step, value, wall_time), downsampled to max_points."""
    if isinstance(scalars, dict):
        rows = scalars.get(key, _EMPTY)
    elif scalars is None or scalars.empty:
        rows = _EMPTY
    else:
        rows = scalars[scalars["key"] == key].sort_values("step", kind="stable")
    if max_points is not None and len(rows) > max_points:
        rows = rows.iloc[downsample_indices(len(rows), max_points)]
    return rows


def x_values(rows: pd.DataFrame, x_axis: str) -> list:
    """The x coordinates of rows: steps, or wall times as ISO strings (JSON-safe for Patch)."""
    if x_axis == "step":
        return rows["step"].astype("int64").tolist()
    if x_axis != "wall":
        raise ValueError(f"x_axis must be 'step' or 'wall', got {x_axis!r}")
    return wall_strings(rows["wall_time"])


def epoch_seconds(wall: pd.Series) -> np.ndarray:
    """Wall times as float seconds since the epoch, whether stored as numbers or timestamps."""
    if pd.api.types.is_numeric_dtype(wall):
        return wall.to_numpy(np.float64)
    times = pd.to_datetime(wall, utc=True)
    return (times - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(np.float64)


def wall_strings(wall: pd.Series) -> list[str]:
    """Wall times as local-free ISO strings plotly reads as dates (the store keeps unix s)."""
    if len(wall) == 0:
        return []
    times = pd.to_datetime(pd.Series(epoch_seconds(pd.Series(wall))), unit="s")
    return list(times.dt.strftime("%Y-%m-%d %H:%M:%S.%f"))


def pass_keys(keys: Sequence[str]) -> list[str]:
    """The pass@k keys present, ordered by k (pass@1, pass@2, …); eval/pass@k excluded."""
    found = [(int(m.group(1)), k) for k in keys if (m := re.fullmatch(r"pass@(\d+)", k))]
    return [k for _, k in sorted(found)]


def sparkline(values: Sequence[float], width: int = 24, floor: float | None = 0.0) -> str:
    """Unicode block sparkline of the last `width` values (plain text: safe in any cell).
    The scale starts at `floor` (0 for entropy) so a flat run looks flat and a collapse
    looks like one; floor=None scales min..max."""
    vals = np.asarray([v for v in values if v is not None and not math.isnan(v)], float)[-width:]
    if len(vals) == 0:
        return ""
    lo, hi = float(vals.min()), float(vals.max())
    if floor is not None:
        lo = min(lo, floor)
    if hi - lo < 1e-12:
        return SPARK_CHARS[3] * len(vals)
    idx = np.round((vals - lo) / (hi - lo) * (len(SPARK_CHARS) - 1)).astype(int)
    return "".join(SPARK_CHARS[i] for i in idx)


def strategy_color(strategy: str | None) -> str:
    """A stable colour per strategy so `all`, `fork` and `ict` read the same on every page."""
    if strategy in STRATEGY_COLORS:
        return STRATEGY_COLORS[strategy]
    return _FALLBACK_COLORS[sum(map(ord, strategy or "")) % len(_FALLBACK_COLORS)]


# ---------------------------------------------------------------- figure pieces
def _line(x: list, y: list, *, name: str, color: str, meta: dict, gl: bool,
          opacity: float = 1.0, width: float = 2.0, dash: str = "solid", showlegend: bool = True,
          legendgroup: str | None = None, xaxis: str = "x", yaxis: str = "y", **kw) -> dict:
    return {"type": "scattergl" if gl else "scatter", "x": x, "y": y, "name": name,
            "mode": "lines", "opacity": opacity, "meta": meta, "xaxis": xaxis, "yaxis": yaxis,
            "line": {"color": color, "width": width, "dash": dash}, "showlegend": showlegend,
            "legendgroup": legendgroup or name, **kw}


def _clean(values: np.ndarray | Sequence[float]) -> list:
    """Floats for JSON: NaN becomes None (a gap in the line), never the invalid token NaN."""
    arr = np.asarray(values, dtype=np.float64)
    if not np.isnan(arr).any():
        return arr.tolist()
    out = arr.astype(object)
    out[np.isnan(arr)] = None
    return out.tolist()


def _smoothed(y: Sequence[float], smoothing: float, key: str) -> tuple[list, dict]:
    """EMA values plus the trace meta that lets the live tick resume the same EMA."""
    values, acc, count = ema_debiased(y, smoothing)
    return _clean(values), {"key": key, "role": "smooth", "ema": [acc, count]}


def _raw_and_smooth(rows: pd.DataFrame, key: str, *, name: str, color: str, smoothing: float,
                    x_axis: str, gl: bool, showlegend: bool = True, **axes) -> list[dict]:
    """Raw values (faint when smoothing) plus the debiased EMA on top, as in TensorBoard."""
    x = x_values(rows, x_axis)
    y = rows["value"].to_numpy(np.float64)
    traces = [_line(x, _clean(y), name=name, color=color, gl=gl, meta={"key": key, "role": "raw"},
                    opacity=0.25 if smoothing > 0 else 1.0, width=1.2 if smoothing else 2.0,
                    showlegend=showlegend and smoothing == 0, legendgroup=name, **axes)]
    if smoothing > 0:
        values, meta = _smoothed(y, smoothing, key)
        traces.append(_line(list(x), values, name=name, color=color, gl=gl, meta=meta,
                            showlegend=showlegend, legendgroup=name, **axes))
    return traces


def _hline(y: float, text: str, color: str, dash: str, yref: str = "y",
           xref: str = "x domain") -> tuple[dict, dict]:
    shape = {"type": "line", "xref": xref, "x0": 0, "x1": 1, "yref": yref, "y0": y, "y1": y,
             "line": {"color": color, "width": 1, "dash": dash}}
    note = {"text": text, "xref": xref, "x": 0.005, "xanchor": "left", "yref": yref, "y": y,
            "yanchor": "bottom", "showarrow": False, "font": {"size": 10, "color": color}}
    return shape, note


def _layout(title: str, *, height: int, x_axis: str = "step", log_y: bool = False,
            uirevision: str = "run", **extra) -> dict:
    layout = {"template": "plotly_white", "height": height, "uirevision": uirevision,
              "title": {"text": title, "x": 0.01, "font": {"size": 14}},
              "margin": {"l": 55, "r": 25, "t": 42, "b": 32}, "hovermode": "x unified",
              "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1,
                         "xanchor": "right", "font": {"size": 11}},
              "xaxis": {"type": "date" if x_axis == "wall" else "linear", "showspikes": True},
              "yaxis": {"type": "log" if log_y else "linear"}}
    for k, v in extra.items():
        layout[k] = {**layout.get(k, {}), **v} if isinstance(v, dict) else v
    return layout


def _flat_range(values: pd.Series) -> dict:
    """A fixed y-range for a (nearly) constant series: autorange would magnify float noise
    (0.9999999 vs 1.0) into spikes."""
    vals = values.dropna().to_numpy(np.float64)
    if len(vals) == 0 or np.ptp(vals) > 1e-6 * max(1.0, float(np.abs(vals).max())):
        return {}
    mid = float(vals.mean())
    pad = max(abs(mid) * 0.5, 1e-3)
    return {"range": [mid - pad, mid + pad], "autorange": False}


def empty_figure(message: str, height: int = 300) -> dict:
    """A blank chart that says why it is blank (no run, no data yet)."""
    return {"data": [], "layout": {
        "template": "plotly_white", "height": height, "xaxis": {"visible": False},
        "yaxis": {"visible": False}, "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
        "annotations": [{"text": message, "showarrow": False, "xref": "paper", "yref": "paper",
                         "x": 0.5, "y": 0.5, "font": {"size": 14, "color": "#868e96"}}]}}


# ---------------------------------------------------------------- run page: entropy
def entropy_figure(scalars: pd.DataFrame, *, alerts: pd.DataFrame | None = None,
                   vocab_size: int | None = None, smoothing: float = 0.0, x_axis: str = "step",
                   log_y: bool = False, max_points: int | None = None,
                   uirevision: str = "run") -> dict:
    """Entropy mean with its p20–p80 band, Rényi-2, JS (right axis), fork and log|V| lines,
    alert markers and the forecasted collapse step drawn ahead of the curve."""
    mean = series(scalars, "entropy/mean", max_points)
    lo, hi = series(scalars, "entropy/p20", max_points), series(scalars, "entropy/p80", max_points)
    renyi, js = series(scalars, "renyi2/mean", max_points), series(scalars, "js/mean", max_points)
    gl = use_webgl(sum(map(len, (mean, lo, hi, renyi, js))))
    data = []
    for rows, key, fill in ((lo, "entropy/p20", "none"), (hi, "entropy/p80", "tonexty")):
        y, meta = _clean(rows["value"].to_numpy(np.float64)), {"key": key, "role": "raw"}
        if smoothing > 0:
            y, meta = _smoothed(rows["value"].to_numpy(np.float64), smoothing, key)
        data.append(_line(x_values(rows, x_axis), y, name="entropy p20–p80", gl=gl,
                          color="rgba(217,72,15,0.35)", width=0.5, fill=fill, meta=meta,
                          fillcolor="rgba(217,72,15,0.13)", showlegend=fill != "none",
                          legendgroup="band", hoverinfo="skip"))
    data += _raw_and_smooth(mean, "entropy/mean", name="entropy H (mean)", color=ENTROPY_COLOR,
                            smoothing=smoothing, x_axis=x_axis, gl=gl)
    data += _raw_and_smooth(renyi, "renyi2/mean", name="Rényi-2 H2", color=RENYI_COLOR,
                            smoothing=smoothing, x_axis=x_axis, gl=gl)
    js_traces = _raw_and_smooth(js, "js/mean", name="JS to group (right axis)", color=JS_COLOR,
                                smoothing=smoothing, x_axis=x_axis, gl=gl, yaxis="y2")
    for trace in js_traces:                 # secondary: dotted, so H stays the eye's anchor
        trace["line"].update(dash="dot", width=1.5)
    data += js_traces
    data.append(alert_trace(alerts, mean, x_axis))
    shapes, notes = [], []
    for shape, note in (_hline(FORK_THRESHOLD, "fork threshold 0.672", "#495057", "dot"),):
        shapes.append(shape)
        notes.append(note)
    top = [FORK_THRESHOLD, *hi["value"].dropna().tolist(), *mean["value"].dropna().tolist()]
    if vocab_size:
        log_v = math.log(vocab_size)
        # log|V| is the ceiling; draw it when near the data, else say where it is
        if log_v <= 1.6 * max(top):
            shape, note = _hline(log_v, f"log|V| = {log_v:.2f} (uniform)", "#868e96", "dash")
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
    layout = _layout("Token entropy", height=380, x_axis=x_axis, log_y=log_y,
                     margin={"r": 70},
                     uirevision=uirevision, shapes=shapes, annotations=notes,
                     yaxis={"title": {"text": "nats"}, "rangemode": "tozero"},
                     yaxis2={"title": {"text": "JS (nats)"}, "overlaying": "y", "side": "right",
                             "rangemode": "tozero", "showgrid": False,
                             "type": "log" if log_y else "linear", **_js_range(js, log_y)})
    return {"data": data, "layout": layout}


def _js_range(js: pd.DataFrame, log_y: bool) -> dict:
    # JS is small next to H: keep it in the lower half of the chart so the entropy curve
    # stays what the eye reads first
    top = js["value"].max() if len(js) else None
    if log_y or top is None or not np.isfinite(top) or top <= 0:
        return {}
    return {"range": [0, 2.2 * float(top)], "autorange": False}


def alert_text(alert: dict) -> str:
    """One line per alert for hovers and the banner: severity, step, message, what to do."""
    action = alert.get("action") or ""
    text = (f"{alert.get('severity', '')} · {alert.get('detector', '')} at step "
            f"{int(alert.get('step', 0))}: {alert.get('message', '')}")
    return f"{text} → {action}" if action else text


def alert_trace(alerts: pd.DataFrame | None, mean: pd.DataFrame, x_axis: str) -> dict:
    """Alerts as markers on the entropy curve (hover: detector, message, recommendation)."""
    x, y, text, colors, symbols = [], [], [], [], []
    if alerts is not None and not alerts.empty and not mean.empty:
        steps = mean["step"].to_numpy()
        for a in alerts.sort_values("step").to_dict("records"):
            # the nearest drawn point: the curve may be downsampled
            i = int(np.clip(np.searchsorted(steps, a["step"]), 0, len(steps) - 1))
            x.append(x_values(mean.iloc[[i]], x_axis)[0] if x_axis == "wall" else int(a["step"]))
            y.append(float(mean["value"].iloc[i]))
            text.append(alert_text(a))
            colors.append(SEVERITY_COLOR.get(a.get("severity"), "#e67700"))
            symbols.append(SEVERITY_SYMBOL.get(a.get("severity"), "circle"))
    return {"type": "scatter", "x": x, "y": y, "mode": "markers", "name": "alerts",
            "hovertext": text, "hoverinfo": "text", "meta": {"key": "alerts", "role": "alerts"},
            "marker": {"size": 13, "color": colors, "symbol": symbols,
                       "line": {"width": 1.5, "color": "#ffffff"}}}


def latest_forecast(alerts: pd.DataFrame | None) -> int | None:
    """The forecast step of the most recent alert that has one (None when none forecast)."""
    if alerts is None or alerts.empty or "forecast" not in alerts:
        return None
    has = alerts[alerts["forecast"].notna()]
    if has.empty:
        return None
    return int(has.sort_values("step")["forecast"].iloc[-1])


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
def histogram_matrix(hist: pd.DataFrame | None) -> tuple[list[int], list[float], list[float],
                                                         np.ndarray]:
    """Per-step histograms as (steps, bin_lo, bin_hi, share[step, bin]); each row sums to 1."""
    if hist is None or hist.empty:
        return [], [], [], np.zeros((0, 0))
    # numpy, not pivot_table: 10x faster on 600 steps x 104 bins
    steps, step_idx = np.unique(hist["step"].to_numpy(np.int64), return_inverse=True)
    los, bin_idx = np.unique(hist["bin_lo"].to_numpy(np.float64), return_inverse=True)
    his = np.zeros(len(los))
    his[bin_idx] = hist["bin_hi"].to_numpy(np.float64)
    counts = np.zeros((len(steps), len(los)))
    np.add.at(counts, (step_idx, bin_idx), hist["count"].to_numpy(np.float64))
    totals = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    return steps.tolist(), los.tolist(), his.tolist(), share


def bin_labels(los: Sequence[float], his: Sequence[float]) -> list[str]:
    """Bin names ("0.01–0.0126") for the heatmap's categorical y-axis (hover shows them)."""
    return [f"{lo:.3g}–{hi:.3g}" for lo, hi in zip(los, his)]


def entropy_heatmap(hist: pd.DataFrame | None, *, max_steps: int | None = None,
                    uirevision: str = "run") -> dict:
    """Entropy distribution of all tokens per step (share per bin, one column per step, at
    most max_steps evenly spaced): a collapse shows as the mass sliding into the lowest
    bins, an explosion as it rising."""
    steps, los, his, share = histogram_matrix(hist)
    if not steps:
        return empty_figure("no entropy histograms logged yet", height=320)
    keep = downsample_indices(len(steps), max_steps)
    steps, share = [steps[i] for i in keep], share[keep]
    used = np.flatnonzero(share.sum(axis=0) > 0)
    top = int(used.max()) + 2 if len(used) else len(los)      # drop the empty bins above
    los, his, share = los[:top], his[:top], share[:, :top]
    labels = bin_labels(los, his)
    ticks = [labels[int(np.argmin(np.abs(np.asarray(los) - e)))] for e in _TICK_EDGES
             if e <= los[-1]]
    text = [f"{lo:g}" for lo in los]
    trace = {"type": "heatmap", "x": steps, "y": labels, "z": share.tolist(), "transpose": True,
             "zmin": 0, "zmax": float(max(share.max(), 1e-9)), "colorscale": HEAT_SCALE,
             "colorbar": {"title": {"text": "share"}, "thickness": 10, "tickformat": ".0%"},
             "meta": {"key": "histogram", "role": "heatmap", "bins": los},
             "hovertemplate": "step %{x}<br>entropy %{y} nats<br>share %{z:.1%}<extra></extra>"}
    median = {"type": "scatter", "x": list(steps), "y": median_labels(share, labels),
              "mode": "lines", "line": {"color": "#1864ab", "width": 2, "shape": "hv"},
              "name": "median token", "hoverinfo": "skip", "showlegend": True,
              "meta": {"key": "histogram", "role": "median", "bins": los}}
    tick_text = [text[labels.index(t)] for t in dict.fromkeys(ticks)]
    layout = _layout("Entropy distribution of all tokens per step (mass sliding to 0 = collapse)",
                     height=330, uirevision=uirevision, hovermode="closest",
                     yaxis={"type": "category", "title": {"text": "entropy (nats)"},
                            "tickmode": "array", "tickvals": list(dict.fromkeys(ticks)),
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
    both = hi.merge(lo[["step", "value"]], on="step", suffixes=("", "_lo"))
    both = both.assign(value=both["value"] - both["value_lo"]).drop(columns="value_lo")
    return both.iloc[downsample_indices(len(both), max_points)]


def passk_figure(scalars: pd.DataFrame, *, smoothing: float = 0.0, x_axis: str = "step",
                 max_points: int | None = None, uirevision: str = "run") -> dict:
    """Reward and pass@1…pass@G on top, the diversity gap pass@G − pass@1 below."""
    keys = pass_keys(keys_of(scalars))
    reward = series(scalars, "reward/mean", max_points)
    rows = {k: series(scalars, k, max_points) for k in keys}
    gl = use_webgl(len(reward) + sum(map(len, rows.values())))
    data = _raw_and_smooth(reward, "reward/mean", name="reward", color="#343a40",
                           smoothing=smoothing, x_axis=x_axis, gl=gl)
    for shade, key in zip(np.linspace(0.0, 0.7, max(len(keys), 1)), keys):
        rgb = tuple(int(a + (b - a) * shade) for a, b in zip((24, 100, 171), (165, 216, 255)))
        data += _raw_and_smooth(rows[key], key, name=key, color=f"rgb{rgb}",
                                smoothing=smoothing, x_axis=x_axis, gl=gl)
    if len(keys) >= 2:
        gap = diversity_gap(scalars, keys[-1], keys[0], max_points)
        y, meta = _clean(gap["value"].to_numpy(np.float64)), {"key": "gap", "role": "raw"}
        if smoothing > 0:
            y, meta = _smoothed(gap["value"].to_numpy(np.float64), smoothing, "gap")
        meta["gap"] = [keys[-1], keys[0]]
        data.append(_line(x_values(gap, x_axis), y, gl=gl, color="#2b8a3e", yaxis="y2",
                          name=f"diversity gap {keys[-1]} − {keys[0]}", fill="tozeroy",
                          fillcolor="rgba(43,138,62,0.15)", meta=meta))
    layout = _layout("Reward, pass@k and the diversity gap pass@G − pass@1", height=390,
                     x_axis=x_axis, uirevision=uirevision,
                     yaxis={"domain": [0.36, 1.0], "title": {"text": "reward / pass@k"}},
                     yaxis2={"domain": [0.0, 0.28], "anchor": "x", "rangemode": "tozero",
                             "title": {"text": "gap"}})
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------- run page: small multiples
def _grid_axes(n: int, cols: int, hgap: float = 0.06, vgap: float = 0.16
               ) -> list[tuple[str, str, dict, dict]]:
    """(xref, yref, xaxis layout, yaxis layout) for n panels laid out cols wide."""
    rows = math.ceil(n / cols)
    width, height = (1 - hgap * (cols - 1)) / cols, (1 - vgap * (rows - 1)) / rows
    out = []
    for i in range(n):
        r, c = divmod(i, cols)
        x0, y1 = c * (width + hgap), 1 - r * (height + vgap)
        name = "" if i == 0 else str(i + 1)
        clip = (lambda v: round(min(max(v, 0.0), 1.0), 6))   # float dust outside [0, 1]
        out.append((f"x{name}", f"y{name}",
                    {"domain": [clip(x0), clip(x0 + width)], "anchor": f"y{name}"},
                    {"domain": [clip(y1 - height), clip(y1)], "anchor": f"x{name}"}))
    return out


def scalar_grid(scalars: pd.DataFrame, keys: Sequence[str] = DIAGNOSTIC_KEYS, *,
                smoothing: float = 0.0, x_axis: str = "step", log_y: bool = False,
                max_points: int | None = None, cols: int = 4, title: str = "Training signals",
                uirevision: str = "run") -> dict:
    """Small multiples, one panel per key (fork/selected fraction, cov, loss, KL, …)."""
    keys = list(keys)
    if not keys:
        return empty_figure("pick scalars by name above", height=90)
    cols = min(cols, len(keys))
    rows = {k: series(scalars, k, max_points) for k in keys}
    gl = use_webgl(sum(map(len, rows.values())))
    data, layout_axes, notes = [], {}, []
    for key, (xref, yref, xa, ya) in zip(keys, _grid_axes(len(keys), cols)):
        data += _raw_and_smooth(rows[key], key, name=key, color="#1c7ed6", smoothing=smoothing,
                                x_axis=x_axis, gl=gl, showlegend=False, xaxis=xref, yaxis=yref)
        layout_axes["xaxis" + xref[1:]] = {**xa, "type": "date" if x_axis == "wall" else "linear"}
        layout_axes["yaxis" + yref[1:]] = {**ya, "type": "log" if log_y else "linear",
                                           **_flat_range(rows[key]["value"])}
        label = key if len(rows[key]) else f"{key} (not logged)"
        notes.append({"text": label, "xref": "paper", "yref": "paper", "x": sum(xa["domain"]) / 2,
                      "y": ya["domain"][1], "xanchor": "center", "yanchor": "bottom",
                      "showarrow": False, "font": {"size": 12}})
    nrows = math.ceil(len(keys) / cols)
    layout = _layout(title, height=190 * nrows + 70, x_axis=x_axis, log_y=log_y,
                     uirevision=uirevision, hovermode="closest", annotations=notes)
    layout.update(layout_axes)
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------- compare page
COMPARE_PANELS = ("entropy/mean", "pass@1", "reward/mean", "gap")


def compare_figure(runs: Sequence[dict], *, panels: Sequence[str] = COMPARE_PANELS,
                   smoothing: float = 0.0, max_points: int | None = None) -> dict:
    """Several runs overlaid, one panel per key, colour by strategy, dash style per run.

    runs: dicts with run_id, label, strategy, scalars (the Reader's DataFrame).
    """
    if not runs:
        return empty_figure("select runs to compare", height=400)
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    axes = _grid_axes(len(panels), 2, hgap=0.08, vgap=0.14)
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
            data.append(_line(x_values(rows, "step"), _clean(y), gl=False, dash=dash,
                              name=f"{run['label']} ({strategy})", color=strategy_color(strategy),
                              meta={"key": panel, "role": "compare", "run": run["run_id"]},
                              showlegend=i == 0, legendgroup=run["run_id"], xaxis=xref,
                              yaxis=yref))
    notes = [{"text": "pass@G − pass@1 (diversity gap)" if p == "gap" else p, "xref": "paper",
              "yref": "paper", "x": sum(xa["domain"]) / 2, "y": ya["domain"][1],
              "xanchor": "center", "yanchor": "bottom", "showarrow": False}
             for p, (_, _, xa, ya) in zip(panels, axes)]
    shape, _ = _hline(FORK_THRESHOLD, "", "#adb5bd", "dot")
    layout = _layout("Runs compared (colour = strategy)", height=300 * math.ceil(len(panels) / 2)
                     + 80, uirevision="compare", hovermode="closest", annotations=notes,
                     shapes=[shape] if panels and panels[0] == "entropy/mean" else [])
    for xref, yref, xa, ya in axes:
        layout["xaxis" + xref[1:]] = {**layout.get("xaxis" + xref[1:], {}), **xa}
        layout["yaxis" + yref[1:]] = {**layout.get("yaxis" + yref[1:], {}), **ya}
    return {"data": data, "layout": layout}


# ---------------------------------------------------------------- tokens page
def position_step_heatmap(tokens: pd.DataFrame | None, metric: str = "entropy",
                          title: str = "") -> dict:
    """Mean `metric` at each completion position (y) across training steps (x)."""
    if tokens is None or tokens.empty:
        return empty_figure("no token rows for this prompt", height=280)
    table = tokens.pivot_table(index="pos", columns="step", values=metric, aggfunc="mean")
    z = table.to_numpy(np.float64)
    trace = {"type": "heatmap", "x": [str(int(s)) for s in table.columns],
             "y": [int(p) for p in table.index], "z": [_clean(r) for r in z],
             "colorscale": TOKEN_SCALE, "reversescale": metric == "logp",
             "colorbar": {"title": {"text": metric}, "thickness": 10},
             "hovertemplate": "step %{x}<br>position %{y}<br>" + metric +
                              " %{z:.3f}<extra></extra>"}
    layout = _layout(title or f"{metric} by position across training", height=300,
                     uirevision="tokens", hovermode="closest",
                     xaxis={"type": "category", "title": {"text": "step"}},
                     yaxis={"autorange": "reversed", "title": {"text": "position"}})
    return {"data": [trace], "layout": layout}
