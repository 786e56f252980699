"""The DuckDB store: it persists and reads, nothing else (ingest and alerts: monitor/collector/ingest.py).
One process owns the file; a single writer thread inserts Arrow tables in bulk, a batch id is
stored once; reads use their own cursors (monitor/collector/reader.py). Tables: forksight.base.tables."""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from forksight.base.records import Records
from forksight.monitor.collector.dbfile import connect, duckdb_config
from forksight.monitor.collector.faults import Fault
from forksight.monitor.collector.ledger import Ledger
from forksight.monitor.collector.inserts import add_scalar_keys, add_token_steps, insert_arrow
from forksight.monitor.collector.words import WORDS_PER_STEP, add_words
from forksight.monitor.collector.store_health import StoreHealth
from forksight.monitor.collector.reader import STALE_AFTER_S, Reader
from forksight.monitor.collector.rollups import roll_up
from forksight.base.tables import DATA_TABLES
from forksight.monitor.collector.store_health import LakeOutbox

log = logging.getLogger("forksight.store")


# ---------------------------------------------------------------------------- writer
@dataclass
class WriteResult:
    """What one write did: stored False when its batch id was already stored."""

    stored: bool
    rows: dict[str, int] = field(default_factory=dict)


@dataclass
class Committed:
    """One write of a committed group, as an `after` hook sees it."""

    run_id: str
    records: Records
    result: WriteResult
    context: Any


@dataclass
class _WriteJob:
    run_id: str
    records: Records
    batch_id: str | None
    future: Future
    after: Callable[[Any, list["Committed"]], None] | None = None
    context: Any = None
    duplicate: bool = False
    conflict: str | None = None       # the batch id was stored with other content


class BatchConflict(ValueError):
    """A batch id already stored with different content (a batch id names one batch)."""


@dataclass
class _CallJob:
    fn: Callable
    future: Future


_STOP = object()
_MAX_GROUP_ROWS = 4_000_000   # rows merged into one transaction by the writer


def _one(cur, sql: str, params: Sequence) -> tuple | None:
    # fetch everything: DuckDB refuses new work on a cursor with an unfinished result
    rows = cur.execute(sql, list(params)).fetchall()
    return rows[0] if rows else None


