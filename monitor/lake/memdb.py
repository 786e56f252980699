"""Small in-memory DuckDB databases for lake reads, each ATTACHed to one shared DuckDB instance:
`duckdb.connect(':memory:')` costs 15-30 ms (a new instance and its thread pool), an ATTACH a
tenth of a millisecond, and a lake run's first page opens one. Duck-typed as a connection for the
collector's Reader (cursor per read) and the code that fills it (execute, register, sql)."""
from __future__ import annotations

import itertools
import threading
import weakref

_LOCK = threading.Lock()
_BASE: list = []
_NAMES = itertools.count()


def _base():
    import duckdb

    with _LOCK:
        if not _BASE:
            conn = duckdb.connect(":memory:")
            conn.execute("SET parquet_metadata_cache = true")   # lake files never change: one footer read
            _BASE.append(conn)
        return _BASE[0]


def _detach(name: str, own) -> None:
    try:
        own.close()
        _base().cursor().execute(f"DETACH DATABASE IF EXISTS {name}")
    except Exception:  # noqa: BLE001 - interpreter shutdown: the instance is going anyway
        pass


class MemoryDb:
    """One attached in-memory database; detached when the last reference to it goes (no read can
    still be running on it then). Not thread-safe for execute/register (its fillers hold a lock);
    cursor() gives each read its own connection, as the Reader wants."""

    def __init__(self):
        base = _base()
        self.name = f"lake_mem_{next(_NAMES)}"
        self._own = base.cursor()
        self._own.execute(f"ATTACH ':memory:' AS {self.name}; USE {self.name}")
        weakref.finalize(self, _detach, self.name, self._own)

    def cursor(self):
        cur = _base().cursor()
        cur.execute(f"USE {self.name}")
        return cur

    def execute(self, sql: str, params=None):
        return self._own.execute(sql, params or [])

    def sql(self, sql: str):
        return self._own.sql(sql)

    def register(self, name: str, data) -> None:
        self._own.register(name, data)

    def unregister(self, name: str) -> None:
        self._own.unregister(name)
