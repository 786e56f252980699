"""The DuckDB store and the in-process sink: exact round trips, idempotence, rank merge, bounds."""
from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from forksight.compose.local import LocalSink
from forksight.monitor.sinks.client import NullSink, open_sink
from forksight.monitor.collector.ingest import Ingest
from forksight.base.records import Records, RecordError, histograms_table, samples_table, scalars_table, tokens_table
from forksight.monitor.collector.reader import histogram_quantile
from forksight.monitor.collector.store import Store


def _token_columns(rng, n_samples=3, length=7):
    n = n_samples * length
    return {
        "sample_id": np.repeat(np.arange(n_samples), length),
        "pos": np.tile(np.arange(length), n_samples),
        "token_id": rng.integers(0, 311, n),
        "token": [f"<b>t{i}</b>" if i % 2 else "'; DROP TABLE tokens; --" for i in range(n)],
        "entropy": rng.random(n).astype(np.float32) * 5,
        "renyi2": rng.random(n).astype(np.float32),
        "js": rng.random(n).astype(np.float32) * 0.1,
        "logp": -rng.random(n).astype(np.float32),
        "top1": rng.random(n).astype(np.float32),
        "fork": rng.random(n) > 0.5,
        "selected": rng.random(n) > 0.5,
    }


def test_local_sink_round_trips_every_record_kind_exactly(tmp_path):
    rng = np.random.default_rng(0)
    sink = open_sink("exact", db=str(tmp_path / "a.duckdb"), strategy="fork", model="tiny",
                     config={"vocab_size": 311, "lr": 3e-4})
    cols = _token_columns(rng)
    samples = [{"sample_id": i, "group_id": i // 2, "prompt": f"<script>alert({i})</script>",
                "completion": "x" * (i + 1), "reward": i / 4, "correct": i % 2 == 0, "length": i + 1,
                "source": "sampled"} for i in range(4)]
    counts, edges = rng.integers(0, 50, 12).astype(float), np.linspace(0, 6, 13)
    sink.log_scalars(5, {"entropy/mean": 1.25, "loss": -0.5}, weight=42)
    sink.log_tokens(5, cols)
    sink.log_samples(5, samples)
    sink.log_histogram(5, "entropy", counts, edges)
    sink.flush()
    r = sink.reader

    sc = r.read_scalars(sink.run_id)
    assert dict(zip(sc.key, sc.value)) == {"entropy/mean": 1.25, "loss": -0.5}
    tok = r.read_tokens(sink.run_id, 5)
    assert len(tok) == len(cols["pos"])
    for name, values in cols.items():
        got = tok[name].to_numpy()
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            np.testing.assert_array_equal(got.astype(np.float32), values)      # float32 kept bit-exact
        else:
            assert list(got) == list(values)
    smp = r.read_samples(sink.run_id, step=5)
    for key in samples[0]:
        assert smp[key].tolist() == [s[key] for s in samples]
    h = r.read_histograms(sink.run_id, "entropy")
    np.testing.assert_array_equal(h["count"], counts)
    np.testing.assert_allclose(h["bin_lo"], edges[:-1])
    np.testing.assert_allclose(h["bin_hi"], edges[1:])
    run = r.run(sink.run_id)
    assert (run["strategy"], run["model"], run["config"]) == ("fork", "tiny", {"vocab_size": 311, "lr": 3e-4})
    sink.finish()
    with Store(tmp_path / "a.duckdb") as store:          # reopened: the file kept it all
        assert store.reader.row_counts("exact") == {"scalars": 2, "tokens": 21, "samples": 4,
                                                    "histograms": 12, "probes": 0, "reference": 0, "alerts": 0}
        assert store.reader.run("exact")["status"] == "finished"


