"""Records -> Arrow: the one place that turns logged rows into the store's Arrow tables, checked the
same way on every path (LocalSink, JSON and Arrow ingest): known columns, same-kind types, finite
numbers, bounded text. A RecordError names the field and the fix."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forksight.base.limits import MAX_TOKEN_ROWS
from forksight.base.tables import (
    ALERTS, DATA_TABLES, HISTOGRAMS, PROBES, REFERENCE, SAMPLES, SCALARS, TOKEN_COLUMNS, TOKENS, Table,
)

# Arrow schemas of what the writer inserts (run_id is added by the INSERT itself, except alerts)
SCALARS_SCHEMA = SCALARS.arrow_schema()
TOKENS_SCHEMA = TOKENS.arrow_schema()
SAMPLES_SCHEMA = SAMPLES.arrow_schema()
HISTOGRAMS_SCHEMA = HISTOGRAMS.arrow_schema()
PROBES_SCHEMA = PROBES.arrow_schema()
REFERENCE_SCHEMA = REFERENCE.arrow_schema()
ALERTS_SCHEMA = ALERTS.arrow_schema(run_id=True)


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
    probes: pa.Table | None = None
    reference: pa.Table | None = None
    digest: str | None = None         # hash of the request that carried them: a reused batch id must match

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


def _check_text(table: pa.Table, spec, where: str) -> None:
    # every bounded text column of the table's spec, by characters
    for column in spec.columns:
        if column.max_chars is not None and column.name in table.column_names and table.num_rows:
            longest = pc.max(pc.utf8_length(table[column.name])).as_py()
            if longest is not None and longest > column.max_chars:
                raise RecordError(f"{where}.{column.name}: a value has {longest} characters; "
                                  f"the limit is {column.max_chars}")


def _rows_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema, rank: int, where: str, **fill) -> pa.Table:
    cols = {name: [r.get(name) for r in rows] for name in schema.names}
    cols["rank"] = [r.get("rank", rank) for r in rows]
    for name, default in fill.items():
        cols[name] = [default if v is None else v for v in cols[name]]
    try:
        return pa.table(cols, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise RecordError(f"{where}: {exc}") from None


def finite_or_null(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with every non-finite float as None (JSON cannot carry NaN/inf; the store keeps null)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def alerts_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Alert rows (with run_id) -> the `alerts` table's Arrow form; a non-finite number becomes
    null (JSON answers and the store agree), fields the table lacks are dropped."""
    clean = [finite_or_null({k: r.get(k) for k in ALERTS_SCHEMA.names}) for r in rows]
    return pa.Table.from_pylist(clean, schema=ALERTS_SCHEMA)


def scalars_table(rows: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Rows of {step, key, value, weight?, wall_time?} -> the scalars Arrow table."""
    table = _rows_table(rows, SCALARS_SCHEMA, rank, "scalars", wall_time=time.time())
    _check_finite(table, "scalars")
    return table


def samples_table(rows: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Rows of sample dicts (step, sample_id, group_id, prompt, completion, ...) -> Arrow."""
    table = _rows_table(rows, SAMPLES_SCHEMA, rank, "samples")
    _check_text(table, SAMPLES, "samples")
    _check_finite(table, "samples")
    return table


def probes_table(rows: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Rows of probe dicts (step, sample_id, pos, v_before, v_after, delta, se, k, ...) -> Arrow."""
    return _keyed_table(PROBES, PROBES_SCHEMA, rows, rank)


def reference_table(rows: Sequence[Mapping[str, Any]], rank: int = 0) -> pa.Table:
    """Rows of re-scored reference tokens (step, sample_id, pos, token_id, token, entropy, ...) -> Arrow."""
    return _keyed_table(REFERENCE, REFERENCE_SCHEMA, rows, rank)


def _keyed_table(spec: Table, schema: pa.Schema, rows: Sequence[Mapping[str, Any]], rank: int) -> pa.Table:
    """Rows of one per-token table keyed by (step, sample_id, pos): every row names all three."""
    table = _rows_table(rows, schema, rank, spec.name)
    for column in spec.columns:
        if column.required and column.wire and table[column.name].null_count:
            raise RecordError(f"{spec.name}.{column.name}: null values; every row needs {column.name}")
    _check_text(table, spec, spec.name)
    _check_finite(table, spec.name)
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


def _same_kind(source: pa.DataType, target: pa.DataType) -> bool:
    # as strict as the JSON route: no string -> number, no number -> bool; widths may change
    if pa.types.is_null(source):
        return True
    if pa.types.is_integer(target):
        return pa.types.is_integer(source)
    if pa.types.is_floating(target):
        return pa.types.is_floating(source) or pa.types.is_integer(source)
    if pa.types.is_string(target):
        return pa.types.is_string(source) or pa.types.is_large_string(source)
    return pa.types.is_boolean(source)


def tokens_table(data: pa.Table | Mapping[str, Any], *, step: int | None = None, rank: int = 0) -> pa.Table:
    """Per-token columns (Arrow table or dict of equal-length arrays) -> the tokens table.

    Refuses unknown, missing or repeated columns, other kinds of values, NaN/inf, out-of-range numbers.
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
    names = data.column_names
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise RecordError(f"tokens: column(s) {repeated} appear more than once; send each column once")
    unknown = sorted(set(names) - set(TOKEN_COLUMNS))
    if unknown:
        raise RecordError(f"tokens: unknown column(s) {unknown}; allowed: {sorted(TOKEN_COLUMNS)}")
    missing = [n for n, c in TOKEN_COLUMNS.items() if c.required and n not in names]
    if missing:
        raise RecordError(f"tokens: missing required column(s) {missing}")
    if data.num_rows > MAX_TOKEN_ROWS:
        raise RecordError(f"tokens: {data.num_rows} rows; the limit is {MAX_TOKEN_ROWS} per batch: split it")
    n = data.num_rows
    arrays = []
    for f in TOKENS_SCHEMA:
        if f.name in names:
            col = data[f.name]
            if not _same_kind(col.type, f.type):
                raise RecordError(f"tokens.{f.name}: values are {col.type}; send {f.type} values")
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
    for name, column in TOKEN_COLUMNS.items():
        if column.required and table[name].null_count:
            raise RecordError(f"tokens.{name}: null values; every row needs {name}")
        if n and (column.ge is not None or column.lt is not None) and table[name].null_count < n:
            low, high = (v.as_py() for v in pc.min_max(table[name]).values())
            if column.ge is not None and low < column.ge:
                raise RecordError(f"tokens.{name}: {low} is below {column.ge}; {name} counts from {column.ge}")
            if column.lt is not None and high >= column.lt:
                raise RecordError(f"tokens.{name}: {high} is not below the limit {column.lt}")
    _check_finite(table, "tokens")
    _check_text(table, TOKENS, "tokens")
    return table
