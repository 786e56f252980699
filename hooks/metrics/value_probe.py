"""Monte-Carlo value probes (docs/algorithms.md §12; VinePPO's estimator, Phi-4's pivotal tokens):
for a stored completion y of prompt x, V(x, y<t) and V(x, y≤t) of probed positions t, each the mean
reward of K continuations sampled from the policy (untruncated softmax at the run's temperature),
up to the run's completion length, from an explicit and complete sampling configuration (the
model's own generation_config, e.g. a repetition_penalty, never leaks in: V is this policy's value).
A prefix that already ended (any of the run's end-of-sequence ids, or the length cap) has its
value determined: the reward of the prefix itself, SE 0. V(x, y≤t) is V(x, y<t+1): every distinct
prefix is estimated once and shared by the positions that need it (a sweep over T positions costs
T+1 values). The prefix is the run's prompt ids + the stored completion ids, never re-tokenised."""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from contextlib import contextmanager
from typing import Callable, Sequence

import torch

from forksight.base.constants import FORK_ENTROPY

POSITION_MODES = ("forks", "all")


@dataclass
class ProbeSettings:
    """How a step is probed; every field has a default, `check()` explains a bad one."""

    k: int = 16                      # continuations per value
    positions: str | int = "forks"   # forks (every fork + as many random non-forks), all, or N random
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
            raise ValueError(f"positions must be 'forks', 'all' or a number N >= 1 of random positions per "
                             f"completion, got {self.positions!r}")
        self.positions = positions
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


class RewardError(RuntimeError):
    """The reward function raised or returned something that is not a finite number."""


# a reward of one probed completion: (index into the inputs, the completion's ids) -> float
Reward = Callable[[int, list[int]], float]


@dataclass
class _Value:
    mean: float
    se: float
    k: int


