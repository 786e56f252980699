"""Multi-resolution rollups (monitor/collector/rollups.py): a long run's downsampled reads come
from them and equal what the raw rows give, computed here another way (numpy over the rows)."""
from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from forksight.base.records import Records
from forksight.monitor.collector.rollups import HISTOGRAM_WIDTHS, SCALAR_WIDTHS, column_width, plan
from forksight.monitor.collector.store import Store

STEPS, KEYS = 3000, ("a", "b")


def _scalars(rng, steps: range, rank: int) -> pa.Table:
    n = len(steps) * len(KEYS)
    return pa.table({"step": np.repeat(np.asarray(steps, np.int64), len(KEYS)),
                     "key": pa.array(list(KEYS) * len(steps)), "value": rng.normal(size=n),
                     "wall_time": 1e9 + np.repeat(np.asarray(steps, np.float64), len(KEYS)),
                     "rank": np.full(n, rank, np.int32),
                     "weight": rng.integers(0, 3, n).astype(np.float64)})


def _histograms(steps: range, rank: int) -> pa.Table:
    n = len(steps) * 3
    step = np.repeat(np.asarray(steps, np.int64), 3)
    return pa.table({"step": step, "rank": np.full(n, rank, np.int32), "key": pa.array(["entropy"] * n),
                     "bin_lo": np.tile([0.0, 1.0, 2.0], len(steps)),
                     "bin_hi": np.tile([1.0, 2.0, 3.0], len(steps)),
                     "count": (step % 7 + np.tile([1.0, 2.0, 3.0], len(steps)) + rank).astype(np.float64)})


def _long_run(store: Store) -> str:
    """Two ranks, each in batches of 250 steps, rank 1 after rank 0: buckets merge across writes."""
    rng = np.random.default_rng(0)
    run = store.create_run("long")
    for rank in (0, 1):
        for first in range(0, STEPS, 250):
            steps = range(first, min(STEPS, first + 250))
            store.write(run, Records(scalars=_scalars(rng, steps, rank),
                                     histograms=_histograms(steps, rank))).result()
    return run


def _raw(store: Store, run: str):
    """Every stored scalar row as a DataFrame (step, key, value, weight)."""
    return store.reader._query("SELECT step, key, value, coalesce(weight, 1) AS weight "  # noqa: SLF001
                               "FROM scalars WHERE run_id = ?", [run])


def _merged(rows) -> float:
    w = rows.weight.to_numpy()
    return float((rows.value * w).sum() / w.sum()) if w.sum() > 0 else float(rows.value.mean())


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("roll") / "r.duckdb")
    run = _long_run(store)
    yield store, run
    store.close()


def test_downsampled_read_is_the_raw_merged_value_at_each_kept_step(long_store):
    store, run = long_store
    w, k = plan(STEPS, 100, SCALAR_WIDTHS)
    assert w > 0                                      # this read comes from the rollups
    df = store.reader.read_scalars(run, downsample=100)
    raw = _raw(store, run)
    merged = {kv: _merged(rows) for kv, rows in raw.groupby(["key", "step"])}
    for key in KEYS:
        part = df[df.key == key]
        assert len(part) <= 100
        assert part.step.iloc[0] == 0 and part.step.iloc[-1] == STEPS - 1
        # the first step of every w·k steps, then the last step
        assert part.step.tolist() == [*range(0, STEPS, w * k), STEPS - 1]
        np.testing.assert_allclose(part.value.to_numpy(),
                                   [merged[(key, s)] for s in part.step], rtol=1e-12)
        np.testing.assert_array_equal(part.wall_time.to_numpy(), 1e9 + part.step.to_numpy())


