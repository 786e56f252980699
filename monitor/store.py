"""The DuckDB store: schema and the single writer thread (reads: monitor/reader.py).

One process owns the file (DuckDB lets no second process open it). Writes go through a queue
drained by one thread that inserts registered Arrow tables in bulk (never executemany); a
batch id seen twice is stored once, checked in the same transaction as the data. Reads use
their own cursor of the same connection, so routes, dashboard and tests read concurrently.
Times are unix seconds (DOUBLE).
"""
from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

# the store's public names, wherever they live (producers import them from here)
from forksight.monitor.reader import PERCENTILE_KEY, STALE_AFTER_S, Reader, histogram_quantile  # noqa: F401
from forksight.monitor.records import (  # noqa: F401
    ALERTS_SCHEMA, ALL_TABLES, DATA_TABLES, HISTOGRAMS_SCHEMA, SAMPLES_SCHEMA, SCALARS_SCHEMA, SCHEMAS,
    TOKENS_SCHEMA, RecordError, Records, histograms_table, samples_table, scalars_table, tokens_table,
)

log = logging.getLogger("forksight.store")

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, name VARCHAR, project VARCHAR, created_at DOUBLE,
    status VARCHAR, strategy VARCHAR, model VARCHAR, config VARCHAR, heartbeat DOUBLE);
CREATE TABLE IF NOT EXISTS scalars (
    run_id VARCHAR, step BIGINT, key VARCHAR, value DOUBLE, wall_time DOUBLE,
    rank INTEGER, weight DOUBLE);
CREATE TABLE IF NOT EXISTS tokens (
    run_id VARCHAR, step BIGINT, rank INTEGER, sample_id BIGINT, pos INTEGER,
    token_id INTEGER, token VARCHAR, entropy FLOAT, renyi2 FLOAT, js FLOAT, logp FLOAT,
    top1 FLOAT, fork BOOLEAN, selected BOOLEAN);
CREATE TABLE IF NOT EXISTS samples (
    run_id VARCHAR, step BIGINT, rank INTEGER, sample_id BIGINT, group_id BIGINT,
    prompt VARCHAR, completion VARCHAR, reward DOUBLE, correct BOOLEAN, length INTEGER,
    source VARCHAR);
CREATE TABLE IF NOT EXISTS histograms (
    run_id VARCHAR, step BIGINT, rank INTEGER, key VARCHAR, bin_lo DOUBLE, bin_hi DOUBLE,
    count DOUBLE);
CREATE TABLE IF NOT EXISTS alerts (
    run_id VARCHAR, step BIGINT, wall_time DOUBLE, detector VARCHAR, severity VARCHAR,
    message VARCHAR, value DOUBLE, threshold DOUBLE, forecast BIGINT, action VARCHAR);
CREATE TABLE IF NOT EXISTS batches (
    run_id VARCHAR, batch_id VARCHAR, received_at DOUBLE, PRIMARY KEY (run_id, batch_id));
