"""`forksight compact --to-lake`: move a run's token history out of the collector's DuckDB file once
the lake holds it. A step moves only when none of its rows waits in the outbox (the committer's
watermark passed them all) and the lake holds exactly as many of its rows as the file; the file keeps
the step in its token_steps index and records it in lake_token_steps, so the tiered reader reads
that step's rows from the lake (docs/lake.md, "Reads")."""
from __future__ import annotations

from forksight.monitor.lake.errors import LakeError
from forksight.monitor.lake.outbox import MOVED, outbox_table
from forksight.monitor.lake.run_views import plan_files
from forksight.monitor.lake.schema import COLLECTOR, identifier

MOVED_DDL = f"CREATE TABLE IF NOT EXISTS {MOVED} (run_id VARCHAR, step BIGINT, rows BIGINT, PRIMARY KEY (run_id, step));"


def _collector(conn) -> str:
    try:
        rows = conn.execute("SELECT value FROM lake_state WHERE key = 'collector_id'").fetchall()
    except Exception:  # noqa: BLE001 - no lake_state table: this file never wrote a lake
        rows = []
    if not rows:
        raise LakeError("this DuckDB file has never committed to a lake: serve it with --lake-catalog (and let "
                        "the backlog drain, GET /api/health/lake) before compact --to-lake")
    return rows[0][0]


def lake_step_counts(conn, catalog, collector: str, run_id: str) -> dict[int, int]:
    """Token rows per step of (collector, run_id) in the lake, counted by DuckDB over the planned files
    (one column read, in bounded memory), or by pyiceberg when the plan cannot be read directly."""
    files, _, _ = plan_files(catalog, "tokens", collector, run_id)
    if files is None:
        from pyiceberg.expressions import And, EqualTo

        steps = catalog.load_table(identifier("tokens")).scan(
            row_filter=And(EqualTo(COLLECTOR, collector), EqualTo("run_id", run_id)),
            selected_fields=("step",)).to_arrow()
        conn.register("_lake_steps", steps)
        try:
            return dict(conn.execute("SELECT step, count(*) FROM _lake_steps GROUP BY step").fetchall())
        finally:
            conn.unregister("_lake_steps")
    if not files:
        return {}
    paths = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    return dict(conn.execute(f"SELECT step, count(*) FROM read_parquet([{paths}]) WHERE {COLLECTOR} = ? "
                             "AND run_id = ? GROUP BY step", [collector, run_id]).fetchall())


def move_tokens(conn, catalog, run_id: str) -> dict:
    """Delete the run's token rows the lake holds from the file (one transaction); what it did."""
    collector = _collector(conn)
    local = dict(conn.execute("SELECT step, count(*) FROM tokens WHERE run_id = ? GROUP BY step", [run_id]).fetchall())
    waiting = {r[0] for r in conn.execute(f"SELECT DISTINCT step FROM {outbox_table('tokens')} WHERE run_id = ?",
                                          [run_id]).fetchall()}
    lake = lake_step_counts(conn, catalog, collector, run_id)
    move = sorted(s for s, n in local.items() if s not in waiting and lake.get(s) == n)
    conn.execute(MOVED_DDL)
    conn.execute("BEGIN TRANSACTION")
    try:
        conn.executemany(f"INSERT OR REPLACE INTO {MOVED} VALUES (?, ?, ?)", [[run_id, s, local[s]] for s in move])
        conn.execute("DELETE FROM tokens WHERE run_id = ? AND step IN (SELECT unnest(?::BIGINT[]))", [run_id, move])
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return {"run_id": run_id, "collector": collector, "token_steps_moved": len(move),
            "token_rows_moved": sum(local[s] for s in move),
            "token_steps_kept_waiting": len([s for s in local if s in waiting]),
            "token_steps_kept_unequal": len([s for s in local if s not in waiting and lake.get(s) != local[s]])}
