"""The reference set on a verl run (both trainers): `+trainer.forksight.reference_every=N` (default: the
validation interval `trainer.test_freq`, else 25; 0: off), `reference_size` (32). The set is the first
completion of each of the first `reference_size` prompt groups of the run's first step; its base is that
step's own old-log-prob pass (the policy after 0 updates, stored at step 0). Every N steps, when verl
logs the step (its update done, the workers idle), the driver asks the actor workers to score the same
text teacher-forced — `actor_rollout_wg.compute_log_prob`, the call verl's own old-log-prob pass makes,
with the batch padded to the worker group's size — and stores H, H2 (with `calculate_sum_pi_squared`),
log p and the fork flag (hooks/capture/reference.py). A run resumed from a checkpoint keeps no set (its
first step is not the base): it says so and re-scores nothing, never a new set silently."""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import numpy as np

log = logging.getLogger("forksight.verl")


def reference_every(settings: Mapping, config: Mapping | None) -> int:
    """reference_every, else verl's validation interval, else 25."""
    from forksight.hooks.capture.reference import DEFAULT_EVERY

    if settings.get("reference_every") is not None:
        return int(settings["reference_every"])
    freq = ((config or {}).get("trainer") or {}).get("test_freq")
    return int(freq) if isinstance(freq, int) and freq > 0 else DEFAULT_EVERY


def pick_set(tensors: Mapping, mask, uids: list, size: int):
    """(prompt ids, completion ids, the rows picked): the first row of each of the first `size` uid groups."""
    first: dict[Any, int] = {}
    for row, uid in enumerate(uids):
        if uid not in first and len(first) < size:
            first[uid] = row
    rows = list(first.values())
    width = tensors["prompts"].shape[1]
    prompt_mask = tensors["attention_mask"][:, :width].bool()
    prompts = [tensors["prompts"][r][prompt_mask[r]].tolist() for r in rows]
    completions = [tensors["responses"][r][mask[r].bool()].tolist() for r in rows]
    return prompts, completions, rows


def _rows_of(values, mask, rows) -> list[np.ndarray]:
    return [values[r][mask[r].bool()].double().cpu().numpy() for r in rows]


def base_scored(tokens: Mapping, mask, rows):
    """The base scoring: the picked rows' own old-log-prob pass (H, H2 from Σp² when asked, log p)."""
    import torch

    from forksight.hooks.metrics.reference import Scored

    entropy = _rows_of(tokens["entropy"].float(), mask, rows)
    logp = _rows_of(tokens["logp"].float(), mask, rows)
    sum_sq = tokens.get("sum_pi_squared")
    renyi2 = _rows_of(-torch.log(sum_sq.float().clamp_min(1e-30)), mask, rows) if sum_sq is not None else \
        [np.full(len(h), math.nan) for h in entropy]
    return Scored(entropy, renyi2, logp)


def rows_divisor(config: Mapping | None, world: int) -> int:
    """The batch size the workers' log-prob pass can split: the worker group's size × its micro-batch
    (`rollout.log_prob_micro_batch_size_per_gpu`) unless it batches by tokens (`log_prob_use_dynamic_bsz`)."""
    rollout = (((config or {}).get("actor_rollout_ref") or {}).get("rollout") or {})
    micro = rollout.get("log_prob_micro_batch_size_per_gpu")
    dynamic = bool(rollout.get("log_prob_use_dynamic_bsz", False))
    return max(1, world) * (int(micro) if isinstance(micro, int) and micro > 0 and not dynamic else 1)


