"""The lake's metadata stays bounded under a live run: a heartbeat alone (every 30 s of a run that logs
nothing) commits nothing, a status change, new data or a new alert does; every table carries Iceberg's
retention properties, and the committer's own expiry drops snapshots past a table's max age."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from forksight.base.records import Records, alerts_table, scalars_table  # noqa: E402
from forksight.monitor.collector.inserts import insert_arrow  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.schema import LAKE_TABLES, RETENTION  # noqa: E402
from forksight.monitor.lake.service import start_lake  # noqa: E402


def snapshots(catalog, name: str) -> int:
    return len(catalog.load_table(f"forksight.{name}").metadata.snapshots)


def test_a_heartbeat_alone_commits_nothing_and_a_change_does(tmp_path):
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"))
    store = Store(str(tmp_path / "a.duckdb"))
    try:
        run = store.create_run("live")
        lake = start_lake(store, catalog, uri="sqlite://", warehouse="wh", collector_id="c", commit_seconds=3600,
                          writer_process=False)
        lake.stop()                                  # driven by hand: one cycle is one commit interval
        lake.cycle(force=True)
        assert snapshots(catalog, "runs") >= 1       # the new run
        seen = {n: snapshots(catalog, n) for n in ("runs", "scalars", "alerts")}

        def grew() -> set[str]:                      # the tables a cycle committed to
            now = {n: snapshots(catalog, n) for n in seen}
            out = {n for n in now if now[n] != seen[n]}
            seen.update(now)
            return out
        for _ in range(5):                           # a live run that only heartbeats
            time.sleep(0.002)
            assert store.heartbeat(run)
            lake.cycle(force=True)
            assert grew() == set()
        store.write(run, Records(scalars=scalars_table([{"step": 0, "key": "k", "value": 1.0}])), "b0").result()
        store.heartbeat(run)
        lake.cycle(force=True)                       # new data: the rows, and the run's row (its heartbeat) once
        assert grew() == {"scalars", "runs"}
        beat = store.reader.run(run)["heartbeat"]
        assert catalog.load_table("forksight.runs").scan().to_arrow()["heartbeat"].to_pylist() == [beat]
        lake.cycle(force=True)
        assert grew() == set()                       # nothing new since
        store.call(lambda cur: insert_arrow(cur, "alerts", alerts_table([{
            "run_id": run, "step": 0, "wall_time": 1.0, "detector": "d", "severity": "warning", "message": "m",
            "action": "x"}])))
        lake.cycle(force=True)
        assert grew() == {"alerts"}
        store.update_run(run, status="finished")
        lake.cycle(force=True)
        assert grew() == {"runs"}
    finally:
        store.close()


def test_tables_carry_retention_and_the_committer_expires_past_the_max_age(tmp_path):
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"))
    for name in LAKE_TABLES:
        props = catalog.load_table(f"forksight.{name}").properties
        assert {k: props.get(k) for k in RETENTION} == RETENTION
    store = Store(str(tmp_path / "a.duckdb"))
    try:
        run = store.create_run("r")
        lake = start_lake(store, catalog, uri="sqlite://", warehouse="wh", collector_id="c", commit_seconds=3600,
                          writer_process=False)
        lake.stop()
        for step in range(4):
            store.write(run, Records(scalars=scalars_table([{"step": step, "key": "k", "value": step}])),
                        f"b{step}").result()
            lake.cycle(force=True)
        assert snapshots(catalog, "scalars") == 4
        with catalog.load_table("forksight.scalars").transaction() as tx:    # an operator's shorter max age
            tx.set_properties({"history.expire.max-snapshot-age-ms": "1"})
        time.sleep(0.01)
        lake._expire()
        table = catalog.load_table("forksight.scalars")
        assert len(table.metadata.snapshots) == 1                          # the current one stays
        assert sorted(table.scan().to_arrow()["step"].to_pylist()) == [0, 1, 2, 3]   # every row still read
        store.write(run, Records(scalars=scalars_table([{"step": 9, "key": "k", "value": 9.0}])), "b9").result()
        lake.cycle(force=True)                                             # the watermark survived expiry
        assert sorted(catalog.load_table("forksight.scalars").scan().to_arrow()["step"].to_pylist()) == [0, 1, 2, 3, 9]
    finally:
        store.close()
