"""The HTTP sink against a real collector: concurrent writers, a collector killed mid-ingest,
a collector that is not there yet, flush at exit, and the embedded default."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import duckdb
import httpx
import numpy as np
import pytest

from collector_util import InProcessCollector, ServeProcess, free_port
from forksight.monitor.sinks.client import HttpSink, open_sink

WORKER = r"""
import sys, numpy as np
from forksight.monitor.sinks.client import open_sink
url, name, steps, rows, ending = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sink = open_sink(name, url=url)
for step in range(steps):
    sink.log_scalars(step, {"entropy/mean": 1.0 + step, "loss": float(step)}, weight=rows)
    sink.log_tokens(step, {"sample_id": np.arange(rows) // 10, "pos": np.arange(rows) % 10,
                           "entropy": np.full(rows, step, np.float32), "token": ["<t>"] * rows})
print(sink.run_id, flush=True)
if ending == "finish":
    sink.finish()
elif ending == "raise":
    raise RuntimeError("training blew up")
# ending == "exit": no finish(): the atexit hook must flush and mark the run
"""


@pytest.fixture(autouse=True)
def _own_spool(tmp_path, monkeypatch):
    """Each test's sinks spool under its own tmp dir (./.forksight is relative to the cwd)."""
    monkeypatch.chdir(tmp_path)


def _counts(url, run):
    return httpx.get(f"{url}/api/runs/{run}/counts", timeout=30).json()


def test_four_client_processes_write_at_once_and_exit_paths_flush(collector):
    steps, rows = 20, 300
    endings = ["finish", "finish", "exit", "raise"]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, collector.url, f"proc{i}", str(steps), str(rows), e],
                              cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, e in enumerate(endings)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 1], [o[1][-500:] for o in outs]
    assert "training blew up" in outs[3][1]
    runs = {o[0].strip(): e for o, e in zip(outs, endings)}
    assert sorted(runs) == ["proc0", "proc1", "proc2", "proc3"]
    status = {r["run_id"]: r["status"] for r in httpx.get(f"{collector.url}/api/runs").json()}
    for run, ending in runs.items():
        counts = _counts(collector.url, run)
        assert (counts["scalars"], counts["tokens"]) == (2 * steps, steps * rows)
        assert status[run] == ("crashed" if ending == "raise" else "finished")
    means = httpx.get(f"{collector.url}/api/runs/proc2/scalars", params={"keys": "loss"}).json()
    assert [m["value"] for m in means] == [float(s) for s in range(steps)]


def _stored(db, run):
    with duckdb.connect(str(db), read_only=True) as con:
        tokens = con.execute("SELECT count(*), count(DISTINCT (step, sample_id, pos)) FROM tokens WHERE run_id = ?",
                             [run]).fetchall()[0]
        scalars = con.execute("SELECT count(*) FROM scalars WHERE run_id = ?", [run]).fetchall()[0][0]
        batches = {r[0] for r in con.execute("SELECT batch_id FROM batches WHERE run_id = ?", [run]).fetchall()}
    return tokens, scalars, batches


def test_collector_killed_mid_ingest_loses_nothing_acknowledged_and_the_spool_delivers_the_rest(tmp_path):
    db, port = tmp_path / "k.duckdb", free_port()
    server = ServeProcess(db, port=port).start()
    sink = HttpSink(server.url, "crash", flush_interval=0.02, retries=2)
    acked: list[str] = []
    original = sink._send

    def recording_send(item, retries=3):        # remember what the collector acknowledged
        ok = original(item, retries)
        if ok and item.kind in ("json", "arrow"):
            acked.append(item.batch_id)
        return ok
    sink._send = recording_send
    rows, restarted, logged = 400, threading.Event(), {"steps": 0, "at_restart": None}

    def train():                               # logs on through the outage and 20 steps past it
        step = 0
        while not (restarted.is_set() and step >= logged["at_restart"] + 20):
            sink.log_scalars(step, {"entropy/mean": 1.0})
            sink.log_tokens(step, {"sample_id": np.zeros(rows, int), "pos": np.arange(rows),
                                   "entropy": np.ones(rows, np.float32)})
            step += 1
            logged["steps"] = step
            time.sleep(0.01)
    trainer = threading.Thread(target=train)
    trainer.start()
    while len(acked) < 5:                      # mid-ingest: some batches are in
        time.sleep(0.01)
    server.kill()
    acked_before_kill = list(acked)
    deadline = time.monotonic() + 30
    while sink.spooled() < 3 and time.monotonic() < deadline:   # the sink spools meanwhile
        time.sleep(0.05)
    assert sink.spooled() >= 3
    server = ServeProcess(db, port=port).start()
    logged["at_restart"] = logged["steps"]
    restarted.set()
    trainer.join()
    assert sink.flush(60) and sink.spooled() == 0
    sink.finish()
    server.stop()
    steps = logged["steps"]
    (tokens, distinct), scalars, batches = _stored(db, "crash")
    assert tokens == distinct == steps * rows          # rows in == rows stored, none twice
    assert scalars == steps
    assert set(acked_before_kill) <= batches and set(acked) <= batches
    assert sink.rejected == []