"""


# ---------------------------------------------------------------------------- writer
@dataclass
class WriteResult:
    """What one write did: stored False when its batch id was already stored."""

    stored: bool
    rows: dict[str, int] = field(default_factory=dict)
    alerts: list[dict] = field(default_factory=list)


@dataclass
class _WriteJob:
    run_id: str
    records: Records
    batch_id: str | None
    future: Future
    duplicate: bool = False


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


def _load_alert_hub():
    try:
        from forksight.monitor.alerts import AlertHub
    except ModuleNotFoundError as exc:
        if exc.name != "forksight.monitor.alerts":
            raise
        return None
    return AlertHub()


class Store:
    """Owns one DuckDB file: schema, the single writer thread, and `reader`."""

    def __init__(self, path: str, *, alerts: bool = True, hub=None, stale_after: float = STALE_AFTER_S):
        import duckdb

        self.path = str(path)
        try:
            self._conn = duckdb.connect(self.path)
        except duckdb.IOException as exc:
            raise RuntimeError(
                f"cannot open {self.path}: {exc}. Another process (likely `forksight serve`) owns it; "
                "stream to that collector with url=... instead of db=...") from None
        self._conn.execute("SET enable_progress_bar = false")   # a collector's log is no terminal
        self._conn.execute(SCHEMA_SQL)
        self.reader = Reader(self._conn, stale_after=stale_after)
        self.hub = hub if hub is not None else (_load_alert_hub() if alerts else None)
        self._queue: queue.Queue = queue.Queue()
        self._last_alert_step: dict[str, int] = {}
        self._pending: dict[str, dict[int, _PendingStep]] = {}
        self._beat: dict[str, float] = {}
        self._vocab: dict[str, int | None] = {}
        self._closed = False
        self._wcur = self._conn.cursor()
        self._thread = threading.Thread(target=self._run, name="forksight-store-writer", daemon=True)
        self._thread.start()

    # -- public write API (each returns at once; the writer thread does the work)
    def write(self, run_id: str, records: Records, batch_id: str | None = None) -> Future:
        """Queue one batch; the Future gives a WriteResult once it is committed."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(RuntimeError("store is closed"))
            return fut
        self._queue.put(_WriteJob(run_id, records, batch_id, fut))
        return fut

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run fn(cursor) on the writer thread, in order with queued writes; return its result."""
        if self._closed:
            raise RuntimeError("store is closed")
        fut: Future = Future()
        self._queue.put(_CallJob(fn, fut))
        return fut.result()

    def create_run(self, name: str, *, project: str = "default", strategy: str | None = None,
                   model: str | None = None, config: dict | None = None, run_id: str | None = None,
                   join: bool = False) -> str:
        """Create a run and return its id: `name` unless taken (then name-2, name-3, ...).

        run_id: create exactly this id, or update it if it exists. join: return the newest live
        run named `name` (ranks > 0), LookupError when there is none.
        """
        from forksight.monitor.schema import RUN_ID_PATTERN, RUN_ID_RE, slug_run_name

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
                self._vocab.pop(run_id, None)
                return run_id
            new_id = run_id
            if new_id is None:
                taken = {r[0] for r in cur.execute(
                    "SELECT run_id FROM runs WHERE run_id = ? OR run_id LIKE ?", [name, f"{name}-%"]).fetchall()}
                new_id, k = name, 2
                while new_id in taken:
                    new_id, k = f"{name}-{k}", k + 1
            cur.execute("INSERT INTO runs VALUES (?, ?, ?, ?, 'live', ?, ?, ?, ?)",
                        [new_id, name, project, now, strategy, model, config_text, now])
            return new_id

        return self.call(create)

    def update_run(self, run_id: str, *, status: str | None = None, strategy: str | None = None,
                   model: str | None = None, config: dict | None = None) -> list[dict] | None:
        """Change a run's status/metadata and refresh its heartbeat; None if no such run.

        Returns the alerts raised by ending the run (its last step is evaluated then).
        """
        config_text = json.dumps(config, allow_nan=False) if config is not None else None

        def update(cur) -> list[dict] | None:
            if not _one(cur, "SELECT 1 FROM runs WHERE run_id = ?", [run_id]):
                return None
            cur.execute("UPDATE runs SET status = coalesce(?, status), strategy = coalesce(?, strategy), "
                        "model = coalesce(?, model), config = coalesce(?, config), heartbeat = ? WHERE run_id = ?",
                        [status, strategy, model, config_text, time.time(), run_id])
            self._vocab.pop(run_id, None)
            if status is not None and status != "live":        # the run ended: its last step is complete
                return self._run_alerts([], final=run_id).get(id(None), [])
            return []

        return self.call(update)

    def heartbeat(self, run_id: str) -> bool:
        """Mark the run alive now (a 'crashed' run that beats again is live again)."""
        return self.call(lambda cur: bool(cur.execute(
            "UPDATE runs SET heartbeat = ?, status = CASE WHEN status = 'crashed' THEN 'live' ELSE status END "
            "WHERE run_id = ? RETURNING 1", [time.time(), run_id]).fetchall()))

    def flush(self) -> None:
        """Block until everything queued so far is written."""
        self.call(lambda cur: None)

    def close(self) -> None:
        """Write what is queued, stop the writer, close the hub and the file."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        if self.hub is not None and hasattr(self.hub, "close"):
            self.hub.close()
        self._wcur.close()
        self._conn.close()

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
            job.future.set_exception(exc)

    def _write_group(self, jobs: list[_WriteJob]) -> None:
        cur = self._wcur
        try:
            cur.begin()
            seen: set = set()
            for job in jobs:
                if job.batch_id is None:
                    continue
                key = (job.run_id, job.batch_id)
                job.duplicate = key in seen or _one(
                    cur, "SELECT 1 FROM batches WHERE run_id = ? AND batch_id = ?", list(key)) is not None
                seen.add(key)
            fresh = [j for j in jobs if not j.duplicate]
            for run_id in dict.fromkeys(j.run_id for j in fresh):
                if run_id not in self._last_alert_step:
                    row = _one(cur, "SELECT max(step) FROM scalars WHERE run_id = ?", [run_id])
                    self._last_alert_step[run_id] = -1 if row[0] is None else int(row[0])
                mine = [j for j in fresh if j.run_id == run_id]
                for name in DATA_TABLES:
                    parts = [t for j in mine if (t := getattr(j.records, name)) is not None and t.num_rows]
                    if parts:
                        # one contiguous chunk: DuckDB inserts it ~1.4x faster than many small ones
                        self._insert(cur, name, run_id, pa.concat_tables(parts).combine_chunks())
                if time.time() - self._beat.get(run_id, 0.0) > 1.0:    # ingest is a heartbeat
                    self._beat[run_id] = time.time()
                    cur.execute("UPDATE runs SET heartbeat = ? WHERE run_id = ?", [time.time(), run_id])
            ids = [(j.run_id, j.batch_id) for j in fresh if j.batch_id is not None]
            if ids:
                now = time.time()
                self._insert(cur, "batches", None, pa.table({
                    "run_id": [r for r, _ in ids], "batch_id": [b for _, b in ids],
                    "received_at": pa.array([now] * len(ids), pa.float64())}))
            cur.commit()
        except Exception as exc:  # noqa: BLE001 - a failing batch must fail alone
            try:
                cur.rollback()
            except Exception:  # noqa: BLE001 - the transaction may already be gone
                pass
            if len(jobs) > 1:
                for job in jobs:
                    self._write_group([job])
            else:
                log.warning("write of batch %s failed: %s", jobs[0].batch_id, exc)
                jobs[0].future.set_exception(exc)
            return
        alerts = self._run_alerts(fresh)
        for job in jobs:
            job.future.set_result(WriteResult(stored=not job.duplicate,
                                              rows={} if job.duplicate else job.records.num_rows(),
                                              alerts=alerts.get(id(job), [])))

    @staticmethod
    def _insert(cur, table: str, run_id: str | None, data: pa.Table) -> None:
        cur.register("_forksight_in", data)
        try:
            if run_id is None:
                cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _forksight_in")
            else:
                cur.execute(f"INSERT INTO {table} BY NAME SELECT ?::VARCHAR AS run_id, * FROM _forksight_in", [run_id])
        finally:
            cur.unregister("_forksight_in")

    def _vocab_size(self, run_id: str) -> int | None:
        if run_id not in self._vocab:
            row = _one(self._wcur, "SELECT config FROM runs WHERE run_id = ?", [run_id])
            config = json.loads(row[0]) if row and row[0] else {}
            vocab = config.get("vocab_size") if isinstance(config, dict) else None
            self._vocab[run_id] = int(vocab) if isinstance(vocab, (int, float)) else None
        return self._vocab[run_id]

    def _run_alerts(self, jobs: list[_WriteJob], final: str | None = None) -> dict[int, list[dict]]:
        """Feed complete steps (rank-merged) to the hub; store and route the alerts it returns.

        A step is complete once a later step arrives (or the run ends, `final`): by then all of
        its scalars, from several calls or ranks, are in. Merging happens here in memory, so
        alerts cost no query per step.
        """
        out: dict[int, list[dict]] = {}
        if self.hub is None:
            return out
        rows_all: list[dict] = []
        runs: dict[str, _WriteJob | None] = {final: None} if final else {}
        for job in jobs:
            pending = self._pending.setdefault(job.run_id, {})
            last = self._last_alert_step.get(job.run_id, -1)
            if job.records.scalars is not None and job.records.scalars.num_rows:
                t = job.records.scalars
                for step, key, value, rank, weight in zip(*(t[c].to_pylist() for c in
                                                            ("step", "key", "value", "rank", "weight"))):
                    if step > last:
                        pending.setdefault(step, _PendingStep()).add(key, value, rank, weight)
                runs[job.run_id] = job
            h = job.records.histograms
            if h is not None and h.num_rows:
                for step, key, lo, hi, count in zip(*(h[c].to_pylist() for c in
                                                      ("step", "key", "bin_lo", "bin_hi", "count"))):
                    if key == "entropy" and step > last:
                        pending.setdefault(step, _PendingStep()).add_bin(lo, hi, count)
        for run_id, job in runs.items():
            pending = self._pending.get(run_id, {})
            newest = max(pending, default=None)
            ready = sorted(s for s in pending if run_id == final or s < newest)
            for step in ready:
                merged = pending.pop(step).merged()
                self._last_alert_step[run_id] = step
                if not merged:
                    continue
                try:
                    rows = self.hub.on_step(run_id, step, merged, self._vocab_size(run_id)) or []
                except Exception:  # noqa: BLE001 - a detector bug must not stop ingest
                    log.exception("alert hub failed on run %s step %s", run_id, step)
                    rows = []
                for row in rows:
                    # JSON answers cannot carry NaN/inf: a non-finite alert field becomes null
                    row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                           for k, v in row.items()}
                    row["run_id"] = run_id
                    row.setdefault("step", step)
                    row.setdefault("wall_time", time.time())
                    out.setdefault(id(job), []).append(row)
                    rows_all.append(row)
        if rows_all:
            table = pa.Table.from_pylist([{k: r.get(k) for k in ALERTS_SCHEMA.names} for r in rows_all],
                                         schema=ALERTS_SCHEMA)
            try:
                self._insert(self._wcur, "alerts", None, table)
            except Exception:  # noqa: BLE001
                log.exception("could not store %d alert(s)", len(rows_all))
        return out


