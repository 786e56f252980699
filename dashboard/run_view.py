"""The run page's work, as plain functions of (reader, arguments): `draw_run` builds every
figure, `tick_run` returns Patches for steps ingested since. The page's callbacks only adapt
them (TensorBoard's *_impl pattern), and the benchmark times them directly.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pandas as pd
from dash import html

from forksight.base.runconfig import vocab_size_of
from forksight.base.interfaces import Reader
from forksight.dashboard import alert_figures as A
from forksight.dashboard import figures as F
from forksight.dashboard import heldout_figures as H
from forksight.dashboard import mismatch_figures as M
from forksight.dashboard import probe_figures as P
from forksight.dashboard import reference_figures as RF
from forksight.dashboard import trust_figures as T
from forksight.dashboard import run_figures as R
from forksight.dashboard.data import LRU
from forksight.dashboard.alerts_view import alert_list
from forksight.dashboard.live import extend_patch, trace_plan
from forksight.dashboard.verdict import Verdict, verdict

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="forksight-dash-read")
ALL_POINTS = 1 << 40          # "all" in the downsampling picker
HEATMAP_STEPS = 600           # histogram buckets read: rollup widths grow 4x, so 150 to 600 of them
# heatmap columns drawn: the buckets merged to this many, so the figure's cells and bytes are the same
# on a run of any length (issue 48, item 8: 157 columns at 10,000 steps had become 391 at 100,000)
HEATMAP_COLUMNS = HEATMAP_STEPS // 4
EVAL_WATCH_S = 120.0          # how long after a step a live page looks for its late evaluation
RUN_KEYS_CORE = ("entropy/mean", "entropy/p20", "entropy/p80", "renyi2/mean", "js/mean",
                 "reward/mean", "fork/threshold")


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
    """|V| from the run's config, else None (the rule: forksight.base.runconfig)."""
    return vocab_size_of((run or {}).get("config"))


def other_keys(keys: list[str]) -> list[str]:
    """Scalar keys not already on a fixed chart: the 'any other scalar by name' choices."""
    shown = set(RUN_KEYS_CORE) | set(F.DIAGNOSTIC_KEYS) | set(F.pass_keys(keys)) | \
        set(M.DRAWN_KEYS) | set(H.eval_pass_keys(keys))
    return [k for k in keys if k not in shown]


def banner(alerts: pd.DataFrame, run_id: str = "", prefix: str = "/") -> list:
    """Every alert of the run (alerts_view.alert_list): the first collapse forecast pinned, the
    newest three, the rest behind "show all N"; one Fix line each (text children: escaped)."""
    return alert_list(alerts, run_id, prefix)


def run_verdict(alerts: pd.DataFrame, entropy: float | None, last_step: int) -> Verdict:
    """The run's health from its alerts and its latest entropy (last_step < 0: waiting)."""
    rows = alerts.to_dict("records") if alerts is not None and len(alerts) else []
    return verdict(rows, {} if entropy is None else {"entropy/mean": entropy},
                   None if last_step < 0 else last_step)


def waiting_figures(message: str = "waiting for the first step of this run…") -> dict:
    """What the charts show before a run's first step: one line of text, no empty axes."""
    return {g: F.empty_figure(message if g == "entropy" else "", height=200 if g == "entropy"
                              else 40)
            for g in ("entropy", "heatmap", "mismatch", "ratios", "passk", "signals",
                      "custom", "heldout", "probes", "trust", "pattern")}


def mismatch_histogram(reader: Reader, run_id: str, at: int | None = None) -> dict:
    """The ratio histogram of the run's last step with one (at or before `at`), its first step
    outlined beside it, and that step's stored mismatch scalars: three small reads."""
    hist = reader.read_histogram_ends(run_id, M.HISTOGRAM_KEY, at)
    step = int(hist["step"].max()) if len(hist) else None
    values = reader.steps_scalars(run_id, [step]).get(step, {}) if step is not None else {}
    return M.ratio_histogram(hist, step=step, scalars_at=values, uirevision=run_id)


