"""The compare page's pure figure: several runs overlaid, colour by strategy, each run's health
in the legend, its alerts as markers and its collapse forecast as a line; a collapsed run is
drawn faded so its reward never reads as the winner's."""
from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from forksight.dashboard.alert_figures import escape_markup, hover_text
from forksight.dashboard.figures import (FORK_THRESHOLD, SEVERITY_COLOR, SEVERITY_SYMBOL,
                                         X_TITLES, base_layout, clean, ema_debiased,
                                         empty_figure, grid_axes, hline, keys_of, line_trace,
                                         pass_keys, series, steps_x, strategy_color, x_values,
                                         y_scale)
from forksight.dashboard.run_figures import diversity_gap

COMPARE_PANELS = ("entropy/mean", "pass@1", "reward/mean", "gap")
GAP = "gap"
FADED = ("collapsed", "exploding")        # runs whose numbers no longer mean progress
_SIGNAL = re.compile(r"\[signal `([^`]+)` = ")


def alert_signal(alert: dict) -> str | None:
    """The scalar an alert is about: its `signal` column, else the key its message names."""
    signal = alert.get("signal")
    if isinstance(signal, str) and signal:
        return signal
    found = _SIGNAL.search(alert.get("message") or "")
    return found.group(1) if found else None


def panel_rows(scal, panel: str, max_points: int | None = None) -> pd.DataFrame:
    """One run's rows for a panel: a scalar key, or "gap" (pass@G − pass@1)."""
    if panel != GAP:
        return series(scal, panel, max_points)
    keys = pass_keys(keys_of(scal))
    return diversity_gap(scal, keys[-1], keys[0], max_points) if len(keys) > 1 \
        else series(None, panel)


def shown_panels(runs: Sequence[dict], panels: Sequence[str]) -> tuple[list[str], list[str]]:
    """(panels with a non-zero value in some run, panels hidden: all zero or not logged)."""
    shown, hidden = [], []
    for panel in panels:
        values = [panel_rows(r["scalars"], panel)["value"].to_numpy(np.float64) for r in runs]
        live = any(np.nan_to_num(v).any() for v in values if len(v))
        (shown if live else hidden).append(panel)
    return shown, hidden


def panels_to_draw(runs: Sequence[dict], panels: Sequence[str]
                   ) -> tuple[list[str], list[str], dict | None]:
    """(panels to draw, panels hidden, None), or the placeholder figure last while there is nothing
    to draw: no run picked, no step yet, or every picked metric zero or unlogged."""
    if not runs:
        return [], [], empty_figure("select runs to compare", height=400)
    if all(r["scalars"] is None or r["scalars"].empty for r in runs):
        return [], [], empty_figure("waiting for the first step of these runs…", height=200)
    shown, hidden = shown_panels(runs, panels)
    if not shown:
        return [], hidden, empty_figure("every picked metric is zero or not logged in these runs: "
                                        + escape_markup(", ".join(hidden)), height=200)
    return shown, hidden, None


def legend_name(run: dict) -> str:
    """"grpo (all) · collapsed at step 37": the run, its strategy and its health."""
    verdict = run.get("verdict")
    tail = f" · {verdict.label}" if verdict is not None else ""
    return escape_markup(f"{run['label']} ({run.get('strategy') or '?'}){tail}")


def _run_alerts(run: dict, panel_of: dict, x_axis: str) -> tuple[list[dict], list[dict]]:
    """(traces, shapes): markers at each alert on the panel that shows its signal (else the
    first panel) at the run's drawn value there, and the run's collapse forecast as a dashed
    vertical line in its colour on the first panel."""
    alerts = run.get("alerts")
    color = strategy_color(run.get("strategy"))
    out, marks, shapes = [], {}, []
    if alerts is None:
        alerts = pd.DataFrame(columns=["step"])
    for a in alerts.sort_values("step").to_dict("records"):
        panel = panel_of.get(alert_signal(a)) or next(iter(panel_of.values()))
        rows = panel["rows"][run["run_id"]]
        if rows.empty:
            continue
        step = int(a["step"])
        near = rows.iloc[[int(np.clip(np.searchsorted(rows["step"].to_numpy(), step), 0,
                                      len(rows) - 1))]]
        m = marks.setdefault((panel["x"], panel["y"]), {"x": [], "y": [], "text": [],
                                                         "color": [], "symbol": []})
        m["x"] += steps_x([step], rows, x_axis)
        m["y"].append(float(near["value"].iloc[0]))
        m["text"].append(hover_text(a))
        m["color"].append(SEVERITY_COLOR.get(a.get("severity"), "#e67700"))
        m["symbol"].append(SEVERITY_SYMBOL.get(a.get("severity"), "circle"))
    for (xref, yref), m in marks.items():
        out.append({"type": "scatter", "mode": "markers", "x": m["x"], "y": m["y"],
                    "xaxis": xref, "yaxis": yref, "hovertext": m["text"], "hoverinfo": "text",
                    "name": "alerts", "legendgroup": run["run_id"], "showlegend": False,
                    "meta": {"key": "alerts", "role": "alerts", "run": run["run_id"]},
                    "marker": {"size": 11, "color": m["color"], "symbol": m["symbol"],
                               "line": {"width": 1.5, "color": color}}})
    verdict = run.get("verdict")
    forecast = getattr(verdict, "forecast", None)
    if forecast is not None and getattr(verdict, "state", "") == "collapsing":
        first = next(iter(panel_of.values()))
        x = steps_x([forecast], first["rows"][run["run_id"]], x_axis)[0]
        shapes.append({"type": "line", "xref": first["x"], "x0": x, "x1": x,
                       "yref": f"{first['y']} domain", "y0": 0, "y1": 1,
                       "name": f"forecast:{run['run_id']}",
                       "line": {"color": color, "dash": "dash", "width": 1.5}})
        out.append({"type": "scatter", "mode": "text", "x": [x], "y": [0.0],
                    "xaxis": first["x"], "yaxis": first["y"], "textposition": "top left",
                    "text": [escape_markup(f"{run['label']}: collapse ≈ step {forecast}")],
                    "textfont": {"size": 10, "color": color}, "hoverinfo": "skip",
                    "showlegend": False, "legendgroup": run["run_id"],
                    "meta": {"key": "forecast", "role": "forecast", "run": run["run_id"],
                             "step": forecast}})
    if getattr(verdict, "state", "") in FADED and verdict.step is not None:
        # where the run was lost, on every panel: what it shows past this line is no progress
        # (unlabelled: the legend and the chips above name it; labels collided with titles)
        for panel in panel_of.values():
            x = steps_x([verdict.step], panel["rows"][run["run_id"]], x_axis)[0]
            shapes.append({"type": "line", "xref": panel["x"], "x0": x, "x1": x,
                           "yref": f"{panel['y']} domain", "y0": 0, "y1": 1,
                           "name": f"{verdict.state}:{run['run_id']}",
                           "line": {"color": color, "dash": "dot", "width": 1.5}})
    return out, shapes


