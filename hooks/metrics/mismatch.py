"""Training–inference mismatch from the sampled tokens (docs/algorithms.md §11): the one home of the
per-token log ratio log r = log p_train − log p_sampler, its step scalars (`mismatch/*`, KL(sampler ‖
trainer) by the k1 and k3 estimators, ratio quantiles, out-of-band fractions, sequence-level weights)
and the cleaning of a sampler's log p before it is stored.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from forksight.base.constants import MISMATCH_BANDS

# a log p above 0 is p > 1; bf16/fp16 rounding can land a hair above 0, so only past this is it wrong
_LOGP_SLACK = 1e-3


def log_ratio(logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """log p_train − log p_sampler per token (float64), NaN where masked out or either is unknown."""
    lr = logp.detach().to(torch.float64).cpu() - sampler_logp.detach().to(torch.float64).cpu()
    known = mask.detach().bool().cpu() & torch.isfinite(lr)
    return torch.where(known, lr, torch.full_like(lr, math.nan))


def clean_sampler_logp(sampler_logp: Tensor, mask: Tensor, where: str) -> tuple[Tensor, str | None]:
    """The sampler's log p as float32 with NaN (= unknown, stored null) for values that cannot be a log p
    at valid positions (NaN, ±inf, above 0); the message says how many and what to check, else None."""
    values = sampler_logp.detach().to(torch.float32)
    valid = mask.detach().bool().to(values.device)
    # NaN is "unknown" already; a present value that cannot be a log p is bad
    bad = valid & ~torch.isnan(values) & ~(torch.isfinite(values) & (values <= _LOGP_SLACK))
    n_bad = int(bad.sum())
    values = torch.where(bad, torch.full_like(values, math.nan), values)
    if not n_bad:
        return values, None
    return values, (f"{where}: {n_bad} sampler log p value(s) are +inf, -inf or above 0 and cannot be a "
                    f"log-probability; they are stored as null (unknown). Check the inference engine's "
                    f"logprobs output (a log p is ≤ 0 and finite for a token it sampled)")


def _token_keys(lr: np.ndarray, corrected: np.ndarray | None) -> dict[str, float]:
    """Token-level mismatch scalars of the log ratios lr (non-empty, float64)."""
    r = np.exp(lr)
    low2, low5 = (math.log(b) for b in MISMATCH_BANDS)
    out = {
        "mismatch/tokens": float(lr.size),
        "mismatch/kl_k1": float(np.mean(-lr)),
        "mismatch/kl_k3": float(np.mean(np.expm1(lr) - lr)),   # r − 1 − log r ≥ 0, exact near r = 1
        "mismatch/logp_diff_abs_mean": float(np.mean(np.abs(lr))),
        "mismatch/logp_diff_abs_max": float(np.max(np.abs(lr))),
        "mismatch/is_ratio_min": float(r.min()),
        "mismatch/is_ratio_mean": float(r.mean()),
        "mismatch/is_ratio_max": float(r.max()),
        "mismatch/is_ratio_p99": float(np.quantile(r, 0.99)),
        "mismatch/frac_outside_2x": float(np.mean(np.abs(lr) > low2)),
        "mismatch/frac_outside_5x": float(np.mean(np.abs(lr) > low5)),
    }
    if corrected is not None:
        out["mismatch/frac_corrected"] = float(np.mean(corrected))
    return {k: v for k, v in out.items() if math.isfinite(v)}   # r overflows past |log r| ≈ 709


def _sequence_keys(lr: Tensor) -> dict[str, float]:
    """Sequence-level weights w_i = Π_t r_{i,t} of the rows holding a known ratio: the largest |log w|
    and the normalised effective sample size (Σw)² / (n Σw²), computed in log space."""
    known = ~torch.isnan(lr)
    rows = known.any(1)
    if not bool(rows.any()):
        return {}
    seq = torch.where(known, lr, torch.zeros_like(lr)).sum(1)[rows]
    n = seq.numel()
    log_ess = 2 * torch.logsumexp(seq, 0) - math.log(n) - torch.logsumexp(2 * seq, 0)
    return {"mismatch/seq_log_ratio_max": float(seq.abs().max()), "mismatch/seq_ess": float(log_ess.exp())}


def mismatch_scalars(logp: Tensor, sampler_logp: Tensor, mask: Tensor, fork: Tensor | None = None,
                     corrected: Tensor | None = None) -> dict[str, float]:
    """The step's `mismatch/*` scalars over mask-valid tokens whose trainer and sampler log p are both
    known (empty when none is); with fork, the token-level keys again over `/fork` and `/nonfork` tokens.
    corrected [B, T] bool: tokens the run's own correction (TIS truncation, MIS masking) changed."""
    return ratio_scalars(log_ratio(logp, sampler_logp, mask), fork=fork, corrected=corrected)


def ratio_scalars(lr: Tensor, fork: Tensor | None = None, corrected: Tensor | None = None) -> dict[str, float]:
    """`mismatch_scalars` of log ratios already computed by `log_ratio` [B, T] (NaN: not counted)."""
    known = ~torch.isnan(lr)
    if not bool(known.any()):
        return {}
    fixed = corrected.detach().bool().cpu() if corrected is not None else None

    def part(where: Tensor) -> dict[str, float]:
        return _token_keys(lr[where].numpy(), fixed[where].numpy() if fixed is not None else None)

    out = part(known)
    out.update(_sequence_keys(lr))
    if fork is not None:
        is_fork = fork.detach().bool().cpu()
        for name, where in (("fork", known & is_fork), ("nonfork", known & ~is_fork)):
            if bool(where.any()):
                out.update({f"{k}/{name}": v for k, v in part(where).items()})
    return out
