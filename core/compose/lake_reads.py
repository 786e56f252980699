"""The roof's wiring of tiered reads (docs/lake.md, "Reads"): the lake's TieredReader gets the
collector's Reader and rollup builder from here, so the lake room never imports the collector."""
from __future__ import annotations

from forksight.monitor.collector.reader import Reader
from forksight.monitor.collector.rollups import rebuild_rollups


def open_reader(conn, rollups: bool | tuple[str, ...] = True, before_rollups=None) -> Reader:
    """The collector's Reader over an in-memory DuckDB of lake rows: the rollups of every table
    built from its rows now (True), of those named (a tuple), or none; `before_rollups(table)` is
    called when a read first needs a table's rollups (the lake run builds them then)."""
    if rollups:
        rebuild_rollups(conn, tables=("scalars", "histograms") if rollups is True else tuple(rollups))
    return Reader(conn, before_rollups=before_rollups)


def tiered_reader(store, committer):
    """The Reader over `store`'s file and the lake `committer` writes to (its catalog and collector id)."""
    from forksight.monitor.lake.reader import TieredReader

    return TieredReader(store.reader, store, committer.catalog, committer.collector, open_reader)
