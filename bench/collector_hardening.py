"""Issue 26's cases against a real collector, printed as JSON (one object per case: HTTP status,
server peak RSS, seconds and what was said). Run it on this checkout and on an older tree to get
the before/after table:

    python bench/collector_hardening.py                       # this checkout
    python bench/collector_hardening.py --src /tmp/old/pkg    # a tree holding an older `forksight`
    python bench/collector_hardening.py --cases tokens_2m,sigterm --rows 2000000

--src is put first on PYTHONPATH of every server this starts. The disk-full cases mount a tmpfs
(root only; they report `skipped` otherwise). Nothing here asserts a time: it measures."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np
import pyarrow as pa

ARROW = {"Content-Type": "application/vnd.apache.arrow.stream"}
CASES = ("tokens_2m", "wide_60k", "slow_dash", "sigterm", "disk_full_insert", "disk_full_checkpoint")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_mb(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def tokens(step: int, n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return ipc(pa.table({"step": pa.array(np.full(n, step), pa.int64()),
                         "sample_id": pa.array(np.arange(n) // 1000, pa.int64()),
                         "pos": pa.array(np.arange(n) % 1000, pa.int32()), "entropy": pa.array(rng.random(n))}))


class Server:
    """`python -m forksight serve` from `src` on a free port; .peak() reads its VmHWM."""

    def __init__(self, src: str | None, db: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        if src:
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        self.log = open(db + ".log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "forksight", "serve", "--db", db, "--port",
                                      str(self.port), *args], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=tempfile.gettempdir())
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/api/health", timeout=1).status_code in (200, 503):
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def peak(self) -> float | None:
        return peak_mb(self.proc.pid)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def case_tokens_2m(src, tmp, rows: int) -> dict:
    srv = Server(src, os.path.join(tmp, "t.duckdb"), "--no-dashboard")
    try:
        http = httpx.Client(base_url=srv.url, timeout=300)
        run = http.post("/api/runs", json={"name": "big"}).json()["run_id"]
        per = 500_000
        for i in range(0, rows, per):
            body = tokens(1, min(per, rows - i), seed=i)
            http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"b{i}"}, content=body, headers=ARROW)
        before = srv.peak()
        t0, size = time.monotonic(), 0
        try:
            with http.stream("GET", f"/api/runs/{run}/tokens", params={"step": 1}) as resp:
                for chunk in resp.iter_bytes():
                    size += len(chunk)
                status, total = resp.status_code, resp.headers.get("x-total-count")
        except httpx.HTTPError as exc:
            status, total = f"no answer ({type(exc).__name__})", None
        first = time.monotonic() - t0
        # the whole step, page after page (after) — or the one answer (before)
        t0, walked, cursor = time.monotonic(), 0, None
        if total is not None:
            while True:
                resp = http.get(f"/api/runs/{run}/tokens", params={"step": 1, "limit": 100_000,
                                                                   **({"cursor": cursor} if cursor else {})})
                walked += len(resp.json())
                cursor = resp.headers.get("x-next-cursor")
                if not cursor:
                    break
        return {"case": "tokens_2m", "rows": rows, "status": status, "seconds": round(first, 2),
                "answer_mb": round(size / 2**20, 1), "x_total_count": total,
                "server_peak_mb_before_read": before, "server_peak_mb": srv.peak(),
                "all_pages_rows": walked or None, "all_pages_seconds": round(time.monotonic() - t0, 2) if walked else None}
    finally:
        srv.stop()


def case_wide_60k(src, tmp) -> dict:
    srv = Server(src, os.path.join(tmp, "w.duckdb"), "--no-dashboard")
    try:
        http = httpx.Client(base_url=srv.url, timeout=30)
        run = http.post("/api/runs", json={"name": "wide"}).json()["run_id"]
        cols = {"step": pa.array([1], pa.int64()), "sample_id": pa.array([0], pa.int64()), "pos": pa.array([0], pa.int32())}
        cols.update({f"c{i}": pa.array([0], pa.int8()) for i in range(60_000 - 3)})
        body = ipc(pa.table(cols))
        t0 = time.monotonic()
        try:
            resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": "w"}, content=body, headers=ARROW)
            status, detail = resp.status_code, len(resp.text)
        except httpx.HTTPError as exc:
            status, detail = f"no answer within 30 s ({type(exc).__name__})", None
        return {"case": "wide_60k", "body_mb": round(len(body) / 2**20, 1), "status": status,
                "seconds": round(time.monotonic() - t0, 2), "answer_chars": detail, "server_peak_mb": srv.peak()}
    finally:
        srv.stop()


def case_slow_dash(src, tmp, clients: int = 12) -> dict:
    srv = Server(src, os.path.join(tmp, "d.duckdb"))
    stop = threading.Event()

    def trickle():
        body = b'{"output": "runs-table.data"' + b" " * 2000 + b"}"
        head = (f"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", srv.port), timeout=120) as sock:
            sock.sendall(head)
            for byte in body:
                if stop.wait(0.5):            # 2 bytes a second
                    return
                sock.sendall(bytes([byte]))
    try:
        threads = [threading.Thread(target=trickle, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        time.sleep(3)                          # let every slow client reach the app
        t0 = time.monotonic()
        try:
            status = httpx.get(srv.url + "/", timeout=30).status_code
        except httpx.HTTPError as exc:
            status = f"no answer within 30 s ({type(exc).__name__})"
        took = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            layout = httpx.get(srv.url + "/_dash-layout", timeout=30).status_code
        except httpx.HTTPError as exc:
            layout = f"no answer within 30 s ({type(exc).__name__})"
        return {"case": "slow_dash", "slow_clients": clients, "status": status, "seconds": round(took, 2),
                "layout_status": layout, "layout_seconds": round(time.monotonic() - t0, 2),
                "server_peak_mb": srv.peak()}
    finally:
        stop.set()
        srv.stop()


def case_sigterm(src, tmp) -> dict:
    db = os.path.join(tmp, "s.duckdb")
    srv = Server(src, db, "--no-dashboard", "--webhook", "http://127.0.0.1:9/hook")
    http = httpx.Client(base_url=srv.url, timeout=30)
    run = http.post("/api/runs", json={"name": "s"}).json()["run_id"]
    http.post(f"/api/runs/{run}/ingest", json={"batch_id": "b", "scalars": [
        {"step": s, "key": "loss", "value": 1.0} for s in range(100)]})
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    code = srv.proc.wait(60)
    srv.log.close()
    return {"case": "sigterm", "status": f"exit {code}", "seconds": round(time.monotonic() - t0, 2),
            "wal_left": os.path.exists(db + ".wal"), "server_peak_mb": None}


# the disk-full cases run an in-process collector (Collector from `src`) in a child process: the
# checkpoint case sets DuckDB's checkpoint_threshold, which no serve flag does
_DISK_CHILD = r"""
import json, os, sys, time, httpx, numpy as np, pyarrow as pa
sys.path.insert(0, sys.argv[1])
from collector_hardening import tokens, ARROW, peak_mb
from forksight.compose.app import Collector
where, kind = sys.argv[2], sys.argv[3]
c = Collector(os.path.join(where, "c.duckdb"), port=int(sys.argv[4]), dashboard=False).start()
class Gone:
    def __init__(self, exc):
        self.status_code, self.text = f"no answer ({type(exc).__name__})", str(exc)
    def json(self):
        return {}
