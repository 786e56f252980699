"""Token-selection strategies: which completion tokens the loss trains on, and how the loss is
normalised. The scores (entropy, JS, log p) come from the one metrics.token_stats call the step
already made; the KL for distillation from metrics.token_kl.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from forksight.hooks import metrics


@dataclass
class Selection:
    """The mask the loss uses, its normaliser (see loss.masked_normalise) and step scalars."""

    mask: torch.Tensor  # [B, T] bool
    normalizer: str     # "tokens" | "selected" | "response"
    info: dict[str, float] = field(default_factory=dict)


def select(strategy: str, stats: "metrics.TokenStats", *, advantages: torch.Tensor | None = None,
           rho: float = 0.2, normalizer: str = "paper", generator: torch.Generator | None = None,
           stapo_tau_p: float = 0.01, stapo_entropy_q: float = 0.05,
           kl: torch.Tensor | None = None, distill_tokens: int = 1) -> Selection:
    """Dispatch on the strategy name (docs/algorithms.md §3–§5)."""
    valid = stats.mask.bool()
    fork_norm = "tokens" if normalizer == "paper" else "selected"
    if strategy == "all":
        return Selection(valid.clone(), "tokens")
    if strategy == "fork":
        # a quantile of this batch's trained tokens (ρ), whatever fork rule fork/frac follows
        mask, threshold = metrics.top_rho_mask(stats.entropy, valid, rho)
        return Selection(mask, fork_norm, {"selected/threshold": threshold})
    if strategy == "ict":
        if stats.js is None:
            raise ValueError("strategy 'ict' needs JS: call token_stats with group_ids")
        return Selection(metrics.top_rho_per_response(stats.js, valid, rho), "response")
    if strategy == "random":
        return Selection(random_mask(valid, rho, generator), fork_norm)
    if strategy == "stapo":
        if advantages is None or stats.logp is None:
            raise ValueError("strategy 'stapo' needs advantages and token log-probs")
        spurious = stapo_spurious(stats, advantages, stapo_tau_p, stapo_entropy_q)
        return Selection(valid & ~spurious, "selected", {"stapo/silenced_frac":
                         float(spurious.sum()) / max(int(valid.sum()), 1)})
    if strategy in ("maxtok", "mintok", "rand1tok"):
        if kl is None:
            raise ValueError(f"strategy {strategy!r} needs the per-token KL to the teacher")
        return Selection(distill_mask(strategy, kl, valid, distill_tokens, generator), "selected")
    raise ValueError(f"unknown strategy {strategy!r}")


def random_mask(valid: torch.Tensor, rho: float, generator: torch.Generator | None = None
                ) -> torch.Tensor:
    """Exactly round(ρ·n) valid tokens (at least 1) chosen uniformly: the control for fork/ict."""
    flat = valid.reshape(-1).nonzero(as_tuple=True)[0]
    out = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
    if flat.numel():
        keep = max(1, round(rho * flat.numel()))
        order = torch.randperm(flat.numel(), generator=generator, device="cpu").to(valid.device)
        out[flat[order[:keep]]] = True
    return out.view_as(valid)


def stapo_spurious(stats: "metrics.TokenStats", advantages: torch.Tensor, tau_p: float,
                   entropy_q: float) -> torch.Tensor:
    """STAPO's spurious tokens: A > 0, p(y) < τ_p and H below the batch's entropy_q quantile."""
    valid = stats.mask.bool()
    adv = advantages.unsqueeze(1).expand_as(valid) if advantages.dim() == 1 else advantages
    h_valid = stats.entropy[valid].double()
    if h_valid.numel() == 0:
        return torch.zeros_like(valid)
    h_threshold = torch.quantile(h_valid, entropy_q)
    return valid & (adv > 0) & (stats.logp.exp() < tau_p) & (stats.entropy.double() < h_threshold)


def distill_mask(strategy: str, kl: torch.Tensor, valid: torch.Tensor, k: int = 1,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Per trajectory, the k valid positions of largest (maxtok) / smallest (mintok) KL to the
    teacher, or k uniformly random ones (rand1tok)."""
    if strategy == "maxtok":
        score = kl.float().masked_fill(~valid, float("-inf"))
    elif strategy == "mintok":
        score = (-kl.float()).masked_fill(~valid, float("-inf"))
    else:
        noise = torch.rand(valid.shape, generator=generator, device="cpu").to(valid.device)
        score = noise.masked_fill(~valid, float("-inf"))
    k = min(k, valid.shape[1])
    top = score.topk(k, dim=1).indices
    out = torch.zeros_like(valid)
    out.scatter_(1, top, True)
    return out & valid