def test_rollup_min_max_mean_equal_numpy_over_the_raw_rows(long_store):
    store, run = long_store
    raw = _raw(store, run)
    for width in (16, 256):
        stored = store.reader._query(  # noqa: SLF001
            "SELECT * FROM scalar_rollups WHERE run_id = ? AND width = ? AND key = 'b' ORDER BY bucket",
            [run, width])
        rows = raw[raw.key == "b"].assign(bucket=lambda d: d.step // width)
        groups = [g for _, g in rows.groupby("bucket")]
        assert stored.bucket.tolist() == sorted(rows.bucket.unique().tolist())
        np.testing.assert_allclose(stored.vmin, [g.value.min() for g in groups])
        np.testing.assert_allclose(stored.vmax, [g.value.max() for g in groups])
        np.testing.assert_allclose(stored.vw / stored.w, [_merged(g) for g in groups], rtol=1e-12)
        np.testing.assert_allclose(stored.n, [len(g) for g in groups])
        np.testing.assert_array_equal(stored.first_step, [g.step.min() for g in groups])
        np.testing.assert_array_equal(stored.last_step, [g.step.max() for g in groups])


def test_heatmap_columns_sum_each_bin_over_their_steps(long_store):
    store, run = long_store
    hist = store.reader.read_histograms(run, downsample=50)
    steps = sorted(hist.step.unique())
    assert len(steps) <= 50 and steps[-1] == STEPS - 1
    bounds = [-1, *steps]
    for lo_step, step in zip(bounds, steps):
        col = hist[hist.step == step].sort_values("bin_lo")
        s = np.arange(lo_step + 1, step + 1)
        expect = [sum(((s % 7) + base + rank).sum() for rank in (0, 1)) for base in (1.0, 2.0, 3.0)]
        np.testing.assert_allclose(col["count"], expect)


def test_a_file_without_rollups_gets_them_on_open(tmp_path, long_store):
    store, run = long_store
    expect = store.reader.read_scalars(run, downsample=100)
    path = tmp_path / "old.duckdb"
    with Store(path) as fresh:
        old = _long_run(fresh)
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE scalar_rollups; DROP TABLE histogram_rollups")
    con.close()
    with Store(path) as reopened:
        got = reopened.reader.read_scalars(old, downsample=100)
    np.testing.assert_array_equal(got.step, expect.step)
    np.testing.assert_allclose(got.value, expect.value, rtol=1e-12)


def test_plan_reads_fewer_than_four_rows_per_point():
    for span in (10, 999, 4_000, 50_000, 500_000, 3_000_000):
        for points in (24, 600, 1000):
            w, k = plan(span, points, SCALAR_WIDTHS)
            if w == 0:
                assert span < 4 * (points - 1)
                continue
            assert -(-span // (w * k)) <= points - 1        # buckets, the last point besides
            assert span / w < 4 * points or w == SCALAR_WIDTHS[-1]


def test_column_width_gives_at_most_the_columns_asked():
    for span in (10, 600, 601, 9_000, 100_000, 500_000):
        for columns in (50, 600):
            w = column_width(span, columns, HISTOGRAM_WIDTHS)
            if w == 0:
                assert span <= columns
                continue
            assert -(-span // w) <= columns or w == HISTOGRAM_WIDTHS[-1]
            assert w == HISTOGRAM_WIDTHS[0] or -(-span // (w // 4)) > columns    # the narrowest


def test_scalar_keys_index_equals_the_distinct_keys_of_the_rows(tmp_path):
    with Store(tmp_path / "k.duckdb") as store:
        run = store.create_run("keys")
        for i, keys in enumerate((["a", "b"], ["b"], ["c", "a"], ["b"])):
            store.write(run, Records(scalars=pa.table({
                "step": np.full(len(keys), i, np.int64), "key": pa.array(keys),
                "value": np.ones(len(keys))}))).result()
        distinct = store.reader._query(  # noqa: SLF001
            "SELECT DISTINCT key FROM scalars WHERE run_id = ? ORDER BY key", [run])["key"].tolist()
        assert store.reader.scalar_keys(run) == distinct == ["a", "b", "c"]


def test_rollups_kept_at_ingest_equal_a_rebuild_from_the_rows(tmp_path):
    from forksight.monitor.collector.rollups import rebuild_rollups

    rng = np.random.default_rng(3)
    with Store(tmp_path / "i.duckdb") as store:
        run = store.create_run("ingested")
        for rank in (1, 0):                   # rank 1 first: a later write has the earlier rows
            for first in range(0, 700, 90):
                steps = range(first, min(700, first + 90))
                store.write(run, Records(scalars=_scalars(rng, steps, rank),
                                         histograms=_histograms(steps, rank))).result()
        order = {"scalar_rollups": "run_id, key, width, bucket",
                 "histogram_rollups": "run_id, key, width, bucket, bin_lo"}
        kept = {t: store.reader._query(f"SELECT * FROM {t} ORDER BY {o}") for t, o in order.items()}  # noqa: SLF001
        store.call(rebuild_rollups)
        for t, o in order.items():
            rebuilt = store.reader._query(f"SELECT * FROM {t} ORDER BY {o}")  # noqa: SLF001
            assert len(rebuilt) == len(kept[t]) > 0
            pd.testing.assert_frame_equal(kept[t], rebuilt, check_exact=False, rtol=1e-9)