def test_same_batch_id_is_stored_once(tmp_path):
    with Store(tmp_path / "a.duckdb") as store:
        run = store.create_run("idem")
        records = Records(scalars=scalars_table([{"step": 1, "key": "k", "value": 2.0}]),
                          tokens=tokens_table({"sample_id": [0, 0], "pos": [0, 1]}, step=1))
        first = store.write(run, records, "batch-1")
        second = store.write(run, records, "batch-1")       # possibly merged in one transaction
        assert first.result().stored and not second.result().stored
        assert not store.write(run, records, "batch-1").result().stored
        assert store.write(run, records, "batch-2").result().stored
        assert store.reader.row_counts(run)["scalars"] == 2
        assert store.reader.row_counts(run)["tokens"] == 4


def test_ranks_merge_by_token_weight_and_percentiles_from_summed_histograms(tmp_path):
    rng = np.random.default_rng(1)
    edges = np.linspace(0.0, 4.0, 41)
    values = {0: rng.gamma(2.0, 0.4, 3000), 1: rng.gamma(1.0, 0.3, 1000)}
    with Store(tmp_path / "a.duckdb") as store:
        run = store.create_run("ddp")
        for rank, v in values.items():
            counts, _ = np.histogram(np.clip(v, 0, 3.999), edges)
            store.write(run, Records(
                scalars=scalars_table([{"step": 3, "key": "entropy/mean", "value": float(v.mean()),
                                        "weight": float(v.size)},
                                       {"step": 3, "key": "entropy/p80", "value": float(np.percentile(v, 80))}],
                                      rank),
                histograms=histograms_table([{"step": 3, "key": "entropy", "counts": counts, "edges": edges}],
                                            rank))).result()
        merged = store.reader.steps_scalars(run, [3])[3]
        both = np.concatenate(list(values.values()))
        assert merged["entropy/mean"] == pytest.approx(both.mean(), rel=1e-12)   # token-weighted
        # the merged p80 falls in the bin holding the exact p80 of all tokens (bin width 0.1)
        assert abs(merged["entropy/p80"] - np.percentile(both, 80)) <= 0.1
        assert store.reader.read_histograms(run)["count"].sum() == both.size


def test_histogram_quantile_hand_worked():
    lo, hi, counts = np.array([0.0, 1, 2]), np.array([1.0, 2, 3]), np.array([1.0, 2, 3])
    # total 6; the median (3rd value) ends bin [1,2): 1 + (3-1)/2 * 1 = 2.0
    assert histogram_quantile(lo, hi, counts, 0.5) == 2.0
    assert histogram_quantile(lo, hi, counts, 1.0) == 3.0
    assert histogram_quantile(lo, hi, counts, 0.0) == 0.0
    assert math.isnan(histogram_quantile(lo, hi, np.zeros(3), 0.5))


def test_read_scalars_keeps_at_most_downsample_points_with_first_and_last(tmp_path):
    with Store(tmp_path / "a.duckdb") as store:
        run = store.create_run("long")
        steps = np.arange(5003)
        rows = [{"step": int(s), "key": k, "value": float(s) * m} for s in steps for k, m in (("a", 1), ("b", -2))]
        store.write(run, Records(scalars=scalars_table(rows))).result()
        df = store.reader.read_scalars(run, downsample=1000)
        for key, mult in (("a", 1), ("b", -2)):
            part = df[df.key == key]
            assert len(part) <= 1001
            assert part.step.iloc[0] == 0 and part.step.iloc[-1] == 5002
            np.testing.assert_array_equal(part.value.to_numpy(), part.step.to_numpy() * mult)
        assert len(store.reader.read_scalars(run, keys=["a"], downsample=10_000)) == 5003
        since = store.reader.read_scalars(run, keys=["b"], since_step=5000)
        assert since.step.tolist() == [5000, 5001, 5002]


