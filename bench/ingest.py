"""Ingest benchmark: our writer vs DuckDB's raw Arrow insert, HTTP loopback, 8 clients, TensorBoard.

Prints one JSON object; every ratio is measured side by side in this run. Progress on stderr.
Targets (issue 3): in-process writer >= 2M token rows/s, one HTTP client >= 500k rows/s.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forksight.base.records import Records, tokens_table
from forksight.monitor.collector.store import Store

TOTAL_ROWS = 2_000_000
CHUNK_ROWS = 65_536           # rows per log_tokens call (a step's bounded sample at scale)
STEPS_TB = 300                # steps of scalars + histogram for the TensorBoard comparison


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def token_columns(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"sample_id": np.arange(n, dtype=np.int64) // 512, "pos": (np.arange(n) % 512).astype(np.int32),
            "token_id": rng.integers(0, 151_000, n, dtype=np.int32),
            "token": pa.array(np.array(["▁the", "7", "+", "=", "<b>"])[rng.integers(0, 5, n)]),
            "entropy": rng.random(n, dtype=np.float32) * 3, "renyi2": rng.random(n, dtype=np.float32),
            "js": rng.random(n, dtype=np.float32), "logp": -rng.random(n, dtype=np.float32),
            "top1": rng.random(n, dtype=np.float32), "fork": rng.random(n) > 0.8,
            "selected": rng.random(n) > 0.5}


def rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1)


# ---------------------------------------------------------------------------- in-process
def bench_raw_duckdb(table: pa.Table, path: str) -> float:
    """Seconds for DuckDB's own Arrow insert of `table` into the store's tokens table."""
    import duckdb

    with Store(path):
        pass                                   # the same schema, created by the store
    con = duckdb.connect(path)
    con.execute("SET enable_progress_bar = false")
    con.register("t", table)
    start = time.perf_counter()
    con.execute("INSERT INTO tokens BY NAME SELECT 'raw' AS run_id, * FROM t")
    seconds = time.perf_counter() - start
    con.close()
    return seconds


def bench_store(chunks: list[dict], path: str) -> float:
    """Seconds for the in-process writer: Store.write of prepared chunks, all committed."""
    with Store(path) as store:
        run = store.create_run("w")
        tables = [tokens_table(c, step=i) for i, c in enumerate(chunks)]
        start = time.perf_counter()
        for f in [store.write(run, Records(tokens=t)) for t in tables]:
            f.result()
        return time.perf_counter() - start


def bench_local_sink(chunks: list[dict], path: str) -> float:
    """Seconds for LocalSink.log_tokens (validation included) until flushed."""
    from forksight.compose.local import LocalSink

    with Store(path) as store:
        sink = LocalSink(path, "sink", store=store)
        start = time.perf_counter()
        for i, c in enumerate(chunks):
            sink.log_tokens(i, c)
        sink.flush()
        seconds = time.perf_counter() - start
        assert store.reader.row_counts(sink.run_id)["tokens"] == sum(len(c["pos"]) for c in chunks)
        sink.finish()
    return seconds


def bench_in_process(tmp: str, rows: int = 1_000_000, repeats: int = 3) -> dict:
    """Raw insert, writer and sink interleaved `repeats` times (this machine is shared: best of each)."""
    columns = token_columns(rows)
    table = tokens_table(columns, step=0)
    chunks = [{k: v[i:i + CHUNK_ROWS] for k, v in columns.items()} for i in range(0, rows, CHUNK_ROWS)]
    raw, writer, sink = [], [], []
    for r in range(repeats):
        raw.append(bench_raw_duckdb(table, os.path.join(tmp, f"raw{r}.duckdb")))
        writer.append(bench_store(chunks, os.path.join(tmp, f"store{r}.duckdb")))
        sink.append(bench_local_sink(chunks, os.path.join(tmp, f"sink{r}.duckdb")))
    raw_s, writer_s, sink_s = min(raw), min(writer), min(sink)
    return {"rows": rows, "repeats": repeats,
            "duckdb_raw_arrow_rows_per_s": rate(rows, raw_s), "store_writer_rows_per_s": rate(rows, writer_s),
            "local_sink_rows_per_s": rate(rows, sink_s), "writer_over_raw": round(raw_s / writer_s, 3),
            "local_sink_over_raw": round(raw_s / sink_s, 3), "target_rows_per_s": 2_000_000}


# ---------------------------------------------------------------------------- HTTP
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_collector(db: str) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "forksight", "serve", "--db", db, "--port", str(port),
                             "--no-dashboard"], cwd=Path(__file__).resolve().parents[1],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/api/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("collector did not start")


def bench_http_one(url: str, columns: dict) -> float:
    from forksight.monitor.sinks.client import HttpSink

    sink = HttpSink(url, "http1", max_batch_rows=262_144)
    start = time.perf_counter()
    for i in range(0, TOTAL_ROWS, CHUNK_ROWS):
        sink.log_tokens(i // CHUNK_ROWS, {k: v[i:i + CHUNK_ROWS] for k, v in columns.items()})
    assert sink.flush(120)
    seconds = time.perf_counter() - start
    sink.finish()
    assert sink.sent_rows == TOTAL_ROWS and not sink.rejected
    return seconds


def _client_latencies(args) -> list[float]:
    import httpx

    url, idx, batches, rows = args
    table = tokens_table(token_columns(rows, seed=idx), step=0)
    out = pa.BufferOutputStream()
    with pa.ipc.new_stream(out, table.schema) as writer:
        writer.write_table(table)
    body = out.getvalue().to_pybytes()
    with httpx.Client(base_url=url, timeout=120) as http:
        run = http.post("/api/runs", json={"name": f"c{idx}"}).json()["run_id"]
        spans = []                                  # wall-clock (start, end): comparable across processes
        for b in range(batches):
            start = time.time()
            resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"{idx}-{b}"}, content=body,
                             headers={"Content-Type": "application/vnd.apache.arrow.stream"})
            spans.append((start, time.time()))
            assert resp.status_code == 200, resp.text
    return spans


def bench_http_eight(url: str, batches: int = 8, rows: int = 16_384) -> dict:
    with mp.get_context("spawn").Pool(8) as pool:
        spans = np.array([s for part in pool.map(_client_latencies, [(url, i, batches, rows) for i in range(8)])
                          for s in part])
    lat = spans[:, 1] - spans[:, 0]
    seconds = spans[:, 1].max() - spans[:, 0].min()     # first request out to last answer in
    return {"clients": 8, "batch_rows": rows, "batches": int(lat.size),
            "p50_batch_ms": round(float(np.percentile(lat, 50)) * 1e3, 1),
            "p99_batch_ms": round(float(np.percentile(lat, 99)) * 1e3, 1),
            "aggregate_rows_per_s": rate(int(lat.size) * rows, seconds)}


# ---------------------------------------------------------------------------- TensorBoard
def step_data(rng) -> tuple[dict, np.ndarray, np.ndarray]:
    keys = ["entropy/mean", "entropy/p20", "entropy/p50", "entropy/p80", "entropy/p95", "renyi2/mean",
            "js/mean", "top1/mean", "fork/frac", "selected/threshold", "selected/frac", "cov/logp_adv",
            "reward/mean", "reward/std", "pass@1", "pass@8", "loss", "kl", "grad_norm", "lr"]
    edges = np.linspace(0, 12, 121)
    return {k: float(rng.random()) for k in keys}, rng.integers(0, 1000, 120).astype(np.float64), edges


def _ours(data: list, path: str, alerts: bool) -> float:
    from forksight.compose.local import LocalSink

    with Store(path) as store:
        LocalSink(path, "warmup", store=store, alerts=alerts).finish()     # imports and first-call costs
        sink = LocalSink(path, "tbcmp", store=store, alerts=alerts)
        start = time.perf_counter()
        for step, (scalars, counts, edges) in enumerate(data):
            sink.log_scalars(step, scalars)
            sink.log_histogram(step, "entropy", counts, edges)
        sink.flush()
        seconds = time.perf_counter() - start
        sink.finish()
    return seconds


def _tensorboard(data: list, logdir: str) -> float:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(logdir)
    start = time.perf_counter()
    for step, (scalars, counts, edges) in enumerate(data):
        for k, v in scalars.items():
            writer.add_scalar(k, v, step)
        centers = (edges[:-1] + edges[1:]) / 2
        writer.add_histogram_raw("entropy", min=float(edges[0]), max=float(edges[-1]), num=float(counts.sum()),
                                 sum=float((counts * centers).sum()), sum_squares=float((counts * centers**2).sum()),
                                 bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist(), global_step=step)
    writer.flush()
    writer.close()
    return time.perf_counter() - start


def bench_tensorboard(tmp: str) -> dict:
    """The same per-step scalars + entropy histogram: TensorBoard's SummaryWriter vs LocalSink."""
    rng = np.random.default_rng(0)
    data = [step_data(rng) for _ in range(STEPS_TB)]
    rows = sum(len(s) + len(c) for s, c, _ in data)          # scalar rows + histogram bins
    _tensorboard(data[:10], os.path.join(tmp, "tb-warmup"))
    tb_s = min(_tensorboard(data, os.path.join(tmp, f"tb{r}")) for r in range(2))
    ours_s = min(_ours(data, os.path.join(tmp, f"tbcmp-a{r}.duckdb"), alerts=True) for r in range(2))
    bare_s = min(_ours(data, os.path.join(tmp, f"tbcmp-n{r}.duckdb"), alerts=False) for r in range(2))
    return {"steps": STEPS_TB, "rows": rows, "tensorboard_rows_per_s": rate(rows, tb_s),
            "forksight_rows_per_s_with_alerts": rate(rows, ours_s),
            "forksight_rows_per_s_without_alerts": rate(rows, bare_s),
            "ours_over_tensorboard_with_alerts": round(tb_s / ours_s, 2),
            "ours_over_tensorboard_without_alerts": round(tb_s / bare_s, 2)}


def main() -> None:
    out: dict = {"chunk_rows": CHUNK_ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        say("in-process: DuckDB raw Arrow insert vs Store writer vs LocalSink (best of 3, interleaved)")
        out["in_process"] = bench_in_process(tmp)
        say("HTTP loopback, one client")
        proc, url = start_collector(os.path.join(tmp, "http.duckdb"))
        try:
            columns = token_columns(TOTAL_ROWS)
            http_s = bench_http_one(url, columns)
            out["http_one_client"] = {"rows": TOTAL_ROWS, "rows_per_s": rate(TOTAL_ROWS, http_s),
                                      "over_local_sink": round(rate(TOTAL_ROWS, http_s)
                                                               / out["in_process"]["local_sink_rows_per_s"], 3),
                                      "target_rows_per_s": 500_000}
            say("HTTP loopback, 8 client processes")
            out["http_eight_clients"] = bench_http_eight(url)
        finally:
            proc.terminate()
            proc.wait(30)
        say("TensorBoard SummaryWriter vs LocalSink (scalars + histogram per step)")
        out["tensorboard"] = bench_tensorboard(tmp)
    out["cpus"] = os.cpu_count()
    out["load_average_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
