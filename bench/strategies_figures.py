"""One sweep cell's figures from its DuckDB file: train reward, held-out eval pass@1/pass@8 at
start/peak/end, the collapse step (the entropy_collapse detector's alerts and the raw entropy
floor it uses), entropy and fork share. Pure functions of the stored scalars and alerts.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from forksight.monitor.alerts.config import CollapseConfig

# train-side series are averaged over WINDOW steps at the start and the end, and their peak is the
# best WINDOW-step rolling mean: one step's reward on 64 samples is too noisy to read alone
WINDOW = 10
DETECTOR = "entropy_collapse"


def entropy_floor(entropy: list[float], config: CollapseConfig | None = None) -> float:
    """The floor the entropy_collapse detector declares collapse under: max(floor, baseline ×
    (1 − drop_fraction)), the baseline being the mean of the first baseline_steps values."""
    c = config or CollapseConfig()
    base = float(np.mean(entropy[: c.baseline_steps])) if entropy else 0.0
    return max(c.floor, base * (1.0 - c.drop_fraction))


def floor_step(steps: list[int], entropy: list[float], config: CollapseConfig | None = None) -> int | None:
    """First step whose raw (unsmoothed) entropy is under the detector's floor; None if never,
    or if the run is shorter than the detector's baseline."""
    c = config or CollapseConfig()
    if len(entropy) < c.baseline_steps:
        return None
    floor = entropy_floor(entropy, c)
    below = [s for s, h in zip(steps, entropy) if h < floor]
    return int(below[0]) if below else None


def first_alert(alerts: list[dict], severity: str) -> int | None:
    """First step of an entropy_collapse alert of this severity (warning or critical)."""
    hits = [int(a["step"]) for a in alerts if a["detector"] == DETECTOR and a["severity"] == severity]
    return min(hits) if hits else None


def _ends(values: list[float], window: int) -> tuple[float | None, float | None, float | None]:
    """(start, peak, end): mean of the first and last `window` values, best rolling mean."""
    if not values:
        return None, None, None
    w = max(1, min(window, len(values)))
    rolling = np.convolve(np.asarray(values, float), np.ones(w) / w, mode="valid")
    return float(np.mean(values[:w])), float(rolling.max()), float(np.mean(values[-w:]))


def _evals(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """(first, best, last) held-out evaluation: each is one evaluation over all held-out problems."""
    if not values:
        return None, None, None
    return float(values[0]), float(max(values)), float(values[-1])


def series(rows: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one scalar, in step order, over the steps that logged it."""
    steps = sorted(s for s, r in rows.items() if key in r)
    return steps, [float(rows[s][key]) for s in steps]


def figures(rows: dict[int, dict[str, float]], alerts: list[dict], window: int = WINDOW) -> dict[str, Any]:
    """Every figure of one run, from its scalars by step ({step: {key: value}}) and alerts
    (dicts with detector, severity, step). Rounded to 6 decimals (the JSON is read by people)."""
    out: dict[str, Any] = {}
    for name, key in (("reward", "reward/mean"), ("entropy", "entropy/mean"), ("fork_frac", "fork/frac")):
        start, peak, end = _ends(series(rows, key)[1], window)
        out.update({f"{name}_start": start, f"{name}_peak": peak, f"{name}_end": end})
    for k in (1, 8):
        eval_steps, values = series(rows, f"eval/pass@{k}")
        first, best, last = _evals(values)
        out.update({f"eval_pass{k}_start": first, f"eval_pass{k}_peak": best, f"eval_pass{k}_end": last})
    eval_steps = series(rows, "eval/pass@1")[0]
    out["eval_steps"] = [int(s) for s in eval_steps]
    steps, entropy = series(rows, "entropy/mean")
    out["steps"] = int(steps[-1]) if steps else 0
    out["entropy_floor"] = entropy_floor(entropy) if entropy else None
    out["collapse_step"] = first_alert(alerts, "critical")          # the detector's verdict
    out["collapse_warning_step"] = first_alert(alerts, "warning")   # its earlier warning
    out["collapse_step_floor"] = floor_step(steps, entropy)         # raw entropy under its floor
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}
