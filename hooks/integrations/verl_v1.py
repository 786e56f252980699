"""verl's v1 trainer (`trainer.use_v1=True`, verl 0.9's default): per-token data from TransferQueue.

The v1 trainer (verl/trainer/ppo/v1/trainer_base.py, PPOTrainer and its sync / async subclasses)
keeps each step's rows in TransferQueue until `fit()` calls `tq.kv_clear`, right after
`_compute_metrics`. Four methods of PPOTrainer are wrapped (post-import, hooks/integrations/verl_install.py):

- `_compute_old_log_prob`: the old-log-prob pass already runs with `calculate_entropy=True`; its
  batch metadata also asks the FSDP workers for top-1/JS (`forksight_stats`, hooks/integrations/verl_worker.py)
  and, when `actor.calculate_sum_pi_squared=True`, for Σp² (v1 never asks for it itself). The flags
  are taken off again, so the actor update never computes them. When verl's rollout correction
  rejects tokens (`algorithm.rollout_correction.rollout_rs`), the response masks are read here,
  before `_compute_advantage` zeroes the rejected tokens in TransferQueue.
- `_compute_metrics`: before verl's own metric pass, one `kv_batch_get` reads what is already
  stored (responses, masks, uid, rm_scores, reward extras, entropy, old log p, advantages, the
  engine's `rollout_log_probs` when `rollout.calculate_log_probs=True`, and the workers' Σp² / top-1 /
  JS): no recompute, and nothing is read after the clear.
- `_start_profiling` (start of each step) stops the run after a critical alert; `fit()` marks the
  run `finished`, `stopped` or `crashed`.
"""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from forksight.hooks.integrations.verl_state import STATE, stop_checked, watched_fit

log = logging.getLogger("forksight.verl")

MODULE = "verl.trainer.ppo.v1.trainer_base"
# what the step's rows hold in TransferQueue when _compute_metrics runs (absent fields are skipped)
FIELDS = ["prompts", "responses", "response_mask", "rm_scores", "uid", "extra_fields", "entropy", "old_log_probs",
          "advantages", "rollout_log_probs", "sum_pi_squared", "forksight_top1", "forksight_js"]
# full-sequence fields the workers wrote (log p convention: token t+1 at position t)
_FROM_WORKERS = ("sum_pi_squared", "forksight_top1", "forksight_js")
_FLAGS = ("forksight_stats", "forksight_group_size", "calculate_sum_pi_squared")


def read_step(tq, meta, correct_key: str | None, masks_before: dict | None = None) -> dict[str, Any] | None:
    """One step's rows from TransferQueue as the legacy trainer's batch ({"tensors", "non_tensor"})
    and tokens ({"entropy", "logp", "sum_pi_squared", "top1", "js"}, and "response_mask" from
    masks_before: TransferQueue key -> the row's response mask before verl's rejection sampling),
    padding rows left out."""
    import torch
    from verl.workers.utils.padding import response_from_nested

    keep = [k for k, tag in enumerate(meta.tags) if not (tag or {}).get("is_padding", False)]
    if not keep:
        return None
    keys = [meta.keys[k] for k in keep]
    data = tq.kv_batch_get(keys=keys, partition_id=meta.partition_id, select_fields=FIELDS)
    response_mask_nested = data["response_mask"]
    tensors: dict[str, torch.Tensor] = {}
    for name in ("prompts", "responses", "response_mask", "rm_scores", "entropy", "old_log_probs", "advantages",
                 "rollout_log_probs", *_FROM_WORKERS):
        if name not in data.keys():
            continue
        value = data[name]
        if name in _FROM_WORKERS:
            value = response_from_nested(value, response_mask_nested)
        tensors[name] = value.to_padded_tensor(0) if value.is_nested else value
    # the mask before verl's rejection sampling, when the old-log-prob hook read it: the rows' tokens
    mask = _before(masks_before, keys, tensors["response_mask"])
    prompt_lens = data["prompts"].offsets().diff()
    width = tensors["prompts"].shape[1]
    prompt_mask = (torch.arange(width)[None, :] < prompt_lens[:, None]).long()
    tensors["attention_mask"] = torch.cat([prompt_mask, mask.long()], dim=1)
    tensors["token_level_scores"] = tensors.pop("rm_scores")
    non_tensor: dict[str, np.ndarray] = {"uid": np.array(list(data["uid"]), dtype=object)}
    verdicts = _reward_extra(data, correct_key)
    if verdicts is not None:
        non_tensor[correct_key] = verdicts
    tokens = {"entropy": tensors.pop("entropy", None), "logp": tensors.get("old_log_probs"),
              "sum_pi_squared": tensors.pop("sum_pi_squared", None)}
    if mask is not tensors["response_mask"]:
        tokens["response_mask"] = mask
    for name in ("top1", "js"):
        value = tensors.pop(f"forksight_{name}", None)
        if value is not None:
            tokens[name] = value.float().masked_fill(mask == 0, 0.0)
    return {"tensors": tensors, "non_tensor": non_tensor, "tokens": tokens}