def compare_figure(runs: Sequence[dict], *, panels: Sequence[str] = COMPARE_PANELS,
                   smoothing: float = 0.0, max_points: int | None = None, log_y: bool = False,
                   x_axis: str = "step") -> dict:
    """Several runs overlaid, one panel per key with a non-zero value (all-zero and unlogged
    ones are named in the title instead), colour by strategy, dash style per run.

    runs: dicts with run_id, label, strategy, scalars (the Reader's DataFrame) and optionally
    verdict (verdict.Verdict) and alerts (the run's alert rows).
    """
    panels, hidden, placeholder = panels_to_draw(runs, panels)
    if placeholder is not None:
        return placeholder
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")
    axes = grid_axes(len(panels), 2 if len(panels) > 1 else 1, hgap=0.08, vgap=0.16)
    # the healthy first: the legend reads best to worst and faded runs draw underneath
    order = sorted(runs, key=lambda r: getattr(r.get("verdict"), "state", "healthy") in FADED)
    data, seen, extra, shapes = [], {}, [], []
    panel_of = {p: {"x": xref, "y": yref, "rows": {}} for p, (xref, yref, _, _) in
                zip(panels, axes)}
    for run in order:
        strategy = run.get("strategy") or "?"
        dash = dashes[seen.get(strategy, 0) % len(dashes)]
        seen[strategy] = seen.get(strategy, 0) + 1
        faded = getattr(run.get("verdict"), "state", "") in FADED
        for i, (panel, (xref, yref, _, _)) in enumerate(zip(panels, axes)):
            rows = panel_rows(run["scalars"], panel, max_points)
            panel_of[panel]["rows"][run["run_id"]] = rows
            y = rows["value"].to_numpy(np.float64)
            y = ema_debiased(y, smoothing)[0] if smoothing > 0 else y
            if log_y:
                y = np.where(y > 0, y, np.nan)        # a log axis cannot show 0 or less
            data.append(line_trace(x_values(rows, x_axis), clean(y), gl=False, dash=dash,
                                   name=legend_name(run), color=strategy_color(strategy),
                                   opacity=0.45 if faded else 1.0, width=1.5 if faded else 2.2,
                                   meta={"key": panel, "role": "compare", "run": run["run_id"]},
                                   showlegend=i == 0, legendgroup=run["run_id"], xaxis=xref,
                                   yaxis=yref))
        traces, lines = _run_alerts(run, panel_of, x_axis)
        extra += traces
        shapes += lines
    data += extra
    notes = [{"text": escape_markup("pass@G − pass@1 (diversity gap)" if p == GAP else p),
              "xref": "paper", "yref": "paper", "x": sum(xa["domain"]) / 2,
              "y": ya["domain"][1], "xanchor": "center", "yanchor": "bottom",
              "showarrow": False} for p, (_, _, xa, ya) in zip(panels, axes)]
    if panels[0] == "entropy/mean":
        shape, _ = hline(FORK_THRESHOLD, "", "#adb5bd", "dot")
        shapes.append(shape)
    title = "Runs compared (colour = strategy; faded = collapsed or exploding)"
    if hidden:
        title += f" <span style='font-size:11px;color:#868e96'>(hidden, all zero or not " \
                 f"logged: {escape_markup(', '.join(hidden))})</span>"
    layout = base_layout(title, height=300 * math.ceil(len(panels) / 2) + 110,
                         uirevision="compare", hovermode="closest", annotations=notes,
                         shapes=shapes, x_axis=x_axis, log_y=log_y,
                         legend={"orientation": "h", "y": -0.08, "yanchor": "top", "x": 0,
                                 "xanchor": "left"})
    for xref, yref, xa, ya in axes:
        layout["xaxis" + xref[1:]] = {**layout.get("xaxis" + xref[1:], {}), **xa,
                                      "type": "date" if x_axis == "wall" else "linear",
                                      "title": {"text": X_TITLES[x_axis], "standoff": 2}}
        layout["yaxis" + yref[1:]] = {**layout.get("yaxis" + yref[1:], {}), **ya,
                                      **y_scale(log_y)}
    return {"data": data, "layout": layout}
