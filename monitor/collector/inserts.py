"""Bulk inserts into the store's tables, shared by the writer thread and the tools that seed a file:
an Arrow table by column name, and the writer's indexes (token_steps, scalar_keys)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def insert_arrow(cur, table: str, data: pa.Table, run_id: str | None = None,
                 constants: dict[str, int] | None = None) -> None:
    """Bulk-insert an Arrow table by column name (run_id, when given, fills that column; constants:
    more integer columns given one value on every row, e.g. the lake's sequence number)."""
    cur.register("_forksight_in", data)
    fixed = ([("run_id", "VARCHAR", run_id)] if run_id is not None else []) + \
        [(name, "BIGINT", value) for name, value in (constants or {}).items()]
    head = "".join(f"?::{kind} AS {name}, " for name, kind, _ in fixed)
    try:
        cur.execute(f"INSERT INTO {table} BY NAME SELECT {head}* FROM _forksight_in", [v for *_, v in fixed])
    except BaseException:
        try:        # after a failed insert this fails too ("transaction is aborted"): keep the first error
            cur.unregister("_forksight_in")
        except Exception:  # noqa: BLE001
            pass
        raise
    cur.unregister("_forksight_in")


def _add_to_index(cur, table: str, column: str, run_id: str, values: pa.Array) -> None:
    """Insert (run_id, value) for each distinct value into an index table; known pairs are skipped."""
    view = f"_forksight_{table}"
    cur.register(view, pa.table({column: pc.unique(values)}))
    try:
        cur.execute(f"INSERT OR IGNORE INTO {table} SELECT ?::VARCHAR, {column} FROM {view}", [run_id])
    finally:
        cur.unregister(view)


def add_token_steps(cur, run_id: str, steps: pa.Array) -> None:
    """Record that these steps hold token rows of the run (already known ones are skipped)."""
    _add_to_index(cur, "token_steps", "step", run_id, steps)


def add_scalar_keys(cur, run_id: str, keys: pa.Array) -> None:
    """Record the run's scalar keys (already known ones are skipped)."""
    _add_to_index(cur, "scalar_keys", "key", run_id, keys)
