"""The reference set through training (the bundled trainer, TRL, `handle.rescore(model)`, `forksight
rescore`): a fixed set of completions, kept at the run's start, re-scored teacher-forced by the policy
every `every` steps. The first scoring is the base: its rows also hold each prompt's tokens (negative
positions), so the set can be rebuilt from the store (a resumed run, `forksight rescore`). Each scoring
logs the set's rows (the `reference` table) and the ref/* scalars against the base
(hooks/metrics/reference.py). Re-scoring never takes more than `budget` of the training time: a due
step that would pass it is skipped (ref/skipped = 1) and the log says so once; the base is never skipped."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import numpy as np

from forksight.base.fork_rule import ForkRule
from forksight.base.interfaces import Sink
from forksight.hooks.metrics.reference import ReferenceSet, Scored, pattern_scalars, score

log = logging.getLogger("forksight.reference")

DEFAULT_EVERY = 25          # without an evaluation interval to follow
DEFAULT_SIZE = 32           # held-out prompts x 1 completion


def _none(value: float) -> float | None:
    return None if value != value else float(value)          # NaN -> null


class ReferenceScorer:
    """Holds the set and its base scoring, decides when a step is re-scored, logs rows and scalars."""

    def __init__(self, sink: Sink, ref: ReferenceSet, *, every: int = DEFAULT_EVERY,
                 fork_rule: "ForkRule | str | None" = None, temperature: float = 1.0,
                 decode: Callable[[int], str] | None = None, budget: float | None = 0.02,
                 batch_size: int = 8, pad_id: int = 0, base: Scored | None = None):
        if every < 1:
            raise ValueError(f"reference_every must be >= 1 (0 turns the reference set off), got {every}")
        if budget is not None and not budget > 0:
            raise ValueError(f"the reference budget is a share of training time and must be > 0, got {budget}")
        if not len(ref):
            raise ValueError("the reference set is empty: give at least one prompt and completion")
        self.sink, self.ref, self.every = sink, ref, every
        self.rule = ForkRule.parse(fork_rule)
        self.temperature, self.budget, self.batch_size, self.pad_id = temperature, budget, batch_size, pad_id
        self.base = base                     # the first scoring; None until the base step is scored
        self.started = time.perf_counter()
        self.spent = 0.0
        self.last_seconds: float | None = None
        self._decode, self._texts = decode, {}
        self._warned = False

    def due(self, step: int) -> bool:
        """The base (before any scoring) and every `every`-th step."""
        return self.base is None or step % self.every == 0

    def token(self, token_id: int) -> str | None:
        if self._decode is None:
            return None
        if token_id not in self._texts:
            self._texts[token_id] = self._decode(token_id)
        return self._texts[token_id]

    def rescore(self, model, step: int, score_fn: Callable[[], Scored] | None = None) -> dict[str, float] | None:
        """Score the set with `model` as the policy of `step` (or take `score_fn()`'s scoring: verl's workers
        score it); log its rows and ref/* scalars (returned). None when skipped for the time budget."""
        train = time.perf_counter() - self.started - self.spent
        if self.base is not None and self.budget is not None and self.last_seconds is not None \
                and self.spent + self.last_seconds > self.budget * train:
            if not self._warned:
                self._warned = True
                log.warning("forksight: reference re-scoring skipped from step %d on: one takes %.1f s, past the "
                            "budget of %.3g%% of training time (%.1f s spent of %.1f s); raise the budget or "
                            "re-score less often (ref/skipped marks each skipped step)", step, self.last_seconds,
                            100 * self.budget, self.spent, train)
            self.sink.log_scalars(step, {"ref/skipped": 1.0})
            return None
        start = time.perf_counter()
        scored = (score_fn() if score_fn is not None else
                  score(model, self.ref, temperature=self.temperature, batch_size=self.batch_size,
                        pad_id=self.pad_id)).with_forks(self.rule)
        first = self.base is None
        if first:
            self.base = scored
        self.sink.log_reference(step, self.rows(scored, prompts=first))
        seconds = time.perf_counter() - start
        scalars = pattern_scalars(self.base, scored)
        scalars.update({"ref/seconds": seconds, "ref/skipped": 0.0})
        if first:        # a one-off, as the step-0 evaluation (and it pays the kernels' warm-up): not budgeted
            self.started = time.perf_counter()
        else:
            self.spent += seconds
            self.last_seconds = seconds
            scalars["ref/budget_used"] = self.spent / max(time.perf_counter() - self.started - self.spent, 1e-9)
        self.sink.log_scalars(step, scalars)
        return scalars

    def rows(self, scored: Scored, prompts: bool = False) -> list[dict[str, Any]]:
        """The set's rows as `scored` scores it; with prompts, each prompt's tokens at -len .. -1 first."""
        rows: list[dict[str, Any]] = []
        for i, (prompt, completion) in enumerate(zip(self.ref.prompts, self.ref.completions)):
            if prompts:
                rows += [{"sample_id": i, "pos": p - len(prompt), "token_id": int(t), "token": self.token(int(t))}
                         for p, t in enumerate(prompt)]
            h, h2, lp, fork = scored.entropy[i], scored.renyi2[i], scored.logp[i], scored.fork[i]
            rows += [{"sample_id": i, "pos": p, "token_id": int(t), "token": self.token(int(t)),
                      "entropy": _none(h[p]), "renyi2": _none(h2[p]), "logp": _none(lp[p]), "fork": bool(fork[p])}
                     for p, t in enumerate(completion)]
        return rows

    # -- what a checkpoint keeps, so a resumed run keeps its set and its base
    def state(self) -> dict[str, Any]:
        base = self.base
        return {"prompts": self.ref.prompts, "completions": self.ref.completions,
                "base": None if base is None else {k: [a.tolist() for a in getattr(base, k)]
                                                   for k in ("entropy", "renyi2", "logp", "fork")}}

    @staticmethod
    def base_of(state: dict | None, rule: ForkRule) -> Scored | None:
        if not state or not state.get("base"):
            return None
        b = state["base"]
        scored = Scored(*[[np.asarray(a, dtype=np.float64) for a in b[k]] for k in ("entropy", "renyi2", "logp")])
        return scored.with_forks(rule)


def set_from_rows(rows: Sequence[dict]) -> tuple[ReferenceSet, Scored]:
    """The set and its base scoring from the base step's stored rows (prompt rows at negative positions).
    ValueError when the rows hold no prompt (not a base step's)."""
    by_sample: dict[int, dict[str, list]] = {}
    for r in sorted(rows, key=lambda r: (int(r["sample_id"]), int(r["pos"]))):
        item = by_sample.setdefault(int(r["sample_id"]), {"prompt": [], "completion": [], "h": [], "h2": [], "lp": []})
        if int(r["pos"]) < 0:
            item["prompt"].append(int(r["token_id"]))
        else:
            item["completion"].append(int(r["token_id"]))
            for key, name in (("h", "entropy"), ("h2", "renyi2"), ("lp", "logp")):
                value = r.get(name)
                item[key].append(float("nan") if value is None else float(value))
    if not by_sample or any(not v["prompt"] for v in by_sample.values()):
        raise ValueError("the stored reference rows hold no prompt tokens: they are not the base step's")
    items = [by_sample[i] for i in sorted(by_sample)]
    ref = ReferenceSet([v["prompt"] for v in items], [v["completion"] for v in items])
    base = Scored(*[[np.asarray(v[k], dtype=np.float64) for v in items] for k in ("h", "h2", "lp")])
    return ref, base
