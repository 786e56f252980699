"""Standard engines read the lake without forksight (docs/lake.md, "Reading the lake with other engines"):
pyiceberg's own catalog loader -> DuckDB, DuckDB over the Parquet files the current snapshot lists, and
PySpark in local mode over those files (its own venv: `make lake-spark`; skipped without it). Every
read equals the rows the writing collector's DuckDB file holds, with the counts sent over HTTP."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import duckdb
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from lake_engines_util import COLLECTOR, data_files, write_lake  # noqa: E402
from lake_util import KEYS, STEP_TABLES, duck_rows, sort  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPARK_PYTHON = Path(os.environ.get("FORKSIGHT_SPARK_PYTHON") or REPO / ".venv" / "spark" / "bin" / "python")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return write_lake(tmp_path_factory.mktemp("lake-engines"))


def _user_catalog(written):
    """The catalog as a user outside forksight opens it: pyiceberg's load_catalog, nothing of forksight.
    The name must be "forksight": a SQL catalog keys its tables by catalog name."""
    from pyiceberg.catalog import load_catalog

    return load_catalog("forksight", type="sql", uri=written.catalog_uri, warehouse="file://" + written.warehouse)


def test_pyiceberg_to_duckdb_reads_every_table_as_the_collector_stored_it(written):
    from pyiceberg.expressions import EqualTo

    catalog = _user_catalog(written)
    assert {t for _, t in catalog.list_tables("forksight")} == {*STEP_TABLES, "runs", "alerts"}
    conn = duckdb.connect()
    for name in (*STEP_TABLES, "runs"):
        scan = catalog.load_table(f"forksight.{name}").scan(row_filter=EqualTo("collector", COLLECTOR))
        scan.to_duckdb(name, connection=conn)
        got = sort(conn.sql(f"SELECT * EXCLUDE (collector) FROM {name}").to_arrow_table(), name)
        assert got == duck_rows(written.db, name), name
        if name in STEP_TABLES:
            assert len(got) == written.sent[name], name          # counted from what was sent
    # a fleet-style question in SQL over the lake: fork rate per run, equal to the file's own answer
    question = "SELECT run_id, count(*) AS n, avg(fork::DOUBLE) AS fork_rate FROM tokens GROUP BY run_id ORDER BY run_id"
    with duckdb.connect(written.db, read_only=True) as own:
        assert conn.sql(question).fetchall() == own.sql(question).fetchall()


def test_a_filtered_scan_reads_one_run_and_step_block_only(written):
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual

    table = _user_catalog(written).load_table("forksight.tokens")
    run = written.runs[1]
    where = And(EqualTo("collector", COLLECTOR), And(EqualTo("run_id", run), GreaterThanOrEqual("step", 1000)))
    files, every = data_files(table, where), data_files(table)
    assert files and len(files) < len(every)             # partition pruning: not every file is planned
    got = table.scan(row_filter=where).to_duckdb("t").sql("SELECT * EXCLUDE (collector) FROM t").to_arrow_table()
    with duckdb.connect(written.db, read_only=True) as own:
        want = own.sql(f"SELECT * EXCLUDE (_lake_seq) FROM tokens WHERE run_id = '{run}' AND step >= 1000").to_arrow_table()
    assert sort(got, "tokens") == sort(want, "tokens") and want.num_rows > 0


def test_duckdb_alone_reads_the_parquet_files_the_snapshot_lists(written):
    catalog = _user_catalog(written)
    conn = duckdb.connect()
    for name in STEP_TABLES:
        paths = data_files(catalog.load_table(f"forksight.{name}"))
        rel = conn.read_parquet(paths, union_by_name=True)
        got = sort(rel.select(*[c for c in rel.columns if c != "collector"]).to_arrow_table(), name)
        assert got == duck_rows(written.db, name), name


@pytest.mark.slow
def test_spark_reads_the_parquet_files_the_snapshot_lists(written):
    if not SPARK_PYTHON.exists():
        pytest.skip(f"no Spark venv at {SPARK_PYTHON}: `make lake-spark` builds it (PySpark is ~500 MB, kept out "
                    "of `make test`)")
    catalog = _user_catalog(written)
    wanted = {name: data_files(catalog.load_table(f"forksight.{name}")) for name in ("tokens", "scalars", "samples")}
    done = subprocess.run([str(SPARK_PYTHON), str(REPO / "tests" / "spark_read.py"), json.dumps(wanted)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("SPARK-JSON "))
    got = json.loads(line[len("SPARK-JSON "):])
    import pyarrow as pa

    for name, read in got.items():
        assert read["count"] == written.sent[name], name
        rows = sort(pa.Table.from_pylist(read["rows"]), name)
        want = duck_rows(written.db, name)
        # Spark's columns in the files' order; compare each row's values by column name
        assert [{k: r[k] for k in w} for r, w in zip(rows, want)] == want, name
        assert set(KEYS[name]) <= set(rows[0])