@pytest.mark.parametrize("build, message", [
    (lambda: tokens_table({"sample_id": [0], "pos": [0], "entropy": [float("nan")]}, step=1), "tokens.entropy"),
    (lambda: tokens_table({"sample_id": [0], "pos": [0], "logp": [-float("inf")]}, step=1), "tokens.logp"),
    (lambda: tokens_table({"sample_id": [0], "pos": [0], "bogus": [1]}, step=1), "unknown column"),
    (lambda: tokens_table({"sample_id": [0], "token": ["a"]}, step=1), "missing required column(s) ['pos']"),
    (lambda: tokens_table({"sample_id": [0], "pos": [0], "token": ["x" * 5000]}, step=1), "tokens.token"),
    (lambda: tokens_table({"sample_id": [0], "pos": ["seven"]}, step=1), "tokens.pos"),
    (lambda: scalars_table([{"step": 1, "key": "k", "value": float("inf")}]), "scalars.value"),
    (lambda: samples_table([{"step": 1, "sample_id": 0, "completion": "y" * 70_000}]), "samples.completion"),
])
def test_bad_records_are_refused_with_the_field_named(build, message):
    with pytest.raises(RecordError, match=None) as err:
        build()
    assert message in str(err.value)


def test_run_names_unless_taken_join_and_stale_heartbeat_reads_crashed(tmp_path):
    with Store(tmp_path / "a.duckdb", stale_after=0.5) as store:
        assert store.create_run("exp") == "exp"
        assert store.create_run("exp") == "exp-2"
        assert store.create_run("exp", join=True) == "exp-2"          # newest live run of that name
        with pytest.raises(LookupError):
            store.create_run("nobody", join=True)
        with pytest.raises(ValueError, match="'my-run-1'"):          # suggests a name that works
            store.create_run("my run #1")
        assert Ingest(store).update_run("exp", status="finished") == []
        assert Ingest(store).update_run("ghost", status="finished") is None
        time.sleep(0.7)
        status = dict(zip(*store.reader.list_runs()[["run_id", "status"]].T.values))
        assert status == {"exp": "finished", "exp-2": "crashed"}
        assert store.heartbeat("exp-2")
        assert store.reader.run("exp-2")["status"] == "live"


def _collapse(step: int) -> float:
    return max(0.001, 1.5 * math.exp(-step / 5))


def test_local_sink_gets_alerts_from_the_hub_and_stops_on_critical(tmp_path):
    sink = LocalSink(str(tmp_path / "a.duckdb"), "collapse", config={"vocab_size": 311}, stop_on_alert=True)
    stopped_at = None
    for step in range(60):
        sink.log_scalars(step, {"entropy/mean": _collapse(step), "reward/mean": 0.5})
        sink.flush()
        if sink.should_stop and stopped_at is None:
            stopped_at = step
    stored = sink.reader.read_alerts("collapse")
    assert len(stored) == len(sink.alerts) > 0
    # what a live page polls: the last scalar step and the alert count, as the full reads say
    assert sink.reader.run_progress("collapse") == (59, len(stored))
    assert sink.reader.run_progress("no-such-run") == (-1, 0)
    assert stored.detector.tolist() == [a["detector"] for a in sink.alerts]
    critical = [a["step"] for a in sink.alerts if a["severity"] == "critical"]
    # a step is judged once the next one arrives (all its scalars are in by then)
    assert critical and stopped_at == critical[0] + 1
    # every alert was raised on a step whose stored entropy is really below its first value
    first = _collapse(0)
    assert all(_collapse(a["step"]) < first for a in sink.alerts)
    sink.finish()


def test_null_sink_accepts_everything_and_owes_nothing():
    # (that it has every Sink method with the Protocol's parameters: tests/test_interfaces.py)
    sink = NullSink()
    sink.log_scalars(0, {"a": 1.0})
    sink.log_tokens(0, {"sample_id": [0], "pos": [0]})
    sink.log_samples(0, [{"prompt": "p", "completion": "c"}])
    assert sink.flush() is True and sink.undelivered() == {} and sink.finish() == {}
    assert sink.alerts == [] and sink.should_stop is False
    assert isinstance(open_sink("x", db="ignored.duckdb", rank=1), NullSink)


