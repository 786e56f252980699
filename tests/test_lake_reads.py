"""Tiered reads on the SQLite catalog: collector A's reader lists every run of the lake and reads a run
only collector B wrote (through the lake's Parquet files) with the values B's own DuckDB file gives,
through the Reader protocol; two collectors' runs of one name stay apart; a lake-only run's pages
render in a real headless Chromium against a real `forksight serve --lake-catalog`."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from lake_util import batch  # noqa: E402

from forksight.base.interfaces import Reader  # noqa: E402
from forksight.base.records import (  # noqa: E402
    Records, alerts_table, histograms_table, samples_table, scalars_table, tokens_table,
)
from forksight.compose.lake_reads import tiered_reader  # noqa: E402
from forksight.monitor.collector.inserts import insert_arrow  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.service import start_lake  # noqa: E402

LONG = 260            # steps of B's run "b": long enough that a downsampled read uses the rollups
TOKENS_EVERY = 20     # B's token steps


def write_run(store: Store, name: str, steps: int, scale: float = 1.0) -> str:
    """A run of `steps` steps: lake_util's batch scalars (values scaled), samples, histograms, and
    token rows every TOKENS_EVERY steps; ranks 0 and 1 at step 5 (a multi-rank merge)."""
    run = store.create_run(name)
    for step in range(steps):
        body = batch(step, tokens=30)
        scalars = [dict(s, value=s["value"] * scale) for s in body["scalars"]]
        rec = Records(scalars=scalars_table(scalars), samples=samples_table(body["samples"]),
                      histograms=histograms_table(body["histograms"]),
                      tokens=tokens_table({k: v for k, v in body["tokens"][0].items() if k != "step"}, step=step)
                      if step % TOKENS_EVERY == 0 else None)
        store.write(run, rec, f"{name}-{step}").result()
    store.write(run, Records(scalars=scalars_table([{"step": 5, "key": "entropy/mean", "value": 9.0}], rank=1)),
                f"{name}-r1").result()
    return run


def add_alerts(store: Store, run: str, steps: list[int]) -> None:
    rows = [{"run_id": run, "step": s, "wall_time": 100.0 + s, "detector": f"det{s % 2}",
             "severity": "critical" if s % 2 else "warning", "message": f"m{s}", "action": "look"} for s in steps]
    store.call(lambda cur: insert_arrow(cur, "alerts", alerts_table(rows)))


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """Collectors box-a (run "a") and box-b (runs "b" and "a") on one SQLite-catalogued lake; B's
    committer stopped (everything committed); yields (A's tiered reader, B's store, the lake dir)."""
    tmp = tmp_path_factory.mktemp("lake-reads")
    catalog = open_catalog(f"sqlite:///{tmp}/catalog.db", str(tmp / "wh"))
    b = Store(str(tmp / "b.duckdb"))
    lake_b = start_lake(b, catalog, uri="sqlite://", warehouse="wh", collector_id="box-b", commit_seconds=0.2)
    assert write_run(b, "b", LONG) == "b" and write_run(b, "a", 12, scale=-1.0) == "a"
    add_alerts(b, "b", [3, 40, 41])       # odd steps critical: 2 critical, 1 warning
    lake_b.stop()                         # the last drain: every row and alert of B is in the lake
    a = Store(str(tmp / "a.duckdb"))
    lake_a = start_lake(a, catalog, uri="sqlite://", warehouse="wh", collector_id="box-a", commit_seconds=0.2)
    write_run(a, "a", 15)
    add_alerts(a, "a", [2])
    try:
        yield tiered_reader(a, lake_a), b, tmp
    finally:
        lake_a.stop()
        a.close()
        b.close()


def same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert len(want), "the reference read is empty: the test would prove nothing"
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False)


def test_a_lists_every_run_of_the_lake_and_two_collectors_runs_of_one_name_stay_apart(lake):
    reader, _, _ = lake
    assert isinstance(reader, Reader)
    runs = reader.list_runs()
    assert sorted(runs["run_id"]) == ["a", "a@box-b", "b@box-b"]
    assert dict(zip(runs["run_id"], runs["name"])) == {"a": "a", "a@box-b": "a@box-b", "b@box-b": "b@box-b"}
    assert dict(zip(runs["run_id"], runs["last_step"])) == {"a": 14, "a@box-b": 11, "b@box-b": LONG - 1}
    page, total = reader.runs_page(where=[("name", "contains", "box-b")], order=[("last_step", True)])
    assert total == 2 and list(page["run_id"]) == ["b@box-b", "a@box-b"]
    assert dict(zip(page["run_id"], zip(page["critical"], page["warning"]))) == {"b@box-b": (2, 1), "a@box-b": (0, 0)}
    # A's own "a" and B's "a" hold different values (B's scaled by -1): never merged
    mine = reader.read_scalars("a", ["reward/mean"])
    theirs = reader.read_scalars("a@box-b", ["reward/mean"])
    assert list(mine["value"]) == [s * 0.25 for s in range(15)]
    assert list(theirs["value"]) == [-s * 0.25 for s in range(12)]
    assert not reader.has_run("zz@box-b") and reader.run("zz@box-b") is None and reader.has_run("b@box-b")


def test_a_reads_a_lake_only_run_as_b_reads_it_from_its_own_file(lake):
    reader, b, _ = lake
    own, rid = b.reader, "b@box-b"
    run = reader.run(rid)
    assert run["name"] == rid and run["last_step"] == own.run("b")["last_step"] == LONG - 1
    assert reader.scalar_keys(rid) == own.scalar_keys("b") == ["entropy/mean", "reward/mean"]
    reader.close_runs()

    def rollup_rows() -> tuple[int, int]:     # what the lake run's own database holds so far
        db = reader._lake_reader(rid).db
        return tuple(db.conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                     for t in ("scalar_rollups", "histogram_rollups"))
    for downsample, since in ((1000, None), (20, None), (1000, 200)):    # 20: read from rebuilt rollups
        same(reader.read_scalars(rid, downsample=downsample, since_step=since),
             own.read_scalars("b", downsample=downsample, since_step=since))
        if downsample == 1000 and since is None:     # a raw read: no rollup is built for it
            assert rollup_rows() == (0, 0)
    assert rollup_rows()[0] > 0 and rollup_rows()[1] == 0     # built on the first read that used them
    # hand-worked: the two ranks of step 5 merge by weighted mean (weight null = 1)
    at5 = reader.steps_scalars(rid, [5, 6])
    assert at5 == own.steps_scalars("b", [5, 6])
    assert math.isclose(at5[5]["entropy/mean"], (1.0 + 5 / 7 + 9.0) / 2) and at5[6]["reward/mean"] == 1.5
    for downsample in (1000, 10):
        same(reader.read_histograms(rid, downsample=downsample), own.read_histograms("b", downsample=downsample))
    same(reader.read_histogram_ends(rid, "entropy", at=100), own.read_histogram_ends("b", "entropy", at=100))
    steps = list(range(0, LONG, TOKENS_EVERY))
    assert reader.token_steps(rid) == own.token_steps("b") == steps
    assert reader.token_step_span(rid) == (len(steps), 0, steps[-1])
    assert reader.first_token_steps(rid, 3) == steps[:3]
    assert reader.nearest_token_steps(rid, [31, 50, 999]) == own.nearest_token_steps("b", [31, 50, 999]) \
        == [40, 40, steps[-1]]
    assert reader.spread_token_steps(rid, 4) == own.spread_token_steps("b", 4)
    for step in (0, 120):
        same(reader.read_tokens(rid, step), own.read_tokens("b", step))
        same(reader.read_tokens(rid, step, sample_id=2, limit=5), own.read_tokens("b", step, sample_id=2, limit=5))
    same(reader.read_token_history(rid, [0, 40, 41], ["logp", "sampler_logp"], per_step=7),
         own.read_token_history("b", [0, 40, 41], ["logp", "sampler_logp"], per_step=7))
    same(reader.read_token_history(rid, [40], "entropy", prompt="p40"),
         own.read_token_history("b", [40], "entropy", prompt="p40"))
    same(reader.read_samples(rid, limit=50), own.read_samples("b", limit=50))
    same(reader.read_samples(rid, step=7), own.read_samples("b", step=7))
    same(reader.read_alerts(rid).drop(columns="run_id"), own.read_alerts("b").drop(columns="run_id"))
    assert reader.run_progress(rid) == own.run_progress("b") == (LONG - 1, 3)
    counts = reader.row_counts(rid)
    assert counts == own.row_counts("b")
    assert counts["tokens"] == 30 * len(steps) and counts["scalars"] == 2 * LONG + 1    # counted from what was sent


def test_fleet_reads_merge_the_file_and_the_lake(lake):
    reader, b, _ = lake
    page, total = reader.read_alerts_page()
    assert total == 4 and sorted(set(page["run_id"])) == ["a", "b@box-b"]
    assert set(page.loc[page.run_id == "b@box-b", "run_name"]) == {"b@box-b"}
    critical, n = reader.read_alerts_page(severities=["critical"], run_ids=["b@box-b"])
    assert n == 2 and list(critical["step"]) == [41, 3]       # newest first
    assert reader.alert_detectors() == ["det0", "det1"]
    assert sorted(set(reader.read_alerts()["run_id"])) == ["a", "b@box-b"]
    spark = reader.read_scalars_of_runs(["reward/mean"], downsample=24)
    assert sorted(set(spark["run_id"])) == ["a", "a@box-b", "b@box-b"]
    theirs = spark[spark.run_id == "b@box-b"].drop(columns="run_id")
    same(theirs, b.reader.read_scalars_of_runs(["reward/mean"], 24, ["b"]).drop(columns="run_id"))
    only = reader.read_scalars_of_runs(["reward/mean"], downsample=24, run_ids=["a@box-b"])
    assert set(only["run_id"]) == {"a@box-b"} and len(only) == 12


def test_a_lake_run_reads_only_its_own_files(lake):
    """The views over a lake run list the data files of (collector, run_id) only: the partition
    paths of every file name that run."""
    reader, _, _ = lake
    from forksight.monitor.lake.run_views import plan_files

    files, snap, _ = plan_files(reader.catalog, "tokens", "box-b", "b")
    assert files and snap is not None
    assert all("collector=box-b/run_id=b/" in f for f in files), files


def test_compact_to_lake_moves_committed_token_steps_and_the_reader_reads_them_from_the_lake(tmp_path):
    import json
    import subprocess
    import sys

    from collector_util import REPO

    uri, wh = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh")
    db = str(tmp_path / "c.duckdb")
    c = Store(db)
    lake = start_lake(c, open_catalog(uri, wh), uri=uri, warehouse=wh, collector_id="box-c", commit_seconds=0.2)
    write_run(c, "c", 60)                 # token steps 0, 20, 40
    lake.stop()                           # committed; the outbox hook stays: what follows waits in it
    body = batch(61, tokens=30)
    c.write("c", Records(tokens=tokens_table({k: v for k, v in body["tokens"][0].items() if k != "step"}, step=61)),
            "c-61").result()
    before = {s: c.reader.read_tokens("c", s) for s in (0, 20, 40, 61)}
    history = c.reader.read_token_history("c", [0, 20, 40, 61], ["entropy", "logp"], per_step=11)
    counts, steps = c.reader.row_counts("c"), c.reader.token_steps("c")
    c.close()
    done = subprocess.run([sys.executable, "-m", "forksight", "compact", "--db", db, "--run", "c", "--to-lake",
                           "--lake-catalog", uri, "--lake-warehouse", wh], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["token_steps_moved"] == 3 and said["token_rows_moved"] == 90     # 3 steps x 30 rows sent
    assert said["token_steps_kept_waiting"] == 1 and said["token_steps_kept_unequal"] == 0   # step 61: not committed
    c = Store(db)
    try:
        assert c.reader.read_tokens("c", 20).empty and len(c.reader.read_tokens("c", 61)) == 30   # out of the file
        lake = start_lake(c, open_catalog(uri, wh), uri=uri, warehouse=wh, collector_id="box-c", commit_seconds=3600)
        lake.stop()
        reader = tiered_reader(c, lake)
        for s, want in before.items():
            same(reader.read_tokens("c", s), want)
        same(reader.read_token_history("c", [0, 20, 40, 61], ["entropy", "logp"], per_step=11), history)
        assert reader.token_steps("c") == steps and reader.row_counts("c") == counts
    finally:
        c.close()
    bad = subprocess.run([sys.executable, "-m", "forksight", "compact", "--db", db, "--run", "c", "--to-lake"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "--to-lake needs --lake-catalog" in bad.stderr


def test_every_reader_method_says_which_lake_tables_it_reads():
    """lazy_run.NEEDS names the step tables each Reader method reads on a lake run; a method left out
    opens every table first (slow, not wrong), so the map lists every public method of the Reader."""
    from forksight.monitor.collector.reader import Reader as FileReader
    from forksight.monitor.lake.lazy_run import NEEDS

    public = {n for n in dir(FileReader) if not n.startswith("_") and callable(getattr(FileReader, n))}
    assert public - set(NEEDS) == set()
    assert set(NEEDS) - public == set()          # no stale names either
