"""Which tokens verl's own rollout correction (`algorithm.rollout_correction`) changed, for
`mismatch/frac_corrected`.

Covered: the decoupled mode (`bypass_mode=false`, verl's default), where the driver corrects once
per batch with old_log_probs − rollout_log_probs, the same log ratio forksight stores:
- `rollout_is` = token | sequence with a TIS threshold (one number: weights above it are truncated)
  or an IcePop one (`"lower_upper"`: weights outside the band are zeroed); batch normalisation
  rescales weights but truncates no other token;
- `rollout_rs` (every option, chained): verl's own rejection mask, the tokens the batch's
  `response_mask` lost against the mask before the correction.
Not covered: `bypass_mode=true` (verl corrects inside the actor's loss against the current policy,
and no old-log-prob pass runs, so no per-token record reaches the driver).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from forksight.hooks.metrics.mismatch import log_ratio


def correction_settings(config: Mapping | None) -> dict[str, Any] | None:
    """verl's rollout_correction section when a correction is on in decoupled mode, else None."""
    section = ((config or {}).get("algorithm") or {}).get("rollout_correction") or {}
    if not isinstance(section, Mapping) or _on(section.get("bypass_mode")):
        return None
    settings = {key: section.get(key) for key in ("rollout_is", "rollout_is_threshold", "rollout_rs",
                                                  "rollout_rs_threshold")}
    return settings if settings["rollout_is"] or settings["rollout_rs"] else None


def _on(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def corrected_tokens(settings: Mapping[str, Any], logp: torch.Tensor, sampler_logp: torch.Tensor,
                     mask: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: tokens verl rejected, or whose IS weight it truncated (TIS) or zeroed (IcePop);
    mask: the response mask before the correction, kept: verl's response_mask after it."""
    mask = mask.bool().cpu()
    out = mask & ~kept.bool().cpu()                      # rollout_rs: verl's own rejection mask
    level, threshold = settings.get("rollout_is"), settings.get("rollout_is_threshold")
    lr = log_ratio(logp, sampler_logp, mask)
    known = ~torch.isnan(lr)
    if level and threshold is not None and bool(known.any()):
        # verl's own weights from the same log ratio (float32, as verl has it): a TIS weight sits at
        # the bound where verl truncated it, an IcePop weight is 0 where verl zeroed it
        from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold, compute_rollout_correction_weights

        weights, _ = compute_rollout_correction_weights(
            torch.where(known, lr, torch.zeros_like(lr)).float(), known.float(), rollout_is=level,
            rollout_is_threshold=threshold, rollout_is_batch_normalize=False)
        upper, lower = _parse_rollout_is_threshold(threshold)
        out |= known & ((weights == 0) if lower is not None else (weights >= upper))
    return out