def score_on_workers(trainer, prompts: list[list[int]], completions: list[list[int]], temperature: float,
                     sum_pi_squared: bool, divisor: int = 1):
    """The set scored teacher-forced by the actor workers' current weights (verl's compute_log_prob); the
    batch is padded with copies of its last row to a multiple of `divisor` (rows_divisor), then dropped."""
    import torch
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    from forksight.hooks.metrics.reference import Scored

    n = len(prompts)
    rows = list(range(n)) + [n - 1] * (-n % max(1, divisor))
    width_p, width_r = max(map(len, prompts)), max(max(map(len, completions)), 1)
    b = len(rows)
    prompt_ids = torch.zeros(b, width_p, dtype=torch.long)
    response_ids = torch.zeros(b, width_r, dtype=torch.long)
    attention = torch.zeros(b, width_p + width_r, dtype=torch.long)
    for i, r in enumerate(rows):
        p, c = prompts[r], completions[r]
        prompt_ids[i, width_p - len(p):] = torch.tensor(p)
        response_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        attention[i, width_p - len(p):width_p + len(c)] = 1
    response_mask = attention[:, width_p:].clone()
    td = TensorDict({"prompts": prompt_ids, "responses": response_ids, "input_ids": torch.cat([prompt_ids, response_ids], 1),
                     "attention_mask": attention, "response_mask": response_mask,
                     "position_ids": (attention.cumsum(-1) - 1).clamp(min=0)}, batch_size=[b])
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=bool(sum_pi_squared), compute_loss=False,
                         temperature=float(temperature))
    out = trainer.actor_rollout_wg.compute_log_prob(td)
    entropy = no_padding_2_padding(tu.get(out, "entropy"), td).float()
    logp = no_padding_2_padding(tu.get(out, "log_probs"), td).float()
    sum_sq = tu.get(out, "sum_pi_squared") if sum_pi_squared else None
    keep = list(range(n))
    renyi2 = _rows_of(-torch.log(no_padding_2_padding(sum_sq, td).float().clamp_min(1e-30)), response_mask, keep) \
        if sum_sq is not None else [np.full(len(c), math.nan) for c in completions]
    return Scored(_rows_of(entropy, response_mask, keep), renyi2, _rows_of(logp, response_mask, keep))


class VerlReference:
    """Picks the set at the run's first step and re-scores it every `every` steps through the workers."""

    def __init__(self, sink, settings: Mapping, config: Mapping | None, decode=None):
        self.sink, self.every = sink, reference_every(settings, config)
        self.size, self.rule = int(settings.get("reference_size") or 32), settings["fork_rule"]
        self.budget = float(settings.get("reference_budget") or 0.02)
        rollout = ((config or {}).get("actor_rollout_ref") or {})
        self.temperature = float(((rollout.get("rollout") or {}).get("temperature")) or 1.0)
        self.sum_pi_squared = bool((rollout.get("actor") or {}).get("calculate_sum_pi_squared", False))
        self.decode, self.scorer, self.done = decode, None, not self.every
        self.config = config

    def first_step(self, step: int, batch: Mapping, tokens: Mapping | None, mask) -> None:
        """The run's first reported step: keep the set and store its base (step 0)."""
        if self.done or self.scorer is not None:
            return
        self.done = True
        if step != 1 or tokens is None or tokens.get("entropy") is None:
            log.warning("forksight: no reference set for this verl run (%s): re-scoring is off",
                        "resumed at step %d: its first step is not the base" % step if step != 1
                        else "its first step has no per-token entropy")
            return
        from forksight.hooks.capture.reference import ReferenceScorer
        from forksight.hooks.metrics.reference import ReferenceSet

        prompts, completions, rows = pick_set(batch["tensors"], mask, list(batch["non_tensor"]["uid"]), self.size)
        self.scorer = ReferenceScorer(self.sink, ReferenceSet(prompts, completions), every=self.every,
                                      fork_rule=self.rule, temperature=self.temperature, decode=self.decode,
                                      budget=self.budget, base=None)
        base = base_scored(tokens, mask, rows)
        self.scorer.rescore(None, 0, score_fn=lambda: base)           # the base, stored at step 0

    def after_step(self, trainer, step: int) -> None:
        """Re-score at a due step (the update of `step` is done)."""
        if self.scorer is not None and trainer is not None and step > 0 and self.scorer.due(step):
            ref = self.scorer.ref
            divisor = rows_divisor(self.config, int(getattr(trainer.actor_rollout_wg, "world_size", 1) or 1))
            self.scorer.rescore(None, step, score_fn=lambda: score_on_workers(
                trainer, ref.prompts, ref.completions, self.temperature, self.sum_pi_squared, divisor))
