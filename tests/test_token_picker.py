"""The tokens page's step picker reads the token_steps index, never the whole step list: its
answers equal a Python search over every step, and what it sends the browser stays the same
small size however many steps the run has."""
from __future__ import annotations

import json

import numpy as np
import pytest

from forksight.dashboard.pages.tokens import MARKS, history_steps, step_picker
from forksight.monitor.collector.store import Store


def _python_nearest(steps: list[int], wanted: int) -> int:
    return min(steps, key=lambda s: (abs(s - wanted), s))       # the earlier one on a tie


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    with Store(tmp_path_factory.mktemp("picker") / "p.duckdb") as store:
        sparse = sorted(set(rng.integers(5, 50_000, 3_000).tolist()))    # every few steps, gaps
        dense = list(range(20_000))

        def fill(cur):
            for run, steps in (("sparse", sparse), ("dense", dense), ("one", [7])):
                cur.execute("INSERT INTO token_steps SELECT ?, unnest(?::BIGINT[])", [run, steps])
        store.call(fill)
        store.steps = {"sparse": sparse, "dense": dense, "one": [7]}
        yield store


def test_nearest_token_steps_equal_a_python_search(store):
    steps = store.steps["sparse"]
    wanted = [-10, 0, steps[0], steps[-1], 10**9, *np.random.default_rng(1).integers(0, 50_010, 300).tolist()]
    wanted += [(a + b) // 2 for a, b in zip(steps[:50], steps[1:51])]     # midpoints: ties
    got = store.reader.nearest_token_steps("sparse", wanted)
    assert got == [_python_nearest(steps, w) for w in wanted]
    assert store.reader.nearest_token_steps("none", [1, 2]) == [None, None]
    assert store.reader.token_step_span("sparse") == (len(steps), steps[0], steps[-1])
    assert store.reader.first_token_steps("sparse", 3) == steps[:3]


def test_the_picker_is_the_same_few_bytes_for_a_long_run(store):
    sizes = {}
    for run in ("sparse", "dense", "one"):
        steps = store.steps[run]
        picker = step_picker(store.reader, run)
        assert (picker["min"], picker["max"], picker["value"]) == (steps[0], steps[-1], steps[-1])
        assert min(picker["marks"]) == steps[0] and max(picker["marks"]) == steps[-1]
        assert len(picker["marks"]) <= MARKS
        assert picker["span"] == {"run": run, "count": len(steps), "first": steps[0], "last": steps[-1]}
        sizes[run] = len(json.dumps(picker))
        # a wished-for step (an alert's link) lands on the nearest token step
        assert step_picker(store.reader, run, "12345")["value"] == _python_nearest(steps, 12345)
    assert max(sizes.values()) < 600           # 3,000 and 20,000 steps: no step list in it
    assert step_picker(store.reader, "none")["span"] == {"run": "none", "count": 0}


def test_history_steps_spread_over_the_run(store):
    for run in ("sparse", "dense"):
        steps = np.array(store.steps[run])
        first, last = steps[0], steps[-1]
        part = np.minimum(22, (steps - first) * 23 // (last - first))       # 23 equal parts
        expect = sorted({int(steps[part == p].min()) for p in np.unique(part)} | {int(last)})
        got = history_steps(store.reader, run, 24)
        assert got == expect and got[0] == first and got[-1] == last and len(got) <= 24
    assert history_steps(store.reader, "one", 24) == [7]
    assert history_steps(store.reader, "none", 24) == []


def test_prompt_history_is_one_read_equal_to_per_step_reads(tmp_path):
    import sys
    from pathlib import Path

    import pandas as pd

    from forksight.dashboard.pages.tokens import prompt_history

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from seed import LONG_RUN, seed

    db = str(tmp_path / "h.duckdb")
    seed(db, steps=90, runs=1, token_rows_per_step=1024, progress=False)   # 16 samples, 4 prompts
    with Store(db) as store:
        reader = store.reader
        for prompt, metric in (("47+26=", "entropy"), (None, "js"), ("no such prompt", "logp")):
            got, mine = prompt_history(reader, LONG_RUN, prompt, metric)
            steps = history_steps(reader, LONG_RUN)
            parts = []
            for step in steps:                  # the slow way: every step's rows, filtered here
                tokens = reader.read_tokens(LONG_RUN, step)
                if mine:
                    samples = reader.read_samples(LONG_RUN, step=step)
                    tokens = tokens[tokens.sample_id.isin(samples.sample_id[samples.prompt == prompt])]
                parts.append(tokens[["step", "pos", metric]])
            expect = pd.concat(parts, ignore_index=True)
            assert mine == (prompt == "47+26=")          # an unknown prompt: every rollout
            assert len(got) == len(expect) > 0 and got.step.nunique() == len(steps)
            pd.testing.assert_frame_equal(got, expect, check_dtype=False)
