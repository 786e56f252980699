"""Why an alert fired, drawn on the chart that shows its signal: a marker at the detector's
smoothed value, a dashed threshold line labelled with detector and severity, the forecast step;
stagnation as its fitted reward trend, a non-finite statistic as a line at its step. Alerts
whose signal no chart shows stay markers on the entropy curve (the fallback)."""
from __future__ import annotations

# An alert row names its chart in `signal` and carries what the detector fitted in `evidence`
# (JSON data): nothing here reads the message, which is for people.
import math
import textwrap
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from forksight.dashboard.figures import (SEVERITY_COLOR, SEVERITY_SYMBOL, epoch_seconds,
                                         wall_strings, x_values)
from forksight.monitor.alerts.hub import evidence_of

STAGNATION, NON_FINITE = "stagnation", "non_finite"
Panel = tuple[pd.DataFrame, str, str]     # a signal's drawn rows, its xref and yref


def escape_markup(text: object) -> str:
    """Text safe in Plotly's HTML-like labels: `&`, `<`, `>` as entities (Plotly shows them
    as the characters), so model or user text never renders as markup."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def alert_text(alert: dict) -> str:
    """One line per alert for hovers and the banner: severity, step, message, what to do."""
    action = alert.get("action") or ""
    text = (f"{alert.get('severity', '')} · {alert.get('detector', '')} at step "
            f"{int(alert.get('step', 0))}: {alert.get('message', '')}")
    return f"{text} → {action}" if action else text


def hover_text(alert: dict, width: int = 100) -> str:
    """alert_text wrapped for a hover box and escaped; `<br>` is the only markup in it."""
    return "<br>".join(escape_markup(line) for line in textwrap.wrap(alert_text(alert), width))


def _finite(x: object) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# ---------------------------------------------------------------- which chart
def route_alerts(alerts: pd.DataFrame | None, charts: Mapping[str, Sequence[str]]
                 ) -> dict[str, pd.DataFrame]:
    """Each alert to the first chart in `charts` that shows its signal; the others (and alerts
    that name no signal) under "rest", for the entropy chart."""
    if alerts is None:
        alerts = pd.DataFrame(columns=["step", "message"])
    signals = alerts["signal"] if len(alerts) and "signal" in alerts else \
        pd.Series(None, index=alerts.index, dtype=object)
    taken = pd.Series(False, index=alerts.index)
    out = {}
    for name, keys in charts.items():
        mine = signals.isin(list(keys)) & ~taken if len(alerts) else taken
        out[name] = alerts[mine]
        taken |= mine
    out["rest"] = alerts[~taken]
    return out


def latest_forecast(alerts: pd.DataFrame | None) -> int | None:
    """The forecast step of the most recent alert that has one (None when none forecast)."""
    if alerts is None or alerts.empty or "forecast" not in alerts:
        return None
    has = alerts[alerts["forecast"].notna()]
    if has.empty:
        return None
    return int(has.sort_values("step")["forecast"].iloc[-1])


# ---------------------------------------------------------------- where on the chart
def step_x(rows: pd.DataFrame, step: float, x_axis: str):
    """The x of a step on a chart: the step, or its wall time interpolated from the drawn rows
    (extrapolated at the run's pace past either end). None when no wall time is known."""
    if x_axis == "step":
        return int(step)
    if rows.empty:
        return None
    steps, wall = rows["step"].to_numpy(np.float64), epoch_seconds(rows["wall_time"])
    ok = ~np.isnan(wall)
    steps, wall = steps[ok], wall[ok]
    if len(steps) == 0:
        return None
    rate = (wall[-1] - wall[0]) / (steps[-1] - steps[0]) if len(steps) > 1 and \
        steps[-1] > steps[0] else 0.0          # seconds per step
    if step <= steps[0]:
        t = wall[0] - rate * (steps[0] - step)
    elif step >= steps[-1]:
        t = wall[-1] + rate * (step - steps[-1])
    else:
        t = float(np.interp(step, steps, wall))
    return wall_strings(pd.Series([t]))[0]


def _level_at(rows: pd.DataFrame, step: int) -> float | None:
    """The last finite drawn value at or before `step` (else the first one after)."""
    values = rows[rows["value"].map(_finite).notna()]
    if values.empty:
        return None
    before = values[values["step"] <= step]
    return float((before if len(before) else values)["value"].iloc[-1 if len(before) else 0])


def _nearest(rows: pd.DataFrame, step: int) -> pd.DataFrame:
    # the nearest drawn point: the curve may be downsampled
    steps = rows["step"].to_numpy()
    return rows.iloc[[int(np.clip(np.searchsorted(steps, step), 0, len(steps) - 1))]]


def stagnation_trend(alert: dict, level: float | None = None
                     ) -> tuple[float, float, float, float] | None:
    """(x0, y0, x1, y1) of the reward trend a stagnation alert fitted, from its evidence: it ends
    at the alert step at the fitted level (else `level`) and spans the fitted window (`value` is
    the window's gain, not a level). None when the row has no window in its evidence."""
    evidence = evidence_of(alert)
    span = _finite(evidence.get("span"))
    if span is None and _finite(evidence.get("window")) is not None:
        span = float(evidence["window"]) - 1.0     # rows migrated from messages: steps, not span
    if span is None:
        return None
    fitted = _finite(evidence.get("fitted"))
    end = fitted if fitted is not None else (level or 0.0)
    step, gain = int(alert["step"]), float(_finite(alert.get("value")) or 0.0)
    return step - span, end - gain, step, end


# ---------------------------------------------------------------- the pieces
def _threshold_line(alert: dict, xref: str, yref: str) -> tuple[dict, dict]:
    color = SEVERITY_COLOR.get(alert.get("severity"), "#e67700")
    y = float(alert["threshold"])
    shape = {"type": "line", "xref": f"{xref} domain", "x0": 0, "x1": 1, "yref": yref,
             "y0": y, "y1": y, "line": {"color": color, "width": 1.5, "dash": "dash"},
             "name": f"threshold:{alert.get('detector')}"}
    label = f"{alert.get('detector')} {alert.get('severity')}: threshold {y:.4g}"
    # a warning's label above its line at the right, a critical one's below its line at the
    # left: a detector's two thresholds sit close together and their labels never overlap
    critical = alert.get("severity") == "critical"
    note = {"text": escape_markup(label), "xref": f"{xref} domain", "x": 0.005 if critical
            else 0.995, "xanchor": "left" if critical else "right", "yref": yref, "y": y,
            "yanchor": "top" if critical else "bottom", "showarrow": False,
            "font": {"size": 10, "color": color}}
    return shape, note


def _vline(x, xref: str, yref: str, color: str, text: str, dash: str) -> tuple[dict, dict]:
    shape = {"type": "line", "xref": xref, "x0": x, "x1": x, "yref": f"{yref} domain",
             "y0": 0, "y1": 1, "line": {"color": color, "width": 1.2, "dash": dash}}
    note = {"text": escape_markup(text), "xref": xref, "x": x, "yref": f"{yref} domain", "y": 1,
            "xanchor": "right", "yanchor": "top", "showarrow": False,
            "font": {"size": 10, "color": color}}
    return shape, note


def alert_layers(alerts: pd.DataFrame | None, panels: Mapping[str, Panel], x_axis: str, *,
                 fallback: Panel | None = None, log_y: bool = False,
                 drawn_forecasts: Sequence[int] = ()) -> dict:
    """{"data", "shapes", "annotations"} explaining `alerts` on a figure. panels maps each signal
    the figure shows to (rows, xref, yref); an alert on another signal is a marker on the
    fallback's curve at its step (none without a fallback). Markers: every alert; threshold and
    forecast lines: the newest alert per (signal, detector, severity), forecasts not already
    drawn (drawn_forecasts)."""
    out = {"data": [], "shapes": [], "annotations": []}
    if alerts is None or alerts.empty:
        return out
    marks: dict[tuple[str, str], dict[str, list]] = {}
    newest: dict[tuple, tuple[dict, Panel]] = {}
    for a in alerts.sort_values("step", kind="stable").to_dict("records"):
        signal = a.get("signal") if isinstance(a.get("signal"), str) else None
        panel = panels.get(signal) if signal else None
        step = int(a["step"])
        if panel is not None:
            rows, xref, yref = panel
            newest[(signal, a.get("detector"), a.get("severity"))] = (a, panel)
            trend = stagnation_trend(a, _level_at(rows, step)) if a.get("detector") == STAGNATION else None
            if trend is not None:
                _, _, x1, y = trend
                x = step_x(rows, x1, x_axis)
            elif a.get("detector") in (NON_FINITE, STAGNATION):   # a count / a gain: not a level
                x, y = step_x(rows, step, x_axis), _level_at(rows, step)
            else:                                      # the detector's smoothed statistic
                x, y = step_x(rows, step, x_axis), _finite(a.get("value"))
                y = _level_at(rows, step) if y is None else y
        elif fallback is not None and not fallback[0].empty:
            rows, xref, yref = fallback
            near = _nearest(rows, step)
            x = x_values(near, x_axis)[0] if x_axis == "wall" else step
            y = _finite(near["value"].iloc[0])
        else:
            continue
        if x is None:
            continue
        m = marks.setdefault((xref, yref), {"x": [], "y": [], "text": [], "color": [],
                                            "symbol": [], "signals": []})
        m["x"].append(x)
        m["y"].append(y)
        m["text"].append(hover_text(a))
        m["color"].append(SEVERITY_COLOR.get(a.get("severity"), "#e67700"))
        m["symbol"].append(SEVERITY_SYMBOL.get(a.get("severity"), "circle"))
        m["signals"].append(signal)
    for a, (rows, xref, yref) in newest.values():
        _explain(out, a, rows, xref, yref, x_axis, log_y, drawn_forecasts)
    for i, ((xref, yref), m) in enumerate(marks.items()):
        out["data"].append({
            "type": "scatter", "x": m["x"], "y": m["y"], "mode": "markers", "name": "alerts",
            "xaxis": xref, "yaxis": yref, "hovertext": m["text"], "hoverinfo": "text",
            "legendgroup": "alerts", "showlegend": i == 0,
            "meta": {"key": "alerts", "role": "alerts", "signals": m["signals"]},
            "marker": {"size": 13, "color": m["color"], "symbol": m["symbol"],
                       "line": {"width": 1.5, "color": "#ffffff"}}})
    return out


def _explain(out: dict, a: dict, rows: pd.DataFrame, xref: str, yref: str, x_axis: str,
             log_y: bool, drawn_forecasts: Sequence[int]) -> None:
    """The lines that say why one alert fired, added to out's data, shapes and annotations."""
    color = SEVERITY_COLOR.get(a.get("severity"), "#e67700")
    signal = a.get("signal")
    trend = stagnation_trend(a, _level_at(rows, int(a["step"]))) if a.get("detector") == STAGNATION else None
    if a.get("detector") == STAGNATION:
        if trend is None:          # no fitted window stored: the marker alone
            return
        x0, y0, x1, y1 = trend
        out["data"].append({
            "type": "scatter", "mode": "lines", "x": [step_x(rows, x0, x_axis),
                                                      step_x(rows, x1, x_axis)],
            "y": [y0, y1], "xaxis": xref, "yaxis": yref, "hovertext": [hover_text(a)] * 2,
            "hoverinfo": "text", "name": escape_markup(
                f"stagnation: fitted trend {float(a.get('value') or 0):+.4f} over {x1 - x0 + 1:g}"
                " steps"),
            "line": {"color": color, "width": 2.5, "dash": "dash"},
            "meta": {"key": "alerts", "role": "trend", "signal": signal,
                     "slope": (y1 - y0) / (x1 - x0) if x1 > x0 else 0.0}})
        return
    if a.get("detector") == NON_FINITE:
        x = step_x(rows, int(a["step"]), x_axis)
        if x is not None:
            shape, note = _vline(x, xref, yref, color, f"non-finite {signal}", "dot")
            out["shapes"].append(shape)
            out["annotations"].append(note)
        return
    threshold = _finite(a.get("threshold"))
    if threshold is not None and not (log_y and threshold <= 0):
        shape, note = _threshold_line(a, xref, yref)
        out["shapes"].append(shape)
        out["annotations"].append(note)
    forecast = a.get("forecast")
    if forecast is not None and not pd.isna(forecast) and int(forecast) not in drawn_forecasts:
        x = step_x(rows, int(forecast), x_axis)
        if x is not None:
            shape, note = _vline(x, xref, yref, color, f"forecast step {int(forecast)}", "dash")
            out["shapes"].append(shape)
            out["annotations"].append(note)
