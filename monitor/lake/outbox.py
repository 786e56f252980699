"""The outbox in the collector's DuckDB file: every data row a write group stores carries, in the same
transaction, a sequence number (`_lake_seq`, a column the lake adds to the file's step tables), and
`lake_outbox` gets one small entry per sequence number (table, run, row count, steps), so a row the
collector acknowledged is either in the lake or waiting here. The rows are written once: the committer
reads an entry's rows back from the table by their number, in sequence order. (Entries a forksight
before this one wrote carry their rows as an Arrow IPC blob in `data`; they are read from it.)
`lake_outbox_<table>` views list the (run_id, step) of what waits."""
from __future__ import annotations

import re
import socket
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from forksight.monitor.lake.errors import LakeError
from forksight.monitor.lake.schema import STEP_TABLES

SEQ = "_lake_seq"
COLLECTOR_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_IPC = ipc.IpcWriteOptions(compression="lz4")
_STEP_NAMES = frozenset(s.name for s in STEP_TABLES)
ENTRIES_PER_INSERT = 64
MOVED = "lake_token_steps"    # the token steps `compact --to-lake` moved out of the file (move_tokens.py)


def outbox_table(name: str) -> str:
    """The view of `name`'s waiting (_lake_seq, run_id, step), one row per step of each entry."""
    return f"lake_outbox_{name}"


def outbox_sql() -> str:
    """DDL of the outbox and its views, the lake's state (collector id, the sequence floor) and the
    runs' last synced digests."""
    parts = [f"CREATE TABLE IF NOT EXISTS lake_outbox ({SEQ} BIGINT, tbl VARCHAR, run_id VARCHAR, nrows BIGINT, "
             "steps BIGINT[], data BLOB);",
             "CREATE TABLE IF NOT EXISTS lake_state (key VARCHAR PRIMARY KEY, value VARCHAR);",
             "CREATE TABLE IF NOT EXISTS lake_synced (run_id VARCHAR PRIMARY KEY, runs VARCHAR, alerts VARCHAR);"]
    parts += [f"CREATE OR REPLACE VIEW {outbox_table(s.name)} AS SELECT {SEQ}, run_id, unnest(steps) AS step "
              f"FROM lake_outbox WHERE tbl = '{s.name}';" for s in STEP_TABLES]
    return "\n".join(parts)


def _encode(data: pa.Table) -> bytes:
    """An entry's rows as the blob format of older outboxes (tests write such entries with it)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, data.schema, options=_IPC) as writer:
        writer.write_table(data)
    return sink.getvalue().to_pybytes()


def add_seq_columns(cur) -> None:
    """The step tables' `_lake_seq` column (null on rows stored without a lake)."""
    for name in sorted(_STEP_NAMES):
        cur.execute(f"ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {SEQ} BIGINT")


def refuse_thinning_unsent(conn, run_id: str) -> None:
    """LakeError when the outbox still holds token rows of `run_id`: they are read back from the file
    by number, so thinning them now would keep them out of the lake."""
    waiting = pending_rows(conn, "tokens", run_id)
    if waiting:
        raise LakeError(f"the lake has not got {waiting} token rows of run {run_id!r} yet (they wait in this file's "
                        "lake outbox): start `forksight serve` with its --lake-catalog until GET /api/health/lake "
                        "shows backlog 0, then compact")


def pending_rows(cur, table: str, run_id: str) -> int:
    """Rows of `run_id` in `table` the lake has not got yet (0 for a file that never had a lake)."""
    has = cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'lake_outbox'").fetchall()
    if not has[0][0]:
        return 0
    return int(cur.execute("SELECT coalesce(sum(nrows), 0) FROM lake_outbox WHERE tbl = ? AND run_id = ?",
                           [table, run_id]).fetchall()[0][0])


def _decode(blob: bytes, run_id: str) -> pa.Table:
    table = ipc.open_stream(pa.py_buffer(blob)).read_all()
    return table.add_column(0, "run_id", pa.array([run_id] * table.num_rows, pa.string()))


def _drop_row_outboxes(cur) -> None:
    # the first writer (one day in the repository) kept rows in tables of these names: empty ones go
    old = [r[0] for r in cur.execute("SELECT table_name FROM information_schema.tables WHERE table_type = "
                                     "'BASE TABLE' AND table_name LIKE 'lake_outbox_%'").fetchall()]
    for name in old:
        if cur.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]:
            raise LakeError(f"{name} holds rows of an older forksight's lake outbox: start that version until "
                            "its backlog has drained (GET /api/health/lake), then this one")
        cur.execute(f"DROP TABLE {name}")


def _state(cur, key: str) -> str | None:
    rows = cur.execute("SELECT value FROM lake_state WHERE key = ?", [key]).fetchall()
    return rows[0][0] if rows else None


def _set_state(cur, key: str, value: str) -> None:
    cur.execute("INSERT OR REPLACE INTO lake_state VALUES (?, ?)", [key, value])


def backlog(cur) -> dict[str, int]:
    """Rows waiting per table."""
    waiting = dict(cur.execute("SELECT tbl, sum(nrows)::BIGINT FROM lake_outbox GROUP BY tbl").fetchall())
    return {s.name: int(waiting.get(s.name) or 0) for s in STEP_TABLES}


