"""A training script that ends without `finish()` still stores every row it logged: the sinks'
exit hook must run before DuckDB's own (registered at `import duckdb`), which refuses to read
the Python-side Arrow tables that queued rows are written from."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import duckdb
import pytest

STEPS = 7
SCRIPT = """
import forksight
sink = forksight.open_sink(run="no-finish", {where})
for step in range(%d):
    sink.log_scalars(step, {{"entropy/mean": 1.0 / (step + 1), "reward": 0.5}})
    sink.log_samples(step, [{{"sample_id": 0, "group_id": 0, "completion": "x", "reward": 0.5}}])
# no sink.finish(): the process just ends, as most scripts do
""" % STEPS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stored(db) -> tuple[int, int, str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        scalars = con.execute("SELECT count(*) FROM scalars WHERE run_id = 'no-finish'").fetchone()[0]
        samples = con.execute("SELECT count(*) FROM samples WHERE run_id = 'no-finish'").fetchone()[0]
        status = con.execute("SELECT status FROM runs WHERE run_id = 'no-finish'").fetchone()[0]
    finally:
        con.close()
    return scalars, samples, status


@pytest.mark.parametrize("mode", ["db", "embedded"])
def test_rows_logged_before_exit_are_all_stored(mode, tmp_path):
    db = tmp_path / "exit.duckdb"
    env = {**os.environ, "FORKSIGHT_DB": str(db), "FORKSIGHT_URL": f"http://127.0.0.1:{_free_port()}"}
    where = f"db={str(db)!r}" if mode == "db" else ""   # neither url nor db: an embedded collector
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(where=where)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "shutting down" not in out.stderr and "not stored" not in out.stderr, out.stderr[-2000:]
    assert _stored(db) == (2 * STEPS, STEPS, "finished")
