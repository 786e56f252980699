"""The DuckDB store: schema, the single writer thread, and the ONE read interface.

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
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from monitor.schema import MAX_TEXT_CHARS, MAX_TOKEN_CHARS, MAX_TOKEN_ROWS, TOKEN_COLUMNS

if TYPE_CHECKING:                      # pandas loads with the first read, not in every producer
    import pandas as pd

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

DATA_TABLES = ("scalars", "tokens", "samples", "histograms")
ALL_TABLES = ("runs", *DATA_TABLES, "alerts", "batches")

# Arrow schemas of what the writer inserts (run_id is added by the INSERT itself).
SCALARS_SCHEMA = pa.schema([("step", pa.int64()), ("key", pa.string()), ("value", pa.float64()),
                            ("wall_time", pa.float64()), ("rank", pa.int32()), ("weight", pa.float64())])
TOKENS_SCHEMA = pa.schema([("step", pa.int64()), ("rank", pa.int32())]
                          + [(n, pa.type_for_alias(t)) for n, (t, _) in TOKEN_COLUMNS.items() if n != "step"])
SAMPLES_SCHEMA = pa.schema([("step", pa.int64()), ("rank", pa.int32()), ("sample_id", pa.int64()),
                            ("group_id", pa.int64()), ("prompt", pa.string()), ("completion", pa.string()),
                            ("reward", pa.float64()), ("correct", pa.bool_()), ("length", pa.int32()),
                            ("source", pa.string())])
HISTOGRAMS_SCHEMA = pa.schema([("step", pa.int64()), ("rank", pa.int32()), ("key", pa.string()),
                               ("bin_lo", pa.float64()), ("bin_hi", pa.float64()), ("count", pa.float64())])
ALERTS_SCHEMA = pa.schema([("run_id", pa.string()), ("step", pa.int64()), ("wall_time", pa.float64()),
                           ("detector", pa.string()), ("severity", pa.string()), ("message", pa.string()),
                           ("value", pa.float64()), ("threshold", pa.float64()), ("forecast", pa.int64()),
                           ("action", pa.string())])
SCHEMAS = {"scalars": SCALARS_SCHEMA, "tokens": TOKENS_SCHEMA, "samples": SAMPLES_SCHEMA,
           "histograms": HISTOGRAMS_SCHEMA}

PERCENTILE_KEY = re.compile(r"^entropy/p(\d{1,2})$")   # recomputed from merged histograms
STALE_AFTER_S = 120.0                                  # a live run silent this long is 'crashed'


class RecordError(ValueError):
    """A record that cannot be stored as given; the message names the field and the fix."""


# ---------------------------------------------------------------------------- records -> Arrow
@dataclass
class Records:
    """One batch's rows, one Arrow table per data table (None when the batch has none)."""

    scalars: pa.Table | None = None
    tokens: pa.Table | None = None
    samples: pa.Table | None = None
    histograms: pa.Table | None = None

    def tables(self) -> Iterable[tuple[str, pa.Table]]:
        for name in DATA_TABLES:
            table = getattr(self, name)
            if table is not None and table.num_rows:
                yield name, table

    def num_rows(self) -> dict[str, int]:
        return {name: table.num_rows for name, table in self.tables()}


def _check_finite(table: pa.Table, where: str) -> None:
    # numpy, not pyarrow.compute: per-call overhead matters for the many small per-step tables
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_floating(col.type) and col.null_count < len(col):
            values = (pc.drop_null(col) if col.null_count else col).to_numpy()
            bad = values.size - int(np.count_nonzero(np.isfinite(values)))
            if bad:
                raise RecordError(f"{where}.{name}: {bad} non-finite value(s) (NaN/inf); send finite numbers or null")


def _check_text(table: pa.Table, column: str, limit: int, where: str) -> None:
    if column in table.column_names and table.num_rows:
        longest = pc.max(pc.utf8_length(table[column])).as_py()
        if longest is not None and longest > limit:
            raise RecordError(f"{where}.{column}: a value has {longest} characters; the limit is {limit}")


