"""A lake written by a real `forksight serve` (SQLite catalog) for the engine tests, and the list of
Parquet files the current snapshot of a table holds (what Spark or DuckDB read without Iceberg)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from collector_util import ServeProcess
from lake_util import STEP_TABLES, batch, create_run, post, rows_of, wait_drained

COLLECTOR = "box-e"


@dataclass
class WrittenLake:
    catalog_uri: str
    warehouse: str
    db: str                               # the collector's DuckDB file (closed)
    runs: list[str]
    sent: dict[str, int]                  # rows per step table, counted from the bodies sent


def write_lake(tmp: Path, steps: int = 12, tokens: int = 40) -> WrittenLake:
    """Two runs through a real collector, steps in two step blocks (0.. and 1500..), drained and stopped."""
    uri, wh, db = f"sqlite:///{tmp}/catalog.db", str(tmp / "wh"), str(tmp / "e.duckdb")
    sent = {t: 0 for t in STEP_TABLES}
    args = ("--lake-catalog", uri, "--lake-warehouse", wh, "--collector-id", COLLECTOR,
            "--lake-commit-rows", "300", "--lake-commit-seconds", "0.3")
    with ServeProcess(db, args=args) as srv:
        runs = [create_run(srv.url, "left"), create_run(srv.url, "right")]
        for i in range(steps):
            body = batch(i if i < steps // 2 else i + 1500, tokens=tokens, tag="e")
            post(srv.url, runs[i % 2], body)
            for t, n in rows_of(body).items():
                sent[t] += n
        wait_drained(srv.url)
    return WrittenLake(uri, wh, db, runs, sent)


def data_files(table, row_filter=None) -> list[str]:
    """Local paths of the Parquet files a scan of the current snapshot plans (none may carry deletes:
    forksight's lake is append and copy-on-write overwrite only)."""
    scan = table.scan(row_filter=row_filter) if row_filter is not None else table.scan()
    paths = []
    for task in scan.plan_files():
        assert not task.delete_files, f"{task.file.file_path} has delete files: read it through Iceberg"
        parsed = urlparse(task.file.file_path)
        paths.append(parsed.path if parsed.scheme in ("file", "") else task.file.file_path)
    return paths
