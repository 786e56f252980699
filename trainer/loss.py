"""GRPO/DAPO losses: group-normalised advantages, the clipped surrogate with separate low/high
clip (clip-higher), the k3 KL to a reference, token-level normalisation under a selection mask,
the token-level TIS weights of a sampler/trainer mismatch, the sparse-distillation loss, and the
bounded log-likelihood used by the warm-up.
"""
from __future__ import annotations

import math
from typing import Literal

import torch

Normalizer = Literal["tokens", "selected", "response"]


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, *, scale: bool = True,
                     eps: float = 1e-4) -> torch.Tensor:
    """A_i = (r_i - mean_group) / (std_group + eps), or mean-centred only when not `scale`.
    std is the population std (unbiased=False), as in DAPO; zero-variance groups give 0."""
    rewards = rewards.float()
    adv = torch.zeros_like(rewards)
    for gid in torch.unique(group_ids):
        rows = group_ids == gid
        r = rewards[rows]
        centred = r - r.mean()
        adv[rows] = centred / (r.std(unbiased=False) + eps) if scale else centred
    return adv


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π‖π_ref) per token: exp(r) - r - 1 with r = ref - logp."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1


def masked_normalise(per_token: torch.Tensor, selected: torch.Tensor, valid: torch.Tensor,
                     normalizer: Normalizer) -> torch.Tensor:
    """Sum of per-token losses over `selected`, divided by: every valid token ("tokens", the
    DAPO token-level / fork-paper choice), the selected count ("selected", verl/STAPO), or each
    response's own selected count then averaged over responses ("response", ICT)."""
    sel = selected.float()
    if normalizer == "tokens":
        return (per_token * sel).sum() / valid.float().sum().clamp(min=1)
    if normalizer == "selected":
        return (per_token * sel).sum() / sel.sum().clamp(min=1)
    if normalizer == "response":
        per_response = (per_token * sel).sum(dim=1) / sel.sum(dim=1).clamp(min=1)
        return per_response[sel.sum(dim=1) > 0].mean() if sel.any() else per_token.sum() * 0
    raise ValueError(f"unknown normalizer {normalizer!r}: tokens, selected or response")


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
              selected: torch.Tensor, valid: torch.Tensor, *, clip_low: float = 0.2,
              clip_high: float = 0.28, normalizer: Normalizer = "tokens",
              ref_logp: torch.Tensor | None = None, beta: float = 0.0,
              is_weight: torch.Tensor | None = None,
              keep: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The DAPO clipped surrogate -w·min(ρA, clip(ρ, 1-εl, 1+εh)A) (+ β·k3 KL), over the selected
    tokens, normalised as `normalizer` says. advantages: [B] (broadcast over tokens) or [B, T];
    is_weight [B, T]: a detached per-token weight w (TIS), 1 when None. keep [B, T] bool: DPPO's
    trust region in place of the ratio clip (hooks.metrics.trust.dppo_keep): -w·ρA where keep, no
    gradient where not."""
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    if keep is None:
        per_token = -torch.minimum(unclipped, clipped)
    else:
        per_token = -unclipped * keep.detach().to(unclipped.dtype)
    if is_weight is not None:
        per_token = per_token * is_weight.detach().to(per_token.dtype)
    info: dict[str, float] = {}
    sel = selected & valid
    if ref_logp is not None and beta > 0:
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + beta * kl
        info["kl"] = float((kl.detach() * valid).sum() / valid.sum().clamp(min=1))
    loss = masked_normalise(per_token, sel, valid, normalizer)
    n_sel = sel.sum().clamp(min=1)
    info["clip/frac"] = float(((clipped < unclipped) & sel).sum() / n_sel)  # the clip won the min
    # which bound won it (as TRL's clip_ratio/high_mean, low_mean): clip_asymmetry reads the split
    info["clip/high_frac"] = float(((ratio > 1 + clip_high) & (adv > 0) & sel).sum() / n_sel)
    info["clip/low_frac"] = float(((ratio < 1 - clip_low) & (adv < 0) & sel).sum() / n_sel)
    return loss, info


def tis_weights(log_ratio: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level truncated importance sampling (Yao et al. 2025): weight min(r, cap) with
    r = p_train_old / p_sampler = exp(log_ratio), 1 where the ratio is unknown (NaN); and the
    tokens whose ratio the cap truncated (r > cap). log_ratio: hooks.metrics.mismatch.log_ratio."""
    known = ~torch.isnan(log_ratio)
    capped = torch.clamp(log_ratio, max=math.log(cap))
    weight = torch.where(known, torch.exp(capped), torch.ones_like(log_ratio)).float()
    return weight, known & (log_ratio > math.log(cap))


def distill_loss(token_kl: torch.Tensor, selected: torch.Tensor) -> torch.Tensor:
    """Sparse on-policy distillation: mean of the per-token reverse KL over selected tokens."""
    sel = selected.float()
    return (token_kl * sel).sum() / sel.sum().clamp(min=1)


def bounded_nll(logp: torch.Tensor) -> torch.Tensor:
    """log(2 - p): bounded by log 2, ≈ -log p on confident tokens (docs/algorithms.md §8)."""
    return torch.log(2 - torch.exp(logp))
