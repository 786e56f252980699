"""Statistics of one captured training forward: which tokens count (labels, attention, and the
environment's tokens an integration marks), per-token entropy / Rényi-2 / top-1 / log p, and
ICT JS on whole groups within a compute budget. Output: one `ForwardRecord` per forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from forksight.hooks import metrics

# Training runs the LM head forward + backward (~3 passes per token); JS costs one more pass
# over the rows it covers, so js_budget is a fraction of those 3 passes.
_TRAIN_PASSES = 3.0


@dataclass
class ForwardRecord:
    """One training forward's per-token results, rows in forward order (index: sample of each row)."""

    entropy: Tensor
    renyi2: Tensor
    top1: Tensor
    logp: Tensor
    js: Tensor
    mask: Tensor           # model tokens that count
    tokens: Tensor
    index: list[int]
    env: Tensor | None = None       # environment tokens (tool output): shown, never counted
    selected: Tensor | None = None
    sampler_logp: Tensor | None = None   # the inference engine's log p of each token (NaN: unknown)
    corrected: Tensor | None = None      # tokens the run's own mismatch correction truncated or masked
    ratio: Tensor | None = None          # π/π_old per trained token (NaN elsewhere), when π_old is known
    tv: Tensor | None = None             # DPPO's binary TV, likewise
    clipped: Tensor | None = None        # the PPO ratio clip bound the token


def _first_valid_column(mask: Tensor) -> int:
    """Index of the first column where any row is valid (completion start); 0 when none."""
    cols = mask.any(0).nonzero()
    return int(cols[0]) if cols.numel() else 0


