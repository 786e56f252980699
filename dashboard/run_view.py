"""The run page's work, as plain functions of (reader, arguments): `draw_run` builds every
figure, `tick_run` returns Patches for steps ingested since. The page's callbacks only adapt
them (TensorBoard's *_impl pattern), and the benchmark times them directly.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd
from dash import html

from dashboard import figures as F
from dashboard.live import extend_patch, trace_plan

ALL_POINTS = 1 << 40          # "all" in the downsampling picker
HEATMAP_STEPS = 600           # heatmap columns: more than the eye resolves at 1,000 px
RUN_KEYS_CORE = ("entropy/mean", "entropy/p20", "entropy/p80", "renyi2/mean", "js/mean",
                 "reward/mean")


@dataclass
class Controls:
    """What the user picked on the run page."""

    smoothing: float = 0.6
    x_axis: str = "step"
    log_y: bool = False
    max_points: int = 2000
    custom_keys: tuple[str, ...] = ()

    @classmethod
    def from_inputs(cls, smoothing, x_axis, log_y, max_points, custom_keys) -> "Controls":
        """Build from raw callback inputs, validating each (a clear error says which)."""
        smoothing = float(smoothing or 0.0)
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if x_axis not in ("step", "wall"):
            raise ValueError(f"x_axis must be 'step' or 'wall', got {x_axis!r}")
        points = ALL_POINTS if max_points in (None, "all") else int(max_points)
        return cls(smoothing, x_axis, bool(log_y), max(points, 2), tuple(custom_keys or ()))


def vocab_size(run: dict | None) -> int | None:
    """|V| from the run's config (trainer and TRL adapter store vocab_size), else None."""
    config = (run or {}).get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            config = None
    value = config.get("vocab_size") if isinstance(config, dict) else None
    return int(value) if isinstance(value, (int, float)) and value > 1 else None


def run_row(reader, run_id: str) -> dict | None:
    """The run's list_runs row as a dict, or None."""
    runs = reader.list_runs()
    rows = runs[runs["run_id"] == run_id]
    return None if rows.empty else rows.iloc[0].to_dict()


def other_keys(keys: list[str]) -> list[str]:
    """Scalar keys not already on a fixed chart: the 'any other scalar by name' choices."""
    shown = set(RUN_KEYS_CORE) | set(F.DIAGNOSTIC_KEYS) | set(F.pass_keys(keys))
    return [k for k in keys if k not in shown]


def banner(alerts: pd.DataFrame) -> list:
    """The newest alerts, critical first, with what to do (text children: escaped)."""
    if alerts is None or alerts.empty:
        return []
    recent = alerts.sort_values("step").tail(20)
    recent = recent.assign(rank=recent["severity"].map({"critical": 0}).fillna(1))
    top = recent.sort_values(["rank", "step"], ascending=[True, False]).head(3)
    items = []
    for a in top.to_dict("records"):
        sev = a.get("severity") or "warning"
        items.append(html.Div(className=f"alert alert-{sev}", children=[
            html.Strong(f"{sev.upper()} · {a.get('detector')} · step {int(a['step'])}: "),
            html.Span(a.get("message") or ""),
            html.Div(className="alert-action", children=f"Recommendation: {a.get('action')}")
            if a.get("action") else None,
        ]))
    return items