def test_collector_not_there_yet_the_run_and_its_batches_wait_in_the_spool(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sink = HttpSink(url, "late", flush_interval=0.02, retries=1)
    for step in range(5):
        sink.log_scalars(step, {"reward/mean": step / 10})
    assert not sink.flush(0.5) and sink.spooled() >= 2        # the run creation + data
    with InProcessCollector(tmp_path / "l.duckdb", port=port) as server:
        assert sink.flush(60)
        sink.finish()
        got = httpx.get(f"{server.url}/api/runs/late/scalars").json()
        assert [(g["step"], g["value"]) for g in got] == [(s, s / 10) for s in range(5)]
        assert httpx.get(f"{server.url}/api/runs/late").json()["status"] == "finished"


EMBEDDED = r"""
import sys
from forksight.monitor.sinks.client import open_sink
sink = open_sink("emb-a")
print(type(sink).__name__, sink.run_id, flush=True)
for s in range(5):
    sink.log_scalars(s, {"x": float(s)})
sink.flush()
print("ready", flush=True)
sys.stdin.readline()
"""


def test_embedded_default_starts_a_collector_another_process_streams_to(tmp_path, monkeypatch):
    port, db = free_port(), tmp_path / "emb.duckdb"
    env = {**os.environ, "FORKSIGHT_URL": f"http://127.0.0.1:{port}", "FORKSIGHT_DB": str(db)}
    owner = subprocess.Popen([sys.executable, "-c", EMBEDDED], cwd=tmp_path, env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert owner.stdout.readline().split() == ["HttpSink", "emb-a"]
        assert owner.stdout.readline().strip() == "ready"
        monkeypatch.setenv("FORKSIGHT_URL", env["FORKSIGHT_URL"])
        other = open_sink("emb-b")                    # finds the embedded collector: no second one
        assert isinstance(other, HttpSink) and other.url == env["FORKSIGHT_URL"]
        other.log_scalars(0, {"x": 42.0})
        other.finish()
        health = httpx.get(f"{env['FORKSIGHT_URL']}/api/health").json()
        assert health["db"] == str(db)
        owner.stdin.write("\n")
        owner.stdin.flush()
        assert owner.wait(60) == 0, owner.stderr.read()
    finally:
        if owner.poll() is None:
            owner.kill()
    with duckdb.connect(str(db), read_only=True) as con:        # the owner closed the file at exit
        rows = con.execute("SELECT run_id, step, value FROM scalars ORDER BY run_id, step").fetchall()
        status = dict(con.execute("SELECT run_id, status FROM runs").fetchall())
    assert rows == [("emb-a", s, float(s)) for s in range(5)] + [("emb-b", 0, 42.0)]
    assert status == {"emb-a": "finished", "emb-b": "finished"}


def test_finish_with_the_collector_gone_returns_in_seconds_and_keeps_the_spool(tmp_path):
    sink = HttpSink(f"http://127.0.0.1:{free_port()}", "gone", flush_interval=0.02, retries=1,
                    spool_dir=tmp_path / "spool")
    for step in range(3):
        sink.log_scalars(step, {"loss": float(step)})
    done = threading.Thread(target=sink.finish)        # retries=1: it gives up, never waits forever
    done.start()
    done.join(timeout=120)
    assert not done.is_alive(), "finish() kept waiting for a collector that is gone"
    files = sorted(p.name.split(".")[1] for p in (tmp_path / "spool").glob("*.req"))
    assert "run" in files and "json" in files and "status" in files       # nothing dropped


def test_a_later_process_of_the_run_delivers_what_an_earlier_one_left_in_the_spool(tmp_path, monkeypatch):
    first = HttpSink(f"http://127.0.0.1:{free_port()}", "resume", flush_interval=0.02, retries=1)
    for step in range(3):
        first.log_scalars(step, {"loss": float(step)})
    first.finish()                                                # collector gone: all kept on disk
    assert list((tmp_path / ".forksight" / "spool").glob("resume.r0.*/*.req"))
    with InProcessCollector(tmp_path / "r.duckdb") as server:
        second = HttpSink(server.url, "resume", flush_interval=0.02)
        assert second.run_id == "resume"                          # the name was never taken
        second.log_scalars(3, {"loss": 3.0})
        second.finish()
        got = httpx.get(f"{server.url}/api/runs/resume/scalars").json()
        assert [(g["step"], g["value"]) for g in got] == [(s, float(s)) for s in range(4)]
    assert not list((tmp_path / ".forksight" / "spool").glob("resume.r0.*"))


def test_resume_continues_the_same_run_over_http_while_a_new_run_of_that_name_gets_name_2(tmp_path):
    with InProcessCollector(tmp_path / "resume.duckdb") as server:
        first = open_sink("again", url=server.url)
        first.log_scalars(1, {"loss": 1.0})
        first.finish()
        resumed = open_sink("again", url=server.url, resume=True)
        resumed.log_scalars(2, {"loss": 0.5})
        resumed.finish()
        fresh = open_sink("again", url=server.url)
        fresh.finish()
        assert (first.run_id, resumed.run_id, fresh.run_id) == ("again", "again", "again-2")
        reader = server.collector.store.reader
        stored = reader.read_scalars("again")
        assert stored.step.tolist() == [1, 2] and stored.value.tolist() == [1.0, 0.5]
