"""A full disk on a real small filesystem (a tmpfs the test mounts; skipped with the reason where it
cannot): a write that does not fit answers 507 naming disk full and the space it needs, DuckDB's
checkpoint failing at commit (which invalidates the open database) is said as such, /api/health
answers 503 with the store's state while it cannot write, opening is never called "damaged", and
once there is room again the collector reopens the file by itself with every acknowledged row."""
from __future__ import annotations

import os

import httpx
import numpy as np
import pyarrow as pa
import pytest

from collector_util import InProcessCollector, fill_disk, mount_small_filesystem, unmount
from forksight.base.constants import ARROW_MEDIA_TYPE


@pytest.fixture
def small_fs(tmp_path):
    where = tmp_path / "fs"
    why = mount_small_filesystem(where, "24m")
    if why is not None:
        pytest.skip(why)
    yield where
    unmount(where)


def arrow_tokens(step: int, n: int) -> bytes:
    rng = np.random.default_rng(step)
    table = pa.table({"step": pa.array([step] * n, pa.int64()), "sample_id": pa.array(np.arange(n) // 100, pa.int64()),
                      "pos": pa.array(np.arange(n) % 100, pa.int32()), "entropy": pa.array(rng.random(n))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def post(http, run: str, step: int, n: int):
    return http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"b{step}"}, content=arrow_tokens(step, n),
                     headers={"Content-Type": ARROW_MEDIA_TYPE})


def fill_until_refused(http, run: str, n: int, first: int = 0) -> tuple[int, int, httpx.Response]:
    """Post batches of n rows until one is refused: (rows acknowledged, the refused step, its answer)."""
    acked = 0
    for step in range(first, first + 400):
        resp = post(http, run, step, n)
        if resp.status_code != 200:
            return acked, step, resp
        acked += resp.json()["rows"]["tokens"]
    raise AssertionError("the small disk never filled")


def test_a_large_batch_on_a_full_disk_is_a_507_naming_the_space_then_stored_once_there_is_room(small_fs):
    with InProcessCollector(small_fs / "c.duckdb") as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        run = http.post("/api/runs", json={"name": "full"}).json()["run_id"]
        assert post(http, run, 0, 1000).status_code == 200
        filler = fill_disk(small_fs, 1 << 20)
        # 400k rows (~13 MiB in memory): DuckDB writes such an insert to the file as it goes, and the
        # ENOSPC came back masked as "Current transaction is aborted" (a 500)
        refused = post(http, run, 1, 400_000)
        assert refused.status_code == 507, refused.text
        detail = refused.json()["detail"]
        assert detail.startswith("disk full") and "MiB free" in detail and "send it again" in detail
        health = http.get("/api/health")
        assert health.status_code == 503
        state = health.json()["store"]
        assert state["disk_full"] and not state["writable"] and not state["invalidated"]
        assert state["needed_bytes"] > 0 and state["free_bytes"] < 3 << 20
        from forksight.monitor.sinks.client import collector_answers

        assert collector_answers(srv.url)        # an unhealthy collector is still there: no second one started
        assert http.get(f"/api/runs/{run}/counts").json()["tokens"] == 1000     # reads go on
        os.remove(filler)
        assert http.get("/api/health").status_code == 200
        again = post(http, run, 1, 400_000)
        assert again.status_code == 200 and again.json()["stored"], again.text
        assert http.get(f"/api/runs/{run}/counts").json()["tokens"] == 401_000


def test_a_checkpoint_that_fills_the_disk_is_said_and_healed_and_no_acknowledged_row_is_lost(small_fs):
    from forksight.monitor.collector.store import Store

    db = small_fs / "c.duckdb"
    with InProcessCollector(db) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        store = srv.collector.store
        run = http.post("/api/runs", json={"name": "ckpt"}).json()["run_id"]
        # a small checkpoint threshold: DuckDB checkpoints at commit as soon as the .wal passes it
        store.call(lambda cur: cur.execute("SET checkpoint_threshold = '256KB'"))
        filler = fill_disk(small_fs, 6 << 20)
        acked, step, refused = fill_until_refused(http, run, 20_000)
        assert acked > 0 and refused.status_code == 507, refused.text
        assert "invalidated" in refused.json()["detail"] and "disk full" in refused.json()["detail"]
        # health tells the truth (it was 200 "ok" while every write failed)
        health = http.get("/api/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert health.json()["store"]["disk_full"] and not health.json()["store"]["writable"]
        counts = http.get(f"/api/runs/{run}/counts")                   # was a bare text 500
        assert counts.status_code == 200 or (counts.status_code in (503, 507) and counts.json()["detail"]), counts.text
        os.remove(filler)
        healed = http.get("/api/health")                               # reopens the file, replays the .wal
        assert healed.status_code == 200, healed.text
        assert healed.json()["store"] == {**healed.json()["store"], "writable": True, "invalidated": False}
        again = post(http, run, step, 20_000)
        assert again.status_code == 200, again.text
        acked += again.json()["rows"].get("tokens", 0) or 20_000 * again.json()["duplicate"]
        stored = http.get(f"/api/runs/{run}/counts").json()["tokens"]
        assert stored == acked == 20_000 * (step + 1)
    with Store(db) as reopened:                                          # and after a clean close
        assert reopened.reader.row_counts(run)["tokens"] == acked


def test_opening_a_file_on_a_full_disk_says_disk_full_never_damaged(small_fs):
    import subprocess
    import sys

    from forksight.monitor.collector.store import Store

    db = small_fs / "o.duckdb"
    script = ("import sys, numpy as np, os\nfrom forksight.base.records import Records, tokens_table\n"
              "from forksight.monitor.collector.store import Store\nstore = Store(sys.argv[1])\n"
              "run = store.create_run('o')\nn = 10_000\n"
              "for step in range(30):\n"      # small inserts: their rows go to the .wal, not the file
              "    store.write(run, Records(tokens=tokens_table({'sample_id': np.arange(n), 'pos': np.zeros(n, np.int32),"
              " 'entropy': np.random.rand(n)}, step=step))).result()\nos._exit(0)\n")
    subprocess.run([sys.executable, "-c", script, str(db)], check=True)    # acknowledged, left in the .wal
    assert os.path.getsize(str(db) + ".wal") > 1 << 20
    filler = fill_disk(small_fs, 64 << 10)
    with pytest.raises(RuntimeError) as refused:
        Store(db)
    text = str(refused.value)
    assert "disk is full" in text and "not damaged" in text and "damaged or not" not in text
    assert "MiB" in text
    os.remove(filler)
    with Store(db) as store:
        assert store.reader.row_counts("o")["tokens"] == 300_000 and store.lost_rows == {}
