"""A fixed reference set re-scored, teacher-forced, by a policy (the 80/20 paper's analysis, Wang et al.
2025, §3): per position H, H2 and log p of the stored token under the policy now; and how the entropy
pattern moved from the base's (docs/algorithms.md §15).

`score` is one forward pass per batch of reference completions, no sampling. `pattern_scalars` compares
two scorings of the same text: fork overlap and Jaccard index, Spearman ρ of H, mean |ΔH| per base-entropy
decile, H on the base's forks and on the rest, the mean log p of the text."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from forksight.base.fork_rule import ForkRule
from forksight.base.rank_bins import rank_bins

DECILES = 10


@dataclass
class ReferenceSet:
    """Prompts and completions as token ids, one completion per prompt (row i of each)."""

    prompts: list[list[int]]
    completions: list[list[int]]

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.completions):
            raise ValueError(f"a reference set needs one prompt per completion: {len(self.prompts)} prompts, "
                             f"{len(self.completions)} completions")
        empty = [i for i, p in enumerate(self.prompts) if not p]
        if empty:
            raise ValueError(f"reference prompts {empty[:5]} are empty: each completion needs its prompt's tokens")

    def __len__(self) -> int:
        return len(self.completions)

    @property
    def max_id(self) -> int:
        return max((max(ids) for ids in (*self.prompts, *self.completions) if ids), default=-1)


@dataclass
class Scored:
    """One policy's scoring of a reference set: per completion, arrays over its positions."""

    entropy: list[np.ndarray]
    renyi2: list[np.ndarray]
    logp: list[np.ndarray]
    fork: list[np.ndarray] = field(default_factory=list)
    threshold: float = float("nan")

    def flat(self, name: str) -> np.ndarray:
        parts = getattr(self, name)
        return np.concatenate(parts) if parts else np.zeros(0)

    def with_forks(self, rule: ForkRule) -> "Scored":
        """The fork flag of every position under `rule` (top:q: over the whole set's tokens at this step)."""
        self.threshold = rule.threshold(self.flat("entropy"))
        self.fork = [h >= self.threshold for h in self.entropy]
        return self


@torch.no_grad()
def score(model, ref: ReferenceSet, *, temperature: float = 1.0, batch_size: int = 8, pad_id: int = 0) -> Scored:
    """Teacher-forced statistics of each reference completion under `model` (an HF causal LM): the logits
    at position t are those that would have sampled completion token t (prompt left-padded, position ids
    skipping the padding, as generation saw them). Raises ValueError when an id is outside the model's
    vocabulary (a checkpoint of another tokenizer)."""
    from forksight.hooks.metrics.token_stats import token_stats

    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is not None and ref.max_id >= vocab:
        raise ValueError(f"the reference set holds token id {ref.max_id}, outside this model's vocabulary of {vocab}: "
                         "the checkpoint was trained with another tokenizer than the run's")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = Scored([], [], [])
    try:
        for start in range(0, len(ref), batch_size):
            prompts = ref.prompts[start:start + batch_size]
            comps = ref.completions[start:start + batch_size]
            width_p = max(len(p) for p in prompts)
            width_c = max(max((len(c) for c in comps), default=0), 1)
            ids = torch.full((len(prompts), width_p + width_c), pad_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for r, (p, c) in enumerate(zip(prompts, comps)):
                ids[r, width_p - len(p):width_p] = torch.tensor(p)
                ids[r, width_p:width_p + len(c)] = torch.tensor(c, dtype=torch.long)
                attn[r, width_p - len(p):width_p + len(c)] = 1
            ids, attn = ids.to(device), attn.to(device)
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits[:, width_p - 1:-1]
            mask = attn[:, width_p:].bool()
            stats = token_stats(logits, mask=mask, tokens=ids[:, width_p:], temperature=temperature)
            for r, c in enumerate(comps):
                n = len(c)
                out.entropy.append(stats.entropy[r, :n].double().cpu().numpy())
                out.renyi2.append(stats.renyi2[r, :n].double().cpu().numpy())
                out.logp.append(stats.logp[r, :n].double().cpu().numpy())
    finally:
        model.train(was_training)
    return out


def decile_of(base_entropy: np.ndarray) -> np.ndarray:
    """Each position's base-entropy decile, 0 (lowest H) .. 9, by rank (ties broken by position), so each
    decile holds a tenth of the positions even where many share H ≈ 0."""
    return rank_bins(base_entropy, DECILES)


def pattern_scalars(base: Scored, now: Scored) -> dict[str, float]:
    """How the entropy pattern of the same text moved from `base` to `now` (both with forks set): the
    ref/* step scalars. Empty when the set has no token."""
    import pandas as pd

    hb, hn = base.flat("entropy"), now.flat("entropy")
    if not hb.size or hb.size != hn.size:
        return {}
    fb, fn = base.flat("fork").astype(bool), now.flat("fork").astype(bool)
    both, either = int((fb & fn).sum()), int((fb | fn).sum())
    out = {"ref/entropy/mean": float(hn.mean()), "ref/renyi2/mean": float(np.nanmean(now.flat("renyi2"))),
           "ref/logp/mean": float(now.flat("logp").mean()), "ref/fork/frac": float(fn.mean()),
           "ref/fork/threshold": float(now.threshold), "ref/dh/mean": float(np.abs(hn - hb).mean()),
           "ref/tokens": float(hb.size)}
    if fb.any():
        out["ref/fork_overlap"] = both / int(fb.sum())
        out["ref/entropy/base_forks"] = float(hn[fb].mean())
    if either:
        out["ref/fork_jaccard"] = both / either
    if (~fb).any():
        out["ref/entropy/base_rest"] = float(hn[~fb].mean())
    if hb.size > 1 and np.ptp(hb) > 0 and np.ptp(hn) > 0:
        # DataFrame.corr ranks in pandas itself (Series.corr would need scipy)
        out["ref/spearman"] = float(pd.DataFrame({"base": hb, "now": hn}).corr(method="spearman").iloc[0, 1])
    deciles = decile_of(hb)
    for d in range(DECILES):
        inside = deciles == d
        if inside.any():
            out[f"ref/dh/d{d + 1}"] = float(np.abs(hn[inside] - hb[inside]).mean())
    return out
