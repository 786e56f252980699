"""The reference set on a TRL GRPOTrainer run: `forksight.trl.attach(trainer, ..., reference_every=N)`.
When training begins, one completion of each of the first `reference_size` prompts of the eval dataset
(else the train dataset) is sampled from the policy as it starts — prompts as TRL builds them (its own
`maybe_apply_chat_template`), TRL's temperature and completion cap, every stop id, an explicit complete
sampler (hooks/metrics/probe_values.py) on its own random stream — and re-scored teacher-forced every N
optimiser steps on rank 0 (hooks/capture/reference.py). The set is saved into each checkpoint TRL
writes (forksight_reference.json): a run resumed from one keeps its set and base; a resumed run
without one re-scores nothing and says so, never re-samples silently. Default N: the eval interval
when TRL evaluates every so many steps, else 25; 0 turns it off."""
from __future__ import annotations

import json
import logging
import os
from types import SimpleNamespace
from typing import Any

import torch
from transformers import TrainerCallback

from forksight.hooks.capture.reference import DEFAULT_EVERY, DEFAULT_SIZE, ReferenceScorer
from forksight.hooks.metrics.reference import ReferenceSet

log = logging.getLogger("forksight.trl")
REFERENCE_OPTIONS = ("reference_every", "reference_size", "reference_budget")
STATE_FILE = "forksight_reference.json"


def every_of(args, reference_every: int | None) -> int:
    if reference_every is not None:
        if reference_every < 0:
            raise ValueError(f"reference_every must be >= 0 (0: off), got {reference_every}")
        return reference_every
    steps = getattr(args, "eval_steps", None)
    evaluating = str(getattr(args, "eval_strategy", "no")).endswith("steps")
    return int(steps) if evaluating and isinstance(steps, (int, float)) and steps >= 1 else DEFAULT_EVERY


def _prompts(trainer, n: int) -> list:
    dataset = trainer.eval_dataset if trainer.eval_dataset is not None else trainer.train_dataset
    if isinstance(dataset, dict):                       # several eval sets: the first
        dataset = next(iter(dataset.values()))
    if dataset is None or "prompt" not in getattr(dataset, "column_names", []):
        return []
    return [dataset[i]["prompt"] for i in range(min(n, len(dataset)))]


@torch.no_grad()
def sample_set(trainer, size: int, seed: int) -> ReferenceSet | None:
    """One completion per prompt from the trainer's policy, as TRL would sample it."""
    from trl.data_utils import maybe_apply_chat_template

    from forksight.hooks.metrics.probe_values import own_generation_config, sampling_config, stop_ids

    prompts = _prompts(trainer, size)
    if not prompts:
        return None
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    texts = [maybe_apply_chat_template({"prompt": p}, tokenizer)["prompt"] for p in prompts]
    prompt_ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    model = trainer.model
    eos, pad = stop_ids(model, tokenizer), tokenizer.pad_token_id
    pad = pad if pad is not None else eos[0]
    config = sampling_config(SimpleNamespace(temperature=trainer.temperature), eos, pad,
                             max_new_tokens=trainer.max_completion_length, min_new_tokens=0)
    width = max(map(len, prompt_ids))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), own_generation_config(model):
            torch.manual_seed(seed)
            out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=config)
    finally:
        model.train(was_training)
    completions = []
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        completions.append(row[:ends[0] + 1] if ends else row)       # the stop token is the completion's
    return ReferenceSet(prompt_ids, completions)


class TrlReference(TrainerCallback):
    """Samples the set when training begins, re-scores it every `every` steps, saves it with checkpoints."""

    def __init__(self, trainer, sink, *, every: int, size: int = DEFAULT_SIZE, budget: float | None = 0.02,
                 fork_rule=None, seed: int = 271_828):
        self.trainer, self.sink, self.every, self.size = trainer, sink, every, size
        self.budget, self.fork_rule, self.seed = budget, fork_rule, seed
        self.scorer: ReferenceScorer | None = None
        self.tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)

    def _scorer(self, ref: ReferenceSet, base=None) -> ReferenceScorer:
        pad = self.tokenizer.pad_token_id
        return ReferenceScorer(self.sink, ref, every=self.every, fork_rule=self.fork_rule,
                               temperature=self.trainer.temperature, decode=lambda t: self.tokenizer.decode([t]),
                               budget=self.budget, pad_id=pad if pad is not None else 0, base=base)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self.scorer is not None:
            return
        if state.global_step > 0:                                    # resumed: the checkpoint's set, or none
            saved = _saved_state(args.output_dir, state.global_step)
            if saved is None:
                log.warning("forksight: resumed at step %d without a saved reference set (%s in the checkpoint): "
                            "the reference set is not re-scored in this run (a new one would not compare with "
                            "the base)", state.global_step, STATE_FILE)
                return
            from forksight.base.fork_rule import ForkRule

            ref = ReferenceSet(saved["prompts"], saved["completions"])
            self.scorer = self._scorer(ref, ReferenceScorer.base_of(saved, ForkRule.parse(self.fork_rule)))
            return
        ref = sample_set(self.trainer, self.size, self.seed)
        if ref is None:
            log.warning("forksight: no reference set: neither the eval nor the train dataset has a 'prompt' column")
            return
        self.scorer = self._scorer(ref)
        self.scorer.rescore(self.trainer.model, state.global_step)     # the base: the policy as it starts

    def on_step_end(self, args, state, control, **kwargs):
        if self.scorer is not None and state.is_world_process_zero and self.scorer.due(state.global_step):
            self.scorer.rescore(self.trainer.model, state.global_step)

    def on_save(self, args, state, control, **kwargs):
        if self.scorer is not None and state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                with open(os.path.join(folder, STATE_FILE), "w") as f:
                    json.dump(self.scorer.state(), f)


def _saved_state(output_dir: str, step: int) -> dict[str, Any] | None:
    path = os.path.join(output_dir, f"checkpoint-{step}", STATE_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def attach(trainer, db: str | None = None, url: str | None = None, run: str | None = None, **kwargs):
    """`forksight.trl.attach` with the reference set: reference_every (None: the eval interval, else 25;
    0: off), reference_size (32), reference_budget (0.02 of training time); the rest as before."""
    from forksight.hooks.integrations.trl_probe import attach as probing_attach

    options = {k: kwargs.pop(k) for k in REFERENCE_OPTIONS if k in kwargs}
    every = every_of(trainer.args, options.get("reference_every"))      # a bad value: said before any sink opens
    size = int(options.get("reference_size", DEFAULT_SIZE))
    if size < 1:
        raise ValueError(f"reference_size must be >= 1, got {size}")
    callback = probing_attach(trainer, db=db, url=url, run=run, **kwargs)
    if every and callback.handle is not None:
        if getattr(trainer, "is_fsdp_enabled", False) or getattr(trainer, "is_deepspeed_enabled", False):
            log.warning("forksight: no reference set under FSDP or DeepSpeed (rank 0 alone cannot run the sharded "
                        "model): re-score the run's checkpoints offline with `forksight rescore`")
            return callback
        reference = TrlReference(trainer, callback.sink, every=every, size=size,
                                 budget=options.get("reference_budget", 0.02), fork_rule=callback.fork_rule)
        trainer.add_callback(reference)
        inner = callback.detach

        def detach(*args, **kw):                # the reference callback leaves with forksight's own
            if reference in trainer.callback_handler.callbacks:
                trainer.remove_callback(reference)
            inner(*args, **kw)
        callback.reference, callback.detach = reference, detach
    return callback
