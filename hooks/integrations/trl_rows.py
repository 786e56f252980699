"""TRL's generation batch as the training forwards see it: the sample each row is, the tokens the
environment wrote (tool output), the sampler's log p of each token and the tokens TRL's own
importance-sampling correction changed, for `forksight.trl`'s callback.
"""
from __future__ import annotations

import math

import torch


class GenerationRows:
    """Which generation-batch sample each training row is (TRL shuffles the batch before splitting
    it into micro-batches: rows are matched by a hash of their token ids), which of its tokens
    a tool or environment wrote (TRL's tool_mask = 0), and per sample the sampler's log p and
    TRL's correction, handed out right-aligned with each forward's completion columns."""

    def __init__(self):
        gen = torch.Generator().manual_seed(20260)  # own generator: never touch the global RNG
        self.weights = torch.randint(1, 2**61, (4096,), generator=gen, dtype=torch.int64)
        self.table: dict[int, list[int]] = {}
        self.used: dict[int, int] = {}  # rows of each hash handed out this step
        self.env: dict[int, torch.Tensor] = {}  # sample index -> its environment tokens [C]
        self.sampler: dict[int, torch.Tensor] = {}  # sample index -> its sampler log p [C] (NaN unknown)
        self.fixed: dict[int, torch.Tensor] = {}  # sample index -> tokens TRL's IS correction changed [C]
        self.size = 0

    def _hash(self, ids: torch.Tensor) -> list[int]:
        if ids.shape[1] > self.weights.numel():
            extra = torch.randint(1, 2**61, (ids.shape[1],), generator=torch.Generator().manual_seed(ids.shape[1]))
            self.weights = torch.cat([self.weights, extra])
        w = self.weights[: ids.shape[1]].to(ids.device)
        return (ids.long() * w).sum(-1).tolist()  # int64 wrap-around is fine for a hash

    def index(self, prompt_ids: torch.Tensor, completion_ids: torch.Tensor, offset: int, size: int,
              tool_mask: torch.Tensor | None = None, sampler_logp: torch.Tensor | None = None,
              corrected: torch.Tensor | None = None) -> None:
        """A new generation batch: this rank's rows are samples offset, offset + 1, ... of size;
        sampler_logp [B, C] (NaN unknown) and corrected [B, C] as `sampler_rows`/`trl_corrected` give them."""
        self.table, self.size, self.used = {}, size, {}
        for i, h in enumerate(self._hash(torch.cat([prompt_ids, completion_ids], dim=1))):
            self.table.setdefault(h, []).append(offset + i)
        self.env = {} if tool_mask is None else {offset + i: ~row for i, row in enumerate(tool_mask.bool())}
        self.sampler = {} if sampler_logp is None else {offset + i: row for i, row in enumerate(sampler_logp.cpu())}
        self.fixed = {} if corrected is None else {offset + i: row for i, row in enumerate(corrected.cpu())}

    def lookup(self, input_ids: torch.Tensor) -> list[int] | None:
        if not self.table:
            return None
        hashes = self._hash(input_ids)
        if any(h not in self.table for h in hashes):
            return None  # not a row of the current generation batch
        out = []
        for h in hashes:  # identical rows (a collapsed group) may sit in different micro-batches
            candidates, k = self.table[h], self.used.get(h, 0)
            out.append(candidates[k % len(candidates)])
            self.used[h] = k + 1
        return out

    def next_step(self) -> None:
        """Each optimizer step goes over the generation batch (again, with num_iterations > 1)."""
        self.used = {}

    def env_mask(self, index: list[int], width: int) -> torch.Tensor | None:
        """Tool-output tokens of these rows, right-aligned with the forward's completion columns."""
        return _right_aligned(self.env, index, width, False, torch.bool) if self.env else None

    def sampler_logp(self, index: list[int], width: int) -> torch.Tensor | None:
        """The sampler's log p of these rows' tokens (NaN unknown), aligned like `env_mask`."""
        return _right_aligned(self.sampler, index, width, math.nan, torch.float32) if self.sampler else None

    def corrected(self, index: list[int], width: int) -> torch.Tensor | None:
        """Tokens of these rows TRL's importance-sampling correction truncated or masked, aligned like `env_mask`."""
        return _right_aligned(self.fixed, index, width, False, torch.bool) if self.fixed else None