def _before(masks_before: dict | None, keys: list, kept):
    """[B, T] response masks of `keys` from masks_before, or `kept` when a row's is missing."""
    if not masks_before or not all(key in masks_before for key in keys):
        return kept
    before = kept.new_zeros(kept.shape)
    for i, key in enumerate(keys):
        row = masks_before[key][: kept.shape[1]]
        before[i, : row.numel()] = row
    return before


def masks_of(tq, meta) -> dict:
    """TransferQueue key -> response mask of every row of the step (before verl's rejection sampling)."""
    data = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["response_mask"])
    return dict(zip(meta.keys, data["response_mask"].unbind()))


def _reward_extra(data, key: str | None) -> np.ndarray | None:
    """The reward function's verdict (`reward_extra_info[key]`) per row, when every row has one."""
    if not key or "extra_fields" not in data.keys():
        return None
    values = []
    for extra in list(data["extra_fields"]):
        info = (extra or {}).get("reward_extra_info") or {} if isinstance(extra, dict) else {}
        if key not in info:
            return None
        value = info[key]
        values.append(bool(value) and not (isinstance(value, float) and math.isnan(value)))
    return np.array(values)


def patch_v1_trainer(module) -> None:
    """Wrap PPOTrainer (every v1 trainer mode inherits these four methods)."""
    import transfer_queue as tq

    trainer_cls = module.PPOTrainer
    old_log_prob, compute_metrics = trainer_cls._compute_old_log_prob, trainer_cls._compute_metrics
    start_profiling, fit = trainer_cls._start_profiling, trainer_cls.fit

    def _compute_old_log_prob(self, batch, metrics, *args, **kwargs):
        logger = STATE.logger
        if logger is None or not logger.per_token:
            return old_log_prob(self, batch, metrics, *args, **kwargs)
        flags: dict[str, Any] = {}
        if logger.settings["worker_stats"]:
            flags.update(forksight_stats=True, forksight_group_size=int(self.config.actor_rollout_ref.rollout.n))
        if self.config.actor_rollout_ref.actor.get("calculate_sum_pi_squared", False):
            flags["calculate_sum_pi_squared"] = True
        batch.extra_info.update(flags)
        out = None
        try:
            out = old_log_prob(self, batch, metrics, *args, **kwargs)
        finally:                          # the actor update must not compute them again
            for meta in (batch, out):
                for flag in flags:
                    (getattr(meta, "extra_info", None) or {}).pop(flag, None)
        logger.masks_before = None
        if (logger.correction or {}).get("rollout_rs"):
            logger.guard(_keep_masks, logger, out if out is not None else batch)
        return out

    def _keep_masks(logger, meta):
        logger.masks_before = masks_of(tq, meta)

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch, *args, **kwargs):
        logger = STATE.logger
        if logger is not None and logger.per_token:
            logger.guard(_note, logger, global_steps, batch)
        return compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch, *args, **kwargs)

    def _note(logger, step, batch):
        step_data = read_step(tq, batch, logger.settings["correct_key"], logger.masks_before)
        if step_data is not None:
            tokens = step_data.pop("tokens")
            logger.note_batch_dict(step, step_data, tokens)

    trainer_cls._compute_old_log_prob = _compute_old_log_prob
    trainer_cls._compute_metrics = _compute_metrics
    trainer_cls._start_profiling = stop_checked(start_profiling)
    trainer_cls.fit = watched_fit(fit, "v1")
