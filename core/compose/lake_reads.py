"""The roof's wiring of tiered reads (docs/lake.md, "Reads"): the lake's TieredReader gets the
collector's Reader and rollup builder from here, so the lake room never imports the collector."""
from __future__ import annotations

from forksight.monitor.collector.reader import Reader
from forksight.monitor.collector.rollups import rebuild_rollups


def open_reader(conn, rollups: bool = True) -> Reader:
    """The collector's Reader over an in-memory DuckDB of lake rows (rollups built from its rows)."""
    if rollups:
        rebuild_rollups(conn)
    return Reader(conn)


def tiered_reader(store, committer):
    """The Reader over `store`'s file and the lake `committer` writes to (its catalog and collector id)."""
    from forksight.monitor.lake.reader import TieredReader

    return TieredReader(store.reader, store, committer.catalog, committer.collector, open_reader)