def scalars_table(rows: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Rows of {step, key, value, weight?, wall_time?} -> the scalars Arrow table."""
    now = time.time()
    table = pa.table({
        "step": pa.array([r["step"] for r in rows], pa.int64()),
        "key": pa.array([r["key"] for r in rows], pa.string()),
        "value": pa.array([r["value"] for r in rows], pa.float64()),
        "wall_time": pa.array([r.get("wall_time") or now for r in rows], pa.float64()),
        "rank": pa.array([r.get("rank", rank) for r in rows], pa.int32()),
        "weight": pa.array([r.get("weight") for r in rows], pa.float64()),
    }, schema=SCALARS_SCHEMA)
    _check_finite(table, "scalars")
    return table


def samples_table(rows: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Rows of sample dicts (step, sample_id, group_id, prompt, completion, ...) -> Arrow."""
    cols = {name: [r.get(name) for r in rows] for name in SAMPLES_SCHEMA.names}
    cols["rank"] = [r.get("rank", rank) for r in rows]
    try:
        table = pa.table(cols, schema=SAMPLES_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise RecordError(f"samples: {exc}") from None
    for col in ("prompt", "completion"):
        _check_text(table, col, MAX_TEXT_CHARS, "samples")
    _check_finite(table, "samples")
    return table


def histograms_table(items: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Items of {step, key, counts, edges} -> long rows (step, rank, key, bin_lo, bin_hi, count)."""
    step, key, lo, hi, count = [], [], [], [], []
    for item in items:
        counts = np.asarray(item["counts"], dtype=np.float64)
        edges = np.asarray(item["edges"], dtype=np.float64)
        if edges.shape != (counts.size + 1,):
            raise RecordError(f"histograms[{item['key']!r}]: edges must have len(counts)+1 values")
        n = counts.size
        step.append(np.full(n, item["step"], np.int64))
        key.extend([item["key"]] * n)
        lo.append(edges[:-1])
        hi.append(edges[1:])
        count.append(counts)
    cat = (lambda parts, dt: np.concatenate(parts) if parts else np.zeros(0, dt))
    table = pa.table({
        "step": cat(step, np.int64), "rank": pa.array(np.full(len(key), rank, np.int32)),
        "key": pa.array(key, pa.string()), "bin_lo": cat(lo, np.float64),
        "bin_hi": cat(hi, np.float64), "count": cat(count, np.float64),
    }, schema=HISTOGRAMS_SCHEMA)
    _check_finite(table, "histograms")
    return table


def tokens_table(data: pa.Table | Mapping[str, Any], *, step: int | None = None, rank: int = 0) -> pa.Table:
    """Per-token columns (Arrow table or dict of equal-length arrays) -> the tokens table.

    Refuses unknown or missing columns, uncastable types, NaN/inf and over-long token text.
    """
    if not isinstance(data, pa.Table):
        cols = {}
        for name, values in data.items():
            if hasattr(values, "detach"):          # torch tensors, without importing torch
                values = values.detach().cpu().numpy()
            cols[name] = values
        if step is not None:
            n = len(next(iter(cols.values()))) if cols else 0
            cols["step"] = np.full(n, step, np.int64)
        try:
            data = pa.table(cols)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as exc:
            raise RecordError(f"tokens: {exc}") from None
    elif step is not None and "step" not in data.column_names:
        data = data.append_column("step", pa.array(np.full(data.num_rows, step, np.int64)))
    unknown = sorted(set(data.column_names) - set(TOKEN_COLUMNS) - {"rank"})
    if unknown:
        raise RecordError(f"tokens: unknown column(s) {unknown}; allowed: {sorted(TOKEN_COLUMNS)}")
    missing = [n for n, (_, req) in TOKEN_COLUMNS.items() if req and n not in data.column_names]
    if missing:
        raise RecordError(f"tokens: missing required column(s) {missing}")
    if data.num_rows > MAX_TOKEN_ROWS:
        raise RecordError(f"tokens: {data.num_rows} rows; the limit is {MAX_TOKEN_ROWS} per batch: split it")
    n = data.num_rows
    arrays = []
    for f in TOKENS_SCHEMA:
        if f.name in data.column_names:
            col = data[f.name]
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise RecordError(f"tokens.{f.name}: cannot be read as {f.type}: {exc}") from None
        elif f.name == "rank":
            col = pa.array(np.full(n, rank, np.int32))
        else:
            col = pa.nulls(n, f.type)
        arrays.append(col)
    table = pa.Table.from_arrays(arrays, schema=TOKENS_SCHEMA)
    for name in ("step", "sample_id", "pos"):
        if table[name].null_count:
            raise RecordError(f"tokens.{name}: null values; every row needs {name}")
        if n and pc.min(table[name]).as_py() < 0:
            raise RecordError(f"tokens.{name}: negative values; {name} counts from 0")
    _check_finite(table, "tokens")
    _check_text(table, "token", MAX_TOKEN_CHARS, "tokens")
    return table


def histogram_quantile(lo: np.ndarray, hi: np.ndarray, counts: np.ndarray, q: float) -> float:
    """Quantile q of a histogram, linear inside the bin (how ranks' percentiles are merged)."""
    cum = np.cumsum(counts)
    if not cum.size or cum[-1] <= 0:
        return float("nan")
    target = q * cum[-1]
    i = int(min(np.searchsorted(cum, target, side="left"), cum.size - 1))
    before = cum[i - 1] if i else 0.0
    frac = (target - before) / counts[i] if counts[i] > 0 else 0.0
    return float(lo[i] + frac * (hi[i] - lo[i]))


# ---------------------------------------------------------------------------- reader
class Reader:
    """The one read interface (TensorBoard's DataProvider is the model). Thread-safe."""

    def __init__(self, conn, stale_after: float = STALE_AFTER_S):
        self._conn = conn
        self._lock = threading.Lock()
        self.stale_after = stale_after

    def _query(self, sql: str, params: Sequence | None = None) -> pd.DataFrame:
        with self._lock:
            cur = self._conn.cursor()     # own connection per call: concurrent reads are safe
        try:
            return cur.execute(sql, params or []).df()
        finally:
            cur.close()

    def list_runs(self) -> pd.DataFrame:
        """All runs, newest first, with status derived from heartbeat age."""
        return self._query("""
            SELECT r.run_id, r.name, r.project, r.strategy, r.model,
                   CASE WHEN r.status = 'live' AND r.heartbeat < ? THEN 'crashed' ELSE r.status END AS status,
                   r.created_at, r.heartbeat,
                   (SELECT max(s.step) FROM scalars s WHERE s.run_id = r.run_id) AS last_step,
                   r.config
            FROM runs r ORDER BY r.created_at DESC, r.run_id""", [time.time() - self.stale_after])

    def run(self, run_id: str) -> dict | None:
        """One run's row as a dict (config parsed), or None."""
        runs = self.list_runs()
        row = runs[runs.run_id == run_id]
        if row.empty:
            return None
        out = row.iloc[0].to_dict()
        out["config"] = json.loads(out["config"]) if out.get("config") else None
        return out

    def has_run(self, run_id: str) -> bool:
        return bool(len(self._query("SELECT 1 FROM runs WHERE run_id = ?", [run_id])))

    def scalar_keys(self, run_id: str) -> list[str]:
        df = self._query("SELECT DISTINCT key FROM scalars WHERE run_id = ? ORDER BY key", [run_id])
        return df["key"].tolist()

    def read_scalars(self, run_id: str, keys: Sequence[str] | None = None, downsample: int = 1000,
                     since_step: int | None = None) -> pd.DataFrame:
        """(key, step, value, wall_time) with ranks merged by weighted mean; ≤ downsample points per key."""
        where, params = self._scalar_filter(run_id, keys, since_step)
        df = self._query(f"""
            WITH merged AS (
                SELECT key, step,
                       CASE WHEN sum(coalesce(weight, 1)) > 0
                            THEN sum(value * coalesce(weight, 1)) / sum(coalesce(weight, 1))
                            ELSE avg(value) END AS value,
                       max(wall_time) AS wall_time, count(DISTINCT rank) AS ranks
                FROM scalars WHERE {where} GROUP BY key, step),
            ranked AS (
                SELECT *, row_number() OVER (PARTITION BY key ORDER BY step) AS rn,
                       count(*) OVER (PARTITION BY key) AS n FROM merged)
            SELECT key, step, value, wall_time, ranks FROM ranked
            WHERE (rn - 1) % greatest(1, CAST(ceil(n / ?) AS BIGINT)) = 0 OR rn = n
            ORDER BY key, step""", [*params, max(1, int(downsample))])
        df = self._merge_percentiles(run_id, df)
        return df.drop(columns="ranks").reset_index(drop=True)

    @staticmethod
    def _scalar_filter(run_id, keys, since_step) -> tuple[str, list]:
        where, params = ["run_id = ?"], [run_id]
        if keys is not None:
            keys = list(keys)
            if not keys:
                keys = [""]           # empty selection -> empty result, not everything
            where.append(f"key IN ({', '.join('?' * len(keys))})")
            params.extend(keys)
        if since_step is not None:
            where.append("step >= ?")
            params.append(int(since_step))
        return " AND ".join(where), params

    def _merge_percentiles(self, run_id: str, df: pd.DataFrame) -> pd.DataFrame:
        # a percentile is not a mean: with >1 rank, recompute it from the summed histograms
        multi = df[(df.ranks > 1) & df.key.str.match(PERCENTILE_KEY)]
        if multi.empty:
            return df
        steps = sorted(multi.step.unique().tolist())
        hist = self._query(f"""
            SELECT step, bin_lo, bin_hi, sum(count) AS count FROM histograms
            WHERE run_id = ? AND key = 'entropy' AND step IN ({', '.join('?' * len(steps))})
            GROUP BY step, bin_lo, bin_hi ORDER BY step, bin_lo""", [run_id, *steps])
        df = df.copy()
        for step, h in hist.groupby("step"):
            lo, hi, counts = (h[c].to_numpy(np.float64) for c in ("bin_lo", "bin_hi", "count"))
            for idx in multi.index[multi.step == step]:
                q = int(PERCENTILE_KEY.match(df.at[idx, "key"]).group(1)) / 100.0
                df.at[idx, "value"] = histogram_quantile(lo, hi, counts, q)
        return df

    def step_scalars(self, run_id: str, step: int) -> dict[str, float]:
        """All scalars of one step, ranks merged (what the alert hub sees)."""
        df = self._query("""
            SELECT key, step, CASE WHEN sum(coalesce(weight, 1)) > 0
                                   THEN sum(value * coalesce(weight, 1)) / sum(coalesce(weight, 1))
                                   ELSE avg(value) END AS value, count(DISTINCT rank) AS ranks
            FROM scalars WHERE run_id = ? AND step = ? GROUP BY key, step""", [run_id, int(step)])
        df = self._merge_percentiles(run_id, df)
        return dict(zip(df.key, df.value.astype(float)))

    def read_histograms(self, run_id: str, key: str = "entropy", downsample: int = 1000,
                        since_step: int | None = None) -> pd.DataFrame:
        """(step, bin_lo, bin_hi, count) summed over ranks; ≤ downsample steps."""
        params: list = [run_id, key]
        since = ""
        if since_step is not None:
            since, params = " AND step >= ?", params + [int(since_step)]
        return self._query(f"""
            WITH h AS (SELECT step, bin_lo, bin_hi, sum(count) AS count FROM histograms
                       WHERE run_id = ? AND key = ?{since} GROUP BY step, bin_lo, bin_hi),
            steps AS (SELECT step, row_number() OVER (ORDER BY step) AS rn, count(*) OVER () AS n
                      FROM (SELECT DISTINCT step FROM h)),
            keep AS (SELECT step FROM steps
                     WHERE (rn - 1) % greatest(1, CAST(ceil(n / ?) AS BIGINT)) = 0 OR rn = n)
            SELECT h.step, h.bin_lo, h.bin_hi, h.count FROM h JOIN keep USING (step)
            ORDER BY h.step, h.bin_lo""", [*params, max(1, int(downsample))])

    def histogram_keys(self, run_id: str) -> list[str]:
        df = self._query("SELECT DISTINCT key FROM histograms WHERE run_id = ? ORDER BY key", [run_id])
        return df["key"].tolist()

    def token_steps(self, run_id: str) -> list[int]:
        df = self._query("SELECT DISTINCT step FROM tokens WHERE run_id = ? ORDER BY step", [run_id])
        return [int(s) for s in df["step"]]

    def read_tokens(self, run_id: str, step: int, sample_id: int | None = None) -> pd.DataFrame:
        """Per-token rows of one step (optionally one sample), ordered by rank, sample, position."""
        cols = ", ".join(TOKENS_SCHEMA.names)
        sql, params = f"SELECT {cols} FROM tokens WHERE run_id = ? AND step = ?", [run_id, int(step)]
        if sample_id is not None:
            sql, params = sql + " AND sample_id = ?", params + [int(sample_id)]
        return self._query(sql + " ORDER BY rank, sample_id, pos", params)

    def read_samples(self, run_id: str, step: int | None = None, group_id: int | None = None,
                     limit: int = 10_000) -> pd.DataFrame:
        """Samples (newest steps first when unfiltered), at most `limit` rows."""
        cols = ", ".join(SAMPLES_SCHEMA.names)
        sql, params = f"SELECT {cols} FROM samples WHERE run_id = ?", [run_id]
        if step is not None:
            sql, params = sql + " AND step = ?", params + [int(step)]
        if group_id is not None:
            sql, params = sql + " AND group_id = ?", params + [int(group_id)]
        return self._query(sql + " ORDER BY step DESC, rank, sample_id LIMIT ?", [*params, int(limit)]) \
            .sort_values(["step", "rank", "sample_id"], kind="stable").reset_index(drop=True)

    def read_alerts(self, run_id: str | None = None, since_step: int | None = None) -> pd.DataFrame:
        sql, params = f"SELECT {', '.join(ALERTS_SCHEMA.names)} FROM alerts WHERE true", []
        if run_id is not None:
            sql, params = sql + " AND run_id = ?", params + [run_id]
        if since_step is not None:
            sql, params = sql + " AND step >= ?", params + [int(since_step)]
        return self._query(sql + " ORDER BY run_id, step, wall_time", params)

    def row_counts(self, run_id: str) -> dict[str, int]:
        """Rows per data table for one run (health checks, tests, export)."""
        parts = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t} WHERE run_id = ?"
                                   for t in (*DATA_TABLES, "alerts"))
        df = self._query(parts, [run_id] * (len(DATA_TABLES) + 1))
        return {t: int(n) for t, n in zip(df.t, df.n)}


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
        from monitor.alerts import AlertHub
    except ModuleNotFoundError as exc:
        if exc.name != "monitor.alerts":
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
