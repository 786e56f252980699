"""Values of completion prefixes (docs/algorithms.md §12): V(x, y<t), the mean reward of K
continuations sampled from the policy from an explicit and complete configuration (the model's own
generation_config never leaks in: V is this policy's value). A prefix that already ended (any of the
run's end-of-sequence ids, or the length cap) has its value determined: the reward of the prefix
itself, SE 0. Each distinct prefix is estimated once, in batches of equal length; a caller may want
more prefixes after an estimate (the bisection search's rounds) and estimate again."""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


class RewardError(RuntimeError):
    """The reward function raised or returned something that is not a finite number."""


# a reward of one probed completion: (index into the inputs, the completion's ids) -> float
Reward = Callable[[int, list[int]], float]


@dataclass
class Value:
    """One prefix's value: the mean reward of k continuations and its standard error."""

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


def mean_se(rewards: list[float]) -> Value:
    k = len(rewards)
    mean = sum(rewards) / k
    if all(r in (0.0, 1.0) for r in rewards):           # 0/1 rewards: the binomial SE
        var = mean * (1.0 - mean)
    else:
        var = sum((r - mean) ** 2 for r in rewards) / (k - 1) if k > 1 else 0.0
    return Value(mean, math.sqrt(max(var, 0.0) / k), k)


class Prefixes:
    """Distinct prefixes (input index, completion prefix ids) -> their value, estimated in batches;
    `sampled` counts the continuations drawn (determined values draw none). settings: the probe's
    ProbeSettings (k, temperature, max_new_tokens, first_token_eos, batch_rows)."""

    def __init__(self, model, inputs: Sequence, reward: Reward, settings,
                 eos_ids: tuple[int, ...], pad_id: int):
        self.model, self.inputs, self.reward, self.s = model, inputs, reward, settings
        self.eos_ids, self.pad_id = eos_ids, pad_id
        self.wanted: dict[tuple[int, tuple[int, ...]], Value | None] = {}
        self.sampled = 0

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

    def __getitem__(self, key: tuple[int, tuple[int, ...]]) -> "Value":
        return self.wanted[key]

    def estimate(self, progress=None) -> None:
        """Fill every wanted value not yet known: determined ones from one reward, the rest from K
        continuations. Called again after more are wanted, it estimates only those (a bisection's
        rounds); the progress bar's total grows by what each call adds."""
        open_keys = []
        for key in [k for k, v in self.wanted.items() if v is None]:
            if self._ended(key[1]):
                value = self._score(key[0], list(key[1]))
                self.wanted[key] = Value(value, 0.0, self.s.k)
            else:
                open_keys.append(key)
        by_len: dict[int, list] = {}
        for key in open_keys:
            by_len.setdefault(len(key[1]), []).append(key)
        per_call = max(1, self.s.batch_rows // self.s.k)
        if progress is not None and open_keys:
            progress.total = (progress.total or 0) + len(open_keys)
            progress.refresh()
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
            self.wanted[(i, prefix)] = mean_se(rewards)
        self.sampled += len(cont)


def stop_ids(model, tokenizer) -> tuple[int, ...]:
    """Every id a rollout stops on: the tokenizer's EOS and each of the model generation_config's
    (Qwen2.5-Instruct lists two, Llama-3 three; TRL's and vLLM's rollouts stop on all of them)."""
    ids: list[int] = []
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        ids += [value] if isinstance(value, int) else list(value or [])
    return tuple(dict.fromkeys(int(i) for i in ids))


def sampling_config(settings, eos_ids: Sequence[int], pad_id: int, *, max_new_tokens: int,
                    min_new_tokens: int):
    """The continuations' sampler, complete: untruncated softmax at the run's temperature, every other
    logits processor neutral, stopping on every end-of-sequence id."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True, num_beams=1, temperature=settings.temperature, top_k=0, top_p=1.0, min_p=0.0,
        typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0,
        encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, length_penalty=1.0,
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
