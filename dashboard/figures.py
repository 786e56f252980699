"""What every pure figure is built from: series helpers, EMA, downsampling, traces, layouts.
Figures live by page (run_figures, compare_figures, token_figures) and import neither Dash nor
the Reader, so every chart is unit-tested on a DataFrame."""
from __future__ import annotations

# Figures are plain dicts (plotly's JSON), not `go.Figure`: building the validated objects cost
# 0.2–0.5 s per chart on the CI machine, more than the whole 300 ms callback budget (tests still
# validate them with go.Figure). Every growing trace carries `meta={"key", "role"}` so the live
# tick appends new steps with a Patch (dashboard/live.py) instead of redrawing.

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from forksight.base.downsample import keep_indices
from forksight.base.constants import FORK_ENTROPY

FORK_THRESHOLD = FORK_ENTROPY   # 80th-percentile entropy of Wang et al. (docs/algorithms.md §2)
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
# pass@1 … pass@G: hues far apart (eight blues from light to dark could not be told apart)
PASS_COLORS = ("#1864ab", "#e8590c", "#2b8a3e", "#862e9c", "#c92a2a", "#0b7285", "#f08c00",
               "#d6336c")
X_TITLES = {"step": "step", "wall": "wall time (UTC)"}


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
    """Evenly spaced indices into n points, at most max_points, always keeping first and last: the
    same rule as the Reader's SQL (forksight.base.downsample)."""
    if max_points is not None and max_points < 2:
        raise ValueError(f"max_points must be >= 2 to keep both endpoints, got {max_points}")
    return keep_indices(n, max_points)


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
def line_trace(x: list, y: list, *, name: str, color: str, meta: dict, gl: bool,
               opacity: float = 1.0, width: float = 2.0, dash: str = "solid",
               showlegend: bool = True, legendgroup: str | None = None, xaxis: str = "x",
               yaxis: str = "y", **kw) -> dict:
    return {"type": "scattergl" if gl else "scatter", "x": x, "y": y, "name": name,
            "mode": "lines", "opacity": opacity, "meta": meta, "xaxis": xaxis, "yaxis": yaxis,
            "line": {"color": color, "width": width, "dash": dash}, "showlegend": showlegend,
            "legendgroup": legendgroup or name, **kw}


def spec_lines(rows: dict[str, pd.DataFrame], specs, *, x_axis: str, xref: str, yref: str, gl: bool,
               legend: str, hover: str = ".2f", width=2.0, **style) -> list[dict]:
    """One raw line per (key, legend name, colour, dash) spec with rows, on axes xref/yref and in
    legend `legend` (a panel of a multi-panel figure); width: a number, or dash -> number."""
    traces = []
    for key, name, color, dash in specs:
        r = rows.get(key)
        if r is None or r.empty:
            continue
        traces.append(line_trace(x_values(r, x_axis), clean(r["value"].to_numpy(np.float64)), name=name,
                                 color=color, dash=dash, gl=gl, meta={"key": key, "role": "raw"},
                                 width=width(dash) if callable(width) else width, legendgroup=legend,
                                 legend=legend, xaxis=xref, yaxis=yref,
                                 hovertemplate=f"{name}<br>step %{{x}}: %{{y:{hover}}}<extra></extra>", **style))
    return traces


def panel_notes(titles: Sequence[tuple[str, dict]]) -> list[dict]:
    """Each panel's title in bold above it: (text, its x axis layout) pairs -> annotations."""
    return [{"text": f"<b>{t}</b>", "xref": "paper", "yref": "paper", "x": xa["domain"][0], "y": 1.0,
             "xanchor": "left", "yanchor": "bottom", "showarrow": False, "font": {"size": 12}}
            for t, xa in titles]