def _check_reward(value, where: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:      # numpy / torch scalars
        value = value.item()
    if not isinstance(value, (int, float)):
        raise RewardError(f"the reward function returned {value!r} ({type(value).__name__}) for {where}; "
                          "it must return a number")
    if not math.isfinite(value):
        raise RewardError(f"the reward function returned {value!r} for {where}; it must be a finite number")
    return float(value)


def _mean_se(rewards: list[float]) -> _Value:
    k = len(rewards)
    mean = sum(rewards) / k
    if all(r in (0.0, 1.0) for r in rewards):           # 0/1 rewards: the binomial SE
        var = mean * (1.0 - mean)
    else:
        var = sum((r - mean) ** 2 for r in rewards) / (k - 1) if k > 1 else 0.0
    return _Value(mean, math.sqrt(max(var, 0.0) / k), k)


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
    """Probed positions of one completion, ascending."""
    n = len(fork)
    if settings.positions == "all":
        return list(range(n))
    if settings.positions == "forks":
        forks = [t for t in range(n) if fork[t]]
        rest = [t for t in range(n) if not fork[t]]
        half = max(1, settings.max_positions // 2)
        chosen = rng.sample(forks, min(len(forks), half))
        chosen += rng.sample(rest, min(len(rest), len(chosen), settings.max_positions - len(chosen)))
        return sorted(chosen)
    return sorted(rng.sample(range(n), min(n, int(settings.positions))))


# ---------------------------------------------------------------------------------------------
# values of prefixes


class _Prefixes:
    """Distinct prefixes (input index, completion prefix ids) -> their value, estimated in batches."""

    def __init__(self, model, inputs: Sequence[ProbeInput], reward: Reward, settings: ProbeSettings,
                 eos_ids: tuple[int, ...], pad_id: int):
        self.model, self.inputs, self.reward, self.s = model, inputs, reward, settings
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.wanted: dict[tuple[int, tuple[int, ...]], _Value | None] = {}

    def want(self, i: int, prefix: Sequence[int]) -> tuple[int, tuple[int, ...]]:
        key = (i, tuple(int(t) for t in prefix))
        self.wanted.setdefault(key, None)
        return key

    def _score(self, i: int, ids: list[int]) -> float:
        try:
            value = self.reward(i, ids)
        except RewardError:
            raise
        except Exception as exc:  # noqa: BLE001 - said with the sample it failed on
            raise RewardError(f"the reward function raised {type(exc).__name__}: {exc} (sample "
                              f"{self.inputs[i].sample_id})") from exc
        return _check_reward(value, f"sample {self.inputs[i].sample_id}")

    def _ended(self, prefix: tuple[int, ...]) -> bool:
        return bool(prefix) and (prefix[-1] in self.eos_ids or len(prefix) >= self.s.max_new_tokens)

    def estimate(self, progress=None) -> None:
        """Fill every wanted value: determined ones from one reward, the rest from K continuations."""
        open_keys = []
        for key in self.wanted:
            if self._ended(key[1]):
                value = self._score(key[0], list(key[1]))
                self.wanted[key] = _Value(value, 0.0, self.s.k)
            else:
                open_keys.append(key)
        by_len: dict[int, list] = {}
        for key in open_keys:
            by_len.setdefault(len(key[1]), []).append(key)
        per_call = max(1, self.s.batch_rows // self.s.k)
        if progress is not None:
            progress.total = len(open_keys)
        for length in sorted(by_len):
            keys = by_len[length]
            for start in range(0, len(keys), per_call):
                chunk = keys[start:start + per_call]
                self._sample(chunk, length)
                if progress is not None:
                    progress.update(len(chunk))

    @torch.no_grad()
    def _sample(self, keys: list, length: int) -> None:
        k, device = self.s.k, next(self.model.parameters()).device
        seqs = [list(self.inputs[i].prompt_ids) + list(prefix) for i, prefix in keys]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):                   # left padding, as the run's rollouts
            ids[r, width - len(s):] = torch.tensor(s)
            attn[r, width - len(s):] = 1
        ids = ids.repeat_interleave(k, 0).to(device)
        attn = attn.repeat_interleave(k, 0).to(device)
        config = sampling_config(self.s, self.eos_ids, self.pad_id, max_new_tokens=self.s.max_new_tokens - length,
                                 min_new_tokens=1 if length == 0 and not self.s.first_token_eos else 0)
        with own_generation_config(self.model):
            out = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=config)
        cont = out[:, width:].tolist()
        for n, (i, prefix) in enumerate(keys):
            rewards = []
            for row in cont[n * k:(n + 1) * k]:
                end = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
                if end is not None:                  # the first end-of-sequence id of any kind
                    row = row[:end + 1]
                rewards.append(self._score(i, list(prefix) + row))
            self.wanted[(i, prefix)] = _mean_se(rewards)


# ---------------------------------------------------------------------------------------------
# the probe


def stop_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id a rollout stops on: the tokenizer's EOS and each of the model generation_config's
    (Qwen2.5-Instruct lists two, Llama-3 three; TRL's and vLLM's rollouts stop on all of them)."""
    ids: list[int] = []
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        ids += [value] if isinstance(value, int) else list(value or [])
    return tuple(dict.fromkeys(int(i) for i in ids))


def sampling_config(settings: ProbeSettings, eos_ids: Sequence[int], pad_id: int, *, max_new_tokens: int,
                    min_new_tokens: int):
    """The continuations' sampler, complete: untruncated softmax at the run's temperature, every other
    logits processor neutral, stopping on every end-of-sequence id."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True, num_beams=1, temperature=settings.temperature, top_k=0, top_p=1.0, min_p=0.0,
        typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0,
        encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, length_penalty=1.0, min_length=0,
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, eos_token_id=list(eos_ids),
        pad_token_id=pad_id, num_return_sequences=1, use_cache=True)


