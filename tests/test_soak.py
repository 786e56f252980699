"""Soak on loopback: 16 clients stream JSON and Arrow batches to one `forksight serve` for about a
minute (FORKSIGHT_SOAK_S); no error, every row sent is stored, and the server's memory stays bounded."""
from __future__ import annotations

import json
import os
import threading
import time

import httpx
import numpy as np
import pyarrow as pa
import pytest

from collector_util import ServeProcess

pytestmark = pytest.mark.slow
CLIENTS = 16
TOKENS_PER_BATCH = 512
RSS_LIMIT_MB = 2048           # baseline ~200 MB; DuckDB's buffer pool grows with the file


def _rss_mb(pid: int, field: str = "VmRSS:") -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _arrow_tokens(step: int, rng) -> bytes:
    n = TOKENS_PER_BATCH
    table = pa.table({"step": pa.array([step] * n, pa.int64()), "sample_id": pa.array(np.arange(n) // 64, pa.int64()),
                      "pos": pa.array(np.arange(n) % 64, pa.int64()),
                      "token": pa.array([f"t{i % 97}" for i in range(n)]),
                      "entropy": pa.array(rng.random(n) * 3)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _client(url: str, idx: int, deadline: float, out: dict) -> None:
    rng = np.random.default_rng(idx)
    sent = {"scalars": 0, "tokens": 0, "samples": 0}
    errors: list[str] = []
    with httpx.Client(base_url=url, timeout=60) as http:
        run = http.post("/api/runs", json={"name": f"soak-{idx}"}).json()["run_id"]
        step = 0
        while time.monotonic() < deadline:
            batch = {"batch_id": f"j{step}", "scalars": [{"step": step, "key": f"k{k}", "value": float(rng.random())}
                                                           for k in range(8)],
                     "samples": [{"step": step, "sample_id": s, "group_id": s // 2, "prompt": "1+1=",
                                  "completion": "2", "reward": 1.0} for s in range(4)]}
            try:
                resp = http.post(f"/api/runs/{run}/ingest", content=json.dumps(batch),
                                 headers={"Content-Type": "application/json"})
                if resp.status_code != 200:
                    errors.append(f"ingest {resp.status_code} {resp.text[:200]}")
                else:
                    sent["scalars"] += 8
                    sent["samples"] += 4
                resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"t{step}"},
                                 content=_arrow_tokens(step, rng),
                                 headers={"Content-Type": "application/vnd.apache.arrow.stream"})
                if resp.status_code != 200:
                    errors.append(f"tokens {resp.status_code} {resp.text[:200]}")
                else:
                    sent["tokens"] += TOKENS_PER_BATCH
            except httpx.HTTPError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            step += 1
        out[idx] = (run, sent, errors)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the server's RSS from /proc")
def test_sixteen_clients_for_a_minute_lose_nothing_and_memory_stays_bounded(tmp_path):
    seconds = float(os.environ.get("FORKSIGHT_SOAK_S", "60"))
    with ServeProcess(tmp_path / "soak.duckdb") as server:
        pid, start_rss = server.proc.pid, _rss_mb(server.proc.pid)
        samples: list[float] = []
        results: dict = {}
        deadline = time.monotonic() + seconds
        threads = [threading.Thread(target=_client, args=(server.url, i, deadline, results)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            samples.append(_rss_mb(pid))
            time.sleep(0.5)
        for t in threads:
            t.join()
        peak = _rss_mb(pid, "VmHWM:")
        errors = [e for _, _, errs in results.values() for e in errs]
        assert len(results) == CLIENTS and errors == [], errors[:5]
        for run, sent, _ in results.values():
            stored = httpx.get(f"{server.url}/api/runs/{run}/counts", timeout=60).json()
            assert {k: stored[k] for k in sent} == sent, run
        total = sum(sum(sent.values()) for _, sent, _ in results.values())
        db_mb = os.path.getsize(tmp_path / "soak.duckdb") / 2**20
        print(f"\nsoak: {CLIENTS} clients x {seconds:.0f} s, {total} rows stored, 0 errors; server RSS "
              f"{start_rss:.0f} MB at start, {samples[len(samples) // 2]:.0f} MB halfway, {samples[-1]:.0f} MB at "
              f"the end, peak {peak:.0f} MB; db file {db_mb:.0f} MB")
        assert peak < RSS_LIMIT_MB, f"server peak RSS {peak:.0f} MB"


def _disk_client(url: str, idx: int, deadline: float, out: dict, refused: threading.Event) -> None:
    """Stream token batches; a 507/503 (disk full, store reopening) is retried with the same batch
    id, as a sink does; anything else but 200 is an error."""
    rng = np.random.default_rng(idx)
    acked, statuses, errors = 0, {}, []
    with httpx.Client(base_url=url, timeout=120) as http:
        run = http.post("/api/runs", json={"name": f"disk-{idx}"}).json()["run_id"]
        step = 0
        while time.monotonic() < deadline:
            body = _arrow_tokens(step, rng)
            for _ in range(2000):
                resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"t{step}"}, content=body,
                                 headers={"Content-Type": "application/vnd.apache.arrow.stream"})
                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                if resp.status_code == 200:
                    acked += 0 if resp.json()["duplicate"] else TOKENS_PER_BATCH
                    break
                if resp.status_code in (503, 507) and resp.json()["detail"]:
                    refused.set()
                    time.sleep(0.05)              # a sink's backoff before it sends the batch again
                    continue
                errors.append(f"{resp.status_code} {resp.text[:200]}")
                break
            step += 1
        out[idx] = (run, acked, statuses, errors)


def test_clients_stream_through_a_full_disk_and_every_acknowledged_row_is_stored(tmp_path):
    from collector_util import fill_disk, mount_small_filesystem, unmount

    where = tmp_path / "fs"
    why = mount_small_filesystem(where, "48m")
    if why is not None:
        pytest.skip(why)
    seconds = float(os.environ.get("FORKSIGHT_SOAK_S", "60")) / 4
    try:
        with ServeProcess(where / "disk.duckdb") as server:
            results: dict = {}
            refused = threading.Event()
            deadline = time.monotonic() + seconds
            threads = [threading.Thread(target=_disk_client, args=(server.url, i, deadline, results, refused))
                       for i in range(8)]
            for t in threads:
                t.start()
            filler = fill_disk(where, 2 << 20)
            saw_full = refused.wait(seconds)
            health_full = httpx.get(server.url + "/api/health", timeout=60)
            filler.unlink()
            for t in threads:
                t.join()
            assert saw_full, "the disk never filled: the case was not exercised"
            assert health_full.status_code in (200, 503)
            errors = [e for *_, errs in results.values() for e in errs]
            assert len(results) == 8 and errors == [], errors[:5]
            assert httpx.get(server.url + "/api/health", timeout=60).status_code == 200
            for run, acked, statuses, _ in results.values():
                stored = httpx.get(f"{server.url}/api/runs/{run}/counts", timeout=60).json()["tokens"]
                assert stored == acked, (run, stored, acked, statuses)
            print(f"\ndisk-full soak: {sum(r[1] for r in results.values())} rows acknowledged and stored; "
                  f"answers {[r[2] for r in results.values()]}")
        assert "Traceback" not in server.log(), server.log()[-3000:]
    finally:
        unmount(where)