def test_open_sink_turns_a_path_like_run_name_into_a_valid_id(tmp_path):
    sink = open_sink("/tmp/out dir/run 1", db=str(tmp_path / "a.duckdb"))
    assert sink.run_id == "tmp-out-dir-run-1"
    sink.finish()


def test_a_second_store_on_a_held_file_says_who_owns_it(tmp_path):
    import subprocess
    import sys

    with Store(tmp_path / "a.duckdb"):
        out = subprocess.run([sys.executable, "-c", f"from forksight.monitor.collector.store import Store; Store({str(tmp_path / 'a.duckdb')!r})"],
                             capture_output=True, text=True)
    assert out.returncode != 0 and "url=" in out.stderr and "forksight serve" in out.stderr


def test_reader_frames_have_contract_columns(tmp_path):
    with Store(tmp_path / "a.duckdb") as store:
        run = store.create_run("cols")
        assert list(store.reader.list_runs().columns) == ["run_id", "name", "project", "strategy", "model",
                                                          "status", "created_at", "heartbeat", "last_step", "config"]
        assert list(store.reader.read_scalars(run).columns) == ["key", "step", "value", "wall_time"]
        assert list(store.reader.read_histograms(run).columns) == ["step", "bin_lo", "bin_hi", "count"]
        assert isinstance(store.reader.read_alerts(), pd.DataFrame)
        assert store.reader.token_steps(run) == [] and store.reader.scalar_keys(run) == []


class _RecordingHub:
    """Captures what the store hands the alert hub (the real AlertHub is exercised above)."""

    def __init__(self):
        self.seen: dict[tuple[str, int], dict] = {}

    def on_step(self, run_id, step, scalars, vocab_size=None):
        self.seen[(run_id, step)] = dict(scalars, vocab=vocab_size)
        return []


def test_the_hub_sees_each_complete_step_once_merged_like_the_reader(tmp_path):
    hub = _RecordingHub()
    rng = np.random.default_rng(2)
    edges = np.linspace(0, 2, 21)
    with Store(tmp_path / "a.duckdb") as store:
        ingest = Ingest(store, hub)
        run = store.create_run("merge", config={"vocab_size": 311})
        for step in range(4):
            for rank in (0, 1):                          # each rank in two calls, like report + extra
                v = rng.random(50) * 2
                counts, _ = np.histogram(v, edges)
                ingest.write(run, Records(scalars=scalars_table(
                    [{"step": step, "key": "entropy/mean", "value": float(v.mean()), "weight": 50.0 + rank},
                     {"step": step, "key": "entropy/p50", "value": 9.9}], rank))).result()
                ingest.write(run, Records(scalars=scalars_table([{"step": step, "key": "loss", "value": step + rank}], rank),
                                         histograms=histograms_table([{"step": step, "key": "entropy", "counts": counts,
                                                                       "edges": edges}], rank))).result()
        assert sorted(s for _, s in hub.seen) == [0, 1, 2]       # step 3 waits for the run to end
        ingest.update_run(run, status="finished")
        assert sorted(s for _, s in hub.seen) == [0, 1, 2, 3]
        df = store.reader.read_scalars(run)
        for (_, step), seen in hub.seen.items():
            assert seen.pop("vocab") == 311
            want = dict(zip(df[df.step == step].key, df[df.step == step].value))
            assert seen.keys() == want.keys()
            for key in want:
                assert seen[key] == pytest.approx(want[key], rel=1e-12)
            assert seen["entropy/p50"] != 9.9                        # from the merged histogram