class _PendingStep:
    """One step's scalars and entropy histogram as they arrive, merged across ranks in memory."""

    __slots__ = ("sums", "ranks", "bins")

    def __init__(self):
        self.sums: dict[str, list[float]] = {}     # key -> [sum w*v, sum w]
        self.ranks: set[int] = set()
        self.bins: dict[tuple[float, float], float] = {}

    def add(self, key: str, value: float, rank: int, weight: float | None) -> None:
        w = 1.0 if weight is None else weight
        acc = self.sums.setdefault(key, [0.0, 0.0, 0.0, 0])
        acc[0] += w * value
        acc[1] += w
        acc[2] += value
        acc[3] += 1
        self.ranks.add(rank)

    def add_bin(self, lo: float, hi: float, count: float) -> None:
        self.bins[(lo, hi)] = self.bins.get((lo, hi), 0.0) + count

    def merged(self) -> dict[str, float]:
        """Token-weighted means (same rule as Reader.read_scalars); percentiles from bins with >1 rank."""
        out = {k: (a[0] / a[1] if a[1] > 0 else a[2] / a[3]) for k, a in self.sums.items()}
        if len(self.ranks) > 1 and self.bins:
            edges = sorted(self.bins)
            lo, hi = np.array([e[0] for e in edges]), np.array([e[1] for e in edges])
            counts = np.array([self.bins[e] for e in edges])
            for key in out:
                m = PERCENTILE_KEY.match(key)
                if m:
                    out[key] = histogram_quantile(lo, hi, counts, int(m.group(1)) / 100.0)
        return out
