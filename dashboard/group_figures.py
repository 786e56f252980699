"""The compare page's grouped view (pure): runs grouped by strategy or by any config key (lr,
seed, sampler_dtype, …), each group drawn as the mean over its runs at each step with a band, so
three seeds read as one strategy, not three lines. The band is min–max over the runs, or the 95%
interval of the mean (Student's t over runs); the legend and the hover say which."""
from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from forksight.dashboard.alert_figures import escape_markup
from forksight.dashboard.compare_figures import COMPARE_PANELS, GAP, panel_rows, panels_to_draw
from forksight.dashboard.figures import (FORK_THRESHOLD, X_TITLES, base_layout, clean,
                                         ema_debiased, empty_figure, grid_axes, hline,
                                         strategy_color, y_scale)

BANDS = {"minmax": "min–max over runs", "ci95": "95% interval of the mean (t over runs)"}
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#17becf", "#bcbd22", "#7f7f7f")


def flat_config(config: Mapping | None, prefix: str = "") -> dict[str, object]:
    """A run's config as {dotted key: scalar}: nested dicts flattened, lists and dicts-in-lists
    left out (nothing to group by)."""
    out: dict[str, object] = {}
    for key, value in (config or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{name}."))
        elif value is None or isinstance(value, (str, int, float, bool)):
            out[name] = value
    return out


def group_value(run: dict, group_by: str) -> str:
    """The run's group: its strategy, or the value of config key `group_by` ("–" when unset)."""
    if group_by == "strategy":
        return str(run.get("strategy") or "–")
    value = flat_config(run.get("config")).get(group_by)
    return "–" if value is None else json.dumps(value) if isinstance(value, bool) else str(value)


def group_keys(runs: Sequence[dict]) -> list[str]:
    """What runs can be grouped by: strategy, then every config key whose value differs among
    them (a key they all share groups nothing), then the shared ones."""
    seen: dict[str, set] = {}
    for run in runs:
        for key, value in flat_config(run.get("config")).items():
            seen.setdefault(key, set()).add(json.dumps(value))
    varying = sorted(k for k, v in seen.items() if len(v) > 1 or len(runs) == 1)
    return ["strategy", *varying, *sorted(k for k in seen if k not in varying)]


def aligned(series_list: Sequence[pd.DataFrame]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values[run, step]): every run on the union of their steps, each linearly
    interpolated between its own logged steps and NaN outside its own first..last step (a run
    never extrapolated past where it stopped; a downsampled run still meets the others)."""
    steps = np.unique(np.concatenate([s["step"].to_numpy(np.int64) for s in series_list]
                                     or [np.zeros(0, np.int64)]))
    values = np.full((len(series_list), len(steps)), np.nan)
    for i, rows in enumerate(series_list):
        x, y = rows["step"].to_numpy(np.float64), rows["value"].to_numpy(np.float64)
        ok = np.isfinite(y)
        x, y = x[ok], y[ok]
        if len(x):
            inside = (steps >= x[0]) & (steps <= x[-1])
            values[i, inside] = np.interp(steps[inside], x, y)
    return steps, values


def band_stats(values: np.ndarray, band: str = "minmax") -> dict[str, np.ndarray]:
    """Per step over runs (rows; NaN = that run has no value there): n, mean, lo, hi. minmax: the
    runs' min and max; ci95: mean ± t(0.975, n−1)·sd/√n (lo = hi = mean where n < 2)."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {sorted(BANDS)}, got {band!r}")
    n = np.sum(np.isfinite(values), axis=0)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # a step one run alone reaches
        mean = np.nanmean(values, axis=0) if values.size else np.zeros(0)
        if band == "minmax":
            lo, hi = np.nanmin(values, axis=0), np.nanmax(values, axis=0)
        else:
            sd = np.nanstd(values, axis=0, ddof=1)
            t = np.asarray([t975(int(d)) for d in np.maximum(n - 1, 1)], np.float64)
            half = t * sd / np.sqrt(n)
            half = np.where(n >= 2, half, 0.0)
            lo, hi = mean - half, mean + half
    return {"n": n, "mean": mean, "lo": lo, "hi": hi}


# Student's t 97.5% quantile for 1..30 degrees of freedom (the dashboard does not need scipy)
_T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851,
         2.364624252, 2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830,
         2.160368656, 2.144786688, 2.131449546, 2.119905299, 2.109815578, 2.100922040,
         2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
         2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456)
_Z975 = 1.959963984540054


def t975(df: int) -> float:
    """Student's t 97.5% quantile: the table to 30 degrees of freedom, then the Cornish–Fisher
    expansion around the normal quantile (error < 2e-6 from 31 on)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2) \
        + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3)


def _rgba(color: str, alpha: float) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def group_color(group_by: str, name: str, index: int) -> str:
    """By strategy: the strategy's colour on every page; by another key: a palette in order."""
    return strategy_color(name) if group_by == "strategy" else _PALETTE[index % len(_PALETTE)]


def groups_of(runs: Sequence[dict], group_by: str) -> dict[str, list[dict]]:
    """{group value: its runs}, groups in the order of their first run."""
    out: dict[str, list[dict]] = {}
    for run in runs:
        out.setdefault(group_value(run, group_by), []).append(run)
    return out


