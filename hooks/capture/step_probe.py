"""Value probes during training (the bundled trainer and TRL): at step 1 and every `every` steps, P of the step's
completions are probed with the policy of that step and the run's own reward; the rows go to the
sink's `probes` table and the `probe/*` scalars beside the step's others. Probing never takes more
than `budget` of the training time: a probe that would pass it is skipped (probe/skipped = 1) and
the log says so once; a reward that fails skips that step's probe with one warning."""
from __future__ import annotations

import logging
import random
import time
import warnings
from typing import Callable, Sequence

from forksight.base.interfaces import Sink
from forksight.hooks.metrics.probe_stats import TokenSignals, probe_scalars
from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings, Reward, RewardError, probe

log = logging.getLogger("forksight.probe")


class StepProber:
    """Decides when to probe, keeps the time budget, logs rows and scalars; one per run (rank)."""

    def __init__(self, sink: Sink, settings: ProbeSettings, *, every: int, samples: int = 4,
                 budget: float | None = 0.1, decode: Callable[[int], str] | None = None):
        if every < 1 or samples < 1:
            raise ValueError(f"probe_every and probe_samples must be >= 1, got {every} and {samples}")
        if budget is not None and not budget > 0:
            raise ValueError(f"probe_budget is a share of training time and must be > 0, got {budget}")
        self.sink, self.settings, self.every, self.samples = sink, settings.check(), every, samples
        self.budget, self.decode = budget, decode
        self.started = time.perf_counter()
        self.spent = 0.0                  # seconds spent probing
        self.per_completion: float | None = None
        self._warned: set[str] = set()

    def due(self, step: int) -> bool:
        """The first step (where the run starts from) and every `every`-th."""
        return step == 1 or step % self.every == 0

    def due_within(self, step: int, span: int) -> bool:
        """Whether a batch that trains steps step … step + span − 1 (a generation reused over several
        optimiser steps) holds a due step: it is probed then, with the policy that sampled it."""
        return any(self.due(s) for s in range(step, step + max(1, span)))

    def pick(self, rows: int | Sequence[int], step: int) -> list[int]:
        """Which of the step's completions to probe (seeded by the probe's seed and the step): of
        range(rows), or of the given row indices (those with a token to probe)."""
        pool = range(rows) if isinstance(rows, int) else list(rows)
        rng = random.Random(self.settings.seed * 7_919 + step)
        return sorted(rng.sample(pool, min(len(pool), self.samples)))

    def training_seconds(self) -> float:
        return time.perf_counter() - self.started - self.spent

    def _warn_once(self, key: str, message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            text = message % args
            warnings.warn(text, stacklevel=3)
            log.warning(text)

    def run(self, step: int, model, inputs: Sequence[ProbeInput], signals: Sequence[TokenSignals],
            reward: Reward, *, eos_id: int | Sequence[int], pad_id: int | None = None) -> dict[str, float] | None:
        """Probe `inputs` (already picked) at `step`; the scalars logged, or None when skipped."""
        train = self.training_seconds()
        predicted = (self.per_completion or 0.0) * len(inputs)
        if self.budget is not None and self.per_completion is not None and \
                self.spent + predicted > self.budget * train:
            self._warn_once("budget", "forksight: value probes skipped from step %d on: one takes about %.1f s, "
                            "past the budget of %.3g%% of training time (%.1f s spent of %.1f s); raise "
                            "probe_budget or probe fewer samples (probe/skipped marks each skipped step)",
                            step, predicted, 100 * self.budget, self.spent, train)
            self.sink.log_scalars(step, {"probe/skipped": 1.0})
            return None
        start = time.perf_counter()
        settings = ProbeSettings(**{**self.settings.__dict__, "seed": self.settings.seed * 1_000_003 + step})
        try:
            rows = probe(model, inputs, reward, settings, eos_id=eos_id, pad_id=pad_id, decode=self.decode)
        except RewardError as exc:
            self.spent += time.perf_counter() - start
            self._warn_once("reward", "forksight: value probe of step %d skipped: %s (training goes on; "
                            "later probes are skipped the same way while it fails)", step, exc)
            return None
        seconds = time.perf_counter() - start
        self.spent += seconds
        self.per_completion = seconds / max(1, len(inputs))
        scalars = probe_scalars(rows, signals, len(inputs), seed=settings.seed)
        scalars.update({"probe/seconds": seconds, "probe/skipped": 0.0,
                        "probe/budget_used": self.spent / max(train, 1e-9)})
        self.sink.log_probes(step, rows)
        self.sink.log_scalars(step, scalars)
        return scalars
