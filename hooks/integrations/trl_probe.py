"""Value probes on a TRL GRPOTrainer run: `forksight.trl.attach(trainer, ..., probe_every=N,
probe_samples=P, probe_k=K)`. Each probed step's generation batch is probed right after TRL
generated it (the policy of that step, before it trains on the batch): the prompt ids as TRL
tokenised them (chat template included), the completions' own ids, the trainer's model (HF
generate) and the trainer's own reward_funcs called with the sample's dataset columns as TRL calls
them (weighted by reward_weights; a function returning None counts as TRL's NaN). A generation TRL
reuses over μ optimiser steps (num_iterations, steps_per_generation) is probed when any of its steps
is due, stored at its first step (the policy probed); completions TRL masked out whole
(mask_truncated_completions) are never picked nor counted. Off by default."""
from __future__ import annotations

import inspect
import logging
import math
from typing import Any

import torch

from forksight.base.fork_rule import ForkRule
from forksight.hooks.capture.step_probe import StepProber
from forksight.hooks.metrics.probe_stats import TokenSignals
from forksight.hooks.metrics.token_select import fork_threshold
from forksight.hooks.metrics.token_stats import token_stats
from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings, RewardError, stop_ids

log = logging.getLogger("forksight.trl")
PROBE_OPTIONS = ("probe_every", "probe_samples", "probe_k", "probe_positions", "probe_budget", "probe_seed")


def _noop(*args, **kwargs) -> None:
    return None


def generation_span(args) -> int:
    """Optimiser steps one TRL generation batch trains (μ): it is generated every
    steps_per_generation × num_iterations micro-batches, gradient_accumulation_steps per step."""
    micro = (getattr(args, "steps_per_generation", None) or args.gradient_accumulation_steps) \
        * max(1, int(getattr(args, "num_iterations", 1) or 1))
    return max(1, round(micro / max(1, int(args.gradient_accumulation_steps or 1))))