class Outbox:
    """The store's `lake_outbox` hook and the outbox's reads and deletes. The hook runs on the
    store's writer thread inside the write's transaction; so do `drop` and the setup."""

    def __init__(self, store, collector_id: str | None):
        self.store = store
        self.collector_id, self._next = store.call(lambda cur: self._setup(cur, collector_id))

    def _setup(self, cur, wanted: str | None) -> tuple[str, int]:
        _drop_row_outboxes(cur)
        cur.execute(outbox_sql())
        add_seq_columns(cur)
        stored = _state(cur, "collector_id")
        if wanted is not None and not COLLECTOR_ID_RE.match(wanted):
            raise LakeError(f"--collector-id {wanted!r}: use 1-64 letters, digits, . _ - (starting with a letter "
                            "or digit), e.g. the host's name")
        if wanted is not None and stored is not None and wanted != stored:
            _refuse_new_id(cur, stored, wanted)
        collector = wanted or stored or f"{_host_slug()}-{uuid.uuid4().hex[:8]}"
        _set_state(cur, "collector_id", collector)
        top = max(int(_state(cur, "seq_floor") or 0),
                  cur.execute(f"SELECT coalesce(max({SEQ}), 0) FROM lake_outbox").fetchall()[0][0])
        return collector, top + 1

    def raise_floor(self, committed: int) -> None:
        """The lake holds sequence numbers up to `committed` for this collector (e.g. a new DuckDB file
        under a reused collector id): number new rows past it, so none is mistaken for committed."""
        def bump(cur) -> None:
            self._next = max(self._next, committed + 1)
            _set_state(cur, "seq_floor", str(self._next - 1))
        self.store.call(bump)

    # -- on the writer thread, inside the write's transaction
    def tag(self, table: str, run_id: str, data: pa.Table) -> tuple[dict, list | None]:
        """(the columns to give every row of `data` when it is inserted: its sequence number in
        `_lake_seq`, the outbox entry to `put`); a table the lake does not keep: ({}, None). The number
        goes in as one SQL constant, not a column built here (measured ~4% of ingest)."""
        if table not in _STEP_NAMES:
            return {}, None
        seq, self._next = self._next, self._next + 1   # a rolled-back group leaves a gap: harmless
        return {SEQ: seq}, [seq, table, run_id, data.num_rows, pc.unique(data["step"]).to_pylist(), None]

    def put(self, cur, entries: list[list]) -> None:
        """The write group's entries, one INSERT per ENTRIES_PER_INSERT (a statement costs the writer
        about a millisecond)."""
        for i in range(0, len(entries), ENTRIES_PER_INSERT):
            part = entries[i:i + ENTRIES_PER_INSERT]
            cur.execute("INSERT INTO lake_outbox VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(part)),
                        [v for row in part for v in row])

    # -- the committer's side
    def sequences(self, cur, table: str) -> list[tuple[int, int]]:
        """(sequence number, rows) waiting in `table`'s outbox, oldest first."""
        return cur.execute(f"SELECT {SEQ}, nrows FROM lake_outbox WHERE tbl = ? ORDER BY 1", [table]).fetchall()

    def rows(self, cur, table: str, lo: int, hi: int) -> pa.Table:
        """The rows numbered lo..hi, with their run_id: read back from `table` by their number (sorted
        by number and step: the lake's files stay ordered by step), and any older entry's blob."""
        from forksight.base.tables import TABLES

        cols = ", ".join(TABLES[table].names)
        parts = [cur.sql(f"SELECT {cols} FROM {table} WHERE {SEQ} BETWEEN ? AND ? ORDER BY {SEQ}, step",
                         params=[lo, hi]).to_arrow_table()]
        parts += [_decode(blob, run_id) for run_id, blob in cur.execute(
            f"SELECT run_id, data FROM lake_outbox WHERE tbl = ? AND {SEQ} BETWEEN ? AND ? AND data IS NOT NULL "
            f"ORDER BY {SEQ}", [table, lo, hi]).fetchall()]
        return pa.concat_tables(parts, promote_options="permissive")

    def drop(self, table: str, hi: int) -> int:
        """Delete `table`'s rows numbered up to `hi` (they are in the lake), through the writer thread;
        how many rows."""
        def delete(cur) -> int:
            cur.begin()
            try:
                n = sum(r[0] for r in cur.execute(f"DELETE FROM lake_outbox WHERE tbl = ? AND {SEQ} <= ? "
                                                  "RETURNING nrows", [table, hi]).fetchall())
                _set_state(cur, "seq_floor", str(max(int(_state(cur, "seq_floor") or 0), hi)))
                cur.commit()
            except BaseException:
                cur.rollback()
                raise
            return n
        return self.store.submit(delete).result()


def _refuse_new_id(cur, stored: str, wanted: str) -> None:
    """LakeError when this file has a history in the lake under `stored`: its runs, alerts and moved token
    steps are the lake's rows of collector `stored`, and a new id would show them twice (name@stored
    beside the new id's) and read the moved steps empty. A file that never wrote to the lake may change."""
    waiting = sum(backlog(cur).values())
    synced = cur.execute("SELECT count(*) FROM lake_synced").fetchall()[0][0]
    has_moved = cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                            [MOVED]).fetchall()[0][0]
    moved = cur.execute(f"SELECT count(*) FROM {MOVED}").fetchall()[0][0] if has_moved else 0
    floor = int(_state(cur, "seq_floor") or 0)
    if waiting or synced or moved or floor:
        raise LakeError(f"--collector-id {wanted}: this DuckDB file's runs are in the lake as collector {stored!r} "
                        f"({synced} runs synced, {waiting} rows waiting, {moved} token steps moved to the lake); "
                        f"a new id would list them twice and lose the moved steps. Start with --collector-id "
                        f"{stored} (or without --collector-id), or start the new id on a new --db file")


def _host_slug() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:40].strip("-.") or "collector"
