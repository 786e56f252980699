"""The run page's first open stays flat with the run's length (issue 48, item 8): on a run ten times
longer (seeded as bench/seed.py seeds the benchmark's stores), no statement of the open scans more
than one row group more, and the page the browser receives is as large — the entropy heatmap merges
its rollup buckets into a fixed number of columns (it had grown from 157 to 391 columns, 2.4x its
bytes, between 10,000 and 100,000 steps), each merged column the sum of its buckets' counts."""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from seed import LONG_RUN, seed  # noqa: E402
from test_token_steps_flat import ROW_GROUP, _rows_scanned, _statements  # noqa: E402

from forksight.dashboard.run_figures import histogram_matrix  # noqa: E402
from forksight.dashboard.run_view import HEATMAP_COLUMNS, Controls, draw_run  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402

pytestmark = pytest.mark.slow
SIZES = {"short": 10_000, "long": 100_000}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    root = tmp_path_factory.mktemp("run-flat")
    paths = {}
    for name, steps in SIZES.items():
        paths[name] = str(root / f"{name}.duckdb")
        seed(paths[name], steps=steps, runs=1, token_rows_per_step=8, samples_per_step=1, progress=False)
    return paths


def _open(path: str):
    """The run page's first open (draw_run, no app cache): its statements and what it drew."""
    with Store(path, verify=False) as store:
        drawn = {}
        statements = _statements(store.reader, lambda: drawn.update(draw_run(store.reader, LONG_RUN, Controls())))
    return statements, drawn


def test_the_run_pages_first_open_scans_no_more_of_a_ten_times_longer_run(seeded):
    scanned = {}
    for name, path in seeded.items():
        statements, _ = _open(path)
        with contextlib.redirect_stdout(io.StringIO()):          # DuckDB's profiler prints its plans
            rows = _rows_scanned(path, statements)
        scanned[name] = dict(zip((" ".join(s.split()) for s, _ in statements), rows))
    assert set(scanned["short"]) == set(scanned["long"])           # the same statements
    for sql, many in scanned["long"].items():
        few = scanned["short"][sql]
        for table in set(few) | set(many):
            assert many.get(table, 0) <= few.get(table, 0) + ROW_GROUP, \
                f"{sql[:120]} scans {table}: {few.get(table, 0):,} -> {many.get(table, 0):,} rows"


def test_the_heatmap_has_as_many_columns_and_the_page_as_many_points_on_a_longer_run(seeded):
    drawn = {name: _open(path)[1]["figures"] for name, path in seeded.items()}
    for name in SIZES:
        heat = drawn[name]["heatmap"]["data"][0]
        assert len(heat["x"]) == HEATMAP_COLUMNS, name
    points = {name: sum(len(t.get("x") or []) for f in figures.values() for t in f.get("data", []))
              for name, figures in drawn.items()}
    assert points["long"] <= 1.1 * points["short"], points


def test_merged_columns_sum_their_steps_counts():
    import pandas as pd

    rng = np.random.default_rng(0)
    steps, edges = list(range(0, 70, 7)), [0.0, 0.5, 1.0, 2.0]
    counts = rng.integers(0, 9, size=(len(steps), 3)).astype(float)
    counts[:, 0] += 1                                   # no empty step
    hist = pd.DataFrame([{"step": s, "bin_lo": edges[b], "bin_hi": edges[b + 1], "count": counts[i, b]}
                         for i, s in enumerate(steps) for b in range(3)])
    got_steps, _, _, share = histogram_matrix(hist, columns=4)
    groups = np.arange(len(steps)) * 4 // len(steps)   # 10 steps into 4 runs of 3, 2, 3, 2
    assert got_steps == [max(s for s, g in zip(steps, groups) if g == k) for k in range(4)]
    for k in range(4):
        summed = counts[groups == k].sum(axis=0)
        np.testing.assert_allclose(share[k], summed / summed.sum())
    assert histogram_matrix(hist, columns=20)[0] == steps          # fewer steps than columns: as they are
