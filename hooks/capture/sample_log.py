"""Samples (prompt, completion, reward, verdict) of each step: held until the step's forwards are
reported (so each row gets its completion length), then sent with the step's reward scalars.
"""
from __future__ import annotations

from typing import Any, Sequence

from forksight.base.interfaces import Sink
from forksight.hooks import metrics


def as_text(x: Any) -> str:
    """Prompts/completions may be chat messages: show them as `role: content` lines."""
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)) and all(isinstance(m, dict) for m in x):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in x)
    return str(x)


def sample_rows(prompts: Sequence, completions: Sequence, rewards: Sequence[float],
                correct: Sequence[bool] | None, group_ids: Sequence[int] | None, sample_ids: Sequence[int] | None,
                group_size: int | None, source: str) -> list[dict]:
    """Validated sample rows; group ids default to sample_id // group_size."""
    n = len(completions)
    if not (len(prompts) == n == len(rewards)) or (correct is not None and len(correct) != n):
        raise ValueError(f"prompts, completions, rewards (and correct) need one entry per sample; got "
                         f"{len(prompts)}, {n}, {len(rewards)}" + ("" if correct is None else f", {len(correct)}"))
    ids = list(sample_ids) if sample_ids is not None else list(range(n))
    if group_ids is None:
        if group_size is None:
            raise ValueError("log_samples needs group_ids, or attach(..., group_size=G) to derive them")
        group_ids = [i // group_size for i in ids]
    if len(group_ids) != n or len(ids) != n:
        raise ValueError(f"group_ids and sample_ids need {n} entries each")
    return [{"sample_id": int(ids[i]), "group_id": int(group_ids[i]), "prompt": as_text(prompts[i]),
             "completion": as_text(completions[i]), "reward": float(rewards[i]),
             "correct": bool(correct[i]) if correct is not None else bool(float(rewards[i]) > 0),
             "source": source} for i in range(n)]


class SampleLog:
    """Sample rows waiting for their step's report, by step; with_scalars=False when the caller
    logs the reward scalars itself (TRL: rank 0 from the rewards gathered over all ranks)."""

    def __init__(self, sink: Sink):
        self.sink = sink
        self.pending: dict[int, tuple[list[dict], bool]] = {}

    def add(self, step: int, rows: list[dict], current: int, with_scalars: bool = True) -> None:
        if step < current:  # that step was reported already: send the samples on their own
            self.send(step, rows, with_scalars)
        else:
            held, scalars = self.pending.get(step, ([], False))
            self.pending[step] = (held + rows, scalars or with_scalars)

    def send(self, step: int, rows: list[dict], with_scalars: bool = True) -> None:
        if not rows:
            return
        self.sink.log_samples(step, rows)
        if with_scalars:
            self.sink.log_scalars(step, metrics.group_scalars([r["group_id"] for r in rows],
                                                              [r["reward"] for r in rows], [r["correct"] for r in rows],
                                                              [r.get("length") for r in rows]))

    def release(self, step: int, lengths: dict[int, int]) -> None:
        """Send step's rows (with lengths from its forwards) and any older ones that never had a forward."""
        rows, scalars = self.pending.pop(step, (None, False))
        if rows is not None:
            for row in rows:
                if row.get("length") is None and row["sample_id"] in lengths:
                    row["length"] = lengths[row["sample_id"]]
            self.send(step, rows, scalars)
        for old in sorted(s for s in self.pending if s < step):
            self.send(old, *self.pending.pop(old))

    def drain(self) -> None:
        for step in sorted(self.pending):
            self.send(step, *self.pending.pop(step))
