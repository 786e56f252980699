"""The lake's small in-memory databases (monitor/lake/memdb.py): each is its own namespace on one
shared DuckDB instance, every cursor sees its tables, and it is detached once unreferenced."""
from __future__ import annotations

import gc
import threading

import pyarrow as pa

from forksight.monitor.lake.memdb import MemoryDb, _base


def attached() -> set[str]:
    return {r[0] for r in _base().cursor().execute("SELECT database_name FROM duckdb_databases()").fetchall()}


def test_two_databases_keep_their_own_tables_and_every_cursor_sees_them():
    a, b = MemoryDb(), MemoryDb()
    for db, rows in ((a, [1, 2, 3]), (b, [10])):
        db.execute("CREATE TABLE t (x INTEGER)")
        db.register("_rows", pa.table({"x": pa.array(rows, pa.int32())}))
        db.execute("INSERT INTO t SELECT x FROM _rows")
        db.unregister("_rows")
    got = {}

    def read(db, key):               # a read on another thread, on its own cursor (as the Reader does)
        got[key] = db.cursor().execute("SELECT sum(x), count(*) FROM t").fetchall()[0]
    threads = [threading.Thread(target=read, args=(db, k)) for db, k in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {"a": (6, 3), "b": (10, 1)}


def test_an_unreferenced_database_is_detached():
    db = MemoryDb()
    name = db.name
    db.execute("CREATE TABLE t AS SELECT range AS x FROM range(1000)")
    assert name in attached()
    del db
    gc.collect()
    assert name not in attached()
