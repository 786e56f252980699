"""Selection helpers (docs/algorithms.md §3, §4, §7): the `fork` strategy's top-ρ entropy mask, ICT's top-ρ
per response, Cui et al.'s token covariance. Top-ρ is RELATIVE to each batch; the absolute fork
reference behind `fork/frac` is FORK_ENTROPY (H ≥ 0.672)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from forksight.hooks.metrics.logits_source import as_mask


def _quantile_sorted(sorted_values: Tensor, q: float) -> Tensor:
    """Linear-interpolated quantile of an ascending 1-D tensor (numpy's default method)."""
    pos = q * (sorted_values.numel() - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _check_rho(rho: float) -> float:
    if not 0.0 < float(rho) <= 1.0:
        raise ValueError(f"rho is the fraction of tokens to keep and must be in (0, 1], got {rho}")
    return float(rho)


def top_rho_mask(entropy: Tensor, mask: Tensor, rho: float = 0.2) -> tuple[Tensor, float]:
    """The `fork` strategy's tokens: valid tokens whose entropy ≥ the batch's (1−rho) quantile.

    Returns (mask, quantile threshold); linear interpolation (numpy's default), inf when no token is valid."""
    rho = _check_rho(rho)
    valid = as_mask(mask, tuple(entropy.shape), entropy.device) & ~torch.isnan(entropy)  # NaN: not computed
    values = entropy.detach()[valid].to(torch.float32)
    if values.numel() == 0:
        return torch.zeros_like(valid), float("inf")
    threshold = float(_quantile_sorted(values.sort().values, 1.0 - rho))
    return (entropy >= threshold) & valid, threshold


def fork_threshold(rule, entropy: Tensor, mask: Tensor) -> float:
    """The step's fork threshold in nats under a fork rule (forksight.base.fork_rule): τ for `abs:τ`,
    the (1−q) quantile of the valid tokens' H for `top:q` (inf when none is valid). Forks: H ≥ it."""
    return rule.value if rule.kind == "abs" else top_rho_mask(entropy, mask, rule.value)[1]


def top_rho_per_response(score: Tensor, mask: Tensor, rho: float = 0.1) -> Tensor:
    """Per row, valid tokens whose score ≥ that row's (1−rho) percentile (linear interpolation);
    at least one token per non-empty row (the row's maximum always qualifies). NaN counts as invalid."""
    rho = _check_rho(rho)
    valid = as_mask(mask, tuple(score.shape), score.device) & ~torch.isnan(score)  # NaN: not computed
    x = score.detach().to(torch.float32).masked_fill(~valid, float("inf"))
    ordered = x.sort(dim=-1).values  # valid values first, ascending
    n = valid.sum(-1)
    pos = (1.0 - rho) * (n - 1).clamp(min=0).to(torch.float32)
    lo, hi = pos.floor().long(), pos.ceil().long()
    v_lo, v_hi = ordered.gather(-1, lo[:, None])[:, 0], ordered.gather(-1, hi[:, None])[:, 0]
    threshold = v_lo + (v_hi - v_lo) * (pos - lo)
    threshold = torch.where(n > 0, threshold, torch.full_like(threshold, float("inf")))
    return (score >= threshold[:, None]) & valid


def token_covariance(advantages, logp: Tensor, mask: Tensor) -> Tensor:
    """Cui et al.'s C = (A − Ā)(log π − mean log π) per token, means over valid tokens; 0 elsewhere."""
    valid = as_mask(mask, tuple(logp.shape), logp.device)
    adv = torch.as_tensor(advantages, device=logp.device).detach().to(torch.float32)
    if adv.dim() == 1 and adv.shape[0] == logp.shape[0]:
        adv = adv[:, None].expand_as(logp)
    if tuple(adv.shape) != tuple(logp.shape):
        raise ValueError(f"advantages must be [B] or [B, T] = {list(logp.shape)}, got {tuple(adv.shape)}")
    lp = logp.detach().to(torch.float32)
    count = valid.sum()
    if int(count) == 0:
        return torch.zeros_like(lp)
    w = valid.to(torch.float32)
    adv_mean = (adv * w).sum() / count
    lp_mean = (lp * w).sum() / count
    return torch.where(valid, (adv - adv_mean) * (lp - lp_mean), torch.zeros((), device=lp.device))
