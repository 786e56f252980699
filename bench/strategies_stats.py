"""The sweep's statistics: a seeded percentile bootstrap over seeds, the one learning-rate rule
every strategy is chosen by, and the per-task, per-strategy summary at the chosen lr.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

RESAMPLES = 10_000
LEVEL = 0.95
RULE = ("per task and strategy, the lr with the highest mean over seeds of held-out eval pass@8 at the "
        "end (eval_pass8_end); ties broken by mean eval_pass1_end, then by the smaller lr")
# the figures summarised per strategy (each: mean and 95% bootstrap interval over seeds)
FIGURES = ("eval_pass8_end", "eval_pass1_end", "eval_pass8_start", "eval_pass8_peak", "eval_pass1_start",
           "eval_pass1_peak", "reward_start", "reward_peak", "reward_end", "entropy_start", "entropy_end",
           "fork_frac_start", "fork_frac_end")
COLLAPSE = ("collapse_step", "collapse_step_floor", "collapse_warning_step")
TIE = 1e-9


def bootstrap_ci(values: list[float], resamples: int = RESAMPLES, seed: int = 0,
                 level: float = LEVEL) -> dict[str, float | int | None]:
    """Mean and percentile-bootstrap interval: `resamples` resamples of the values with
    replacement (numpy, seeded), the interval the (1 ± level)/2 quantiles of their means
    (numpy's linear interpolation). With 3 values it can take only 10 distinct means: coarse."""
    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if x.size == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return {"mean": float(x.mean()), "lo": float(lo), "hi": float(hi), "n": int(x.size)}


def _mean(cells: list[dict], key: str) -> float:
    vals = [c[key] for c in cells if c.get(key) is not None]
    return float(np.mean(vals)) if vals else float("-inf")


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def choose_lr(cells: list[dict]) -> float:
    """The lr RULE picks among one task's and strategy's cells (each with lr and figures)."""
    if not cells:
        raise ValueError("choose_lr needs at least one cell")
    by_lr: dict[float, list[dict]] = defaultdict(list)
    for cell in cells:
        by_lr[float(cell["lr"])].append(cell)
    best, best_key = None, None
    for lr in sorted(by_lr):  # ascending: on a full tie the smaller lr is kept
        key = (_mean(by_lr[lr], "eval_pass8_end"), _mean(by_lr[lr], "eval_pass1_end"))
        if best_key is None or key[0] > best_key[0] + TIE or (
                abs(key[0] - best_key[0]) <= TIE and key[1] > best_key[1] + TIE):
            best, best_key = lr, key
    return best


def _collapse(values: list[int | None], resamples: int, seed: int) -> dict[str, Any]:
    """How many seeds collapsed, and mean/interval of the step over those that did (the others
    never reached it within the run: a censored value, not a number to average)."""
    hit = [float(v) for v in values if v is not None]
    return {"collapsed": len(hit), "of": len(values), **bootstrap_ci(hit, resamples, seed)}


def summarise(cells: list[dict], resamples: int = RESAMPLES, seed: int = 0) -> dict[str, Any]:
    """{task: {strategy: {lr, seeds, lr_scores, figures: {name: {mean, lo, hi, n}}}}}."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for cell in cells:
        groups[(cell["task"], cell["strategy"])].append(cell)
    out: dict[str, Any] = {}
    for (task, strategy), group in sorted(groups.items()):
        lr = choose_lr(group)
        chosen = sorted((c for c in group if float(c["lr"]) == lr), key=lambda c: c["seed"])
        lrs = sorted({float(c["lr"]) for c in group})
        figs = {name: bootstrap_ci([c.get(name) for c in chosen], resamples, seed) for name in FIGURES}
        figs.update({name: _collapse([c.get(name) for c in chosen], resamples, seed) for name in COLLAPSE})
        out.setdefault(task, {})[strategy] = {
            "lr": lr, "seeds": [c["seed"] for c in chosen], "figures": figs,
            "lr_scores": {f"{x:g}": {k: _finite(_mean([c for c in group if float(c["lr"]) == x], k))
                                     for k in ("eval_pass8_end", "eval_pass1_end")} for x in lrs},
        }
    return out
