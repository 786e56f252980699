"""The lake writer on the SQLite catalog (one box): a real `forksight serve` commits every table to
Iceberg with the DuckDB tables' exact rows; a crash between the Iceberg commit and the outbox delete
commits nothing twice; a bad URI is refused at start; schema evolution and an incompatible column."""
from __future__ import annotations

import logging
import subprocess
import sys

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from collector_util import REPO, ServeProcess, free_port  # noqa: E402
from lake_util import (  # noqa: E402
    STEP_TABLES, batch, create_run, duck_rows, lake_rows, post, rows_of, wait_drained,
)

from forksight.base.records import Records, alerts_table, scalars_table  # noqa: E402
from forksight.base.tables import SCALARS, TOKENS, Table  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.committer import Committer  # noqa: E402
from forksight.monitor.lake.writer import PROP_COLLECTOR, PROP_HI, PROP_LO, LakeWriter  # noqa: E402
from forksight.monitor.lake.errors import LakeError  # noqa: E402
from forksight.monitor.lake.schema import iceberg_schema, partition_spec  # noqa: E402
from forksight.monitor.lake.service import start_lake  # noqa: E402
from forksight.monitor.collector.inserts import insert_arrow  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402


def _lake_args(tmp_path, *extra: str) -> tuple[str, ...]:
    return ("--lake-catalog", f"sqlite:///{tmp_path}/catalog.db", "--lake-warehouse", str(tmp_path / "wh"), *extra)


def test_serve_commits_every_row_once_with_the_duckdb_values(tmp_path):
    db = tmp_path / "a.duckdb"
    sent = {t: 0 for t in STEP_TABLES}
    with ServeProcess(db, args=_lake_args(tmp_path, "--lake-commit-rows", "150", "--lake-commit-seconds", "0.5",
                                          "--collector-id", "box-1")) as srv:
        runs = [create_run(srv.url, "alpha"), create_run(srv.url, "beta")]
        for step in range(8):
            body = batch(step if step < 6 else step + 1500, tokens=30)    # two step blocks of 1000
            run = runs[step % 2]
            post(srv.url, run, body)
            for t, n in rows_of(body).items():
                sent[t] += n
        assert post(srv.url, runs[0], batch(0, tokens=30))["duplicate"]   # a resent batch: stored once
        health = wait_drained(srv.url)
        assert health["collector_id"] == "box-1" and health["state"] == "ok"
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"), check=False)
    for name in STEP_TABLES:
        lake, duck = lake_rows(catalog, name, "box-1"), duck_rows(str(db), name)
        assert len(lake) == sent[name], name          # counted from what was sent
        assert lake == duck, name                     # and every value equal to DuckDB's
    assert lake_rows(catalog, "runs", "box-1") == duck_rows(str(db), "runs")   # synced at the stop
    # each commit names its collector and a sequence range; the ranges never overlap
    for name in STEP_TABLES:
        table = catalog.load_table(f"forksight.{name}")
        ranges = sorted((int(p[PROP_LO]), int(p[PROP_HI])) for s in table.metadata.snapshots
                        if (p := s.summary.additional_properties).get(PROP_COLLECTOR) == "box-1")
        assert ranges and all(hi < lo2 for (_, hi), (lo2, _) in zip(ranges, ranges[1:])), ranges
    # partitioned: one run's first step block reads only that run's files of that block
    from pyiceberg.expressions import And, EqualTo, LessThan

    files = [t.file.file_path for t in catalog.load_table("forksight.tokens").scan(
        row_filter=And(EqualTo("run_id", runs[1]), LessThan("step", 1000))).plan_files()]
    assert files and all(f"run_id={runs[1]}/step_1000=0/" in f for f in files), files