def clean(values: np.ndarray | Sequence[float]) -> list:
    """Floats for JSON: NaN becomes None (a gap in the line), never the invalid token NaN."""
    arr = np.asarray(values, dtype=np.float64)
    if not np.isnan(arr).any():
        return arr.tolist()
    out = arr.astype(object)
    out[np.isnan(arr)] = None
    return out.tolist()


def smoothed(y: Sequence[float], smoothing: float, key: str) -> tuple[list, dict]:
    """EMA values plus the trace meta that lets the live tick resume the same EMA."""
    values, acc, count = ema_debiased(y, smoothing)
    return clean(values), {"key": key, "role": "smooth", "ema": [acc, count]}


def raw_and_smooth(rows: pd.DataFrame, key: str, *, name: str, color: str, smoothing: float,
                   x_axis: str, gl: bool, showlegend: bool = True, **axes) -> list[dict]:
    """Raw values (faint when smoothing) plus the debiased EMA on top, as in TensorBoard."""
    x = x_values(rows, x_axis)
    y = rows["value"].to_numpy(np.float64)
    traces = [line_trace(x, clean(y), name=name, color=color, gl=gl,
                         meta={"key": key, "role": "raw"},
                         opacity=0.25 if smoothing > 0 else 1.0, width=1.2 if smoothing else 2.0,
                         showlegend=showlegend and smoothing == 0, legendgroup=name, **axes)]
    if smoothing > 0:
        values, meta = smoothed(y, smoothing, key)
        traces.append(line_trace(list(x), values, name=name, color=color, gl=gl, meta=meta,
                                 showlegend=showlegend, legendgroup=name, **axes))
    return traces


def hline(y: float, text: str, color: str, dash: str, yref: str = "y",
          xref: str = "x domain") -> tuple[dict, dict]:
    shape = {"type": "line", "xref": xref, "x0": 0, "x1": 1, "yref": yref, "y0": y, "y1": y,
             "line": {"color": color, "width": 1, "dash": dash}}
    note = {"text": text, "xref": xref, "x": 0.005, "xanchor": "left", "yref": yref, "y": y,
            "yanchor": "bottom", "showarrow": False, "font": {"size": 10, "color": color}}
    return shape, note


def base_layout(title: str, *, height: int, x_axis: str = "step", log_y: bool = False,
                uirevision: str = "run", **extra) -> dict:
    layout = {"template": "plotly_white", "height": height, "uirevision": uirevision,
              "title": {"text": title, "x": 0.01, "font": {"size": 14}},
              "margin": {"l": 55, "r": 25, "t": 42, "b": 48}, "hovermode": "x unified",
              "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1,
                         "xanchor": "right", "font": {"size": 11}},
              "xaxis": {"type": "date" if x_axis == "wall" else "linear", "showspikes": True,
                        "title": {"text": X_TITLES[x_axis], "standoff": 4}},
              "yaxis": y_scale(log_y)}
    for k, v in extra.items():
        layout[k] = {**layout.get(k, {}), **v} if isinstance(v, dict) else v
    return layout


def y_scale(log_y: bool) -> dict:
    """A y axis's type and tick labels: on a log axis powers of ten (10⁻³), never plotly's SI
    suffixes (which printed 101.5092n for 1e-7)."""
    # hover values to 4 significant digits in decimal: 0.004184 (not 0.0041837291), 12000
    hover = {"hoverformat": ".4~r"}
    return {"type": "log", "exponentformat": "power", **hover} if log_y else \
        {"type": "linear", **hover}