class Store(StoreHealth):
    """Owns one DuckDB file: schema, the single writer thread, and `reader`."""

    def __init__(self, path: str, *, stale_after: float = STALE_AFTER_S, verify: bool = True,
                 memory_limit: str | None = None, threads: int | None = None, words_per_step: int = WORDS_PER_STEP):
        """verify: read every block once on open (about 25 ms per million token rows).
        memory_limit ('2GB', '512MiB') and threads cap DuckDB in this process (its defaults:
        80% of RAM, every core), e.g. a collector sharing a node with a training job.
        words_per_step: token strings kept per step in the words aggregate (by count and by fork share)."""
        if words_per_step < 1:
            raise ValueError(f"words_per_step must be >= 1, got {words_per_step}")
        self.words_per_step = words_per_step
        self.path = str(path)
        self._config = duckdb_config(memory_limit, threads)
        self._conn = connect(self.path, verify, self._config)
        self.reader = Reader(self._conn, stale_after=stale_after)
        self.reader.store_health = self.health
        self._ledger = Ledger(self.path, {t: _one(self._conn, f"SELECT count(*) FROM {t}", [])[0]
                                          for t in DATA_TABLES})
        self._fault: Fault | None = None        # why writes fail now (a full disk, an invalidated file)
        self._tried = 0.0
        self._queue: queue.Queue = queue.Queue()
        self._beat: dict[str, float] = {}
        self._keys: dict[str, set[str]] = {}     # scalar keys known to be in scalar_keys, per run
        self._on_close: list[Callable[[], None]] = []
        self._closed = False
        self.lake_outbox: LakeOutbox | None = None     # attach_lake's; read-only from outside
        self._wcur = self._conn.cursor()
        self._thread = threading.Thread(target=self._run, name="forksight-store-writer", daemon=True)
        self._thread.start()

    def attach_lake(self, outbox: "LakeOutbox", health: Callable[[], dict] | None = None) -> None:
        """The lake's declared hook (forksight.monitor.lake): every later write's rows are numbered by
        outbox.tag and recorded by outbox.put in the write's own transaction; health() joins /api/health."""
        self.lake_outbox, self.lake_health = outbox, health

    # -- public write API (each returns at once; the writer thread does the work)
    def write(self, run_id: str, records: Records, batch_id: str | None = None, *,
              after: Callable[[Any, list[Committed]], None] | None = None, context: Any = None) -> Future:
        """Queue one batch; the Future gives a WriteResult once it is committed.

        after(cursor, [Committed, ...]) runs on the writer thread once per committed group, with every
        write of the group that named it (in order), before their Futures resolve.
        """
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("store is closed"))
            return fut
        self._queue.put(_WriteJob(run_id, records, batch_id, fut, after, context))
        return fut

    def submit(self, fn: Callable[[Any], Any]) -> Future:
        """Queue fn(cursor) for the writer thread, in order with queued writes."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("store is closed"))
        elif threading.current_thread() is self._thread:
            self._do_call(_CallJob(fn, fut))      # already on the writer thread: run it now
        else:
            self._queue.put(_CallJob(fn, fut))
        return fut

    def read_cursor(self):
        """A cursor of its own for another thread's reads (close it after use)."""
        with self.reader._lock:
            return self._conn.cursor()

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(cursor) on the writer thread, in order with queued writes; return its result."""
        if self._closed:
            raise RuntimeError("store is closed")
        return self.submit(fn).result()

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call fn() when the store closes, after the queue is written (e.g. an alert hub's close)."""
        self._on_close.append(fn)

    def create_run(self, name: str, *, project: str = "default", strategy: str | None = None,
                   model: str | None = None, config: dict | None = None, run_id: str | None = None,
                   join: bool = False) -> str:
        """Create a run and return its id: `name` unless taken (then name-2, ...). run_id: exactly this
        id, updated if it exists. join: the newest live run named `name` (ranks > 0), else LookupError."""
        from forksight.base.limits import RUN_ID_PATTERN, RUN_ID_RE, slug_run_name

        for what, value in (("run name", name), ("run id", run_id)):
            if value is not None and not RUN_ID_RE.match(value):
                raise ValueError(f"{what} {value!r} must match {RUN_ID_PATTERN} (letters, digits, . _ -; "
                                 f"at most 128 characters), e.g. {slug_run_name(value)!r}")
        config_text = json.dumps(config, allow_nan=False) if config is not None else None

        def create(cur) -> str:
            now = time.time()
            if join:
                row = _one(cur, "SELECT run_id FROM runs WHERE name = ? AND status = 'live' AND heartbeat >= ? "
                           "ORDER BY created_at DESC LIMIT 1", [name, now - self.reader.stale_after])
                if row is None:
                    raise LookupError(f"no live run named {name!r} yet")
                return row[0]
            if run_id is not None and _one(cur, "SELECT 1 FROM runs WHERE run_id = ?", [run_id]):
                cur.execute("UPDATE runs SET status = 'live', heartbeat = ?, strategy = coalesce(?, strategy), "
                            "model = coalesce(?, model), config = coalesce(?, config) WHERE run_id = ?",
                            [now, strategy, model, config_text, run_id])
                return run_id
            new_id = run_id
            if new_id is None:
                taken = {r[0] for r in cur.execute(
                    "SELECT run_id FROM runs WHERE run_id = ? OR run_id LIKE ?", [name, f"{name}-%"]).fetchall()}
                new_id, k = name, 2
                while new_id in taken:
                    new_id, k = f"{name}-{k}", k + 1
            cur.execute("INSERT INTO runs (run_id, name, project, created_at, status, strategy, model, config, "
                        "heartbeat) VALUES (?, ?, ?, ?, 'live', ?, ?, ?, ?)",
                        [new_id, name, project, now, strategy, model, config_text, now])
            return new_id

        return self.call(create)

    def update_run(self, run_id: str, *, status: str | None = None, strategy: str | None = None,
                   model: str | None = None, config: dict | None = None) -> bool:
        """Change a run's status/metadata and refresh its heartbeat; False if no such run."""
        config_text = json.dumps(config, allow_nan=False) if config is not None else None
        return self.call(lambda cur: bool(cur.execute(
            "UPDATE runs SET status = coalesce(?, status), strategy = coalesce(?, strategy), "
            "model = coalesce(?, model), config = coalesce(?, config), heartbeat = ? WHERE run_id = ? RETURNING 1",
            [status, strategy, model, config_text, time.time(), run_id]).fetchall()))

    def heartbeat(self, run_id: str) -> bool:
        """Mark the run alive now (a 'crashed' run that beats again is live again)."""
        return self.call(lambda cur: bool(cur.execute(
            "UPDATE runs SET heartbeat = ?, status = CASE WHEN status = 'crashed' THEN 'live' ELSE status END "
            "WHERE run_id = ? RETURNING 1", [time.time(), run_id]).fetchall()))

    def flush(self) -> None:
        """Block until everything queued so far is written."""
        self.call(lambda cur: None)

    def close(self) -> None:
        """Write what is queued, stop the writer, run the close hooks, close the file."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        for fn in self._on_close:
            try:
                fn()
            except Exception:  # noqa: BLE001 - the file must still be closed
                log.exception("a close hook of %s failed", self.path)
        for thing in (self._wcur, self._conn):
            try:
                thing.close()
            except Exception:  # noqa: BLE001 - an invalidated database: its .wal stays for the next open
                log.warning("closing %s: %s", self.path, thing)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the writer thread
    def _run(self) -> None:
        pending: list = []
        while True:
            job = pending.pop(0) if pending else self._queue.get()
            if job is _STOP:
                return
            if self._fault is not None:
                self._recover()
            if isinstance(job, _CallJob):
                self._do_call(job)
                continue
            group, rows = [job], sum(job.records.num_rows().values())
            while rows < _MAX_GROUP_ROWS:          # merge what is already queued: one transaction
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if not isinstance(nxt, _WriteJob):
                    pending.append(nxt)
                    break
                group.append(nxt)
                rows += sum(nxt.records.num_rows().values())
            self._write_group(group)

    def _do_call(self, job: _CallJob) -> None:
        try:
            job.future.set_result(job.fn(self._wcur))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            job.future.set_exception(self._note(exc) or exc)

    def _write_group(self, jobs: list[_WriteJob]) -> None:
        cur = self._wcur
        new_keys: dict[str, set[str]] = {}     # scalar keys recorded by this group (kept on commit)
        try:
            cur.begin()
            seen: dict = {}
            for job in jobs:
                if job.batch_id is None:
                    continue
                key, digest = (job.run_id, job.batch_id), job.records.digest
                if key not in seen:
                    row = _one(cur, "SELECT digest FROM batches WHERE run_id = ? AND batch_id = ?", list(key))
                    if row is None:
                        seen[key] = digest
                        continue
                    seen[key] = row[0]
                job.duplicate = True
                if seen[key] is not None and digest is not None and seen[key] != digest:
                    job.conflict = (f"batch id {job.batch_id!r} of run {job.run_id!r} was stored before with "
                                    "other content; nothing of this one was stored: send new content under a new id")
            fresh = [j for j in jobs if not j.duplicate]
            outbox: list = []
            for run_id in dict.fromkeys(j.run_id for j in fresh):
                mine = [j for j in fresh if j.run_id == run_id]
                for name in DATA_TABLES:
                    parts = [t for j in mine if (t := getattr(j.records, name)) is not None and t.num_rows]
                    if parts:
                        # one contiguous chunk: DuckDB inserts it ~1.4x faster than many small ones
                        data = pa.concat_tables(parts).combine_chunks()
                        if self.lake_outbox is None:
                            insert_arrow(cur, name, data, run_id)
                        else:     # numbered for the lake, committed (or not) with the rows themselves
                            constants, entry = self.lake_outbox.tag(name, run_id, data)
                            insert_arrow(cur, name, data, run_id, constants)
                            if entry is not None:
                                outbox.append(entry)
                        if name == "tokens":     # the step list the tokens page reads, the words by step
                            add_token_steps(cur, run_id, pa.concat_arrays([pc.unique(t["step"]) for t in parts]))
                            add_words(cur, run_id, data, self.words_per_step)
                        if name == "scalars":    # the run's step span, kept on its row for the runs list
                            top = max(pc.max(t["step"]).as_py() for t in parts)
                            low = min(pc.min(t["step"]).as_py() for t in parts)
                            cur.execute("UPDATE runs SET last_step = greatest(coalesce(last_step, ?), ?), "
                                        "first_step = least(coalesce(first_step, ?), ?) WHERE run_id = ?",
                                        [top, top, low, low, run_id])
                            keys = set(pa.concat_arrays([pc.unique(t["key"]) for t in parts]).to_pylist())
                            if not keys <= self._keys.get(run_id, set()):     # known ones: no statement
                                add_scalar_keys(cur, run_id, pa.array(sorted(keys), pa.string()))
                                new_keys.setdefault(run_id, set()).update(keys)
                        if name in ("scalars", "histograms"):    # a first open reads these
                            roll_up(cur, name, run_id, data)
                if time.time() - self._beat.get(run_id, 0.0) > 1.0:    # ingest is a heartbeat
                    self._beat[run_id] = time.time()
                    cur.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?", [time.time(), run_id])
            if outbox:                   # one statement for the group: each costs ~1 ms on the writer
                self.lake_outbox.put(cur, outbox)
            ids = [j for j in fresh if j.batch_id is not None]
            if ids:
                insert_arrow(cur, "batches", pa.table({
                    "run_id": [j.run_id for j in ids], "batch_id": [j.batch_id for j in ids],
                    "received_at": pa.array([time.time()] * len(ids), pa.float64()),
                    "digest": pa.array([j.records.digest for j in ids], pa.string())}))
            cur.commit()
            for run_id, keys in new_keys.items():
                self._keys.setdefault(run_id, set()).update(keys)
        except Exception as exc:  # noqa: BLE001 - a failing batch must fail alone
            try:
                cur.rollback()
            except Exception:  # noqa: BLE001 - the transaction may already be gone
                pass
            size = sum(t.nbytes for j in jobs for n in DATA_TABLES if (t := getattr(j.records, n)) is not None)
            unavailable = self._note(exc, size)
            if unavailable is not None:      # a full disk or an invalidated file: every batch of the group
                for job in jobs:
                    job.future.set_exception(unavailable)
                return
            if len(jobs) > 1:
                for job in jobs:
                    self._write_group([job])
            else:
                log.warning("write of batch %s failed: %s", jobs[0].batch_id, exc)
                jobs[0].future.set_exception(exc)
            return
        self._fault = None if self._fault is None or self._fault.kind == "disk_full" else self._fault
        added: dict[str, int] = {}
        for job in fresh:
            for name, n in job.records.num_rows().items():
                added[name] = added.get(name, 0) + n
        self._ledger.count(added)
        done = [j for j in jobs if j.conflict is None]
        results = [WriteResult(stored=not j.duplicate, rows={} if j.duplicate else j.records.num_rows()) for j in done]
        hooks: dict = {}
        for job, result in zip(done, results):
            if job.after is not None:
                hooks.setdefault(job.after, []).append(Committed(job.run_id, job.records, result, job.context))
        for hook, committed in hooks.items():   # once per group: a backlog is judged in one pass
            try:
                hook(cur, committed)
            except Exception:  # noqa: BLE001 - the batches are stored; their callers still hear so
                log.exception("after-write hook failed for %d batch(es)", len(committed))
        for job in jobs:
            if job.conflict is not None:
                job.future.set_exception(BatchConflict(job.conflict))
        for job, result in zip(done, results):
            job.future.set_result(result)