def test_a_crash_between_commit_and_delete_commits_nothing_twice(tmp_path):
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"))
    store = Store(str(tmp_path / "a.duckdb"))
    try:
        run = store.create_run("r")
        lake = start_lake(store, catalog, uri="sqlite://", warehouse="wh", collector_id="c", commit_seconds=3600)
        lake.stop()                      # driven by hand below, one cycle at a time
        rows = [{"step": s, "key": "k", "value": s / 3} for s in range(25)]
        store.write(run, Records(scalars=scalars_table(rows)), "b1").result()
        real_drop, calls = lake.outbox.drop, []

        def crash(table, hi):            # the process dies after the Iceberg commit, before the delete
            calls.append(table)
            raise KeyboardInterrupt("killed")
        lake.outbox.drop = crash
        with pytest.raises(KeyboardInterrupt):
            lake.cycle(force=True)
        assert calls == ["scalars"] and store.call(
            lambda cur: cur.execute("SELECT sum(nrows) FROM lake_outbox WHERE tbl = 'scalars'").fetchall()[0][0]) == 25
        lake.outbox.drop = real_drop
        again = Committer(store, lake.outbox, catalog, uri="sqlite://", warehouse="wh",
                          commit_rows=10, commit_seconds=3600)
        assert again.recover() == {"scalars": 25}
        again.cycle(force=True)
        assert len(lake_rows(catalog, "scalars", "c")) == 25
        # alerts and a run's new status reach the lake by overwrite (a repeat changes nothing)
        alert = alerts_table([{"run_id": run, "step": 3, "wall_time": 1.0, "detector": "d", "severity": "warning",
                               "message": "m", "action": "x"}])
        store.call(lambda cur: insert_arrow(cur, "alerts", alert))
        store.update_run(run, status="finished")
        for _ in range(2):
            again.cycle(force=True)
            assert [a["detector"] for a in lake_rows(catalog, "alerts", "c")] == ["d"]
            assert [r["status"] for r in lake_rows(catalog, "runs", "c")] == ["finished"]
    finally:
        store.close()


