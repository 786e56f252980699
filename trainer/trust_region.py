"""One rollout batch's trust region across its updates (`update` in trainer/step.py): DPPO's keep
mask for the loss when `trust_region` is not the ratio clip, the `trust/*` scalars of every
update over the trained tokens, the step's value their mean over the updates (as TRL logs a step),
and the last update's ratio, TV and clip per token (the stored token columns).
The formulas live in hooks/metrics/trust.py, shared with the TRL and verl integrations."""
from __future__ import annotations

import torch

from forksight.hooks.metrics import trust
from forksight.trainer.config import TrainConfig


class TrustTracker:
    """rows: the trained tokens' (row, col) indices, in the order `picked` logits come in."""

    def __init__(self, cfg: TrainConfig, adv: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor],
                 entropy: torch.Tensor | None):
        self.cfg, self.rows = cfg, rows
        # a single update under the ratio clip trains where the policy has not moved from π_old
        # (r = 1, every divergence 0 by construction): nothing to mask, nothing to report
        self.active = cfg.trust_region != "ratio" or cfg.updates_per_batch > 1
        self.adv = (adv[rows[0]] if adv.dim() == 1 else adv[rows]).detach().float()
        self.entropy = entropy[rows].detach().float() if entropy is not None else None
        self.delta = cfg.effective_trust_delta
        # TV's δ for the monitoring: the region's own when it is TV, else DPPO's TV default
        self.tv_delta = self.delta if cfg.trust_region in ("ratio", "tv") else trust.DEFAULT_DELTA["tv"]
        self.old_topk: tuple[torch.Tensor, torch.Tensor] | None = None
        self.old_logq: torch.Tensor | None = None
        self.updates: list[dict[str, float]] = []
        self.tokens: dict[str, torch.Tensor] | None = None   # the last update's ratio, tv, clipped [B, T]

    def anchor(self, picked: torch.Tensor) -> None:
        """π_old's distribution at the trained tokens (first update), as much as the region needs:
        top-K log-probs for topk-kl, the whole log-softmax [N, V] for kl."""
        if self.cfg.trust_region == "topk-kl":
            self.old_topk = trust.old_topk(picked, self.cfg.temperature)
        elif self.cfg.trust_region == "kl":
            self.old_logq = torch.log_softmax(picked.detach().float() / self.cfg.temperature, dim=-1)

    def keep(self, picked: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor | None:
        """Record this update's trust/* and return DPPO's keep mask [B, T] (None: the ratio clip)."""
        cfg = self.cfg
        if not self.active:
            return None
        lp, olp = logp.detach()[self.rows].float(), old_logp[self.rows].float()
        scalars, self.tokens = trust.measure(lp, olp, self.adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                             entropy=self.entropy, tv_delta=self.tv_delta, shape=tuple(logp.shape),
                                             rows=self.rows)
        keep = None
        if cfg.trust_region != "ratio":
            divergence = self._divergence(picked, lp, olp)
            kept = trust.dppo_keep(divergence, lp, olp, self.adv, self.delta)
            if kept.numel():
                scalars["trust/masked_frac"] = float(1 - kept.float().mean())
                scalars["trust/divergence_mean"] = float(divergence.mean())
            keep = torch.ones(logp.shape, dtype=torch.bool, device=logp.device)
            keep[self.rows] = kept
        self.updates.append(scalars)
        return keep

    def _divergence(self, picked: torch.Tensor, lp: torch.Tensor, olp: torch.Tensor) -> torch.Tensor:
        region, temperature = self.cfg.trust_region, self.cfg.temperature
        if region == "tv":
            return trust.binary_tv(lp, olp)
        if region == "binary-kl":
            return trust.binary_kl(lp, olp)
        if region == "topk-kl":
            return trust.topk_kl(picked, *self.old_topk, temperature)
        return trust.full_kl(picked, self.old_logq, temperature)

    def scalars(self) -> dict[str, float]:
        """The step's trust/*: each key's mean over the updates, and how many updates there were
        (none when not `active`)."""
        if not self.updates:
            return {}
        out = trust.mean_of(self.updates)
        out["trust/updates"] = float(len(self.updates))
        return out
