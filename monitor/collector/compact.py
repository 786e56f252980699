"""Keeping a long run's DuckDB file bounded: thin its token rows to N evenly spaced steps plus the
newest (`forksight compact`). Scalars, histograms, samples and alerts stay whole; token rows are
most of a file's bytes (bench/storage.py measures how many per row, sample and step).

DuckDB reuses the blocks a DELETE frees but never gives them back to the disk, so the file is
then rewritten: every table copied into a fresh file beside it (COPY FROM DATABASE), which
replaces the old one only once it is complete.
"""
from __future__ import annotations

import os

from forksight.base.limits import RUN_ID_RE


def kept_steps(steps: list[int], keep: int) -> list[int]:
    """Of the sorted distinct steps, `keep` evenly spaced ones (index i·n // keep, so the first
    is kept) plus the newest; all of them when there are no more than keep + 1."""
    if keep < 1:
        raise ValueError(f"--keep-token-steps must be >= 1, got {keep}")
    n = len(steps)
    if n <= keep + 1:
        return list(steps)
    return [steps[i] for i in sorted({i * n // keep for i in range(keep)} | {n - 1})]


def thin_tokens(cur, run_id: str, keep: int) -> dict[str, int]:
    """Delete the run's token rows outside the kept steps (one transaction); what it did."""
    steps = [r[0] for r in cur.execute(
        "SELECT DISTINCT step FROM tokens WHERE run_id = ? ORDER BY step", [run_id]).fetchall()]
    kept = kept_steps(steps, keep)
    cur.execute("BEGIN TRANSACTION")
    try:
        before = cur.execute("SELECT count(*) FROM tokens WHERE run_id = ?", [run_id]).fetchall()[0][0]
        cur.execute("CREATE OR REPLACE TEMP TABLE forksight_kept_steps (step BIGINT)")
        cur.executemany("INSERT INTO forksight_kept_steps VALUES (?)", [[s] for s in kept])
        for table in ("tokens", "token_steps"):
            cur.execute(f"DELETE FROM {table} WHERE run_id = ? AND step NOT IN (SELECT step FROM forksight_kept_steps)",
                        [run_id])
        after = cur.execute("SELECT count(*) FROM tokens WHERE run_id = ?", [run_id]).fetchall()[0][0]
        cur.execute("DROP TABLE forksight_kept_steps")
        cur.execute("COMMIT")
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    return {"token_steps_before": len(steps), "token_steps_kept": len(kept),
            "token_rows_before": int(before), "token_rows_after": int(after)}


def rewrite_file(conn, path: str) -> None:
    """Copy every table into a fresh file and put it in place of `path` (conn is closed)."""
    tmp = f"{path}.compact-tmp"
    for leftover in (tmp, tmp + ".wal"):
        if os.path.exists(leftover):
            os.remove(leftover)
    source = conn.execute("SELECT current_database()").fetchall()[0][0]
    try:
        conn.execute(f"ATTACH '{tmp.replace(chr(39), chr(39) * 2)}' AS forksight_compact")
        conn.execute(f'COPY FROM DATABASE "{source}" TO forksight_compact')
        conn.execute("DETACH forksight_compact")
    except BaseException:
        conn.close()
        for leftover in (tmp, tmp + ".wal"):
            if os.path.exists(leftover):
                os.remove(leftover)
        raise
    conn.close()
    os.replace(tmp, path)



def open_run_file(db: str, run_id: str):
    """(connection, size in bytes) of the DuckDB file `db` opened for compaction, with `run_id` in it;
    clear errors when the file is missing, held by a collector, damaged, or has no such run."""
    import duckdb

    from forksight.monitor.collector.dbfile import open_failure

    if not os.path.exists(db):
        raise FileNotFoundError(f"no DuckDB file at {db}")
    size_before = os.path.getsize(db)
    try:
        conn = duckdb.connect(db)
    except duckdb.Error as exc:
        if "Could not set lock" in str(exc) or "Conflicting lock" in str(exc):
            raise RuntimeError(f"{db} is held by another process (a running `forksight serve` or training "
                               "run): stop it, compact, then start it again") from None
        raise RuntimeError(open_failure(db, exc)) from None
    try:
        known = {r[0] for r in conn.execute("SELECT run_id FROM runs").fetchall()}
        if run_id not in known:
            raise LookupError(f"no run {run_id!r} in {db}; runs there: {', '.join(sorted(known)) or 'none'}")
    except BaseException:
        conn.close()
        raise
    return conn, size_before

def compact_file(db: str, run_id: str, keep: int, check=None) -> dict:
    """Thin one run's token rows in the DuckDB file `db` and shrink the file; clear errors when
    the file is held by a collector, missing, damaged, or has no such run. check(conn, run_id), given
    by the roof, may refuse first (raising), e.g. while the lake has not got the run's rows yet."""
    import duckdb

    from forksight.monitor.collector.dbfile import open_failure

    if not RUN_ID_RE.match(run_id):
        raise ValueError(f"run id {run_id!r} does not match the run id pattern")
    kept_steps([], keep)  # the same check before the file is touched
    conn, size_before = open_run_file(db, run_id)
    try:
        if check is not None:
            check(conn, run_id)
        done = thin_tokens(conn.cursor(), run_id, keep)
        conn.execute("CHECKPOINT")
        rewrite_file(conn, db)
    except duckdb.Error as exc:
        conn.close()
        raise RuntimeError(open_failure(db, exc)) from None
    except BaseException:
        conn.close()
        raise
    return {"run_id": run_id, **done, "bytes_before": size_before, "bytes_after": os.path.getsize(db)}
