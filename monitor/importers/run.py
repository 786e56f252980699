"""What every reader returns (torch-free): a logged run as forksight steps, and the error for a source
that cannot be read. The format readers (readers.py, wandb_run.py, trl_completions.py, prime_rl.py)
build on it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from forksight.monitor.importers.aliases import canonical

MAX_STEPS = 1_000_000     # steps kept from one source (memory stays bounded whatever the input)
MAX_KEYS = 1_000          # distinct metrics kept
STEP_KEYS = ("step", "global_step", "_step", "iteration", "train/global_step", "trainer/global_step")


class SourceError(ValueError):
    """A source that cannot be read, with what was expected."""


@dataclass
class ImportedRun:
    """A logged run as forksight steps: rows[i] holds step steps[i]'s {key: value}."""

    name: str
    kind: str          # trl, tensorboard, wandb, verl, jsonl, csv, trl-completions, prime-rl
    steps: list[int] = field(default_factory=list)
    rows: list[dict[str, float]] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)   # logged name -> forksight key, where they differ
    config: dict = field(default_factory=dict)
    dropped_keys: int = 0                       # metrics past MAX_KEYS
    samples: list[dict] = field(default_factory=list)   # samples-table rows (TRL's completions log)
    tokens: list = field(default_factory=list)          # tokens-table Arrow tables, one per step (prime-rl)
    # per tokens table: which rows the run's own mismatch correction masked (prime-rl's is_masked), as a
    # numpy bool array, or None where the export says nothing of it; turned into mismatch/frac_corrected
    corrected: list = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return sorted({k for row in self.rows for k in row})


class Builder:
    """Collects (step, name, value) in any order, merges repeats of a step, keeps numbers only."""

    def __init__(self, name: str, kind: str) -> None:
        self.run = ImportedRun(name, kind)
        self.by_step: dict[int, dict[str, float]] = {}
        self.known: set[str] = set()

    def add(self, step: int, name: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        value = float(value)
        key = canonical(name)
        if key not in self.known:
            if len(self.known) >= MAX_KEYS:
                self.run.dropped_keys += 1
                return
            self.known.add(key)
        if key != name:
            self.run.renamed[name] = key
        row = self.by_step.get(step)
        if row is None:
            if len(self.by_step) >= MAX_STEPS:
                return
            row = self.by_step[step] = {}
        row.setdefault(key, value)        # an exact alias wins over a later duplicate name

    def add_row(self, step: int, data: dict) -> None:
        for name, value in data.items():
            if name not in STEP_KEYS:
                self.add(step, str(name), value)

    def done(self) -> ImportedRun:
        steps = sorted(self.by_step)
        self.run.steps = steps
        self.run.rows = [self.by_step[s] for s in steps]
        return self.run


def step_of(entry: dict) -> int | None:
    for key in STEP_KEYS:
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return int(value)
    return None
