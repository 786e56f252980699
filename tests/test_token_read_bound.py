"""A dashboard read of one step is bounded however many token rows the step holds, and the
tokens page says when it read only part of a step (the HTTP route pages through all of it)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from forksight.base.limits import MAX_READ_TOKEN_ROWS
from forksight.base.records import Records, tokens_table
from forksight.dashboard.pages.tokens import sample_options
from forksight.monitor.collector.store import Store


def test_read_tokens_takes_at_most_limit_rows_in_rank_sample_pos_order(tmp_path):
    store = Store(str(tmp_path / "t.duckdb"))
    try:
        run = store.create_run("big")
        sample = np.repeat(np.arange(50), 40)             # 50 samples x 40 positions = 2,000 rows
        pos = np.tile(np.arange(40), 50)
        cols = {"sample_id": sample, "pos": pos, "token_id": pos, "entropy": pos / 40.0}
        store.write(run, Records(tokens=tokens_table(cols, step=7))).result()
        full = store.reader.read_tokens(run, 7, limit=10_000)
        part = store.reader.read_tokens(run, 7, limit=333)
        assert len(full) == 2_000 and len(part) == 333
        order = np.lexsort((pos, sample))                 # what the first 333 rows must be
        assert part["sample_id"].tolist() == sample[order][:333].tolist()
        assert part["pos"].tolist() == pos[order][:333].tolist()
    finally:
        store.close()


def test_the_sample_picker_says_when_the_step_was_read_in_part():
    samples = pd.DataFrame({"sample_id": [0], "group_id": [0], "reward": [1.0], "correct": [True],
                            "prompt": ["p"], "completion": ["c"], "step": [1], "rank": [0]})
    whole = pd.DataFrame({"sample_id": np.zeros(10, dtype=np.int64)})
    capped = pd.DataFrame({"sample_id": np.zeros(MAX_READ_TOKEN_ROWS, dtype=np.int64)})
    assert not any(o.get("disabled") for o in sample_options(whole, samples))
    notes = [o for o in sample_options(capped, samples) if o.get("disabled")]
    assert len(notes) == 1 and f"{MAX_READ_TOKEN_ROWS:,}" in notes[0]["label"]
