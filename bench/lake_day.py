"""A simulated day of a live run under the lake (issue 43, item 2): `bench/lake.py --day` runs it.

One run that heartbeats every commit interval (30 s: 2,880 intervals a day) and logs a step of data every
--day-data-every intervals; the committer is driven by hand, one cycle per interval (its own code, in this
thread). Reported per table: snapshots, metadata.json files and metadata bytes (metadata files, manifest
lists, manifests) after the day; then the committer's own expiry with each table's max age set to the
last quarter of the simulation's wall time (6 h of the day compressed: the tables' default max age),
and the same figures after it."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

INTERVALS_PER_DAY = 86_400 // 30


def metadata_figures(catalog, warehouse: Path) -> dict:
    """Per lake table: snapshots, metadata.json files, and the bytes of everything under its metadata/."""
    from forksight.monitor.lake.schema import LAKE_TABLES, identifier

    out = {}
    for name in LAKE_TABLES:
        table = catalog.load_table(identifier(name))
        folders = [p for p in warehouse.rglob("metadata") if p.parent.name == name]
        files = [f for d in folders for f in d.iterdir() if f.is_file()]
        out[name] = {"snapshots": len(table.metadata.snapshots),
                     "metadata_json_files": sum(f.name.endswith(".metadata.json") for f in files),
                     "metadata_bytes": sum(f.stat().st_size for f in files)}
    return out


def simulated_day(root: Path, intervals: int = INTERVALS_PER_DAY, data_every: int = 30, tokens: int = 256) -> dict:
    from bench_steps import step_with_tokens
    from forksight.monitor.collector.store import Store
    from forksight.monitor.lake.catalog import open_catalog
    from forksight.monitor.lake.schema import LAKE_TABLES, identifier
    from forksight.monitor.lake.service import start_lake

    wh = root / "wh"
    catalog = open_catalog(f"sqlite:///{root}/catalog.db", str(wh))
    rng = np.random.default_rng(0)
    with Store(str(root / "day.duckdb")) as store:
        run = store.create_run("live")
        lake = start_lake(store, catalog, uri="sqlite://", warehouse=str(wh), collector_id="day",
                          commit_seconds=3600, writer_process=False)
        lake.stop()                                    # driven by hand: one cycle per 30-s interval
        start, quarter, steps = time.perf_counter(), None, 0
        for i in range(intervals):
            if i == intervals * 3 // 4:
                quarter = time.perf_counter()
            store.heartbeat(run)
            if i % data_every == 0:
                store.write(run, step_with_tokens(rng, steps, tokens), f"s{steps}").result()
                steps += 1
            lake.cycle(force=True)
        end = time.perf_counter()
        before = metadata_figures(catalog, wh)
        age_ms = max(1, int((end - quarter) * 1000))
        for name in LAKE_TABLES:
            with catalog.load_table(identifier(name)).transaction() as tx:
                tx.set_properties({"history.expire.max-snapshot-age-ms": str(age_ms)})
        lake._expire()
        after = metadata_figures(catalog, wh)
    return {"intervals": intervals, "interval_s_simulated": 30, "heartbeats": intervals, "data_steps": steps,
            "token_rows_per_step": tokens, "wall_s": round(end - start, 1),
            "expiry_max_age": "the last quarter of the simulated day (6 h)", "after_the_day": before,
            "after_the_committers_expiry": after}
