"""Export a run to hive-partitioned Parquet (DIR/<table>/run_id=<id>/*.parquet) for DuckDB, Spark, Trino."""
from __future__ import annotations

import os

from forksight.base.limits import RUN_ID_RE
from forksight.base.tables import TABLES

EXPORT_TABLES = tuple(t for t in TABLES if t not in ("batches", "token_steps", "scalar_keys", "scalar_rollups",
                                                        "histogram_rollups"))   # runs, data tables, alerts


def export_tables(cur, run_id: str, out_dir: str) -> dict[str, int]:
    """COPY each table's rows of `run_id` to out_dir/<table>/run_id=<id>/; returns rows per table.

    Read back with `read_parquet('out_dir/<table>/**/*.parquet', hive_partitioning=true)`.
    Tables without rows for the run write no files.
    """
    if not RUN_ID_RE.match(run_id):      # it is spliced into COPY (no parameters there): keep it plain
        raise ValueError(f"run id {run_id!r} does not match the run id pattern")
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for table in EXPORT_TABLES:
        rows = cur.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchall()[0][0]
        written[table] = int(rows)
        if rows:
            target = os.path.join(out_dir, table).replace("'", "''")
            cols = ", ".join(TABLES[table].names)      # the declared columns (not the lake's _lake_seq)
            cur.execute(f"COPY (SELECT {cols} FROM {table} WHERE run_id = '{run_id}') TO '{target}' "
                        "(FORMAT PARQUET, PARTITION_BY (run_id), OVERWRITE_OR_IGNORE true)")
    return written


def export_file(db: str, run_id: str, out_dir: str) -> dict[str, int]:
    """Open the DuckDB file read-only and export one run; clear errors when locked or unknown."""
    import duckdb

    if not os.path.exists(db):
        raise FileNotFoundError(f"no DuckDB file at {db}")
    from forksight.monitor.collector.dbfile import open_failure

    try:
        conn = duckdb.connect(db, read_only=True)
    except duckdb.Error as exc:
        if "Could not set lock" in str(exc) or "Conflicting lock" in str(exc):
            raise RuntimeError(
                f"{db} is held by another process (a running `forksight serve` or training run): stop "
                f"`forksight serve`, or download the export from the collector with "
                f"GET /api/runs/{run_id}/export") from None
        raise RuntimeError(open_failure(db, exc)) from None
    try:
        known = [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY created_at").fetchall()]
        if run_id not in known:
            raise LookupError(f"no run {run_id!r} in {db}; runs there: {', '.join(known) or 'none'}")
        return export_tables(conn, run_id, out_dir)
    except duckdb.Error as exc:           # a damaged block met while copying
        raise RuntimeError(open_failure(db, exc)) from None
    finally:
        conn.close()