def _last_entropy(frame: pd.DataFrame) -> float | None:
    rows = frame[frame["key"] == "entropy/mean"] if not frame.empty else frame
    return None if rows.empty else float(rows.sort_values("step")["value"].iloc[-1])


def read_run(reader: Reader, run_id: str, keys: list[str], max_points: int, cache: LRU | None = None
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
    jobs = {"run": (reader.run, run_id),
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


def draw_run(reader: Reader, run_id: str, controls: Controls, cache: LRU | None = None,
             prefix: str = "/", focus: int | None = None) -> dict:
    """Every run-page figure drawn in full, plus the state the live tick resumes from
    (`cache`: the app's run frames, see read_run; prefix: the app's URL prefix for links;
    focus: the step the mismatch histogram shows, else its newest)."""
    keys = reader.scalar_keys(run_id)
    mismatch = M.has_mismatch(keys)
    heldout = H.has_heldout(keys)
    probes = P.has_probes(keys)
    trust = T.has_trust(keys)
    pattern = RF.has_reference(keys)
    wanted = [*RUN_KEYS_CORE, *F.DIAGNOSTIC_KEYS, *F.pass_keys(keys), *controls.custom_keys,
              *(M.DRAWN_KEYS if mismatch else ()), *H.eval_pass_keys(keys),
              *(P.PANEL_KEYS if probes else ()), *(T.READ_KEYS if trust else ()),
              *(RF.PANEL_KEYS if pattern else ())]
    wanted = [k for k in dict.fromkeys(wanted) if k in set(keys)]
    ratios = _POOL.submit(mismatch_histogram, reader, run_id, focus) if mismatch else None
    run, frame, hist, alerts = read_run(reader, run_id, wanted, controls.max_points, cache)
    scalars = F.by_key(frame)
    c = controls
    fork_rule = ((run or {}).get("config") or {}).get("fork_rule")      # the rule the run recorded
    # each alert on the chart that shows its signal; the rest as markers on the entropy chart
    routed = A.route_alerts(alerts, {"heldout": H.eval_pass_keys(keys),
                                     "passk": R.passk_signals(keys),
                                     "signals": F.DIAGNOSTIC_KEYS, "mismatch": M.DRAWN_KEYS,
                                     "custom": c.custom_keys})
    figures = {
        "entropy": R.entropy_figure(scalars, alerts=routed["rest"], vocab_size=vocab_size(run),
                                    smoothing=c.smoothing, x_axis=c.x_axis, log_y=c.log_y,
                                    max_points=c.max_points, uirevision=run_id,
                                    fork_rule=fork_rule),
        "heatmap": R.entropy_heatmap(hist, max_steps=HEATMAP_COLUMNS, uirevision=run_id,
                                     x_axis=c.x_axis, walls=F.series(scalars, "entropy/mean")),
        # hidden (the page's wrapper) when the run logs no mismatch: nothing to read or send
        "mismatch": M.mismatch_figure(scalars, alerts=routed["mismatch"], smoothing=c.smoothing,
                                      x_axis=c.x_axis, log_y=c.log_y, max_points=c.max_points,
                                      uirevision=run_id) if mismatch else F.empty_figure("", 40),
        "ratios": ratios.result() if ratios else F.empty_figure("", 40),
        "passk": R.passk_figure(scalars, alerts=routed["passk"], smoothing=c.smoothing,
                                x_axis=c.x_axis, max_points=c.max_points, uirevision=run_id),
        # hidden (the page's wrapper) when the run logs no held-out eval/pass@k
        "heldout": H.heldout_figure(scalars, alerts=routed["heldout"], smoothing=c.smoothing,
                                    x_axis=c.x_axis, max_points=c.max_points,
                                    uirevision=run_id) if heldout else F.empty_figure("", 40),
        # hidden (the page's wrapper) when the run logs no value probes
        "probes": P.pivotal_figure(scalars, x_axis=c.x_axis, max_points=c.max_points, uirevision=run_id,
                                   fork_rule=fork_rule)
        if probes else F.empty_figure("", 40),
        # hidden (the page's wrapper) when the run logs no trust/* (one update per batch, ratio clip)
        "trust": T.trust_figure(scalars, x_axis=c.x_axis, max_points=c.max_points,
                                uirevision=run_id) if trust else F.empty_figure("", 40),
        # hidden (the page's wrapper) when the run keeps no reference set (ref/*)
        "pattern": RF.pattern_figure(scalars, x_axis=c.x_axis, max_points=c.max_points,
                                     uirevision=run_id) if pattern else F.empty_figure("", 40),
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
    if last < 0:
        figures = waiting_figures()
    h = _last_entropy(frame)
    state = {"run_id": run_id, "last_step": last, "last_hist_step": last_hist,
             "controls": controls.key(), "entropy": h,
             "alerts_seen": len(alerts), "forecast": A.latest_forecast(alerts), "mismatch": mismatch,
             "heldout": heldout, "probes": probes, "trust": trust, "pattern": pattern,
             "last_eval_step": _last_eval_step(frame),
             # a live run's next evaluation may land after its step's rows: look for it a while
             "eval_watch_until": time.time() + EVAL_WATCH_S if (run or {}).get("status") == "live"
             else 0.0,
             "keys": wanted, "plans": {name: trace_plan(fig) for name, fig in figures.items()}}
    return {"figures": figures, "state": state, "banner": banner(alerts, run_id, prefix),
            "run": run, "other_keys": other_keys(keys), "mismatch": mismatch, "heldout": heldout,
            "probes": probes, "trust": trust, "pattern": pattern,
            "verdict": run_verdict(alerts, h, last)}


def _last_eval_step(frame: pd.DataFrame) -> int:
    rows = frame[frame["key"].str.startswith("eval/pass@")] if not frame.empty else frame
    return int(rows["step"].max()) if len(rows) else -1


def heatmap_kept(previous: dict | None, state: dict) -> dict | None:
    """A redraw's state with the heatmap's plan as the page already holds it, when that heatmap
    is current: same run, no histogram stored since, and none of the controls it reads changed
    (the x axis and the points bound; not the smoothing, log y or other scalars). The page then
    keeps it and the answer leaves out a third of its bytes. None: send the heatmap again."""
    old = previous if isinstance(previous, dict) else {}      # the browser's copy: any shape
    plans, controls = old.get("plans"), old.get("controls")
    if old.get("run_id") != state["run_id"] or not isinstance(plans, dict) \
            or "heatmap" not in plans or not isinstance(controls, list) \
            or old.get("last_hist_step", -1) != state["last_hist_step"] \
            or state["last_hist_step"] < 0 or controls[1:3] != list(state["controls"][1:3]):
        return None
    return {**state, "plans": {**state["plans"], "heatmap": plans["heatmap"]}}


def tick_run(reader: Reader, state: dict, controls: Controls, prefix: str = "/",
             focus: int | None = None) -> dict:
    """Patches for the steps ingested since the state's last step (figures map to None
    when unchanged; the mismatch histogram, a new figure of the newest step unless the page is
    focused on a step), the advanced state, and a new banner and verdict when alerts arrived."""
    run_id, last = state["run_id"], state["last_step"]
    if last >= 0 and reader.run_progress(run_id) == (last, state["alerts_seen"]):
        # nothing new (the common tick, every live.TICK_MS per open page): one small statement
        # (two for a held-out run just after a step: its evaluation lands after the step's rows)
        return {"figures": dict.fromkeys(state["plans"]), "banner": None,
                "redraw": new_evaluation(reader, state), "state": state, "verdict": None}
    if last < 0:                      # warming up: the first step's keys are not known yet
        started = bool(reader.scalar_keys(run_id))
        return {"figures": {}, "banner": None, "redraw": started, "state": state,
                "verdict": None}
    frame = reader.read_scalars(run_id, keys=state["keys"], downsample=ALL_POINTS,
                                since_step=last + 1)
    scalars = F.by_key(frame)
    hist = reader.read_histograms(run_id, "entropy", downsample=ALL_POINTS,
                                  since_step=state["last_hist_step"] + 1)
    alerts = reader.read_alerts(run_id)
    new_alerts = alerts.iloc[state["alerts_seen"]:] if len(alerts) > state["alerts_seen"] \
        else alerts.iloc[:0]
    state = {**state, "plans": dict(state["plans"])}
    out: dict = {"figures": {}, "banner": None, "redraw": False, "verdict": None}
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
    if not frame.empty and not state.get("heldout"):
        # a run's first held-out evaluation: redraw once to show the chart
        out["redraw"] = out["redraw"] or H.has_heldout(reader.scalar_keys(run_id))
    elif not frame.empty:
        # a new evaluation moves the shaded cost of collapse: redraw (every eval_every steps).
        # Read apart from the frame: the trainer logs step S's eval after step S's scalars, so
        # it may land after the tick has moved past S
        out["redraw"] = out["redraw"] or new_evaluation(reader, state, watch=False)
        state["eval_watch_until"] = time.time() + EVAL_WATCH_S
    if not frame.empty and not state.get("probes"):
        # a run's first probed step: redraw once to show its pivotal-tokens panel
        out["redraw"] = out["redraw"] or P.has_probes(reader.scalar_keys(run_id))
    if not frame.empty and not state.get("trust"):
        # a run's first step with trust/*: redraw once to show its trust-region panel
        out["redraw"] = out["redraw"] or T.has_trust(reader.scalar_keys(run_id))
    if not frame.empty and not state.get("pattern"):
        # a run's first re-scoring after its base: redraw once to show its entropy-pattern panel
        out["redraw"] = out["redraw"] or RF.has_reference(reader.scalar_keys(run_id))
    if not frame.empty and not state.get("mismatch"):
        # a run that starts logging mismatch after its first draw: redraw once to show its charts
        out["redraw"] = out["redraw"] or M.has_mismatch(reader.scalar_keys(run_id))
    elif not frame.empty and focus is None and frame["key"].str.startswith(M.PREFIX).any():
        out["figures"]["ratios"] = mismatch_histogram(reader, run_id)
    if not frame.empty:
        state["last_step"] = max(last, int(frame["step"].max()))
        h = _last_entropy(frame)
        state["entropy"] = state.get("entropy") if h is None else h
    if not hist.empty:
        state["last_hist_step"] = max(state["last_hist_step"], int(hist["step"].max()))
    if len(new_alerts):
        out["banner"] = banner(alerts, run_id, prefix)
        state["alerts_seen"] = len(alerts)
    if len(new_alerts) or not frame.empty:
        out["verdict"] = run_verdict(alerts, state.get("entropy"), state["last_step"])
    out["state"] = state
    return out


def new_evaluation(reader: Reader, state: dict, watch: bool = True) -> bool:
    """Whether a held-out run stored an evaluation since the one drawn. watch: only within
    EVAL_WATCH_S of its last new step (an evaluation follows its step's rows by the time it
    takes; the run's final one comes after its last step)."""
    if not state.get("heldout") or (watch and time.time() > state.get("eval_watch_until", 0)):
        return False
    evals = reader.read_scalars(state["run_id"], keys=H.eval_pass_keys(state["keys"]),
                                downsample=ALL_POINTS,
                                since_step=state.get("last_eval_step", -1) + 1)
    return not evals.empty


def status_line(run: dict | None, state: dict | None) -> str:
    """"live · step 1,234 · fork · tiny-qwen2" above the charts."""
    if not run:
        return "no such run"
    step = (state or {}).get("last_step", run.get("last_step"))
    waiting = step is None or (isinstance(step, float) and math.isnan(step)) or step < 0
    step_text = "waiting for the first step" if waiting else f"step {int(step):,}"
    parts = [str(run.get("status") or "?"), step_text,
             f"strategy {run.get('strategy') or '–'}", f"model {run.get('model') or '–'}"]
    return " · ".join(parts)