def test_sink_keeps_a_steps_good_numbers_when_some_cannot_be_stored(tmp_path, caplog):
    sink = open_sink("lenient", db=str(tmp_path / "a.duckdb"))
    sink.log_scalars(0, {"loss": float("nan"), "k" * 300: 1.0, "entropy/mean": 0.75}, weight=np.int64(12))
    sink.log_samples(0, [{"prompt": "p", "completion": "c" * 70_000, "reward": float("inf"),
                          "correct": np.bool_(True), "advantage": 0.3}])
    sink.flush()
    sc = sink.reader.read_scalars(sink.run_id)
    # the NaN is not stored as a number; its finite marker (0 = NaN) feeds the non-finite alert
    assert sc[["key", "value"]].values.tolist() == [["entropy/mean", 0.75], ["nonfinite/loss", 0.0]]
    smp = sink.reader.read_samples(sink.run_id).iloc[0]
    assert len(smp.completion) == 64 * 1024 and pd.isna(smp.reward) and smp.correct == True  # noqa: E712
    text = caplog.text
    assert "'loss' is nan" in text and "over 200 characters" in text and "['advantage']" in text
    sink.finish()


def test_runs_row_keeps_the_last_step_of_its_scalars_and_old_files_get_it_on_open(tmp_path):
    import duckdb

    db = str(tmp_path / "steps.duckdb")

    def scalars(*steps):
        return Records(scalars=scalars_table([{"step": s, "key": "loss", "value": 1.0} for s in steps]))

    with Store(db) as store:
        a, b, empty = store.create_run("a"), store.create_run("b"), store.create_run("empty")
        store.write(a, scalars(5, 2, 9)).result()
        store.write(a, scalars(3)).result()  # an older step arriving later (another rank) lowers nothing
        store.write(b, scalars(0)).result()
        store.write(b, Records(tokens=tokens_table({"sample_id": [0], "pos": [0]}, step=40))).result()  # not a scalar
        kept = store.reader.list_runs().set_index("run_id")["last_step"]

    def by_sql():  # computed another way: max(step) of each run's scalars
        conn = duckdb.connect(db, read_only=True)
        try:
            return dict(conn.execute("SELECT run_id, max(step) FROM scalars GROUP BY run_id").fetchall())
        finally:
            conn.close()

    assert by_sql() == {a: 9, b: 0}
    assert (kept[a], kept[b]) == (9, 0) and pd.isna(kept[empty])
    with Store(db) as store:
        assert [store.reader.run_progress(r) for r in (a, b, empty)] == [(9, 0), (0, 0), (-1, 0)]
    conn = duckdb.connect(db)  # a file written before the column existed
    conn.execute("ALTER TABLE runs DROP COLUMN last_step")
    conn.close()
    with Store(db) as store:
        again = store.reader.list_runs().set_index("run_id")["last_step"]
        assert store.reader.run(a)["last_step"] == 9
    assert (again[a], again[b]) == (9, 0) and pd.isna(again[empty])


def test_token_step_index_equals_the_distinct_steps_of_the_token_rows_and_is_built_for_old_files(tmp_path):
    import duckdb

    db = str(tmp_path / "index.duckdb")

    def rows(step, n=3):
        return Records(tokens=tokens_table({"sample_id": list(range(n)), "pos": [0] * n}, step=step))

    with Store(db) as store:
        a, b = store.create_run("a"), store.create_run("b")
        for run, step in [(a, 7), (a, 2), (a, 7), (b, 7), (a, 11), (b, 0)]:  # repeats, out of order, 2 runs
            store.write(run, rows(step)).result()
        store.write(a, Records(tokens=pa.concat_tables([rows(s).tokens for s in (30, 30, 20)]))).result()
        listed = {run: store.reader.token_steps(run) for run in (a, b)}
        assert store.reader.token_steps(a, since_step=8) == [11, 20, 30]

    def distinct_by_sql():  # computed another way: the token rows themselves
        conn = duckdb.connect(db, read_only=True)
        try:
            found = conn.execute("SELECT run_id, list(DISTINCT step ORDER BY step) FROM tokens GROUP BY run_id")
            return dict(found.fetchall())
        finally:
            conn.close()

    assert listed == distinct_by_sql() == {a: [2, 7, 11, 20, 30], b: [0, 7]}
    conn = duckdb.connect(db)  # a file written before the index existed
    conn.execute("DROP TABLE token_steps")
    conn.close()
    with Store(db) as store:
        assert {run: store.reader.token_steps(run) for run in (a, b)} == listed
