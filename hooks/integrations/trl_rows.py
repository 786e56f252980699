"""TRL's generation batch as the training forwards see it: the sample each row is, and the tokens
the environment wrote (tool output), for `forksight.trl`'s callback.
"""
from __future__ import annotations

import torch


class GenerationRows:
    """Which generation-batch sample each training row is (TRL shuffles the batch before splitting
    it into micro-batches: rows are matched by a hash of their token ids) and which of its tokens
    a tool or environment wrote (TRL's tool_mask = 0)."""

    def __init__(self):
        gen = torch.Generator().manual_seed(20260)  # own generator: never touch the global RNG
        self.weights = torch.randint(1, 2**61, (4096,), generator=gen, dtype=torch.int64)
        self.table: dict[int, list[int]] = {}
        self.used: dict[int, int] = {}  # rows of each hash handed out this step
        self.env: dict[int, torch.Tensor] = {}  # sample index -> its environment tokens [C]
        self.size = 0

    def _hash(self, ids: torch.Tensor) -> list[int]:
        if ids.shape[1] > self.weights.numel():
            extra = torch.randint(1, 2**61, (ids.shape[1],), generator=torch.Generator().manual_seed(ids.shape[1]))
            self.weights = torch.cat([self.weights, extra])
        w = self.weights[: ids.shape[1]].to(ids.device)
        return (ids.long() * w).sum(-1).tolist()  # int64 wrap-around is fine for a hash

    def index(self, prompt_ids: torch.Tensor, completion_ids: torch.Tensor, offset: int, size: int,
              tool_mask: torch.Tensor | None = None) -> None:
        """A new generation batch: this rank's rows are samples offset, offset + 1, ... of size."""
        self.table, self.size, self.used = {}, size, {}
        for i, h in enumerate(self._hash(torch.cat([prompt_ids, completion_ids], dim=1))):
            self.table.setdefault(h, []).append(offset + i)
        self.env = {} if tool_mask is None else {offset + i: ~row for i, row in enumerate(tool_mask.bool())}

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
        if not self.env:
            return None
        out = torch.zeros(len(index), width, dtype=torch.bool)
        for r, i in enumerate(index):
            row = self.env.get(i)
            if row is not None:
                n = min(width, row.numel())
                out[r, width - n:] = row[row.numel() - n:].cpu()
        return out
