"""The run page's work, as plain functions of (reader, arguments): `draw_run` builds every
figure, `tick_run` returns Patches for steps ingested since. The page's callbacks only adapt
them (TensorBoard's *_impl pattern), and the benchmark times them directly.
"""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd
from dash import html

from forksight.dashboard import alert_figures as A
from forksight.dashboard import figures as F
from forksight.dashboard import run_figures as R
from forksight.dashboard.data import LRU
from forksight.dashboard.live import extend_patch, trace_plan

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="forksight-dash-read")
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
    max_points: int = 1000            # TensorBoard's default bound per series
    custom_keys: tuple[str, ...] = ()

    def key(self) -> list:
        """What a drawn figure depends on: a tick for other controls must not patch it."""
        return [self.smoothing, self.x_axis, self.max_points, list(self.custom_keys)]

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


def read_run(reader, run_id: str, keys: list[str], max_points: int, cache: LRU | None = None
             ) -> tuple[dict | None, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(run row, scalars, histograms, alerts) for a full draw. With the app's `cache`, a redraw
    of the same run (a smoothing, axis or scale change) reads only the steps stored since the
    last read and appends them, so moving a slider does not re-query a 10,000-step run."""
    cache_key = (run_id, max_points, tuple(keys))
    hit = cache.get(cache_key) if cache is not None else None
    since = None if hit is None else (hit["frame"]["step"].max() + 1 if len(hit["frame"])
                                      else None)
    hist_since = None if hit is None else (hit["hist"]["step"].max() + 1 if len(hit["hist"])
                                           else None)
    points = ALL_POINTS if hit is not None else max_points
    # independent reads in parallel: DuckDB releases the GIL and the Reader uses a cursor
    # per call, so the wall time is the slowest read, not the sum
    jobs = {"run": (run_row, reader, run_id),
            "frame": (reader.read_scalars, run_id, keys, points,
                      None if since is None else int(since)),
            "hist": (reader.read_histograms, run_id, "entropy",
                     ALL_POINTS if hit is not None else min(max_points, HEATMAP_STEPS),
                     None if hist_since is None else int(hist_since)),
            "alerts": (reader.read_alerts, run_id)}
    futures = {name: _POOL.submit(*job) for name, job in jobs.items()}
    run, frame, hist, alerts = (futures[n].result() for n in ("run", "frame", "hist", "alerts"))
    if hit is not None:
        frame = pd.concat([hit["frame"], frame], ignore_index=True) if len(frame) else \
            hit["frame"]
        hist = pd.concat([hit["hist"], hist], ignore_index=True) if len(hist) else hit["hist"]
    if cache is not None:
        cache.put(cache_key, {"frame": frame, "hist": hist})
    return run, frame, hist, alerts


def draw_run(reader, run_id: str, controls: Controls, cache: LRU | None = None) -> dict:
    """Every run-page figure drawn in full, plus the state the live tick resumes from
    (`cache`: the app's run frames, see read_run)."""
    keys = reader.scalar_keys(run_id)
    wanted = [*RUN_KEYS_CORE, *F.DIAGNOSTIC_KEYS, *F.pass_keys(keys), *controls.custom_keys]
    wanted = [k for k in dict.fromkeys(wanted) if k in set(keys)]
    run, frame, hist, alerts = read_run(reader, run_id, wanted, controls.max_points, cache)
    scalars = F.by_key(frame)
    c = controls
    # each alert on the chart that shows its signal; the rest as markers on the entropy chart
    routed = A.route_alerts(alerts, {"passk": R.passk_signals(keys),
                                     "signals": F.DIAGNOSTIC_KEYS, "custom": c.custom_keys})
    figures = {
        "entropy": R.entropy_figure(scalars, alerts=routed["rest"], vocab_size=vocab_size(run),
                                    smoothing=c.smoothing, x_axis=c.x_axis, log_y=c.log_y,
                                    max_points=c.max_points, uirevision=run_id),
        "heatmap": R.entropy_heatmap(hist, max_steps=HEATMAP_STEPS, uirevision=run_id),
        "passk": R.passk_figure(scalars, alerts=routed["passk"], smoothing=c.smoothing,
                                x_axis=c.x_axis, max_points=c.max_points, uirevision=run_id),
        "signals": R.scalar_grid(scalars, F.DIAGNOSTIC_KEYS, alerts=routed["signals"],
                                 smoothing=c.smoothing,
                                 x_axis=c.x_axis, log_y=c.log_y, max_points=c.max_points,
                                 uirevision=run_id),
        "custom": R.scalar_grid(scalars, list(c.custom_keys), alerts=routed["custom"],
                                smoothing=c.smoothing,
                                x_axis=c.x_axis, log_y=c.log_y, cols=3,
                                max_points=c.max_points,
                                title="Other scalars", uirevision=run_id),
    }
    last = int(frame["step"].max()) if not frame.empty else -1
    last_hist = int(hist["step"].max()) if not hist.empty else -1
    state = {"run_id": run_id, "last_step": last, "last_hist_step": last_hist,
             "controls": controls.key(),
             "alerts_seen": len(alerts), "forecast": A.latest_forecast(alerts),
             "keys": wanted, "plans": {name: trace_plan(fig) for name, fig in figures.items()}}
    return {"figures": figures, "state": state, "banner": banner(alerts), "run": run,
            "other_keys": other_keys(keys)}


def tick_run(reader, state: dict, controls: Controls) -> dict:
    """Patches for the steps ingested since the state's last step (figures map to None
    when unchanged), the advanced state, and a new banner when alerts arrived."""
    run_id, last = state["run_id"], state["last_step"]
    frame = reader.read_scalars(run_id, keys=state["keys"], downsample=ALL_POINTS,
                                since_step=last + 1)
    scalars = F.by_key(frame)
    hist = reader.read_histograms(run_id, "entropy", downsample=ALL_POINTS,
                                  since_step=state["last_hist_step"] + 1)
    alerts = reader.read_alerts(run_id)
    new_alerts = alerts.iloc[state["alerts_seen"]:] if len(alerts) > state["alerts_seen"] \
        else alerts.iloc[:0]
    state = {**state, "plans": dict(state["plans"])}
    out: dict = {"figures": {}, "banner": None, "redraw": False}
    forecast = A.latest_forecast(alerts)
    if forecast != state["forecast"] or len(new_alerts):
        # a new alert adds its threshold and forecast lines (shapes) to the chart of its
        # signal, a new forecast moves the x-range: redraw (alerts are rare, cooldowns apart)
        out["redraw"] = True
    quiet = frame.empty and hist.empty
    for name, plan in state["plans"].items():
        if quiet:                     # nothing new: the common tick, keep it cheap
            out["figures"][name] = None
            continue
        patch, plan = extend_patch(plan, scalars, last_step=last, smoothing=controls.smoothing,
                                   x_axis=controls.x_axis,
                                   hist=hist if name == "heatmap" else None)
        out["figures"][name] = patch
        state["plans"][name] = plan
    if not frame.empty:
        state["last_step"] = max(last, int(frame["step"].max()))
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
