"""The lake writer on an Iceberg REST catalog (`--lake-catalog http://...`): a real `forksight serve`
commits every table through pyiceberg's RestCatalog with the DuckDB tables' exact rows; two writers'
concurrent commits to one table both land (the loser's 409 is retried); a REST URL nobody answers
is refused at start. The server is tests/rest_catalog_util.py (SqlCatalog behind the REST protocol)."""
from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")
pytest.importorskip("fastapi", reason="the REST catalog test server needs fastapi and uvicorn")

from collector_util import REPO, ServeProcess, free_port  # noqa: E402
from lake_util import (  # noqa: E402
    STEP_TABLES, batch, create_run, duck_rows, lake_rows, post, rows_of, wait_drained,
)
from rest_catalog_util import RestCatalogServer  # noqa: E402

from forksight.base.records import scalars_table  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.errors import LakeError  # noqa: E402
from forksight.monitor.lake.schema import LAKE_TABLES  # noqa: E402
from forksight.monitor.lake.writer import PROP_COLLECTOR, LakeWriter  # noqa: E402


def test_serve_commits_every_row_once_through_a_rest_catalog(tmp_path):
    from pyiceberg.catalog.rest import RestCatalog

    db, wh = tmp_path / "a.duckdb", str(tmp_path / "wh")
    sent = {t: 0 for t in STEP_TABLES}
    with RestCatalogServer(tmp_path) as rest:
        args = ("--lake-catalog", rest.url, "--lake-warehouse", wh, "--lake-commit-rows", "150",
                "--lake-commit-seconds", "0.5", "--collector-id", "box-1")
        with ServeProcess(db, args=args) as srv:
            runs = [create_run(srv.url, "alpha"), create_run(srv.url, "beta")]
            for step in range(8):
                body = batch(step if step < 6 else step + 1500, tokens=30)    # two step blocks of 1000
                post(srv.url, runs[step % 2], body)
                for t, n in rows_of(body).items():
                    sent[t] += n
            assert post(srv.url, runs[0], batch(0, tokens=30))["duplicate"]   # a resent batch: stored once
            health = wait_drained(srv.url)
            assert health["collector_id"] == "box-1" and health["state"] == "ok"
        catalog = open_catalog(rest.url, wh, check=False)
        assert isinstance(catalog, RestCatalog)
        # the six tables exist behind the REST server (its own SqlCatalog, asked directly)
        assert sorted(t[-1] for t in rest.catalog.list_tables("forksight")) == sorted(LAKE_TABLES)
        for name in STEP_TABLES:
            lake, duck = lake_rows(catalog, name, "box-1"), duck_rows(str(db), name)
            assert len(lake) == sent[name], name          # counted from what was sent
            assert lake == duck, name                     # and every value equal to DuckDB's
            # every commit went through the REST server: the SqlCatalog behind it has the same snapshots
            over_rest = catalog.load_table(f"forksight.{name}").metadata.snapshots
            assert [s.snapshot_id for s in over_rest] == \
                [s.snapshot_id for s in rest.catalog.load_table(f"forksight.{name}").metadata.snapshots]
            assert sum(s.summary.additional_properties.get(PROP_COLLECTOR) == "box-1" for s in over_rest) >= 1
        assert lake_rows(catalog, "runs", "box-1") == duck_rows(str(db), "runs")   # synced at the stop
        # the partition spec travelled in the create request: one run's first step block is its own files
        from pyiceberg.expressions import And, EqualTo, LessThan

        files = [t.file.file_path for t in catalog.load_table("forksight.tokens").scan(
            row_filter=And(EqualTo("run_id", runs[1]), LessThan("step", 1000))).plan_files()]
        assert files and all(f"run_id={runs[1]}/step_1000=0/" in f for f in files), files
        assert rest.stats.get(500, 0) == 0, rest.stats


def _rows(collector: str, n: int) -> pa.Table:
    rows = scalars_table([{"step": s, "key": collector, "value": s / 7} for s in range(n)])
    return rows.add_column(0, "run_id", pa.array([f"run-{collector}"] * n))