def _right_aligned(rows: dict[int, torch.Tensor], index: list[int], width: int, fill, dtype) -> torch.Tensor:
    """[len(index), width]: each sample's row with its last columns on the forward's last columns (the
    forward keeps the last `width` completion columns); samples without a row get `fill`."""
    out = torch.full((len(index), width), fill, dtype=dtype)
    for r, i in enumerate(index):
        row = rows.get(i)
        if row is not None:
            n = min(width, row.numel())
            out[r, width - n:] = row[row.numel() - n:].cpu()
    return out


def length_mismatches(generated) -> list[tuple[int, int, int]]:
    """(row, log-prob count, completion tokens) of each row whose sampler log-prob list has another length
    than its completion, from what TRL's `_generate` returned (completion_ids at 1, logprobs at 4)."""
    if not isinstance(generated, tuple) or len(generated) < 5:
        return []
    completion_ids, logprobs = generated[1], generated[4]
    if not isinstance(logprobs, (list, tuple)) or not isinstance(completion_ids, (list, tuple)):
        return []
    return [(i, len(lp), len(ids)) for i, (ids, lp) in enumerate(zip(completion_ids, logprobs))
            if lp is not None and len(lp) != len(ids)]


def sampler_rows(out: dict, bad_rows: list[int]) -> torch.Tensor | None:
    """The sampler's log p of each completion token of this generation batch, [B, C] float32 from TRL's
    `sampling_per_token_logps` (vLLM, or a rollout_func's `logprobs`), NaN where unknown: padding, tokens
    a tool or environment wrote (tool_mask = 0; TRL writes 0.0 there) and the rows in bad_rows (a log-prob
    list of another length than the completion, which TRL pads or widens silently)."""
    sampling = out.get("sampling_per_token_logps")
    if sampling is None:
        return None
    known = out["completion_mask"].bool().cpu()
    B, C = known.shape
    values = torch.full((B, C), math.nan, dtype=torch.float32)
    n = min(C, sampling.shape[1])    # a row longer than its completion widens TRL's padded tensor
    values[:, :n] = sampling[:, :n].detach().float().cpu()
    if out.get("tool_mask") is not None:
        known &= out["tool_mask"].bool().cpu()
    for i in bad_rows:
        if 0 <= i < B:
            known[i] = False
    return torch.where(known, values, torch.full_like(values, math.nan))


def trl_corrected(trainer, out: dict) -> torch.Tensor | None:
    """[B, C] bool: tokens TRL's vLLM importance-sampling correction truncated (`*_truncate`: the ratio
    sits at `vllm_importance_sampling_clip_min/max`, where TRL's clamp put it) or masked (`*_mask`: TRL
    set the ratio to 0), read from the `importance_sampling_ratio` TRL hands its loss; sequence modes
    mark every trained token of the sequence. None when TRL applied no such correction."""
    ratio = out.get("importance_sampling_ratio")
    if ratio is None or not getattr(trainer, "vllm_importance_sampling_correction", False):
        return None
    mode = str(getattr(trainer, "vllm_importance_sampling_mode", ""))
    mask = out["completion_mask"].bool()
    if out.get("tool_mask") is not None:
        mask = mask & out["tool_mask"].bool()
    ratio = ratio.detach().expand_as(mask)   # sequence modes: one ratio per row, [B, 1]
    if mode.endswith("_mask"):
        changed = ratio == 0
    elif mode.endswith("_truncate"):
        low = getattr(trainer, "vllm_importance_sampling_clip_min", None)
        high = getattr(trainer, "vllm_importance_sampling_clip_max", None)
        changed = torch.zeros_like(mask)
        if high is not None:
            changed |= ratio >= high   # compared in float32: exactly where clamp wrote float32(high)
        if low is not None:
            changed |= ratio <= low
    else:
        return None
    return (changed & mask).cpu()