def _health(members: Sequence[dict]) -> str:
    lost = sum(getattr(r.get("verdict"), "state", "") in ("collapsed", "exploding")
               for r in members)
    return f", {lost} collapsed or exploding" if lost else ""


def grouped_figure(runs: Sequence[dict], *, group_by: str = "strategy", band: str = "minmax",
                   panels: Sequence[str] = COMPARE_PANELS, smoothing: float = 0.0,
                   log_y: bool = False) -> dict:
    """One mean line and one band per group on each panel (step axis: runs of a group started at
    different times). runs: dicts with run_id, label, strategy, config, scalars (the Reader's
    frame) and optionally verdict. Smoothing applies to each run before the mean."""
    if band not in BANDS:
        raise ValueError(f"band must be one of {sorted(BANDS)}, got {band!r}")
    panels, hidden, placeholder = panels_to_draw(runs, panels)
    if placeholder is not None:
        return placeholder
    groups = groups_of(runs, group_by)
    axes = grid_axes(len(panels), 2 if len(panels) > 1 else 1, hgap=0.08, vgap=0.16)
    bands, means = [], []
    for g, (name, members) in enumerate(groups.items()):
        color = group_color(group_by, name, g)
        label = escape_markup(f"{group_by} = {name}" if group_by != "strategy" else name)
        legend = f"{label} · mean of {len(members)} run{'s' * (len(members) != 1)}" \
                 f"{escape_markup(_health(members))} (band: {BANDS[band]})"
        for i, (panel, (xref, yref, _, _)) in enumerate(zip(panels, axes)):
            rows = [panel_rows(r["scalars"], panel) for r in members]
            rows = [r.assign(value=ema_debiased(r["value"].to_numpy(np.float64), smoothing)[0])
                    if smoothing > 0 else r for r in rows]
            steps, values = aligned(rows)
            if not len(steps):
                continue
            s = band_stats(values, band)
            mean, lo, hi = s["mean"], s["lo"], s["hi"]
            if log_y:                     # a log axis cannot show 0 or less
                mean, lo, hi = (np.where(v > 0, v, np.nan) for v in (mean, lo, hi))
            x = steps.tolist()
            meta = {"key": panel, "group": name, "group_by": group_by, "band": band,
                    "runs": [r["run_id"] for r in members]}
            common = {"xaxis": xref, "yaxis": yref, "legendgroup": name, "mode": "lines",
                      "type": "scatter", "x": x}
            bands.append({**common, "y": clean(lo), "line": {"width": 0, "color": color},
                          "showlegend": False, "hoverinfo": "skip", "name": f"{label} low",
                          "meta": {**meta, "role": "group-band-lo"}})
            bands.append({**common, "y": clean(hi), "line": {"width": 0, "color": color},
                          "fill": "tonexty", "fillcolor": _rgba(color, 0.18),
                          "showlegend": False, "hoverinfo": "skip", "name": f"{label} band",
                          "meta": {**meta, "role": "group-band"}})
            custom = np.column_stack([s["n"], clean(lo), clean(hi)]).tolist()
            means.append({**common, "y": clean(mean), "name": legend, "showlegend": i == 0,
                          "line": {"width": 2.4, "color": color}, "customdata": custom,
                          "hovertemplate": f"{label}: mean %{{y:.4~r}} over %{{customdata[0]}} "
                                           f"runs<br>{BANDS[band]}: %{{customdata[1]:.4~r}} – "
                                           f"%{{customdata[2]:.4~r}}<extra>step %{{x}}</extra>",
                          "meta": {**meta, "role": "group-mean"}})
    notes = [{"text": escape_markup("pass@G − pass@1 (diversity gap)" if p == GAP else p),
              "xref": "paper", "yref": "paper", "x": sum(xa["domain"]) / 2,
              "y": ya["domain"][1], "xanchor": "center", "yanchor": "bottom",
              "showarrow": False} for p, (_, _, xa, ya) in zip(panels, axes)]
    shapes = [hline(FORK_THRESHOLD, "", "#adb5bd", "dot")[0]] if panels[0] == "entropy/mean" \
        else []
    title = f"Runs grouped by {escape_markup(group_by)}: mean over each group's runs, band = " \
            f"{BANDS[band]}"
    if hidden:
        title += f" <span style='font-size:11px;color:#868e96'>(hidden, all zero or not " \
                 f"logged: {escape_markup(', '.join(hidden))})</span>"
    layout = base_layout(title, height=300 * math.ceil(len(panels) / 2) + 110,
                         uirevision="compare-grouped", hovermode="closest", annotations=notes,
                         shapes=shapes, log_y=log_y,
                         legend={"orientation": "h", "y": -0.08, "yanchor": "top", "x": 0,
                                 "xanchor": "left"})
    for xref, yref, xa, ya in axes:
        layout["xaxis" + xref[1:]] = {**layout.get("xaxis" + xref[1:], {}), **xa,
                                      "type": "linear", "title": {"text": X_TITLES["step"],
                                                                  "standoff": 2}}
        layout["yaxis" + yref[1:]] = {**layout.get("yaxis" + yref[1:], {}), **ya,
                                      **y_scale(log_y)}
    # bands first: every mean line draws on top of every band
    return {"data": bands + means, "layout": layout}