class Safe:
    def __init__(self, http):
        self.http = http
    def __getattr__(self, name):
        def call(*a, **k):
            try:
                return getattr(self.http, name)(*a, **k)
            except httpx.HTTPError as exc:
                return Gone(exc)
        return call
http = Safe(httpx.Client(base_url=c.url, timeout=120))
run = http.post("/api/runs", json={"name": "d"}).json()["run_id"]
if kind == "checkpoint":
    c.store.call(lambda cur: cur.execute("SET checkpoint_threshold = '256KB'"))
    n, leave = 20_000, 6 << 20
else:
    http.post(f"/api/runs/{run}/tokens", params={"batch_id": "first"}, content=tokens(0, 1000), headers=ARROW)
    n, leave = 400_000, 1 << 20
filler = os.path.join(where, "filler")
with open(filler, "wb") as f:
    import shutil
    f.write(b"\0" * max(0, shutil.disk_usage(where).free - leave))
acked, out = (1000 if kind != "checkpoint" else 0), {}
for step in range(1, 400):
    t0 = time.monotonic()
    r = http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"b{step}"}, content=tokens(step, n), headers=ARROW)
    if r.status_code != 200:
        out.update(status=r.status_code, seconds=round(time.monotonic() - t0, 2), detail=r.text[:240])
        break
    acked += n
h = http.get("/api/health")
counts = http.get(f"/api/runs/{run}/counts")
w = http.post(f"/api/runs/{run}/tokens", params={"batch_id": "again"}, content=tokens(999, 10), headers=ARROW)
acked += 10 if w.status_code == 200 else 0
out.update(health_status=h.status_code, health=h.text[:240], counts_status=counts.status_code,
           counts=counts.text[:160], write_while_full=w.status_code)
os.remove(filler)
h2 = http.get("/api/health")
w2 = http.post(f"/api/runs/{run}/tokens", params={"batch_id": f"b{step}"}, content=tokens(step, n), headers=ARROW)
stored = http.get(f"/api/runs/{run}/counts")
out.update(health_after_freeing=h2.status_code, retry_after_freeing=w2.status_code,
           acknowledged_rows=acked + (n if w2.status_code == 200 else 0),
           stored_rows=stored.json().get("tokens") if stored.status_code == 200 else stored.status_code,
           server_peak_mb=peak_mb(os.getpid()))
print(json.dumps(out))
os._exit(0)
"""


def case_disk_full(src, tmp, kind: str) -> dict:
    where = os.path.join(tmp, f"fs-{kind}")
    os.makedirs(where)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", where], capture_output=True, text=True)
    if done.returncode != 0:
        return {"case": f"disk_full_{kind}", "status": "skipped", "why": done.stderr.strip()}
    try:
        env = dict(os.environ)
        if src:
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        child = subprocess.run([sys.executable, "-c", _DISK_CHILD, os.path.dirname(os.path.abspath(__file__)), where,
                                kind, str(free_port())], env=env, capture_output=True, text=True, timeout=300)
        lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if lines else {"status": "child failed", "stderr": child.stderr[-600:]}
        return {"case": f"disk_full_{kind}", **result}
    finally:
        subprocess.run(["umount", "-l", where], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", default=None, help="a directory holding the `forksight` package to measure")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rows", type=int, default=2_000_000, help="token rows of the one step read back")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="fsk-hardening-")
    try:
        for name in args.cases.split(","):
            if name == "tokens_2m":
                result = case_tokens_2m(args.src, tmp, args.rows)
            elif name == "wide_60k":
                result = case_wide_60k(args.src, tmp)
            elif name == "slow_dash":
                result = case_slow_dash(args.src, tmp)
            elif name == "sigterm":
                result = case_sigterm(args.src, tmp)
            elif name.startswith("disk_full_"):
                result = case_disk_full(args.src, tmp, name.removeprefix("disk_full_"))
            else:
                raise SystemExit(f"unknown case {name!r}; one of {', '.join(CASES)}")
            print(json.dumps({"src": args.src or "this checkout", **result}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
