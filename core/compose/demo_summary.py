"""`forksight demo`'s closing summary, read from what the collector stored: per run its lr and why,
entropy at the end against its start, when the collapse warning fired against when entropy fell
under 20% of its start, train reward, held-out pass@1/pass@k (first evaluation → last) and the
dashboard's verdict. Printed as a table and written as JSON (docs/demo.json is one, committed)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from forksight.base.interfaces import Reader

UNDER_FRACTION = 0.2     # "collapsed" for the summary: raw entropy under this share of its start
EDGE_STEPS = 10          # start / end of a series: the mean of its first / last this many steps
COLLAPSE = "entropy_collapse"
DEFINITIONS = {
    "entropy_start": f"mean entropy/mean (nats per token) over the first {EDGE_STEPS} steps",
    "entropy_end": f"mean entropy/mean over the last {EDGE_STEPS} steps",
    "under_20pct_step": f"first step whose raw entropy/mean is under {UNDER_FRACTION:g} × entropy_start",
    "warning_step": "first entropy_collapse alert of severity warning the collector raised",
    "critical_step": "first entropy_collapse alert of severity critical (entropy under the detector's floor)",
    "warning_lead": "under_20pct_step − warning_step: how many steps ahead forksight warned",
    "reward_start / reward_end": f"mean train reward/mean over the first / last {EDGE_STEPS} steps",
    "fork_frac_start / fork_frac_end": f"mean fork/frac (share of tokens with H ≥ 0.672) over the first / last {EDGE_STEPS} steps",
    "heldout": "eval/pass@k on held-out problems the run never trains on: its first evaluation "
               "(the base model, step 0) and its last",
    "verdict": "the dashboard's one-word health of the run at its last step (dashboard/verdict.py)",
}


def _edges(values: np.ndarray) -> tuple[float | None, float | None]:
    if not len(values):
        return None, None
    return float(values[:EDGE_STEPS].mean()), float(values[-EDGE_STEPS:].mean())


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def run_summary(reader: Reader, run_id: str) -> dict:
    """The figures of one stored run (see DEFINITIONS)."""
    from forksight.dashboard.heldout_figures import eval_pass_keys
    from forksight.dashboard.verdict import verdict

    keys = reader.scalar_keys(run_id)
    held = eval_pass_keys(keys)
    wanted = ["entropy/mean", "reward/mean", "fork/frac", *held]
    df = reader.read_scalars(run_id, wanted, downsample=10**6)
    series = {k: g.sort_values("step") for k, g in df.groupby("key")}
    ent = series.get("entropy/mean")
    steps = ent.step.to_numpy(int) if ent is not None else np.array([], int)
    h = ent.value.to_numpy(np.float64) if ent is not None else np.array([])
    h_start, h_end = _edges(h)
    under = np.flatnonzero(h < UNDER_FRACTION * h_start) if h_start is not None else np.array([], int)
    alerts = reader.read_alerts(run_id)
    collapse = alerts[alerts.detector == COLLAPSE] if len(alerts) else alerts
    warned = collapse[collapse.severity == "warning"].step if len(collapse) else []
    critical = collapse[collapse.severity == "critical"].step if len(collapse) else []
    out: dict = {
        "steps": int(steps[-1]) if len(steps) else 0,
        "entropy_start": _r(h_start), "entropy_end": _r(h_end),
        "entropy_end_share": _r(h_end / h_start if h_start else None, 3),
        "under_20pct_step": int(steps[under[0]]) if len(under) else None,
        "warning_step": int(min(warned)) if len(warned) else None,
        "critical_step": int(min(critical)) if len(critical) else None,
    }
    lead = None
    if out["warning_step"] is not None and out["under_20pct_step"] is not None:
        lead = out["under_20pct_step"] - out["warning_step"]
    out["warning_lead"] = lead
    for name, key in (("reward", "reward/mean"), ("fork_frac", "fork/frac")):
        start, end = _edges(series[key].value.to_numpy(np.float64)) if key in series else (None, None)
        out[f"{name}_start"], out[f"{name}_end"] = _r(start), _r(end)
    heldout = {}
    for key in held:
        rows = series[key]
        heldout[key.split("/", 1)[1]] = {"first_step": int(rows.step.iloc[0]), "first": _r(rows.value.iloc[0]),
                                         "last_step": int(rows.step.iloc[-1]), "last": _r(rows.value.iloc[-1])}
    out["heldout"] = heldout
    if ent is not None and len(ent) > 1:      # the run's own pace, from the stored wall times
        wall = float(ent.wall_time.iloc[-1]) - float(ent.wall_time.iloc[0])   # epoch seconds
        out["steps_per_second"] = _r((len(ent) - 1) / wall, 2) if wall > 0 else None
    v = verdict(alerts.to_dict("records") if len(alerts) else [],
                {"entropy/mean": float(h[-1])} if len(h) else {}, out["steps"] or None)
    out["verdict"] = {"state": v.state, "label": v.label, "why": v.why}
    out["alerts"] = sorted(set(alerts.detector)) if len(alerts) else []
    return out


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def summarise(reader: Reader, runs: Sequence[dict], meta: dict) -> dict:
    """{"meta": …, "definitions": …, "runs": [plan row + run_summary]}; runs: the demo's plan rows
    (name, label, strategy, lr, why, run_id), those without a stored run left out."""
    import torch

    rows = [{**run, **run_summary(reader, run["run_id"])} for run in runs if run.get("run_id")]
    return {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit(),
                     "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                     # the kernel path the trainers ran (they inherit ATEN_CPU_CAPABILITY): trajectories differ by it
                     "cpu_capability": torch.backends.cpu.get_cpu_capability(), **meta},
            "definitions": DEFINITIONS, "runs": rows}


def _num(x, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _held(run: dict) -> str:
    parts = []
    for k, fig in run["heldout"].items():
        if k in ("pass@1", max(run["heldout"], key=lambda s: int(s.split("@")[1]))):
            parts.append(f"{k} {_num(fig['first'])}→{_num(fig['last'])}")
    return ", ".join(parts) or "-"


def _collapse_text(run: dict) -> str:
    warned, under, critical = run["warning_step"], run["under_20pct_step"], run["critical_step"]
    parts = [f"warned at step {warned}" if warned is not None else "no collapse warning",
             f"under 20% of its start at step {under}" if under is not None
             else "entropy never under 20% of its start"]
    text = ", ".join(parts)
    if run["warning_lead"] is not None:
        text += f": warned {run['warning_lead']} steps ahead"
    return text + (f" (the detector's floor at step {critical})" if critical is not None else "")


def format_summary(summary: dict) -> str:
    """The table the demo prints at the end, one block per run."""
    lines = ["forksight demo: summary", ""]
    for run in summary["runs"]:
        share = run.get("entropy_end_share")
        lines += [
            f"  {run['label']}   (run {run['run_id']}, {run['steps']} steps)",
            f"    entropy     {_num(run['entropy_start'], '.3f')} → {_num(run['entropy_end'], '.3f')} nats"
            f" ({_num(None if share is None else 100 * share, '.0f')}% of its start)",
            f"    collapse    {_collapse_text(run)}",
            f"    reward      {_num(run['reward_start'])} → {_num(run['reward_end'])} (train)   "
            f"held-out {_held(run)}",
            f"    verdict     {run['verdict']['label']}",
            ""]
    return "\n".join(lines)


def write_summary(summary: dict, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return path
