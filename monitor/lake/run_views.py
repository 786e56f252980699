"""One lake-only run as a small DuckDB database the collector's own Reader SQL runs over: its step
tables are views over the Parquet data files an Iceberg scan plan lists for (collector, run_id), so a
read loads only the columns and row groups it asks for; its runs row, alerts and the writer's indexes
(token_steps, scalar_keys) are small tables filled when their table is first read (RunDb). The run's
id inside is the id shown to users."""
from __future__ import annotations

import threading
from typing import Callable

import pyarrow as pa

from forksight.base.tables import (
    ALERTS, HISTOGRAM_ROLLUPS, RUNS, SCALAR_KEYS, SCALAR_ROLLUPS, TOKEN_STEPS, TABLES,
)
from forksight.monitor.lake.schema import COLLECTOR, STEP_TABLES, identifier

ROWID_SQL = "(hash(filename) % 4194304)::BIGINT * 1099511627776 + file_row_number"   # 2^22 files x 2^40 rows
LOAD_BYTES = 4 << 20  # a lake run's scalars/histograms/samples up to this many Parquet bytes: loaded
SHOWN_SEP = "@"      # a lake-only run is shown as '<run_id>@<collector>' (and named '<name>@<collector>')


def shown_id(run_id: str, collector: str) -> str:
    return f"{run_id}{SHOWN_SEP}{collector}"


