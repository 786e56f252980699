"""Records -> Arrow: the one place that turns logged rows into the store's Arrow tables.

Every producer path (LocalSink, the collector's JSON and Arrow ingest) goes through these
functions, so a row is checked the same way wherever it comes from: known columns, castable
types, finite numbers, bounded text. A RecordError names the field and the fix.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forksight.monitor.schema import MAX_TEXT_CHARS, MAX_TOKEN_CHARS, MAX_TOKEN_ROWS, TOKEN_COLUMNS

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


