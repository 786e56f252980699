"""Monte-Carlo value probes (docs/algorithms.md §12; VinePPO's estimator, Phi-4's pivotal tokens):
for a stored completion y of prompt x, V(x, y<t) and V(x, y≤t) of probed positions t, each the mean
reward of K continuations sampled from the policy (hooks/metrics/probe_values.py: the sampler, the
determined values of ended prefixes, each distinct prefix estimated once). Which positions: `forks`
(every fork and as many random non-forks), `all` (T + 1 values for T tokens), N random, `search`
(bisection, hooks/metrics/probe_search.py: about p·log2 T values for p pivots), or `auto` (the
default: `search` for completions longer than `search_above` tokens, `forks` for shorter ones). The
prefix is the run's prompt ids + the stored completion ids, never re-tokenised."""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from forksight.base.constants import FORK_ENTROPY
from forksight.hooks.metrics.probe_search import bisect
from forksight.hooks.metrics.probe_values import (Prefixes, Reward, RewardError, own_generation_config,  # noqa: F401
                                                  sampling_config, stop_ids)

POSITION_MODES = ("auto", "forks", "all", "search")


@dataclass
class ProbeSettings:
    """How a step is probed; every field has a default, `check()` explains a bad one."""

    k: int = 16                      # continuations per value
    positions: str | int = "auto"    # auto, forks (every fork + as many random non-forks), all, search, N random
    search_above: int = 32           # auto: bisection for completions longer than this, forks otherwise
    split_delta: float | None = None  # search: split a segment while its ends differ by this (None: pivot_delta / 2)
    max_positions: int = 16          # per completion in `forks` mode (forks first, then controls)
    alternatives: int = 3            # top alternative tokens whose branch value is probed at a fork
    temperature: float = 1.0         # the run's sampling temperature (top_k 0, top_p 1)
    max_new_tokens: int = 64         # the run's completion length: a prefix plus its continuation
    first_token_eos: bool = True     # False: no EOS as a completion's first token (the run's min_new_tokens=1)
    fork_entropy: float = FORK_ENTROPY
    pivot_delta: float = 0.2         # pivotal: |delta| >= pivot_delta ...
    pivot_se: float = 2.0            # ... and |delta| > pivot_se x SE
    seed: int = 0
    batch_rows: int = 512            # sequences per generate call

    def check(self) -> "ProbeSettings":
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k (continuations per value) must be a whole number >= 1, got {self.k!r}")
        positions = self.positions
        if isinstance(positions, str) and positions.isdigit():
            positions = int(positions)
        if not (positions in POSITION_MODES or (isinstance(positions, int) and not isinstance(positions, bool)
                                                 and positions >= 1)):
            raise ValueError(f"positions must be 'auto', 'forks', 'all', 'search' or a number N >= 1 of random "
                             f"positions per completion, got {self.positions!r}")
        self.positions = positions
        if positions in ("auto", "search") and not 0 < self.pivot_delta < 1:
            raise ValueError(f"the pivotal delta must be between 0 and 1 (exclusive) to search by bisection: a "
                             f"segment is split while its end values differ by at least it, got {self.pivot_delta!r}"
                             " (0 would split every segment: use positions='all'; >= 1 never splits 0/1 rewards)")
        if self.split_delta is not None and not 0 < self.split_delta <= self.pivot_delta:
            raise ValueError(f"split_delta must lie in (0, pivot_delta = {self.pivot_delta}], got {self.split_delta!r}")
        if isinstance(self.search_above, bool) or not isinstance(self.search_above, int) or self.search_above < 0:
            raise ValueError(f"search_above must be a whole number of tokens >= 0, got {self.search_above!r}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        for name in ("max_positions", "max_new_tokens", "batch_rows"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.alternatives < 0 or self.pivot_delta < 0 or self.pivot_se < 0:
            raise ValueError("alternatives, pivot_delta and pivot_se must be >= 0")
        return self


@dataclass
class ProbeInput:
    """One completion to probe: the prompt as the run tokenised it, the completion's stored ids
    (through EOS when it ended), and optionally the run's own per-token entropy/fork flags."""

    sample_id: int
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    entropy: Sequence[float] | None = None   # the run's H per position (else the probe's forward)
    fork: Sequence[bool] | None = None       # the run's fork flags (else H >= fork_entropy)


# ---------------------------------------------------------------------------------------------
# the teacher-forced pass: the distribution at every completion position


@torch.no_grad()
def position_distributions(model, item: ProbeInput, temperature: float) -> torch.Tensor:
    """[T, V] softmax(logits / temperature) that produced each completion token (float32)."""
    device = next(model.parameters()).device
    ids = torch.tensor([list(item.prompt_ids) + list(item.completion_ids)], device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    p = len(item.prompt_ids)
    return torch.softmax(logits[p - 1: -1].float() / temperature, dim=-1)


def check_vocab(model, inputs: Sequence[ProbeInput]) -> None:
    """Stored token ids must be ids of this model's vocabulary."""
    vocab = model.get_input_embeddings().weight.shape[0]
    for item in inputs:
        ids = list(item.prompt_ids) + list(item.completion_ids)
        bad = [t for t in ids if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"sample {item.sample_id} holds token id {bad[0]}, outside this model's vocabulary "
                             f"of {vocab}: the stored ids come from another tokenizer; probe with the run's model")


def choose_positions(fork: Sequence[bool], settings: ProbeSettings, rng: random.Random) -> list[int]:
    """Probed positions of one completion, ascending, under `forks`, `all` or N random (`auto`
    resolved by the completion's length; `search` chooses as it goes: probe_search.bisect)."""
    n = len(fork)
    positions = mode(settings, n)
    if positions in ("all", "search"):
        return list(range(n))
    if positions == "forks":
        forks = [t for t in range(n) if fork[t]]
        rest = [t for t in range(n) if not fork[t]]
        half = max(1, settings.max_positions // 2)
        chosen = rng.sample(forks, min(len(forks), half))
        chosen += rng.sample(rest, min(len(rest), len(chosen), settings.max_positions - len(chosen)))
        return sorted(chosen)
    return sorted(rng.sample(range(n), min(n, int(positions))))


# ---------------------------------------------------------------------------------------------
# the probe


def probe(model, inputs: Sequence[ProbeInput], reward: Reward, settings: ProbeSettings | None = None, *,
          eos_id: int | Sequence[int], pad_id: int | None = None, decode: Callable[[int], str] | None = None,
          progress=None, counts: dict | None = None) -> list[dict]:
    """Probe rows (the `probes` table's fields) of every probed position of every input; under
    `search`, also one row per segment not searched inside (`span` > 1: its first position, the values
    of its two ends, no fork flag, entropy or pivot). Seeded: the same inputs, model and settings give
    the same rows; the caller's RNG state is left as it was. reward(i, completion_ids) scores input i's
    completion; a failure raises RewardError. eos_id: every id the run's rollouts stop on (`stop_ids`).
    progress: a tqdm-like bar (its total grown by the values each round samples, updated as they are).
    counts: a dict given here gets `continuations` (sampled) and `values` (distinct prefixes)."""
    s = (settings or ProbeSettings()).check()
    check_vocab(model, inputs)
    eos_ids = (int(eos_id),) if isinstance(eos_id, int) else tuple(int(i) for i in eos_id)
    if not eos_ids:
        raise ValueError("eos_id: give at least one end-of-sequence id (forksight.hooks.metrics.value_probe.stop_ids)")
    pad_id = eos_ids[0] if pad_id is None else pad_id
    device = next(model.parameters()).device
    values = Prefixes(model, inputs, reward, s, eos_ids, pad_id)
    plans, searched = [], {}
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(s.seed)
            for i, item in enumerate(inputs):
                read = _read(model, item, s)
                if mode(s, len(read.comp)) == "search":
                    searched[i] = read
                else:
                    plans += _plan(i, read, s, values, random.Random(s.seed * 1_000_003 + int(item.sample_id)))
            values.estimate(progress)
            leaves = bisect(values, {i: read.comp for i, read in searched.items()}, split_at(s), progress)
            for i, segments in leaves.items():
                plans += [_planned(i, searched[i], a, b, values) for a, b in segments]
            values.estimate(progress)                  # the alternatives of the forks the search reached
    finally:
        model.train(was_training)
    if counts is not None:
        counts.update(continuations=values.sampled, values=len(values.wanted))
    return [_row(plan, inputs, values, s, decode) for plan in plans]


def split_at(settings: ProbeSettings) -> float:
    """The search splits a segment while its end values differ by at least this: half the pivotal δ
    unless set. Splitting only at δ missed 39% of the reproducible pivots of real completions (a
    start value near the end's hides a jump inside, e.g. 0.17 → 0.3 → 0.0); at δ/2 the search found
    96% of them at 21% of the sweep's values (bench/probe_search.py, docs/probe_search.md)."""
    return settings.split_delta if settings.split_delta is not None else settings.pivot_delta / 2


def mode(settings: ProbeSettings, length: int) -> str | int:
    """The positions mode a completion of `length` tokens is probed with (`auto` resolved)."""
    if settings.positions == "auto":
        return "search" if length > settings.search_above else "forks"
    return settings.positions


@dataclass
class _Read:
    """One input's teacher-forced reading: ids, H and fork flag per position, and the top
    alternative tokens (not the sampled one) at each fork."""

    comp: list[int]
    entropy: list[float | None]
    fork: list[bool]
    alternatives: dict[int, list[int]]


def _read(model, item: ProbeInput, s: ProbeSettings) -> _Read:
    comp = [int(t) for t in item.completion_ids]
    if not comp:
        return _Read([], [], [], {})
    probs = position_distributions(model, item, s.temperature)
    entropy = (list(item.entropy) if item.entropy is not None else
               (-(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)).tolist())
    entropy = [None if h is None or not math.isfinite(h) else float(h) for h in entropy]
    fork = ([bool(f) for f in item.fork] if item.fork is not None else
            [h is not None and h >= s.fork_entropy for h in entropy])
    alternatives = {}
    forks = [t for t in range(len(comp)) if fork[t]]
    if forks and s.alternatives:
        top = torch.topk(probs[forks], min(s.alternatives + 1, probs.shape[-1]), dim=-1).indices.tolist()
        alternatives = {t: [a for a in row if a != comp[t]][:s.alternatives] for t, row in zip(forks, top)}
    return _Read(comp, entropy, fork, alternatives)


def _planned(i: int, read: _Read, t: int, end: int, values: Prefixes) -> tuple:
    """A row's plan: positions t..end−1 (one token when end = t + 1) with the prefixes it needs."""
    comp = read.comp
    alts = read.alternatives.get(t, []) if end == t + 1 else []
    return (i, t, end - t, values.want(i, comp[:t]), values.want(i, comp[:end]),
            [(a, values.want(i, comp[:t] + [a])) for a in alts], read)


def _plan(i: int, read: _Read, s: ProbeSettings, values: Prefixes, rng: random.Random) -> list[tuple]:
    """The probed positions of one input (forks, all or N random), each with the prefixes it needs."""
    if not read.comp:
        return []
    return [_planned(i, read, t, t + 1, values) for t in choose_positions(read.fork, s, rng)]


def _row(plan: tuple, inputs: Sequence[ProbeInput], values: Prefixes, s: ProbeSettings,
         decode: Callable[[int], str] | None) -> dict:
    i, t, span, before, after, alts, read = plan
    vb, va = values[before], values[after]
    delta, se = va.mean - vb.mean, math.sqrt(vb.se ** 2 + va.se ** 2)
    alternatives = [{"token_id": int(a), "token": decode(a) if decode else None, "value": values[key].mean,
                     "k": values[key].k} for a, key in alts]
    one = span == 1
    return {"sample_id": int(inputs[i].sample_id), "pos": t, "span": span, "token_id": read.comp[t],
            "token": decode(read.comp[t]) if decode else None, "fork": bool(read.fork[t]) if one else None,
            "entropy": read.entropy[t] if one else None,
            "v_before": vb.mean, "v_after": va.mean, "delta": delta, "se": se, "se_before": vb.se,
            "se_after": va.se, "k": s.k, "pivotal": one and is_pivotal(delta, se, s),
            "alternatives": json.dumps(alternatives) if alternatives else None}


def is_pivotal(delta: float, se: float, settings: ProbeSettings) -> bool:
    """|delta| >= pivot_delta and beyond noise (> pivot_se standard errors)."""
    return abs(delta) >= settings.pivot_delta and abs(delta) > settings.pivot_se * se
