"""The HttpSink never loses a record silently (issue 13): an unwritable spool keeps batches in
bounded memory, a full buffer pushes back, flush/finish say exactly what was not delivered, and
a sink started while the collector is down files a new run like the online path does."""
from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import pytest

from collector_util import InProcessCollector, free_port
from forksight.monitor.sinks.http import DeliveryError, HttpSink


@pytest.fixture(autouse=True)
def _own_spool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)          # ./.forksight/spool is relative to the cwd


def _unwritable(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the spool directory should be")
    return blocker / "spool"


def _log(sink, steps: int, tokens_per_step: int) -> None:
    for step in range(steps):
        sink.log_scalars(step, {"loss": float(step), "entropy/mean": 1.0})
        sink.log_tokens(step, {"sample_id": np.zeros(tokens_per_step, np.int64), "pos": np.arange(tokens_per_step)})
        sink.log_samples(step, [{"sample_id": 0, "reward": 1.0}])


def test_nothing_is_lost_when_neither_the_collector_nor_the_spool_takes_batches(tmp_path):
    port = free_port()
    sink = HttpSink(f"http://127.0.0.1:{port}", "nowhere", spool_dir=_unwritable(tmp_path),
                    flush_interval=0.02, retries=1)
    _log(sink, steps=20, tokens_per_step=50)
    assert sink.flush(1.0) is False
    want = {"scalars": 40, "tokens": 1000, "samples": 20}
    assert sink.undelivered() == want                 # exactly what was logged, held in memory
    assert sink.spooled() == 0
    with InProcessCollector(tmp_path / "late.duckdb", port=port) as server:
        assert sink.flush(60) is True
        assert sink.undelivered() == {}
        assert sink.finish() == {}
        counts = httpx.get(f"{server.url}/api/runs/nowhere/counts").json()
    assert {k: counts[k] for k in want} == want      # rows in == rows stored


def test_finish_reports_what_it_could_not_deliver(tmp_path, caplog):
    sink = HttpSink(f"http://127.0.0.1:{free_port()}", "gone", spool_dir=_unwritable(tmp_path),
                    flush_interval=0.02, retries=1)
    _log(sink, steps=3, tokens_per_step=10)
    result: list = []
    done = threading.Thread(target=lambda: result.append(sink.finish()))   # gives up, never hangs
    done.start()
    done.join(timeout=120)
    assert not done.is_alive(), "finish() kept waiting for a collector that is gone"
    left = result[0]
    assert left == {"scalars": 6, "tokens": 30, "samples": 3}
    assert "not delivered" in caplog.text and "lost at exit" in caplog.text


def test_a_full_memory_buffer_pushes_back_then_raises_instead_of_dropping(tmp_path):
    sink = HttpSink(f"http://127.0.0.1:{free_port()}", "full", spool_dir=_unwritable(tmp_path),
                    flush_interval=0.01, retries=1, max_batch_rows=100,
                    max_memory_bytes=20_000, backpressure_timeout=0.5)
    logged = 0
    with pytest.raises(DeliveryError, match="refusing more rows"):
        for step in range(10_000):
            sink.log_tokens(step, {"sample_id": np.zeros(100, np.int64), "pos": np.arange(100)})
            logged += 100
            time.sleep(0.002)
    assert sink.undelivered()["tokens"] == logged     # everything accepted is still held
    sink.finish(timeout=1.0)


def test_a_sink_started_while_the_collector_is_down_files_a_new_run_not_an_old_one(tmp_path):
    port = free_port()
    db = tmp_path / "runs.duckdb"
    with InProcessCollector(db, port=port):
        old = HttpSink(f"http://127.0.0.1:{port}", "exp")
        old.log_scalars(0, {"loss": 9.0})
        old.finish()
    offline = HttpSink(f"http://127.0.0.1:{port}", "exp", flush_interval=0.02, retries=1)
    offline.log_scalars(0, {"loss": 1.0})
    assert offline.flush(0.5) is False and offline.spooled() >= 2
    with InProcessCollector(db, port=port) as server:
        assert offline.flush(60)
        offline.finish()
        assert offline.run_id == "exp-2"              # like the online path: the name was taken
        runs = {r["run_id"]: r for r in httpx.get(f"{server.url}/api/runs").json()}
        old_rows = httpx.get(f"{server.url}/api/runs/exp/scalars").json()
        new_rows = httpx.get(f"{server.url}/api/runs/exp-2/scalars").json()
    assert runs["exp"]["status"] == "finished" and [r["value"] for r in old_rows] == [9.0]
    assert [r["value"] for r in new_rows] == [1.0] and runs["exp-2"]["status"] == "finished"


def test_a_local_sink_whose_writes_fail_says_so_instead_of_returning_true(tmp_path):
    from forksight.compose.local import LocalSink

    sink = LocalSink(str(tmp_path / "l.duckdb"), "local")
    sink.log_scalars(0, {"loss": 1.0})
    assert sink.flush() is True and sink.undelivered() == {}
    sink.store.close()                                # e.g. the file's owner went away under it
    sink.log_scalars(1, {"loss": 0.5, "kl": 0.1})
    sink.log_tokens(1, {"sample_id": [0, 0, 0], "pos": [0, 1, 2]})
    assert sink.flush() is False
    assert sink.undelivered() == {"scalars": 2, "tokens": 3}
    assert sink.finish() == {"scalars": 2, "tokens": 3}