def steps_x(steps: Sequence[int], rows: pd.DataFrame, x_axis: str) -> list:
    """x coordinates of steps that have no wall time of their own (histogram columns, a forecast):
    the steps, or wall times interpolated from rows (step, wall_time) at the run's pace."""
    if x_axis == "step" or rows is None or rows.empty:
        return [int(s) for s in steps]
    known, wall = rows["step"].to_numpy(np.float64), epoch_seconds(rows["wall_time"])
    ok = ~np.isnan(wall)
    known, wall = known[ok], wall[ok]
    if len(known) == 0:
        return [int(s) for s in steps]
    steps = np.asarray(steps, np.float64)
    rate = (wall[-1] - wall[0]) / (known[-1] - known[0]) if known[-1] > known[0] else 0.0
    t = np.interp(steps, known, wall)
    t = np.where(steps > known[-1], wall[-1] + rate * (steps - known[-1]), t)
    t = np.where(steps < known[0], wall[0] - rate * (known[0] - steps), t)
    return wall_strings(pd.Series(t))


def flat_range(values: pd.Series, log_y: bool = False) -> dict:
    """A fixed y-range for a (nearly) constant series: autorange would magnify float noise
    (0.9999999 vs 1.0) into spikes. On a log axis the range is in log10 units (a factor 2
    either side), none for a constant at or below 0."""
    vals = values.dropna().to_numpy(np.float64)
    if len(vals) == 0 or np.ptp(vals) > 1e-6 * max(1.0, float(np.abs(vals).max())):
        return {}
    mid = float(vals.mean())
    if log_y:
        return {} if mid <= 0 else {"range": [math.log10(mid / 2), math.log10(mid * 2)],
                                    "autorange": False}
    pad = max(abs(mid) * 0.5, 1e-3)
    return {"range": [mid - pad, mid + pad], "autorange": False}


def empty_figure(message: str, height: int = 300) -> dict:
    """A blank chart that says why it is blank (no run, no data yet)."""
    return {"data": [], "layout": {
        "template": "plotly_white", "height": height, "xaxis": {"visible": False},
        "yaxis": {"visible": False}, "margin": {"l": 20, "r": 20, "t": 20, "b": 20},
        "annotations": [{"text": message, "showarrow": False, "xref": "paper", "yref": "paper",
                         "x": 0.5, "y": 0.5, "font": {"size": 14, "color": "#868e96"}}]}}


def grid_axes(n: int, cols: int, hgap: float = 0.06, vgap: float = 0.16
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


def with_focus(figure: dict, step: int | None, x_axis: str = "step") -> dict:
    """The figure with a labelled vertical line at `step` on each of its x axes (a link from an
    alert opens the run page at its step); unchanged without a step, on the wall-time axis
    or for a figure without axes."""
    if step is None or x_axis != "step" or not figure.get("data"):
        return figure
    layout = dict(figure["layout"])
    axes = sorted(k for k in layout if re.fullmatch(r"xaxis\d*", k)) or ["xaxis"]
    shapes, notes = list(layout.get("shapes", [])), list(layout.get("annotations", []))
    for axis in axes:
        xref, yref = "x" + axis[5:], "y" + axis[5:]
        shapes.append({"type": "line", "xref": xref, "x0": step, "x1": step,
                       "yref": f"{yref} domain", "y0": 0, "y1": 1, "name": "focus",
                       "line": {"color": "#1c7ed6", "width": 2, "dash": "solid"}})
        notes.append({"text": f"step {step}", "xref": xref, "x": step, "yref": f"{yref} domain",
                      "y": 0, "xanchor": "left", "yanchor": "bottom", "showarrow": False,
                      "font": {"size": 10, "color": "#1c7ed6"}, "name": "focus"})
    layout.update(shapes=shapes, annotations=notes)
    return {**figure, "layout": layout}


def log_annotations(layout: dict, log_axes: set[str]) -> dict:
    """Annotations placed in data units on a log y axis moved to its log10 units (plotly places
    them by the log of the value there; shapes take the value itself). log_axes: {"y", "y2"…}."""
    notes = []
    for note in layout.get("annotations", []):
        y = note.get("y")
        if note.get("yref") in log_axes and isinstance(y, (int, float)):
            note = {**note, "y": math.log10(y)} if y > 0 else {**note, "visible": False}
        notes.append(note)
    return {**layout, "annotations": notes}
