"""The dashboard's frame caches are bounded by bytes, not entries: the tokens page kept up to 512
whole steps whatever their size (24 steps of 400k rows held +700 MB)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from forksight.dashboard.data import LRU, AppState, nbytes


def step_rows(n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    tokens = pd.DataFrame({"sample_id": np.arange(n) // 100, "pos": np.arange(n) % 100,
                           "token": [f"tok{i % 1000}" for i in range(n)], "entropy": rng.random(n)})
    return tokens, pd.DataFrame({"sample_id": [0], "prompt": ["p" * 100]})


def test_values_are_sized_by_the_bytes_they_hold():
    tokens, samples = step_rows(5_000, 0)
    deep = int(tokens.memory_usage(index=True, deep=True).sum()) + int(samples.memory_usage(index=True, deep=True).sum())
    assert deep <= nbytes((tokens, samples)) <= deep + 1_000       # the frames, text included, plus the tuple
    assert nbytes({"frame": tokens}) >= int(tokens.memory_usage(deep=True).sum())
    assert nbytes(tokens) > 5_000 * (8 + 8 + 8 + len("tok999"))     # text counted, not just pointers


def test_a_byte_bounded_cache_never_holds_more_than_its_bytes_and_keeps_the_newest():
    one = nbytes(step_rows(20_000, 0))
    cache = LRU(max_bytes=int(one * 3.5))
    for step in range(24):
        cache.get_or_compute(("run", step), lambda step=step: step_rows(20_000, step))
        assert cache.held_bytes() <= int(one * 3.5)
    kept = [s for s in range(24) if cache.get(("run", s)) is not None]
    assert kept == list(range(24 - len(kept), 24)) and len(kept) == 3   # least recently used went first
    huge = step_rows(200_000, 1)
    assert cache.get_or_compute(("run", "huge"), lambda: huge) is huge   # served, too big to keep
    assert cache.get(("run", "huge")) is None and cache.held_bytes() <= int(one * 3.5)


def test_the_apps_caches_are_bounded_by_bytes():
    state = AppState(reader=None)
    assert state.token_rows.max_bytes == 128 << 20 and state.run_frames.max_bytes == 64 << 20
    big = step_rows(400_000, 2)
    for step in range(24):                      # what once kept +700 MB
        state.token_rows.put(("run", step), big)
    assert state.token_rows.held_bytes() <= 128 << 20