class ForwardStats:
    """Turns captured forwards into `ForwardRecord`s; integrations (TRL) hand in the three callbacks."""

    def __init__(self, model: torch.nn.Module, head: torch.nn.Module, *, group_size: int | None,
                 js_groups: int | str | None, js_budget: float, temperature: float, chunk_size: int,
                 warn_once: Callable[[str, str], None],
                 row_index_fn: Callable[[Tensor], list[int] | None] | None = None,
                 env_mask_fn: Callable[[list[int], int], Tensor | None] | None = None,
                 selection_fn: Callable[[Tensor, Tensor], Tensor | None] | None = None,
                 sampler_logp_fn: Callable[[list[int], int], Tensor | None] | None = None,
                 corrected_fn: Callable[[list[int], int], Tensor | None] | None = None):
        self.model, self.head = model, head
        self.group_size, self.js_groups, self.js_budget = group_size, js_groups, js_budget
        self.temperature, self.chunk_size = temperature, chunk_size
        self.warn_once = warn_once
        # input_ids -> sample index of each row (TRL: rows of the generation batch), None = in order
        self.row_index_fn = row_index_fn
        # (sample indices, width) -> [B, width] bool of environment tokens, right-aligned with the completion
        self.env_mask_fn = env_mask_fn
        # (entropy, mask) -> the tokens the trainer trains on
        self.selection_fn = selection_fn
        # (sample indices, width) -> [B, width] sampler log p (NaN unknown) / corrected tokens, right-aligned
        self.sampler_logp_fn, self.corrected_fn = sampler_logp_fn, corrected_fn
        self._js_credit = 0.0

    # ------------------------------------------------------------------ rows and groups
    def _rows(self, input_ids: Tensor, offset: int) -> list[int]:
        index = self.row_index_fn(input_ids) if self.row_index_fn is not None else None
        if index is None:  # plain loop: rows in the order the forwards saw them
            index = list(range(offset, offset + input_ids.shape[0]))
        return index

    def group_of(self, index: list[int]) -> list[int] | None:
        return None if self.group_size is None else [i // self.group_size for i in index]

    def _split_env(self, mask: Tensor, index: list[int]) -> tuple[Tensor, Tensor | None]:
        """(model-token mask, environment-token mask): the environment's tokens leave the mask."""
        env = self.env_mask_fn(index, mask.shape[1]) if self.env_mask_fn is not None else None
        if env is None:
            return mask, None
        env = env.to(mask.device).bool() & mask
        return mask & ~env, env

    def _js_rows(self, groups: list[int] | None, n_tokens_per_row: list[int]) -> list[int]:
        """Rows that get full distributions this forward: whole groups, lowest group ids first."""
        if groups is None or self.js_groups == 0:
            return []
        order = sorted(set(g for g in groups if g >= 0))
        if self.js_groups == "all":
            chosen = order
        elif isinstance(self.js_groups, int):
            chosen = order[: self.js_groups]
        else:  # budget: credit grows with the tokens trained, a group costs its tokens
            self._js_credit += _TRAIN_PASSES * self.js_budget * sum(n_tokens_per_row)
            chosen = []
            for g in order:
                cost = sum(n for n, gg in zip(n_tokens_per_row, groups) if gg == g)
                if cost > self._js_credit:
                    break
                self._js_credit -= cost
                chosen.append(g)
        keep = set(chosen)
        return [r for r, g in enumerate(groups) if g in keep]

    # ------------------------------------------------------------------ the two sources
    def from_logits(self, ctx: dict, logits: Tensor, offset: int) -> ForwardRecord:
        input_ids = ctx["input_ids"]
        seq, kept = input_ids.shape[1], logits.shape[1]
        first = seq - kept + 1  # input position of the first target token
        tokens = input_ids[:, first:]
        mask = torch.ones_like(tokens, dtype=torch.bool)
        if ctx["attention_mask"] is not None:
            mask &= ctx["attention_mask"][:, first:].bool()
        if ctx["labels"] is not None:
            mask &= ctx["labels"][:, first:] != -100
        start = _first_valid_column(mask)
        z, tokens, mask = logits.detach()[:, :-1][:, start:], tokens[:, start:], mask[:, start:]
        index = self._rows(input_ids, offset)
        mask, env = self._split_env(mask, index)
        groups = self.group_of(index)
        js_rows = self._js_rows(groups, mask.sum(1).tolist())
        kw = dict(temperature=self.temperature, chunk_size=self.chunk_size)
        with torch.no_grad():
            if groups is not None and len(js_rows) == len(index):
                stats = metrics.token_stats(z, mask=mask, tokens=tokens, group_ids=groups, **kw)
                js = stats.js
            else:
                stats = metrics.token_stats(z, mask=mask, tokens=tokens, **kw)
                js = torch.full_like(stats.entropy, float("nan"))
                if js_rows:
                    rows = torch.tensor(js_rows, device=z.device)
                    sub = metrics.token_stats(z[rows], mask=mask[rows], tokens=tokens[rows],
                                              group_ids=[groups[r] for r in js_rows], **kw)
                    js[rows] = sub.js
        return self._record(stats.entropy, stats.renyi2, stats.top1, stats.logp, js, mask, tokens, index, env)

    def from_fused(self, ctx: dict, kwargs: dict, out, offset: int) -> ForwardRecord:
        labels = kwargs.get("labels")
        targets = kwargs.get("shift_labels") if labels is None else labels[:, 1:]
        mask = out.label_mask if getattr(out, "label_mask", None) is not None else targets != -100
        start = _first_valid_column(mask)
        mask = mask[:, start:]
        tokens = targets[:, start:].masked_fill(~mask, 0)
        index = self._rows(ctx["input_ids"], offset)
        mask, env = self._split_env(mask, index)
        with torch.no_grad():
            entropy = out.entropy.detach()[:, start:].float()
            logp = out.log_probs.detach()[:, start:].float()
            lssp = getattr(out, "log_sum_sq_probs", None)
            nan = torch.full_like(entropy, float("nan"))
            renyi2 = (-lssp.detach()[:, start:].float()).clamp(min=0.0) if lssp is not None else nan.clone()
            top1, js = nan.clone(), nan.clone()
            groups = self.group_of(index)
            js_rows = self._js_rows(groups, mask.sum(1).tolist()) if ctx["hidden"] is not None else []
            if js_rows:
                self._full_rows(ctx["hidden"], start, js_rows, groups, mask, tokens, top1, js)
        return self._record(entropy, renyi2, top1, logp, js, mask, tokens, index, env)

    def _full_rows(self, hidden, start, rows, groups, mask, tokens, top1, js) -> None:
        """hidden × Wᵀ (in chunks, inside metrics) for a few whole groups: JS and top-1."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        if getattr(text, "final_logit_softcapping", None) or getattr(text, "logit_scale", None) not in (None, 1, 1.0):
            self.warn_once("softcap", "forksight: this model rescales or soft-caps its logits; JS and top-1 "
                           "from hidden states are skipped on the fused head")
            return
        r = torch.tensor(rows, device=hidden.device)
        h = hidden.detach()[:, :-1][:, start:][r]
        sub = metrics.token_stats(hidden=h, weight=self.head.weight, bias=self.head.bias,
                                  mask=mask[r], tokens=tokens[r], temperature=self.temperature,
                                  group_ids=[groups[i] for i in rows], chunk_size=self.chunk_size)
        top1[r] = sub.top1
        js[r] = sub.js

    def _record(self, entropy, renyi2, top1, logp, js, mask, tokens, index, env) -> ForwardRecord:
        selected = self.selection_fn(entropy, mask) if self.selection_fn is not None else None
        width = mask.shape[1]
        sampler = self.sampler_logp_fn(index, width) if self.sampler_logp_fn is not None else None
        corrected = self.corrected_fn(index, width) if self.corrected_fn is not None else None
        return ForwardRecord(entropy, renyi2, top1, logp, js, mask, tokens, index, env, selected,
                             sampler.to(mask.device) if sampler is not None else None,
                             corrected.to(mask.device) if corrected is not None else None)