def _serve_fails(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forksight", "serve", "--db", str(tmp_path / "x.duckdb"),
                           "--port", str(free_port()), "--no-dashboard", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_bad_lake_uri_is_refused_at_start_saying_what_and_how(tmp_path):
    cases = {("--lake-catalog", "nope://x", "--lake-warehouse", str(tmp_path / "wh")): "not a catalog URI",
             ("--lake-catalog", f"postgresql+psycopg2://u:secret@127.0.0.1:{free_port()}/db",
              "--lake-warehouse", str(tmp_path / "wh")): "cannot use the lake catalog",
             ("--lake-catalog", f"sqlite:///{tmp_path}/c.db"): "needs --lake-warehouse",
             ("--lake-warehouse", str(tmp_path / "wh")): "need --lake-catalog URI",
             (*_lake_args(tmp_path), "--lake-commit-rows", "0"): "--lake-commit-rows must be greater than or equal to 1 (got 0)",
             (*_lake_args(tmp_path), "--collector-id", "a/b"): "--collector-id 'a/b'"}
    for args, said in cases.items():
        done = _serve_fails(tmp_path, *args)
        assert done.returncode == 2 and said in done.stderr, (args, done.stderr)
        assert "secret" not in done.stderr                     # the password is not echoed
        assert not (tmp_path / "x.duckdb").exists()            # refused before the file


def test_a_missing_column_is_added_and_an_incompatible_one_is_named(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.types import StringType

    uri, wh = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh")
    raw = SqlCatalog("forksight", uri=uri, warehouse=f"file://{wh}")
    raw.create_namespace("forksight")
    old = Table("tokens", tuple(c for c in TOKENS.columns if c.name != "sampler_logp"))   # an older forksight
    schema = iceberg_schema(old)
    raw.create_table("forksight.tokens", schema=schema, partition_spec=partition_spec(TOKENS, schema))
    open_catalog(uri, wh)
    fields = {f.name: str(f.field_type) for f in raw.load_table("forksight.tokens").schema().fields}
    assert fields["sampler_logp"] == "float" and list(fields)[-1] == "sampler_logp"

    other = tmp_path / "other"
    raw = SqlCatalog("forksight", uri=f"sqlite:///{other}.db", warehouse=f"file://{other}")
    raw.create_namespace("forksight")
    bad = iceberg_schema(SCALARS)
    raw.create_table("forksight.scalars", schema=pa.schema(
        [pa.field(f.name, pa.string() if f.name == "value" else f.type) for f in bad.as_arrow()]))
    with pytest.raises(LakeError, match=r"forksight\.scalars: column 'value' is string") as err:
        open_catalog(f"sqlite:///{other}.db", str(other))
    assert "forksight writes double" in str(err.value)


def test_health_without_a_lake_has_no_lake_part(tmp_path):
    import httpx

    with ServeProcess(tmp_path / "a.duckdb") as srv:
        assert "lake" not in httpx.get(srv.url + "/api/health").json()
        assert httpx.get(srv.url + "/api/health/lake").status_code == 404


def test_a_commit_conflict_with_another_collector_is_retried_and_lands_once(tmp_path, caplog):
    uri, wh = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh")
    catalog = open_catalog(uri, wh)
    with catalog.load_table("forksight.scalars").transaction() as tx:    # pyiceberg's own retries off:
        tx.set_properties({"commit.retry.num-retries": "0"})             # the conflict reaches ours
    stores = [Store(str(tmp_path / f"{c}.duckdb")) for c in "ab"]
    try:
        lakes = []
        for collector, store in zip("ab", stores):
            run = store.create_run("same")
            lake = start_lake(store, catalog, uri=uri, warehouse=wh, collector_id=collector, commit_seconds=3600)
            lake.stop()
            store.write(run, Records(scalars=scalars_table([{"step": s, "key": collector, "value": s / 7}
                                                            for s in range(10)])), "b").result()
            lakes.append(lake)
        stale = catalog.load_table("forksight.scalars")     # a's view of the table, before b commits
        lakes[1].cycle(force=True)
        data = lakes[0].outbox.rows(stores[0].read_cursor(), "scalars", 1, 10**9)
        with caplog.at_level(logging.INFO, logger="forksight.lake"):     # a's writer, in this process
            LakeWriter(catalog, "a").append("scalars", data, 1, 1, table=stale)
        assert "scalars commit conflicted with another writer" in caplog.text     # refused once, retried
        table = catalog.load_table("forksight.scalars")
        assert sorted(r["key"] for r in table.scan().to_arrow().to_pylist()) == ["a"] * 10 + ["b"] * 10
        assert table.properties["forksight.committed-seq.a"] == "1"
        assert int(table.properties["forksight.committed-seq.b"]) >= 1          # b's watermark kept
    finally:
        for store in stores:
            store.close()


def test_compact_waits_until_the_lake_has_the_token_rows_it_would_thin(tmp_path):
    from forksight.base.records import tokens_table
    from forksight.monitor.collector.compact import compact_file
    from forksight.monitor.lake.outbox import refuse_thinning_unsent

    uri, wh, db = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"), str(tmp_path / "a.duckdb")
    catalog = open_catalog(uri, wh)
    store = Store(db)
    run = store.create_run("r")
    lake = start_lake(store, catalog, uri=uri, warehouse=wh, collector_id="c", commit_seconds=3600)
    lake.stop()
    for step in range(5):
        store.write(run, Records(tokens=tokens_table({"step": [step] * 3, "sample_id": [0, 0, 1],
                                                      "pos": [0, 1, 0]})), f"b{step}").result()
    store.close()
    # the outbox names the rows, the file holds them once: thinning now would keep 6 from the lake
    with pytest.raises(LakeError, match="has not got 15 token rows of run"):
        compact_file(db, run, 2, check=refuse_thinning_unsent)
    store = Store(db)
    try:
        assert store.reader.row_counts(run)["tokens"] == 15           # refused before touching anything
        lake = start_lake(store, catalog, uri=uri, warehouse=wh, commit_seconds=3600)   # the stored id
        lake.stop()
        assert lake.collector == "c"
        lake.cycle(force=True)
        assert sorted({r["step"] for r in lake_rows(catalog, "tokens", "c")}) == list(range(5))
    finally:
        store.close()
    done = compact_file(db, run, 2, check=refuse_thinning_unsent)    # drained: the file keeps 3 of 5 steps
    assert done["token_rows_after"] == 9 and len(lake_rows(catalog, "tokens", "c")) == 15


@pytest.fixture
def local(tmp_path):
    """A DuckDB store with one run and a SQLite-catalogued lake: .uri, .wh, .catalog, .store, .run."""
    from types import SimpleNamespace

    uri, wh = f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh")
    catalog = open_catalog(uri, wh)
    store = Store(str(tmp_path / "a.duckdb"))
    try:
        yield SimpleNamespace(uri=uri, wh=wh, catalog=catalog, store=store, run=store.create_run("r"))
    finally:
        store.close()


def _write_scalars(local, batch_no: int, n: int) -> None:
    """Batch `batch_no`: steps batch_no*n .. +n-1, each value step/3."""
    rows = [{"step": batch_no * n + i, "key": "k", "value": (batch_no * n + i) / 3} for i in range(n)]
    local.store.write(local.run, Records(scalars=scalars_table(rows)), f"b{batch_no}").result()


def test_stop_drains_the_whole_backlog_and_says_what_a_short_timeout_left(local, caplog):
    from forksight.monitor.lake.outbox import Outbox

    outbox = Outbox(local.store, "c")
    local.store.attach_lake(outbox)      # filled before any committer runs
    for b in range(6):                                                # 6 entries of 8 rows: 6 commits of 8 rows
        _write_scalars(local, b, 8)

    def committer():
        return Committer(local.store, outbox, local.catalog, uri=local.uri, warehouse=local.wh, commit_rows=8,
                         commit_seconds=3600)
    short = committer()
    short._stop.set()                     # stopped before its first cycle: only the last drain runs
    short.start()
    with caplog.at_level(logging.WARNING, logger="forksight.lake"):
        left = short.stop(timeout=0)      # no time: one batch, the rest is named and waits
    assert left["scalars"] == 48 - len(lake_rows(local.catalog, "scalars", "c")) and 0 < left["scalars"] < 48
    assert f"stopped with {left['scalars']} rows still in the outbox" in caplog.text
    full = committer()
    full._stop.set()
    full.start()
    assert sum(full.stop(timeout=60).values()) == 0        # one stop drains batch after batch
    got = sorted((r["step"], r["value"]) for r in lake_rows(local.catalog, "scalars", "c"))
    assert got == [(s, pytest.approx(s / 3)) for s in range(48)]      # each row once


def test_new_entries_hold_no_rows_and_an_older_forksights_blob_entries_still_reach_the_lake(local):
    from forksight.monitor.lake.outbox import SEQ, Outbox, _encode

    store, run = local.store, local.run
    outbox = Outbox(store, "c")
    store.attach_lake(outbox)
    _write_scalars(local, 0, 6)
    # an entry as the blob outbox wrote it: its rows only in the blob, not in the table
    old = scalars_table([{"step": 100 + s, "key": "old", "value": -s / 8} for s in range(3)])
    store.call(lambda cur: cur.execute("INSERT INTO lake_outbox VALUES (?, 'scalars', ?, 3, [100, 101, 102], ?)",
                                       [outbox._next, run, _encode(old)]))
    entries = store.call(lambda cur: cur.execute(
        f"SELECT {SEQ}, nrows, data IS NULL FROM lake_outbox ORDER BY 1").fetchall())
    assert [(n, empty) for _, n, empty in entries] == [(6, True), (3, False)]     # rows written once
    tagged = store.call(lambda cur: cur.execute(
        f"SELECT count(*) FROM scalars WHERE {SEQ} = ?", [entries[0][0]]).fetchall()[0][0])
    assert tagged == 6
    committer = Committer(store, outbox, local.catalog, uri=local.uri, warehouse=local.wh, commit_rows=1000,
                          commit_seconds=0)
    committer.cycle(force=True)
    got = sorted((r["step"], r["key"], r["value"]) for r in lake_rows(local.catalog, "scalars", "c"))
    assert got == sorted([(s, "k", pytest.approx(s / 3)) for s in range(6)] +
                         [(100 + s, "old", -s / 8) for s in range(3)])
    assert committer.health()["backlog_total"] == 0


def test_commits_run_in_a_nice_child_process_that_is_replaced_when_it_dies(local):
    import os
    import signal

    from forksight.monitor.lake.writer_process import CHILD_NICE, ProcessWriter

    lake = start_lake(local.store, local.catalog, uri=local.uri, warehouse=local.wh, collector_id="c",
                      commit_seconds=3600)
    lake._stop.set()                         # no background cycles: this test drives them
    lake._thread.join(30)                    # (the thread's last drain has run and found nothing)
    writer = lake.writer
    assert isinstance(writer, ProcessWriter)
    child = writer._proc.pid
    assert child != os.getpid() and os.getpriority(os.PRIO_PROCESS, child) == CHILD_NICE
    for b in range(2):
        _write_scalars(local, b, 5)
        if b == 1:                            # the child is killed between two commits
            os.kill(child, signal.SIGKILL)
            writer._proc.wait(10)
        lake.cycle(force=True)
    assert writer._proc.pid != child          # a new child made the second commit
    assert sorted(r["step"] for r in lake_rows(local.catalog, "scalars", "c")) == list(range(10))
    lake.writer.close()


def test_a_range_the_lake_holds_is_not_appended_again_and_an_overlap_names_the_collector_id(tmp_path):
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"))
    writer = LakeWriter(catalog, "c")
    rows = scalars_table([{"step": s, "key": "k", "value": s / 3} for s in range(4)])
    rows = rows.add_column(0, "run_id", pa.array(["r"] * rows.num_rows))
    assert writer.append("scalars", rows, 1, 2) == 4
    assert writer.append("scalars", rows, 1, 2) == 0           # e.g. a second cycle that read the same outbox
    assert sorted(r["step"] for r in lake_rows(catalog, "scalars", "c")) == [0, 1, 2, 3]
    with pytest.raises(LakeError, match="rows 2-3 of collector 'c' overlap.*--collector-id"):
        writer.append("scalars", rows, 2, 3)
    assert len(lake_rows(catalog, "scalars", "c")) == 4


def test_two_cycles_at_once_commit_each_row_once(local):
    import threading

    lake = start_lake(local.store, local.catalog, uri=local.uri, warehouse=local.wh, collector_id="c",
                      commit_seconds=3600, writer_process=False)
    for b in range(3):
        _write_scalars(local, b, 5)
    threads = [threading.Thread(target=lake.cycle, kwargs={"force": True}) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    lake.stop(timeout=30)
    assert sorted(r["step"] for r in lake_rows(local.catalog, "scalars", "c")) == list(range(15))