def draw_run(reader, run_id: str, controls: Controls) -> dict:
    """Every run-page figure drawn in full, plus the state the live tick resumes from."""
    run = run_row(reader, run_id)
    keys = reader.scalar_keys(run_id)
    wanted = [*RUN_KEYS_CORE, *F.DIAGNOSTIC_KEYS, *F.pass_keys(keys), *controls.custom_keys]
    wanted = [k for k in dict.fromkeys(wanted) if k in set(keys)]
    scalars = reader.read_scalars(run_id, keys=wanted, downsample=controls.max_points)
    hist = reader.read_histograms(run_id, "entropy",
                                  downsample=min(controls.max_points, HEATMAP_STEPS))
    alerts = reader.read_alerts(run_id)
    c = controls
    figures = {
        "entropy": F.entropy_figure(scalars, alerts=alerts, vocab_size=vocab_size(run),
                                    smoothing=c.smoothing, x_axis=c.x_axis, log_y=c.log_y,
                                    uirevision=run_id),
        "heatmap": F.entropy_heatmap(hist, uirevision=run_id),
        "passk": F.passk_figure(scalars, smoothing=c.smoothing, x_axis=c.x_axis,
                                uirevision=run_id),
        "signals": F.scalar_grid(scalars, F.DIAGNOSTIC_KEYS, smoothing=c.smoothing,
                                 x_axis=c.x_axis, log_y=c.log_y, uirevision=run_id),
        "custom": F.scalar_grid(scalars, list(c.custom_keys), smoothing=c.smoothing,
                                x_axis=c.x_axis, log_y=c.log_y, cols=3,
                                title="Other scalars", uirevision=run_id),
    }
    last = int(scalars["step"].max()) if not scalars.empty else -1
    last_hist = int(hist["step"].max()) if not hist.empty else -1
    state = {"run_id": run_id, "last_step": last, "last_hist_step": last_hist,
             "alerts_seen": len(alerts), "forecast": F.latest_forecast(alerts),
             "keys": wanted, "plans": {name: trace_plan(fig) for name, fig in figures.items()}}
    return {"figures": figures, "state": state, "banner": banner(alerts), "run": run,
            "other_keys": other_keys(keys)}


def tick_run(reader, state: dict, controls: Controls) -> dict:
    """Patches for the steps ingested since the state's last step (figures map to None
    when unchanged), the advanced state, and a new banner when alerts arrived."""
    run_id, last = state["run_id"], state["last_step"]
    scalars = reader.read_scalars(run_id, keys=state["keys"], downsample=ALL_POINTS,
                                  since_step=last + 1)
    hist = reader.read_histograms(run_id, "entropy", downsample=ALL_POINTS,
                                  since_step=state["last_hist_step"] + 1)
    alerts = reader.read_alerts(run_id)
    new_alerts = alerts.iloc[state["alerts_seen"]:] if len(alerts) > state["alerts_seen"] \
        else alerts.iloc[:0]
    state = {**state, "plans": dict(state["plans"])}
    out: dict = {"figures": {}, "banner": None, "redraw": False}
    forecast = F.latest_forecast(alerts)
    if forecast != state["forecast"]:
        out["redraw"] = True          # a new forecast moves shapes and the x-range: redraw
    for name, plan in state["plans"].items():
        patch, plan = extend_patch(plan, scalars, last_step=last, smoothing=controls.smoothing,
                                   x_axis=controls.x_axis,
                                   hist=hist if name == "heatmap" else None,
                                   new_alerts=new_alerts if name == "entropy" else None)
        out["figures"][name] = patch
        state["plans"][name] = plan
    if not scalars.empty:
        state["last_step"] = max(last, int(scalars["step"].max()))
    if not hist.empty:
        state["last_hist_step"] = max(state["last_hist_step"], int(hist["step"].max()))
    if len(new_alerts):
        out["banner"] = banner(alerts)
        state["alerts_seen"] = len(alerts)
    out["state"] = state
    return out


def status_line(run: dict | None, state: dict | None) -> str:
    """"live · step 1,234 · fork · tiny-qwen2" above the charts."""
    if not run:
        return "no such run"
    step = (state or {}).get("last_step", run.get("last_step"))
    step_text = "–" if step is None or (isinstance(step, float) and math.isnan(step)) \
        else f"{int(step):,}"
    parts = [str(run.get("status") or "?"), f"step {step_text}",
             f"strategy {run.get('strategy') or '–'}", f"model {run.get('model') or '–'}"]
    return " · ".join(parts)
