"""First contact with the CLI: a busy port refused before anything is created, a new default file
next to the demo's pointed at the demo's, --strategies checked before anything starts, a DuckDB
file another process holds refused without a traceback, and the one line a run prints: where to
see it (once per run, rank 0 only)."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from forksight.monitor.sinks.client import open_sink


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forksight(*argv: str, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "forksight", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_serve_on_a_busy_port_prints_no_banner_creates_no_file_and_names_the_flag(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _forksight("serve", "--db", "x.duckdb", "--port", str(port), cwd=tmp_path)
    assert proc.returncode == 1
    assert f"port {port}" in proc.stderr and f"--port {port + 1}" in proc.stderr
    assert "collector on" not in proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_serve_without_db_next_to_the_demo_file_says_which_file_and_how_to_open_the_demos(tmp_path):
    import duckdb

    duckdb.connect(str(tmp_path / "forksight-demo.duckdb")).close()
    proc = subprocess.Popen([sys.executable, "-m", "forksight", "serve", "--port", str(_free_port()),
                             "--no-dashboard"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        banner = proc.stdout.readline()        # blocks until serve has opened its file
        hint = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert str(tmp_path / "forksight.duckdb") in banner and "new" in banner
    assert "forksight serve --db forksight-demo.duckdb" in hint


@pytest.mark.parametrize("value, said", [
    ("all,frok", "unknown strategy 'frok' in --strategies (did you mean 'fork'?)"),
    ("all,all", "names all twice"),
    (",", "--strategies is empty"),
])
def test_demo_checks_strategies_before_anything_starts(tmp_path, value, said):
    proc = _forksight("demo", "--strategies", value, "--port", str(_free_port()), cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr
    assert "all, fork, ict" in proc.stderr or "twice" in said
    assert list(tmp_path.iterdir()) == []      # no DuckDB file, no log directory


def test_train_on_a_file_another_process_holds_says_so_without_a_traceback(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect('held.duckdb'); "
                               "print('held', flush=True); sys.stdin.read()"], cwd=tmp_path,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = _forksight("train", "--preset", "tiny-test", "--steps", "1", "--db", "held.duckdb",
                          cwd=tmp_path, timeout=600)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "forksight train: cannot open held.duckdb: another process" in proc.stderr
    assert "url" in proc.stderr


def test_a_run_prints_where_to_see_it_once_and_only_on_rank_0(tmp_path, capfd):
    from forksight.compose.app import Collector

    db = str(tmp_path / "runs.duckdb")
    sink = open_sink("first", db=db)
    sink.finish()
    err = capfd.readouterr().err
    assert err.count("forksight: run first is stored in") == 1
    assert f"forksight serve --db {db}, then http://127.0.0.1:8050/run?run=first" in err
    from forksight.monitor.sinks.announce import announce

    announce(sink)                              # the same run again: nothing more
    assert capfd.readouterr().err == ""
    assert open_sink("first", db=db, rank=1) is not None and capfd.readouterr().err == ""
    collector = Collector(str(tmp_path / "served.duckdb"), port=_free_port(), dashboard=False).start()
    try:
        sink = open_sink("over http", url=collector.url)
        sink.finish()
    finally:
        collector.stop()
    err = capfd.readouterr().err
    assert err.strip().splitlines() == [f"forksight: run {sink.run_id} → {collector.url}/run?run={sink.run_id}"]
