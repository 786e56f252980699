"""The outbox in the collector's DuckDB file: every data row a write group stores is also inserted,
in the same transaction, into lake_outbox_<table> with a sequence number (`_lake_seq`), so a row the
collector acknowledged is either in the lake or waiting here. The committer drains it in sequence order."""
from __future__ import annotations

import re
import socket
import uuid

import pyarrow as pa

from forksight.monitor.lake.errors import LakeError
from forksight.monitor.lake.schema import STEP_TABLES

SEQ = "_lake_seq"
COLLECTOR_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def outbox_table(name: str) -> str:
    return f"lake_outbox_{name}"


def outbox_sql() -> str:
    """DDL of the outbox tables (the spec's columns plus _lake_seq; columns added to a spec are added
    here too), the lake's state (collector id, the sequence floor) and the runs' last synced digests."""
    parts = []
    for spec in STEP_TABLES:
        cols = ", ".join(f"{c.name} {c.sql}" for c in spec.columns)
        parts.append(f"CREATE TABLE IF NOT EXISTS {outbox_table(spec.name)} ({SEQ} BIGINT, {cols});")
        parts += [f"ALTER TABLE {outbox_table(spec.name)} ADD COLUMN IF NOT EXISTS {c.name} {c.sql};"
                  for c in spec.columns]
    parts.append("CREATE TABLE IF NOT EXISTS lake_state (key VARCHAR PRIMARY KEY, value VARCHAR);")
    parts.append("CREATE TABLE IF NOT EXISTS lake_synced (run_id VARCHAR PRIMARY KEY, runs VARCHAR, alerts VARCHAR);")
    return "\n".join(parts)


def _state(cur, key: str) -> str | None:
    rows = cur.execute("SELECT value FROM lake_state WHERE key = ?", [key]).fetchall()
    return rows[0][0] if rows else None


def _set_state(cur, key: str, value: str) -> None:
    cur.execute("INSERT OR REPLACE INTO lake_state VALUES (?, ?)", [key, value])


def backlog(cur) -> dict[str, int]:
    """Rows waiting per table."""
    return {s.name: cur.execute(f"SELECT count(*) FROM {outbox_table(s.name)}").fetchall()[0][0]
            for s in STEP_TABLES}


class Outbox:
    """The store's `lake_outbox` hook and the outbox's reads and deletes. The hook runs on the
    store's writer thread inside the write's transaction; so do `drop` and the setup."""

    def __init__(self, store, collector_id: str | None):
        self.store = store
        self.collector_id, self._next = store.call(lambda cur: self._setup(cur, collector_id))

    def _setup(self, cur, wanted: str | None) -> tuple[str, int]:
        cur.execute(outbox_sql())
        stored = _state(cur, "collector_id")
        if wanted is not None and not COLLECTOR_ID_RE.match(wanted):
            raise LakeError(f"--collector-id {wanted!r}: use 1-64 letters, digits, . _ - (starting with a letter "
                            "or digit), e.g. the host's name")
        if wanted is not None and stored is not None and wanted != stored and sum(backlog(cur).values()):
            raise LakeError(f"this DuckDB file's lake backlog was written as collector {stored!r}; start with "
                            f"--collector-id {stored} until it has drained (GET /api/health/lake), then change it")
        collector = wanted or stored or f"{_host_slug()}-{uuid.uuid4().hex[:8]}"
        _set_state(cur, "collector_id", collector)
        top = max(int(_state(cur, "seq_floor") or 0),
                  *(cur.execute(f"SELECT coalesce(max({SEQ}), 0) FROM {outbox_table(s.name)}").fetchall()[0][0]
                    for s in STEP_TABLES))
        return collector, top + 1

    def raise_floor(self, committed: int) -> None:
        """The lake holds sequence numbers up to `committed` for this collector (e.g. a new DuckDB file
        under a reused collector id): number new rows past it, so none is mistaken for committed."""
        def bump(cur) -> None:
            self._next = max(self._next, committed + 1)
            _set_state(cur, "seq_floor", str(self._next - 1))
        self.store.call(bump)

    # -- on the writer thread, inside the write's transaction
    def __call__(self, cur, table: str, run_id: str, data: pa.Table) -> None:
        if table not in {s.name for s in STEP_TABLES}:
            return
        seq, self._next = self._next, self._next + 1   # a rolled-back group leaves a gap: harmless
        cur.register("_lake_outbox_in", data)
        try:
            cur.execute(f"INSERT INTO {outbox_table(table)} BY NAME SELECT ?::BIGINT AS {SEQ}, "
                        "?::VARCHAR AS run_id, * FROM _lake_outbox_in", [seq, run_id])
        finally:
            cur.unregister("_lake_outbox_in")

    # -- the committer's side
    def sequences(self, cur, table: str) -> list[tuple[int, int]]:
        """(sequence number, rows) waiting in `table`'s outbox, oldest first."""
        return cur.execute(f"SELECT {SEQ}, count(*) FROM {outbox_table(table)} GROUP BY 1 ORDER BY 1").fetchall()

    def rows(self, cur, table: str, lo: int, hi: int) -> pa.Table:
        """The rows numbered lo..hi, without their number."""
        return cur.sql(f"SELECT * EXCLUDE ({SEQ}) FROM {outbox_table(table)} WHERE {SEQ} BETWEEN ? AND ? "
                       f"ORDER BY {SEQ}", params=[lo, hi]).to_arrow_table()

    def drop(self, table: str, hi: int) -> int:
        """Delete `table`'s rows numbered up to `hi` (they are in the lake), through the writer thread."""
        def delete(cur) -> int:
            cur.begin()
            try:
                n = cur.execute(f"DELETE FROM {outbox_table(table)} WHERE {SEQ} <= ?", [hi]).fetchall()[0][0]
                _set_state(cur, "seq_floor", str(max(int(_state(cur, "seq_floor") or 0), hi)))
                cur.commit()
            except BaseException:
                cur.rollback()
                raise
            return n
        return self.store.submit(delete).result()


def _host_slug() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40].strip("-.") or "collector"
