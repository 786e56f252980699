"""A run whose rollouts a perturbed copy of the policy sampled, written through the real
StepReporter into any sink: per step, the trainer's logits, a sampler's logits (the same plus noise
that grows over the run, a few tokens far off), the sampled tokens, token_stats, and
`report(..., sampler_logp=...)`. The mismatch view's tests (unit and browser) read it back."""
from __future__ import annotations

import numpy as np
import torch

# token texts: digits, words and one piece of markup the page must show as text
VOCAB = [str(d) for d in range(10)] + ["+", "=", " ans ", " the", " <b>x</b>", " so"]
GROUPS, GROUP_SIZE, LENGTH = 2, 3, 10
UNKNOWN_SAMPLE = GROUPS * GROUP_SIZE - 1     # this rollout's sampler log p is never known
PROMPTS = ("12+35=", "47+26=")


class TinyTokenizer:
    """The one method StepReporter calls: each id's text."""

    def batch_decode(self, ids, skip_special_tokens: bool = False) -> list[str]:
        return [VOCAB[i[0]] for i in ids]


def step_tensors(step: int, steps: int, seed: int = 0) -> dict:
    """One step's trainer logits, sampled tokens and the sampler's log p of each (NaN: unknown)."""
    gen = torch.Generator().manual_seed(seed * 10_007 + step)
    rows = GROUPS * GROUP_SIZE
    logits = torch.randn(rows, LENGTH, len(VOCAB), generator=gen) * 3.0
    noise = torch.randn(rows, LENGTH, len(VOCAB), generator=gen) * (0.05 + 0.6 * step / steps)
    sampler_logits = logits + noise
    far = torch.rand(rows, LENGTH, generator=gen) < 0.05            # a few tokens far off
    sampler_logits = sampler_logits + far[..., None] * 3.0 * torch.randn(
        rows, LENGTH, len(VOCAB), generator=gen)
    probs = torch.softmax(sampler_logits, -1).reshape(rows * LENGTH, len(VOCAB))
    ids = torch.multinomial(probs, 1, generator=gen).reshape(rows, LENGTH)   # the sampler's draw
    mask = torch.ones(rows, LENGTH, dtype=torch.bool)
    mask[0, LENGTH - 2:] = False                                    # a shorter completion
    sampler_logp = torch.log_softmax(sampler_logits, -1).gather(-1, ids[..., None])[..., 0]
    sampler_logp[UNKNOWN_SAMPLE] = float("nan")
    return {"logits": logits, "ids": ids, "mask": mask, "sampler_logp": sampler_logp}


def report_steps(sink, steps: int, seed: int = 0, with_sampler: bool = True) -> list[dict]:
    """Report `steps` steps through a real StepReporter (every group's token rows) and return the
    scalars each report returned."""
    from forksight.hooks.capture.report import StepReporter
    from forksight.hooks.metrics import token_stats

    reporter = StepReporter(sink, TinyTokenizer(), token_groups=GROUPS)
    out = []
    for step in range(steps):
        t = step_tensors(step, steps, seed)
        group_ids = [r // GROUP_SIZE for r in range(GROUPS * GROUP_SIZE)]
        stats = token_stats(t["logits"], mask=t["mask"], tokens=t["ids"], group_ids=group_ids)
        rewards = np.random.default_rng(step).random(len(group_ids)).round(2)
        samples = [{"prompt": PROMPTS[g], "completion": "".join(VOCAB[i] for i in t["ids"][r].tolist()),
                    "reward": float(rewards[r]), "correct": bool(rewards[r] > 0.5)}
                   for r, g in enumerate(group_ids)]
        out.append(reporter.report(step, stats, t["ids"], group_ids=group_ids, samples=samples,
                                   sampler_logp=t["sampler_logp"] if with_sampler else None))
    return out
