"""One collector id per history: a real `forksight serve --lake-catalog` restarted under the same id carries on
(its runs once in the lake, under that id); started on the same file under a new id it is refused, saying what
to do, and the file and the lake are left as they were. A file that never wrote to the lake may take any id."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from collector_util import REPO, ServeProcess, free_port  # noqa: E402
from lake_util import batch, create_run, post, wait_drained  # noqa: E402

from forksight.monitor.lake.catalog import open_catalog  # noqa: E402


def _args(tmp_path, collector: str) -> tuple[str, ...]:
    return ("--lake-catalog", f"sqlite:///{tmp_path}/catalog.db", "--lake-warehouse", str(tmp_path / "wh"),
            "--collector-id", collector, "--lake-commit-seconds", "0.3")


def _lake_runs(tmp_path) -> list[tuple[str, str]]:
    catalog = open_catalog(f"sqlite:///{tmp_path}/catalog.db", str(tmp_path / "wh"), check=False)
    rows = catalog.load_table("forksight.runs").scan().to_arrow().to_pylist()
    return sorted((r["collector"], r["run_id"]) for r in rows)


def test_same_id_restart_carries_on_and_a_new_id_is_refused_with_what_to_do(tmp_path):
    db = tmp_path / "c.duckdb"
    with ServeProcess(db, args=_args(tmp_path, "box-1")) as srv:
        post(srv.url, create_run(srv.url, "r1"), batch(0))
        wait_drained(srv.url)
    with ServeProcess(db, args=_args(tmp_path, "box-1")) as srv:       # the same id: carries on
        post(srv.url, create_run(srv.url, "r2"), batch(0))
        wait_drained(srv.url)
    assert _lake_runs(tmp_path) == [("box-1", "r1"), ("box-1", "r2")]
    refused = subprocess.run([sys.executable, "-m", "forksight", "serve", "--db", str(db), "--port",
                              str(free_port()), "--no-dashboard", *_args(tmp_path, "box-2")],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "in the lake as collector 'box-1'" in refused.stderr and "--collector-id box-1" in refused.stderr
    assert "new --db file" in refused.stderr
    assert _lake_runs(tmp_path) == [("box-1", "r1"), ("box-1", "r2")]     # nothing written under box-2
    with ServeProcess(tmp_path / "fresh.duckdb", args=_args(tmp_path, "box-2")) as srv:    # a new file: fine
        post(srv.url, create_run(srv.url, "r1"), batch(0))
        wait_drained(srv.url)
    assert _lake_runs(tmp_path) == [("box-1", "r1"), ("box-1", "r2"), ("box-2", "r1")]
