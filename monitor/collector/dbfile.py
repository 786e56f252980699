"""Opening the DuckDB file a store owns: DuckDB settings checked from user input, the integrity
check on open (every block read once), and a message for each way opening can fail."""
from __future__ import annotations

import logging
import re

from forksight.base.tables import BACKFILLS, TABLES, schema_sql

log = logging.getLogger("forksight.store")


def duckdb_config(memory_limit: str | None = None, threads: int | None = None) -> dict:
    """DuckDB settings from user input, checked here so a typo is a clear ValueError, not a
    message about a damaged file."""
    config: dict = {}
    if memory_limit is not None:
        size = _MEMORY_LIMIT.fullmatch(str(memory_limit).strip())
        if not size:
            raise ValueError(f"memory limit {memory_limit!r} is not a size: give a number and a unit, "
                             "e.g. 2GB, 512MB or 1.5GiB")
        unit = size[2].upper()                   # DuckDB's reading: KB = 1000 bytes, KiB = 1024
        nbytes = float(size[1]) * (1024 if "I" in unit else 1000) ** ("KMGT".index(unit[0]) + 1)
        if nbytes < MIN_MEMORY_BYTES:
            raise ValueError(f"memory limit {memory_limit!r} is below {MIN_MEMORY_BYTES >> 20} MiB, too little "
                             "for DuckDB to open the file; give e.g. 512MB")
        config["memory_limit"] = str(memory_limit).strip()
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
        config["threads"] = threads
    return config


_MEMORY_LIMIT = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B)", re.IGNORECASE)
MIN_MEMORY_BYTES = 64 << 20


def _no_progress_bar(conn) -> None:
    """DuckDB's progress bar off (a collector's log is no terminal). Inside Jupyter DuckDB refuses
    to change that setting, either way, without ipywidgets (forksight.show in a notebook): the
    default is kept there; a store's queries are short."""
    import duckdb

    try:
        conn.execute("SET enable_progress_bar = false")
    except duckdb.Error as exc:
        if "ipywidgets" not in str(exc):
            raise


def connect(path: str, verify: bool = True, config: dict | None = None):
    """Open the file read-write, create missing tables and (verify) read every block once, so a
    damaged file is refused now, not on the first read of a run; every failure says which kind."""
    import os

    import duckdb

    wal = os.path.exists(path + ".wal")
    try:
        conn = duckdb.connect(path, config=config or {})
    except duckdb.Error as exc:
        raise RuntimeError(open_failure(path, exc)) from None
    try:
        _no_progress_bar(conn)
        before = set(conn.execute("SELECT table_name, column_name FROM information_schema.columns "
                                  "WHERE table_schema = 'main'").fetchall())
        conn.execute(schema_sql())
        migrate(conn, before)
        if verify:
            for table in TABLES:      # every column of every row: DuckDB checks each block's checksum
                conn.execute(f"SELECT sum(hash(t)) FROM {table} t").fetchall()
        if wal:
            log.warning("%s.wal was left by a process that did not close the file; DuckDB replayed it (rows "
                        "acknowledged after the last checkpoint are lost if that log was damaged)", path)
            conn.execute("CHECKPOINT")
    except duckdb.Error as exc:
        conn.close()
        raise RuntimeError(open_failure(path, exc)) from None
    return conn


def migrate(conn, before: set[tuple[str, str]]) -> None:
    """Fill, once, what a file written by an older forksight lacks (`before`: its (table, column)
    pairs as found on open; a new file has nothing to fill)."""
    tables = {table for table, _ in before}
    for table, column, sql in BACKFILLS:
        missing = table not in tables if column is None else (table, column) not in before
        if tables and missing:
            conn.execute(sql)
    if tables and "scalar_rollups" not in tables:
        from forksight.monitor.collector.rollups import rebuild_rollups

        rebuild_rollups(conn)


def open_failure(path: str, exc: Exception) -> str:
    """What went wrong opening a DuckDB file, in words: held by another process, unreadable, or damaged."""
    text = str(exc)
    if "Could not set lock" in text or "Conflicting lock" in text:
        return (f"cannot open {path}: another process (likely `forksight serve`) holds it ({text}); stream "
                "to that collector with url=... instead of db=...")
    from forksight.monitor.collector.faults import free_bytes, is_disk_full, mib, wal_bytes

    if is_disk_full(exc):            # never "damaged": the file is fine, the disk has no room
        return (f"cannot open {path}: the disk is full ({text.splitlines()[0][:200]}). The file is not damaged: "
                f"replaying its .wal ({mib(wal_bytes(path))}) into it needs about that much free space (free "
                f"now: {mib(free_bytes(path))}); free space on that disk and start again")
    if "Out of Memory" in text:
        return (f"DuckDB ran out of memory opening {path} ({text.splitlines()[0]}); raise --memory-limit "
                "(or memory_limit=)")
    if any(s in text for s in ("Is a directory", "No such file", "Permission denied", "Read-only file system")):
        return f"cannot open {path}: {text}; check the path and its permissions"
    return (f"{path} is damaged or not a DuckDB database ({text}); nothing was changed. Move it aside and "
            "restore a copy, or start with a new path (forksight creates the file)")
