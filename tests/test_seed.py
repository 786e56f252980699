"""bench/seed.py writes a store the way the writer would have: its derived tables (token_steps,
scalar_keys, runs.first_step/last_step, rollups) equal what the raw rows give, and the pages read it."""
from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from seed import KEYS, LONG_RUN, add_short_runs, seed  # noqa: E402

from forksight.monitor.collector.rollups import rebuild_rollups  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402


def _rows(con, sql):
    return sorted(con.execute(sql).fetchall())


def test_seeded_store_is_consistent_and_readable(tmp_path):
    db = str(tmp_path / "s.duckdb")
    info = seed(db, steps=300, runs=5, token_rows_per_step=128, progress=False)
    add_short_runs(db, 3, first_index=4)
    assert info["rows"]["tokens"] == 300 * 128 and info["rows"]["scalars"] == 300 * len(KEYS) + 4 * 2 * 50
    con = duckdb.connect(db)
    assert _rows(con, "SELECT * FROM token_steps") == _rows(con, "SELECT DISTINCT run_id, step FROM tokens")
    assert _rows(con, "SELECT * FROM scalar_keys") == _rows(con, "SELECT DISTINCT run_id, key FROM scalars")
    assert _rows(con, "SELECT run_id, first_step, last_step FROM runs") == _rows(
        con, "SELECT run_id, min(step), max(step) FROM scalars GROUP BY run_id")
    order = {"scalar_rollups": "run_id, key, width, bucket",
             "histogram_rollups": "run_id, key, width, bucket, bin_lo"}
    stored = {t: con.execute(f"SELECT * FROM {t} ORDER BY {o}").df() for t, o in order.items()}
    rebuild_rollups(con)                     # from scratch, every run: the same rows (sums in
    for t, o in order.items():               # another order: equal to rounding)
        pd.testing.assert_frame_equal(con.execute(f"SELECT * FROM {t} ORDER BY {o}").df(), stored[t],
                                      check_exact=False, rtol=1e-12)
    con.close()
    with Store(db) as store:
        assert len(store.reader.list_runs()) == 8
        frame = store.reader.read_scalars(LONG_RUN, ["entropy/mean"], downsample=1000)
        assert frame.step.tolist() == list(range(300))           # short: every step, raw
        assert np.all(np.diff(frame.value.to_numpy()[::50]) < 0)   # the seeded collapse
        assert store.reader.token_step_span(LONG_RUN) == (300, 0, 299)
