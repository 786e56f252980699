"""`forksight train --reference-every N`: the bundled trainer's reference set — one completion of each
of `reference_size` held-out prompts, sampled by the base policy at step 0 (its own random stream: the
training trajectory is the same with or without it), re-scored teacher-forced every N steps
(hooks/capture/reference.py). A resumed run keeps the set and base its checkpoint holds."""
from __future__ import annotations

from typing import Any

import torch

from forksight.base.fork_rule import ForkRule
from forksight.hooks.capture.reference import DEFAULT_EVERY, ReferenceScorer
from forksight.hooks.metrics.reference import ReferenceSet


def every_of(config) -> int:
    """Steps between re-scorings: reference_every, else the evaluation interval, else DEFAULT_EVERY."""
    if config.reference_every is not None:
        return config.reference_every
    return config.eval_every or DEFAULT_EVERY


@torch.no_grad()
def sample_set(ctx: Any) -> ReferenceSet:
    """One completion per held-out prompt from the policy as it is now, at the training temperature."""
    from forksight.trainer.rollout import generate
    from forksight.trainer.tasks import held_out

    cfg = ctx.config
    problems = held_out(ctx.task, cfg.reference_size, cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 271_828)
        roll = generate(ctx.model, ctx.tokenizer, [p.prompt for p in problems], 1,
                        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    prompts = [row[m.bool()].tolist() for row, m in
               zip(roll.input_ids[:, :roll.prompt_len].cpu(), roll.attention_mask[:, :roll.prompt_len].cpu())]
    completions = [row[:int(m.sum())].tolist() for row, m in zip(roll.completion.cpu(), roll.mask.cpu())]
    return ReferenceSet(prompts, completions)


def make_reference(ctx: Any, sink, state: dict | None = None) -> ReferenceScorer | None:
    """The run's scorer (rank 0 only; None when off): from the checkpoint's `state` when resuming, else
    a set sampled now."""
    cfg = ctx.config
    every = every_of(cfg)
    if not every or ctx.rank != 0 or not cfg.stream:
        return None
    rule = ForkRule.parse(cfg.fork_rule)
    if state:
        ref, base = ReferenceSet(state["prompts"], state["completions"]), ReferenceScorer.base_of(state, rule)
    else:
        ref, base = sample_set(ctx), None
    tok = ctx.tokenizer
    return ReferenceScorer(sink, ref, every=every, fork_rule=rule, temperature=cfg.temperature,
                           decode=lambda t: tok.decode([t]), budget=cfg.reference_budget,
                           pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0, base=base)