def _literal(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


def _local_path(path: str) -> str | None:
    """A data file's path DuckDB can open (file:// or a plain path); None for an object store."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path


def plan_files(catalog, table: str, collector: str, run_id: str) -> tuple[list[str] | None, int | None, int]:
    """(local data files of one run in `table`, the snapshot planned, their bytes); files None when
    the plan has delete files or non-local paths (then the rows are read through pyiceberg instead)."""
    from pyiceberg.expressions import And, EqualTo

    t = catalog.load_table(identifier(table))
    snap = t.current_snapshot()
    tasks = list(t.scan(row_filter=And(EqualTo(COLLECTOR, collector), EqualTo("run_id", run_id)),
                        selected_fields=("*",)).plan_files())
    paths = [_local_path(task.file.file_path) for task in tasks]
    size = sum(int(task.file.file_size_in_bytes or 0) for task in tasks)
    if any(task.delete_files for task in tasks) or any(p is None for p in paths):
        return None, snap.snapshot_id if snap else None, size
    return paths, snap.snapshot_id if snap else None, size


def _scan_arrow(catalog, table: str, collector: str, run_id: str) -> pa.Table:
    from pyiceberg.expressions import And, EqualTo

    return catalog.load_table(identifier(table)).scan(
        row_filter=And(EqualTo(COLLECTOR, collector), EqualTo("run_id", run_id))).to_arrow()


def _columns_sql(spec, have: set[str], shown: str) -> str:
    """The spec's columns in order: run_id as the shown id, a column no file holds as a typed NULL."""
    out = []
    for c in spec.columns:
        if c.name == "run_id":
            out.append(f"{_literal(shown)}::VARCHAR AS run_id")
        elif c.name in have:
            out.append(f"CAST({c.name} AS {c.sql}) AS {c.name}")
        else:
            out.append(f"NULL::{c.sql} AS {c.name}")
    return ", ".join(out)


def _table_sql(conn, catalog, spec, collector: str, run_id: str, shown: str) -> int | None:
    """Create `spec`'s table in conn: a view over the run's planned Parquet files (or the rows read
    through pyiceberg); the snapshot planned."""
    files, snap, size = plan_files(catalog, spec.name, collector, run_id)
    where = f"{COLLECTOR} = {_literal(collector)} AND run_id = {_literal(run_id)}"
    if files is None:        # delete files or an object store: read through pyiceberg (bounded by the run)
        data = _scan_arrow(catalog, spec.name, collector, run_id)
        conn.register(f"_lake_{spec.name}", data)
        conn.execute(f"CREATE TABLE {spec.name} AS SELECT {_columns_sql(spec, set(data.column_names), shown)} "
                     f"FROM _lake_{spec.name}")
        conn.unregister(f"_lake_{spec.name}")
    elif not files:
        conn.execute(TABLES[spec.name].ddl())
    else:
        source = f"read_parquet([{', '.join(_literal(f) for f in files)}], union_by_name = true" \
                 f"{', filename = true, file_row_number = true' if spec.name == 'tokens' else ''})"
        have = {r[0] for r in conn.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        # tokens: a `rowid` as a table has (the token page's keyset cursor breaks ties with it):
        # the file (hashed) and the row's number in it, unique within the run's files
        extra = f", {ROWID_SQL} AS rowid" if spec.name == "tokens" else ""
        # a small table a page reads many times is loaded once (as fast as the file's own tables
        # then); the tokens, and any table past the bound, stay a view read per query
        kind = "TABLE" if spec.name != "tokens" and size <= LOAD_BYTES else "VIEW"
        conn.execute(f"CREATE {kind} {spec.name} AS SELECT {_columns_sql(spec, have, shown)}{extra} "
                     f"FROM {source} WHERE {where}")
    return snap


class RunDb:
    """One lake run's in-memory DuckDB, built per table on first need: a page that reads the tokens
    of one step plans and opens only `tokens` (and `scalars` for the run's step span); a table's
    rollups are built only when a read first uses them (a run long enough to be read from them).
    `snaps`: the snapshot each built table was planned at."""

    def __init__(self, catalog, collector: str, run_id: str, run_row: dict, alerts: pa.Table,
                 open_reader: Callable):
        from forksight.monitor.lake.memdb import MemoryDb

        self.catalog, self.collector, self.run_id = catalog, collector, run_id
        self.shown, self.open_reader = shown_id(run_id, collector), open_reader
        self.snaps: dict[str, int | None] = {}
        self._rolled: set[str] = set()
        self._lock = threading.RLock()          # ensure() inside rollups() on the same thread
        conn = self.conn = MemoryDb()
        conn.execute("\n".join(spec.ddl() for spec in (RUNS, ALERTS, TOKEN_STEPS, SCALAR_KEYS, SCALAR_ROLLUPS,
                                                       HISTOGRAM_ROLLUPS)))
        row = {c: run_row.get(c) for c in RUNS.names} | {"run_id": self.shown}
        if row.get("name") is not None:
            row["name"] = shown_id(row["name"], collector)
        conn.execute(f"INSERT INTO runs ({', '.join(RUNS.names)}) VALUES ({', '.join('?' * len(RUNS.names))})",
                     [row[c] for c in RUNS.names])
        if alerts.num_rows:
            conn.register("_lake_alerts", alerts)
            conn.execute("INSERT INTO alerts BY NAME SELECT * FROM _lake_alerts")   # shown ids already
            conn.unregister("_lake_alerts")
        self.reader = open_reader(conn, rollups=False, before_rollups=self.rollups)

    def ensure(self, tables) -> None:
        """Plan and open `tables` (step table names) not opened yet."""
        with self._lock:
            for spec in STEP_TABLES:
                if spec.name not in tables or spec.name in self.snaps:
                    continue
                self.snaps[spec.name] = _table_sql(self.conn, self.catalog, spec, self.collector,
                                                   self.run_id, self.shown)
                # the writer's indexes, from the rows (a scan of one column)
                if spec.name == "tokens":
                    self.conn.execute("INSERT INTO token_steps SELECT DISTINCT run_id, step FROM tokens")
                elif spec.name == "scalars":
                    self.conn.execute("INSERT INTO scalar_keys SELECT DISTINCT run_id, key FROM scalars")
                    # the span of the scalars this plan holds (the lake's runs row is synced apart, may lag)
                    self.conn.execute("UPDATE runs SET first_step = (SELECT min(step) FROM scalars), "
                                      "last_step = (SELECT max(step) FROM scalars)")

    def rollups(self, table: str) -> None:
        """Build `table`'s rollups ("scalars" or "histograms") once, on the first read that uses them."""
        with self._lock:
            if table in self._rolled:
                return
            self.ensure((table,))
            self.open_reader(self.conn, rollups=(table,))     # the roof's rollup builder (Reader dropped)
            self._rolled.add(table)


def build_run_db(catalog, collector: str, run_id: str, run_row: dict, alerts: pa.Table,
                 open_reader: Callable):
    """(a Reader over one lake run, the snapshots of the tables it planned so far: a live dict);
    alerts: the run's, already under its shown id. Tables are planned on first need (RunDb).
    open_reader(conn, rollups=) -> Reader is the roof's: it builds the rollups and wraps conn."""
    from forksight.monitor.lake.lazy_run import LazyRunReader

    db = RunDb(catalog, collector, run_id, run_row, alerts, open_reader)
    return LazyRunReader(db), db.snaps
