"""One synthetic step with token rows, for the lake benchmarks (bench/lake.py and bench/lake_day.py)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from forksight.base.records import tokens_table
from synthetic import step_records


def token_columns(rng, n: int) -> dict:
    """n token rows of one step: 64 samples of n/64 positions, random values."""
    per = max(1, n // 64)
    return {"sample_id": np.arange(n, dtype=np.int64) // per, "pos": (np.arange(n) % per).astype(np.int32),
            "token_id": rng.integers(0, 151_000, n, dtype=np.int32),
            "token": pa.array(np.array(["▁the", "7", "+", "=", "<b>"])[rng.integers(0, 5, n)]),
            "entropy": rng.random(n, dtype=np.float32) * 3, "renyi2": rng.random(n, dtype=np.float32),
            "js": rng.random(n, dtype=np.float32), "logp": -rng.random(n, dtype=np.float32),
            "sampler_logp": -rng.random(n, dtype=np.float32),
            "top1": rng.random(n, dtype=np.float32), "fork": rng.random(n) > 0.8, "selected": rng.random(n) > 0.5}


def step_with_tokens(rng, step: int, tokens: int, steps: int = 1000):
    """The step's Records: synthetic scalars/histogram/samples and `tokens` token rows."""
    rec = step_records(rng, step, steps)
    rec.tokens = tokens_table(token_columns(rng, tokens), step=step)
    return rec
