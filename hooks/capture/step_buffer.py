"""A step's forwards → one step report: records scattered by sample index into [rows, width]
tensors (rows a forward never saw stay masked out), then handed to the `StepReporter`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from forksight.hooks import metrics
from forksight.hooks.capture.forward_stats import ForwardRecord


class StepBuffer:
    """The forwards of the step being accumulated."""

    def __init__(self, num_rows: Callable[[], int | None] | None = None):
        self.records: list[ForwardRecord] = []
        self.num_rows = num_rows  # -> size of the sample index space now (TRL: the generation batch)

    def add(self, record: ForwardRecord) -> None:
        self.records.append(record)

    def rows_seen(self) -> int:
        return sum(len(r.index) for r in self.records)

    def take(self) -> list[ForwardRecord]:
        records, self.records = self.records, []
        return records

    def report(self, reporter, step: int, records: list[ForwardRecord], *, group_size: int | None,
               extra: dict | None, advantages: Sequence[float] | None, per_forward_means: bool) -> dict[str, float]:
        """Scatter the records into one batch and report it; returns the step's scalars."""
        width = max(r.mask.shape[1] for r in records)
        index = [i for r in records for i in r.index]
        known = self.num_rows() if self.num_rows is not None else None
        size = max(max(index) + 1, known or 0, len(index)) if index else 0
        device = records[0].mask.device

        def gather(name: str, fill, dtype) -> Tensor:
            out = torch.full((size, width), fill, dtype=dtype, device=device)
            for r in records:
                value = getattr(r, name)
                if value is not None:
                    out[torch.tensor(r.index, device=device), : value.shape[1]] = value.to(dtype)
            return out

        stats = metrics.TokenStats(
            entropy=gather("entropy", 0.0, torch.float32), renyi2=gather("renyi2", 0.0, torch.float32),
            top1=gather("top1", 0.0, torch.float32), logp=gather("logp", 0.0, torch.float32),
            js=gather("js", 0.0, torch.float32), mask=gather("mask", False, torch.bool))
        selected = gather("selected", False, torch.bool) if any(r.selected is not None for r in records) else None
        env = gather("env", False, torch.bool) if any(r.env is not None for r in records) else None
        sampler = (gather("sampler_logp", float("nan"), torch.float32)
                   if any(r.sampler_logp is not None for r in records) else None)
        corrected = gather("corrected", False, torch.bool) if any(r.corrected is not None for r in records) else None
        trust = None
        if any(r.tv is not None for r in records):
            trust = {"ratio": gather("ratio", float("nan"), torch.float32), "tv": gather("tv", float("nan"), torch.float32),
                     "clipped": gather("clipped", False, torch.bool)}
        parts = None
        if per_forward_means:  # micro-batch of each row, as TRL averages its per-micro-batch means
            parts = torch.full((size,), -1, dtype=torch.long)
            for k, r in enumerate(records):
                parts[torch.tensor(r.index)] = k
        groups = [i // group_size for i in range(size)] if group_size else None
        adv = None
        if advantages is not None and len(advantages) >= size:
            adv = torch.as_tensor([float(a) for a in advantages[:size]], device=device)
        return reporter.report(step, stats, gather("tokens", 0, torch.long), selected=selected, group_ids=groups,
                               advantages=adv, extra=dict(extra or {}), parts=parts, env_mask=env,
                               sampler_logp=sampler, corrected=corrected, trust=trust)
