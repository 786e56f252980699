"""Which fork rule finds a run's pivotal tokens (docs/algorithms.md §12): from its probe rows, the
absolute threshold τ (forks: H ≥ τ) and the per-step share q (forks: the step's top q of probed tokens
by H) with the best F1 against the tokens the probes found pivotal, each with a bootstrap 95%
interval over probed completions (the best τ and q of each resample). Reads one-token rows with a
known H; rows of `all` probes cover every token, `search` rows the tokens the search reached (the
others are not pivotal but their H is not in the rows), `forks` rows a biased sample — the result
says which it read."""
from __future__ import annotations

from typing import Sequence

import numpy as np

QS = tuple(round(0.05 * k, 2) for k in range(1, 11))        # 5% … 50%


def _f1(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    tp = float((pred & truth).sum())
    precision = tp / pred.sum() if pred.any() else 0.0
    recall = tp / truth.sum() if truth.any() else 0.0
    return (2 * precision * recall / (precision + recall) if precision + recall else 0.0), precision, recall


def _best_tau(h: np.ndarray, truth: np.ndarray) -> tuple[float, float, float, float]:
    candidates = np.unique(np.quantile(h, np.linspace(0.0, 0.99, 100)))
    scored = [(*_f1(h >= tau, truth), float(tau)) for tau in candidates]
    f1, precision, recall, tau = max(scored, key=lambda s: (s[0], s[3]))
    return tau, f1, precision, recall


def _top_q(h: np.ndarray, steps: np.ndarray, q: float) -> np.ndarray:
    pred = np.zeros(len(h), dtype=bool)
    for s in np.unique(steps):
        at = steps == s
        pred[at] = h[at] >= np.quantile(h[at], 1.0 - q)
    return pred


def _best_q(h: np.ndarray, steps: np.ndarray, truth: np.ndarray) -> tuple[float, float, float, float]:
    scored = [(*_f1(_top_q(h, steps, q), truth), q) for q in QS]
    f1, precision, recall, q = max(scored, key=lambda s: (s[0], -s[3]))
    return q, f1, precision, recall


def calibrate(rows: Sequence[dict], *, resamples: int = 200, seed: int = 0) -> dict:
    """{"tokens", "pivots", "completions", "tau": {...}, "q": {...}, "best"} from probe rows (each
    with step, sample_id, entropy, pivotal and optionally span); ValueError when they hold no
    pivotal token with a known H."""
    kept = [r for r in rows if r.get("entropy") is not None and np.isfinite(r["entropy"])
            and (r.get("span") is None or r.get("span") != r.get("span") or int(r["span"]) == 1)]
    h = np.array([float(r["entropy"]) for r in kept])
    truth = np.array([bool(r["pivotal"]) for r in kept])
    steps = np.array([int(r["step"]) for r in kept])
    if not truth.any():
        raise ValueError(f"the probes hold no pivotal token with a known entropy ({len(kept)} probed token(s)): "
                         "nothing to calibrate against; probe more completions (forksight probe --positions all)")
    units = np.array([hash((int(r["step"]), int(r["sample_id"]))) for r in kept])
    tau, f1_tau, p_tau, r_tau = _best_tau(h, truth)
    q, f1_q, p_q, r_q = _best_q(h, steps, truth)
    rng, ids = np.random.default_rng(seed), np.unique(units)
    taus, qs = [], []
    for _ in range(resamples):                # completions resampled whole, as the pivots cluster in them
        pick = np.concatenate([np.flatnonzero(units == u) for u in rng.choice(ids, len(ids))])
        if truth[pick].any():
            taus.append(_best_tau(h[pick], truth[pick])[0])
            qs.append(_best_q(h[pick], steps[pick], truth[pick])[0])

    def interval(values: list[float]) -> list[float] | None:
        return [round(float(np.percentile(values, 2.5)), 4), round(float(np.percentile(values, 97.5)), 4)] \
            if values else None

    out = {"tokens": int(len(kept)), "pivots": int(truth.sum()), "completions": int(len(ids)),
           "tau": {"value": round(tau, 4), "f1": round(f1_tau, 4), "precision": round(p_tau, 4),
                   "recall": round(r_tau, 4), "interval": interval(taus)},
           "q": {"value": q, "f1": round(f1_q, 4), "precision": round(p_q, 4), "recall": round(r_q, 4),
                 "interval": interval(qs)}}
    out["best"] = f"abs:{out['tau']['value']:g}" if f1_tau >= f1_q else f"top:{q:g}"
    return out