@contextmanager
def own_generation_config(model):
    """The model's generation_config blank while the probe samples: transformers fills every field
    the call leaves unset from it (bad_words_ids, suppress_tokens, a forced EOS, ...); restored after."""
    from transformers import GenerationConfig

    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def probe(model, inputs: Sequence[ProbeInput], reward: Reward, settings: ProbeSettings | None = None, *,
          eos_id: int | Sequence[int], pad_id: int | None = None, decode: Callable[[int], str] | None = None,
          progress=None) -> list[dict]:
    """Probe rows (the `probes` table's fields) of every probed position of every input. Seeded:
    the same inputs, model and settings give the same rows; the caller's RNG state is left as it was.
    reward(i, completion_ids) scores input i's completion; a failure raises RewardError. eos_id: every
    id the run's rollouts stop on (`stop_ids`). progress: a tqdm-like bar (its total set to the values
    to sample, updated as they are)."""
    s = (settings or ProbeSettings()).check()
    check_vocab(model, inputs)
    eos_ids = (int(eos_id),) if isinstance(eos_id, int) else tuple(int(i) for i in eos_id)
    if not eos_ids:
        raise ValueError("eos_id: give at least one end-of-sequence id (forksight.hooks.metrics.value_probe.stop_ids)")
    pad_id = eos_ids[0] if pad_id is None else pad_id
    device = next(model.parameters()).device
    values = _Prefixes(model, inputs, reward, s, eos_ids, pad_id)
    plans = []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(s.seed)
            for i, item in enumerate(inputs):
                plans += _plan(model, i, item, s, values)
            values.estimate(progress)
    finally:
        model.train(was_training)
    rows = []
    for i, t, comp, h, is_fork, before, after, alts in plans:
        vb, va = values.wanted[before], values.wanted[after]
        delta, se = va.mean - vb.mean, math.sqrt(vb.se ** 2 + va.se ** 2)
        alternatives = [{"token_id": int(a), "token": decode(a) if decode else None, "value": values.wanted[key].mean,
                         "k": values.wanted[key].k} for a, key in alts]
        rows.append({"sample_id": int(inputs[i].sample_id), "pos": t, "token_id": comp[t],
                     "token": decode(comp[t]) if decode else None, "fork": bool(is_fork),
                     "entropy": h,
                     "v_before": vb.mean, "v_after": va.mean, "delta": delta, "se": se, "se_before": vb.se,
                     "se_after": va.se, "k": s.k, "pivotal": is_pivotal(delta, se, s),
                     "alternatives": json.dumps(alternatives) if alternatives else None})
    return rows


def _plan(model, i: int, item: ProbeInput, s: ProbeSettings, values: _Prefixes) -> list[tuple]:
    """The probed positions of one input, each with the prefixes whose values it needs."""
    comp = [int(t) for t in item.completion_ids]
    if not comp:
        return []
    probs = position_distributions(model, item, s.temperature)
    entropy = (list(item.entropy) if item.entropy is not None else
               (-(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)).tolist())
    entropy = [None if h is None or not math.isfinite(h) else float(h) for h in entropy]
    fork = ([bool(f) for f in item.fork] if item.fork is not None else
            [h is not None and h >= s.fork_entropy for h in entropy])
    rng = random.Random(s.seed * 1_000_003 + int(item.sample_id))
    plans = []
    for t in choose_positions(fork, s, rng):
        alts = []
        if fork[t] and s.alternatives:
            top = torch.topk(probs[t], min(s.alternatives + 1, probs.shape[-1])).indices.tolist()
            alts = [a for a in top if a != comp[t]][:s.alternatives]
        plans.append((i, t, comp, entropy[t], fork[t], values.want(i, comp[:t]), values.want(i, comp[:t + 1]),
                      [(a, values.want(i, comp[:t] + [a])) for a in alts]))
    return plans


def is_pivotal(delta: float, se: float, settings: ProbeSettings) -> bool:
    """|delta| >= pivot_delta and beyond noise (> pivot_se standard errors)."""
    return abs(delta) >= settings.pivot_delta and abs(delta) > settings.pivot_se * se