class TrlProbe:
    """Wraps the trainer's generation step (after forksight's own tap) to probe every `every` steps."""

    def __init__(self, trainer, sink, *, probe_every: int, probe_samples: int = 4, probe_k: int = 16,
                 probe_positions: str | int = "auto", probe_budget: float | None = 0.1, probe_seed: int = 0,
                 fork_rule=None):
        self.trainer, self.fork_rule = trainer, ForkRule.parse(fork_rule)
        self.tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        settings = ProbeSettings(k=probe_k, positions=probe_positions, temperature=trainer.temperature,
                                 max_new_tokens=trainer.max_completion_length, seed=probe_seed)
        self.prober = StepProber(sink, settings, every=probe_every, samples=probe_samples, budget=probe_budget,
                                 decode=lambda t: self.tokenizer.decode([t]))
        unsupported = [name for f, name in zip(trainer.reward_funcs, trainer.reward_func_names)
                       if isinstance(f, torch.nn.Module) or inspect.iscoroutinefunction(f)]
        if unsupported:
            raise ValueError(f"probe_every: the value probe calls plain reward functions; {unsupported} are reward "
                             "models or async functions, which it does not call yet: probe offline with "
                             "`forksight probe --reward MODULE:FUNCTION` instead")
        inner = trainer._generate_and_score_completions

        def generate_and_probe(inputs):
            out = inner(inputs)
            step = trainer.state.global_step + 1         # the first step this batch is about to train
            if trainer.model.training and self.prober.due_within(step, generation_span(trainer.args)):
                try:
                    self.probe(step, inputs, out)       # a failing reward: StepProber warns once, skips
                except Exception as exc:  # noqa: BLE001 - a probe must never break the run
                    log.warning("forksight: value probe of step %d failed (%r); training goes on", step, exc)
            return out

        trainer._generate_and_score_completions = generate_and_probe   # an instance attribute: detach deletes it

    def _reward(self, example: dict, completion_ids: list[int]) -> float:
        """The trainer's weighted reward of one completion, its functions called as TRL calls them."""
        trainer = self.trainer
        text = self.tokenizer.decode(completion_ids, skip_special_tokens=True)
        prompt = example["prompt"]
        completion: Any = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        kwargs = {k: [v] for k, v in example.items() if k not in ("prompt", "completion", "completion_ids")}
        total, seen = 0.0, False
        for func, weight in zip(trainer.reward_funcs, trainer.reward_weights.tolist()):
            value = func(prompts=[prompt], completions=[completion], completion_ids=[completion_ids], **kwargs,
                         trainer_state=trainer.state, log_extra=_noop, log_metric=_noop)[0]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise RewardError(f"reward function {getattr(func, '__name__', func)!r} returned {value!r}; "
                                  "it must return numbers (or None)")
            total, seen = total + weight * float(value), True
        if not seen:
            raise RewardError("every reward function returned None for a probed completion")
        return total

    @torch.no_grad()
    def probe(self, step: int, inputs: list[dict], out: dict) -> None:
        trainer = self.trainer
        prompt_ids, prompt_mask = out["prompt_ids"], out["prompt_mask"].bool()
        comp_ids, comp_mask = out["completion_ids"], out["completion_mask"].bool()
        local = comp_ids.shape[0]
        offset = trainer.accelerator.process_index * local
        # a completion TRL masked out whole (mask_truncated_completions) has no token to probe
        eligible = [i for i in range(local) if bool(comp_mask[i].any())]
        if not eligible:
            log.info("forksight: no completion of step %d has a token to probe (all masked); probe skipped", step)
            return
        G = trainer.num_generations
        # undecided groups first: a group whose rewards differ gives some member a nonzero advantage
        advantages = out.get("advantages")
        moved = set() if advantages is None else {
            (offset + i) // G for i, a in enumerate(advantages.reshape(local, -1)[:, 0].tolist()) if a != 0.0}
        picked = self.prober.pick(eligible, step, prefer=[i for i in range(local) if (offset + i) // G in moved])
        # entropy and JS of the whole local batch (JS is to the group's mean: every rollout counts)
        ids = torch.cat([prompt_ids, comp_ids], 1)
        attn = torch.cat([prompt_mask, comp_mask], 1).long()
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = trainer.model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits
        logits = logits[:, prompt_ids.shape[1] - 1: -1]
        stats = token_stats(logits.float(), mask=comp_mask, tokens=comp_ids, temperature=trainer.temperature,
                            group_ids=[(offset + i) // G for i in range(local)])
        tau = fork_threshold(self.fork_rule, stats.entropy, comp_mask)        # the run's fork rule
        items, signals, examples = [], [], []
        for i in picked:
            n = int(comp_mask[i].sum())
            entropy = stats.entropy[i, :n].float().cpu().tolist()
            js = None if stats.js is None else stats.js[i, :n].float().cpu().tolist()
            items.append(ProbeInput(offset + i, prompt_ids[i][prompt_mask[i]].tolist(), comp_ids[i, :n].tolist(),
                                    entropy=entropy, fork=[h >= tau for h in entropy]))
            signals.append(TokenSignals(offset + i, entropy, js))
            examples.append(inputs[i])
        self.prober.run(step, trainer.model, items, signals, lambda j, c: self._reward(examples[j], c),
                        eos_id=stop_ids(trainer.model, self.tokenizer), pad_id=self.tokenizer.pad_token_id)


def attach(trainer, db: str | None = None, url: str | None = None, run: str | None = None, **kwargs):
    """`forksight.trl.attach` with value probes: probe_every=N (0/None: off, the default),
    probe_samples, probe_k, probe_positions, probe_budget, probe_seed; the rest as the plain attach."""
    from forksight.hooks.integrations.trl import attach as plain_attach

    options = {k: kwargs.pop(k) for k in PROBE_OPTIONS if k in kwargs}
    callback = plain_attach(trainer, db=db, url=url, run=run, **kwargs)
    if options.get("probe_every"):
        try:
            callback.probe = TrlProbe(trainer, callback.sink, fork_rule=callback.fork_rule, **options)
        except ValueError:
            callback.detach()
            raise
    return callback
