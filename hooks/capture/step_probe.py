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


def undecided(values: Sequence[float], groups: Sequence[int]) -> list[int]:
    """Rows whose group's rewards (or advantages) differ: where the outcome is not yet decided and a
    token can be pivotal (a group all right or all wrong is decided from its first token)."""
    seen: dict[int, set[float]] = {}
    for v, g in zip(values, groups):
        seen.setdefault(int(g), set()).add(round(float(v), 9))
    return [i for i, g in enumerate(groups) if len(seen[int(g)]) > 1]


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

    def pick(self, rows: int | Sequence[int], step: int, prefer: Sequence[int] = ()) -> list[int]:
        """Which of the step's completions to probe (seeded by the probe's seed and the step): of
        range(rows), or of the given row indices (those with a token to probe); those in `prefer`
        first (`undecided`: groups whose rewards differ), the rest only to fill the count."""
        pool = range(rows) if isinstance(rows, int) else list(rows)
        first = [i for i in pool if i in set(prefer)]
        rest = [i for i in pool if i not in set(first)]
        rng = random.Random(self.settings.seed * 7_919 + step)
        chosen = rng.sample(first, min(len(first), self.samples))
        return sorted(chosen + rng.sample(rest, min(len(rest), self.samples - len(chosen))))

    def training_seconds(self) -> float:
        return time.perf_counter() - self.started - self.spent

    def _warn_once(self, key: str, message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            text = message % args
            warnings.warn(text, stacklevel=3)
            log.warning(text)

    def run(self, step: int, model, inputs: Sequence[ProbeInput], signals: Sequence[TokenSignals],
            reward: Reward, *, eos_id: int | Sequence[int], pad_id: int | None = None,
            split: str = "train") -> dict[str, float] | None:
        """Probe `inputs` (already picked) at `step`; the scalars logged, or None when skipped.
        split "eval": held-out completions, rows marked so and scalars under probe/eval/."""
        prefix = "probe/" if split == "train" else f"probe/{split}/"
        train = self.training_seconds()
        predicted = (self.per_completion or 0.0) * len(inputs)
        if self.budget is not None and self.per_completion is not None and \
                self.spent + predicted > self.budget * train:
            self._warn_once("budget", "forksight: value probes skipped from step %d on: one takes about %.1f s, "
                            "past the budget of %.3g%% of training time (%.1f s spent of %.1f s); raise "
                            "probe_budget or probe fewer samples (probe/skipped marks each skipped step)",
                            step, predicted, 100 * self.budget, self.spent, train)
            self.sink.log_scalars(step, {f"{prefix}skipped": 1.0})
            return None
        start = time.perf_counter()
        settings = ProbeSettings(**{**self.settings.__dict__, "seed": self.settings.seed * 1_000_003 + step})
        counts: dict = {}
        try:
            rows = probe(model, inputs, reward, settings, eos_id=eos_id, pad_id=pad_id, decode=self.decode,
                         counts=counts)
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
                        "probe/continuations": float(counts["continuations"]),
                        "probe/budget_used": self.spent / max(train, 1e-9)})
        if split != "train":
            scalars = {prefix + k[len("probe/"):]: v for k, v in scalars.items()}
            rows = [{**r, "split": split} for r in rows]
        self.sink.log_probes(step, rows)
        self.sink.log_scalars(step, scalars)
        return scalars