def test_two_writers_concurrent_commits_to_one_rest_table_both_land(tmp_path, caplog):
    wh = str(tmp_path / "wh")
    with RestCatalogServer(tmp_path) as rest:
        setup = open_catalog(rest.url, wh)                                   # creates the six tables over REST
        with setup.load_table("forksight.scalars").transaction() as tx:      # pyiceberg's own retries off:
            tx.set_properties({"commit.retry.num-retries": "0"})             # the conflict reaches ours
        writers = {c: LakeWriter(open_catalog(rest.url, wh, check=False), c) for c in ("a", "b")}
        # both load the table before either commits: whichever commits second is stale and refused
        stale = {c: w.catalog.load_table("forksight.scalars") for c, w in writers.items()}
        sizes, appended, errors = {"a": 10, "b": 7}, {}, []
        conflicts_before = rest.stats.get(409, 0)
        start = threading.Barrier(2)

        def commit(c: str) -> None:
            try:
                start.wait(10)
                appended[c] = writers[c].append("scalars", _rows(c, sizes[c]), 1, 1, table=stale[c])
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
        threads = [threading.Thread(target=commit, args=(c,)) for c in writers]
        with caplog.at_level(logging.INFO, logger="forksight.lake"):
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        assert not errors and appended == sizes, (errors, appended)
        assert rest.stats.get(409, 0) - conflicts_before == 1, rest.stats      # one refused commit, over HTTP
        assert caplog.text.count("scalars commit conflicted with another writer") == 1   # and retried once
        table = setup.load_table("forksight.scalars")
        got = sorted((r["collector"], r["step"]) for r in table.scan().to_arrow().to_pylist())
        assert got == sorted([("a", s) for s in range(10)] + [("b", s) for s in range(7)])
        assert table.properties["forksight.committed-seq.a"] == table.properties["forksight.committed-seq.b"] == "1"
        assert len(table.metadata.snapshots) == 2                            # nothing committed twice


def test_a_rest_url_nobody_answers_is_refused_at_start_naming_it(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    for check in (True, False):
        with pytest.raises(LakeError) as err:
            open_catalog(url, str(tmp_path / "wh"), check=check)
        said = str(err.value)
        assert f"cannot use the lake catalog {url} with warehouse {tmp_path / 'wh'}" in said, said
        assert "ConnectionError" in said and "check the catalog is running and reachable" in said, said
    done = subprocess.run([sys.executable, "-m", "forksight", "serve", "--db", str(tmp_path / "x.duckdb"),
                           "--port", str(free_port()), "--no-dashboard", "--lake-catalog", url,
                           "--lake-warehouse", str(tmp_path / "wh")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"cannot use the lake catalog {url}" in done.stderr, done.stderr
    assert not (tmp_path / "x.duckdb").exists()            # refused before the file


def test_a_rest_warehouse_is_the_servers_to_resolve_not_a_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with RestCatalogServer(tmp_path) as rest:
        catalog = open_catalog(rest.url, "prod")                 # Polaris, Lakekeeper, Nessie: a name
        assert catalog.properties["warehouse"] == "prod"
        assert catalog.load_table("forksight.scalars").metadata.location.startswith(f"file://{rest.warehouse}")
    assert not (tmp_path / "prod").exists()                      # nothing made here in its name


def test_a_rest_catalog_that_accepts_but_never_answers_times_out_with_a_clear_error(tmp_path, monkeypatch):
    import socket
    import time

    from forksight.monitor.lake import rest

    monkeypatch.setattr(rest, "READ_TIMEOUT_S", 1.0)
    with socket.socket() as silent:                              # the kernel accepts, nobody answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(LakeError, match=f"cannot use the lake catalog {url}.*Timeout"):
            open_catalog(url, "wh")
        assert time.monotonic() - started < 30                   # pyiceberg alone would wait forever
