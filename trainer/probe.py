"""`forksight train --probe-every N`: value probes of the step's own completions with the task's
verifier as the reward and the policy of that step (before its update), through the capture
room's StepProber (budget, rows, probe/* scalars); and, at each evaluation that falls on a probed
step, of held-out completions (rows with split "eval", scalars under probe/eval/), where the run's
generalisation is decided."""
from __future__ import annotations

from typing import Any

import torch

from forksight.base.fork_rule import ForkRule
from forksight.hooks.capture.step_probe import StepProber, undecided
from forksight.hooks.metrics.token_select import fork_threshold
from forksight.hooks.metrics.probe_stats import TokenSignals
from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings, stop_ids


def make_prober(config, sink, tokenizer) -> StepProber | None:
    """The run's prober, or None when probing is off (probe_every 0, the default)."""
    if not config.probe_every:
        return None
    positions = config.probe_positions
    settings = ProbeSettings(k=config.probe_k, positions=int(positions) if positions.isdigit() else positions,
                             temperature=config.temperature, max_new_tokens=config.max_new_tokens,
                             first_token_eos=False, seed=config.seed)      # the rollouts' min_new_tokens=1
    return StepProber(sink, settings, every=config.probe_every, samples=config.probe_samples,
                      budget=config.probe_budget, decode=lambda t: tokenizer.decode([t]))


def _row(values: torch.Tensor | None, i: int, n: int) -> list | None:
    if values is None:
        return None
    return [None if v != v else v for v in values[i, :n].detach().float().cpu().tolist()]   # NaN -> None


def probe_step(ctx: Any, step: int, batch: Any, stats: Any, selected: torch.Tensor) -> dict | None:
    """Probe `ctx.prober.samples` of this step's completions; the probe/* scalars (None: skipped)."""
    roll, cfg, tok = batch.roll, ctx.config, ctx.tokenizer
    prompt_ids = [row[mask.bool()].tolist() for row, mask in
                  zip(roll.input_ids[:, :roll.prompt_len], roll.attention_mask[:, :roll.prompt_len])]
    lengths = roll.mask.sum(-1).tolist()
    tau = fork_threshold(ForkRule.parse(ctx.config.fork_rule), stats.entropy, roll.mask)   # the run's fork rule
    rows_here = roll.completion.shape[0]
    picked = ctx.prober.pick(rows_here, step, prefer=undecided(batch.rewards.tolist(), roll.group_ids.tolist()))
    inputs, signals, problems = [], [], []
    for i in picked:
        n = int(lengths[i])
        sample_id = ctx.rank * rows_here + i                    # as the reporter numbers samples
        entropy = _row(stats.entropy, i, n)
        inputs.append(ProbeInput(sample_id, prompt_ids[i], roll.completion[i, :n].tolist(), entropy=entropy,
                                 fork=[h is not None and h >= tau for h in entropy]))
        signals.append(TokenSignals(sample_id, entropy, _row(stats.js, i, n),
                                    selected[i, :n].bool().cpu().tolist()))
        problems.append(batch.problems[i // cfg.group_size])

    def reward(j: int, ids: list[int]) -> float:
        return ctx.task.verify(problems[j], tok.decode(ids, skip_special_tokens=True))[0]

    return ctx.prober.run(step, ctx.model, inputs, signals, reward, eos_id=stop_ids(ctx.model, tok),
                          pad_id=tok.pad_token_id)


# held-out completions' sample ids sit above any training step's (which number rows from 0 per step)
EVAL_SAMPLE_BASE = 1_000_000_000


@torch.no_grad()
def probe_eval(ctx: Any, step: int, roll: Any, problems: list, n: int) -> dict | None:
    """Probe `ctx.prober.samples` held-out completions (the evaluation's, `n` per problem), those of
    problems whose verdicts differ first, with the policy of this step; probe/eval/* scalars."""
    from forksight.hooks import metrics
    from forksight.trainer.rollout import completion_logits

    cfg, tok = ctx.config, ctx.tokenizer
    logits = completion_logits(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    stats = metrics.token_stats(logits, mask=roll.mask, tokens=roll.completion, temperature=cfg.temperature)
    tau = fork_threshold(ForkRule.parse(cfg.fork_rule), stats.entropy, roll.mask)
    verdicts = [ctx.task.verify(problems[i // n], roll.texts[i])[0] for i in range(len(roll.texts))]
    picked = ctx.prober.pick(len(roll.texts), step, prefer=undecided(verdicts, [i // n for i in range(len(verdicts))]))
    prompt_ids = [row[mask.bool()].tolist() for row, mask in
                  zip(roll.input_ids[:, :roll.prompt_len], roll.attention_mask[:, :roll.prompt_len])]
    inputs, signals, chosen = [], [], []
    for i in picked:
        length = int(roll.mask[i].sum())
        entropy = _row(stats.entropy, i, length)
        inputs.append(ProbeInput(EVAL_SAMPLE_BASE + i, prompt_ids[i], roll.completion[i, :length].tolist(),
                                 entropy=entropy, fork=[h is not None and h >= tau for h in entropy]))
        signals.append(TokenSignals(EVAL_SAMPLE_BASE + i, entropy, None))
        chosen.append(problems[i // n])

    def reward(j: int, ids: list[int]) -> float:
        return ctx.task.verify(chosen[j], tok.decode(ids, skip_special_tokens=True))[0]

    return ctx.prober.run(step, ctx.model, inputs, signals, reward, eos_id=stop_ids(ctx.model, tok),
                          pad_id=tok.pad_token_id, split="eval")
