"""Start a real `forksight serve` subprocess on a free loopback port and wait for /api/health.

Reusable by any test (the `collector` fixture in conftest.py wraps it):

    from collector_util import ServeProcess
    with ServeProcess(tmp_path / "a.duckdb", dashboard=True) as srv:
        httpx.get(srv.url + "/api/health")
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_health(url: str, token: str | None = None, timeout: float = 60.0, proc=None) -> None:
    """Poll GET url/api/health until it answers 200; fail early if proc exits."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"forksight serve exited with {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(url + "/api/health", headers=headers, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"no collector answered {url}/api/health within {timeout} s")


class ServeProcess:
    """`forksight serve --db DB --port PORT` as a subprocess; stop() is SIGTERM, kill() is SIGKILL."""

    def __init__(self, db: str | os.PathLike, *, port: int | None = None, token: str | None = None,
                 dashboard: bool = False, host: str = "127.0.0.1", env: dict | None = None,
                 args: tuple[str, ...] = ()):
        self.db, self.port, self.token, self.host = str(db), port or free_port(), token, host
        self.args = tuple(args)
        self.dashboard = dashboard
        self.env = {**os.environ, **(env or {})}
        self.env.pop("FORKSIGHT_TOKEN", None)
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(self.db).with_suffix(f".serve-{self.port}.log")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def start(self, timeout: float = 60.0) -> "ServeProcess":
        cmd = [sys.executable, "-m", "forksight", "serve", "--db", self.db, "--host", self.host,
               "--port", str(self.port)]
        if self.token:
            cmd += ["--token", self.token]
        if not self.dashboard:
            cmd.append("--no-dashboard")
        cmd += self.args
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_for_health(self.url, self.token, timeout, self.proc)
        except Exception:
            self.stop()
            raise RuntimeError(f"collector did not start; its log:\n{self.log_path.read_text()[-3000:]}") from None
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush (what a crash looks like)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM and wait: uvicorn shuts down and the store closes the file."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        if getattr(self, "_log", None):
            self._log.close()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class InProcessCollector:
    """The same collector in a daemon thread of the test process (real uvicorn, real file):
    starts in well under a second because nothing is imported again."""

    def __init__(self, db: str | os.PathLike, *, port: int | None = None, token: str | None = None,
                 dashboard: bool = False):
        from forksight.compose.app import Collector

        self.port, self.token = port or free_port(), token
        self.collector = Collector(str(db), port=self.port, token=token, dashboard=dashboard)
        self.url, self.db = self.collector.url, str(db)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def __enter__(self) -> "InProcessCollector":
        self.collector.start()
        return self

    def __exit__(self, *exc) -> None:
        self.collector.stop()


def create_run(http: httpx.Client, name: str, **fields) -> str:
    """POST /api/runs through `http` (a client on a collector); the new run id (fails on anything but 201)."""
    resp = http.post("/api/runs", json={"name": name, **fields})
    assert resp.status_code == 201, resp.text
    return resp.json()["run_id"]


def mount_small_filesystem(where: os.PathLike, size: str = "24m") -> str | None:
    """Mount a tmpfs of `size` at `where` (made if missing); None when that works, else why not
    (not root, no mount binary, a container without CAP_SYS_ADMIN): the caller skips with it."""
    os.makedirs(where, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot mount a small filesystem here ({exc})"
    if done.returncode != 0:
        return f"cannot mount a small filesystem here (mount said: {done.stderr.strip() or done.returncode})"
    return None


def unmount(where: os.PathLike) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill_disk(where: os.PathLike, leave: int) -> Path:
    """Write a filler file in `where` until about `leave` bytes stay free; returns its path."""
    import shutil

    filler = Path(where) / "filler"
    free = shutil.disk_usage(where).free
    with open(filler, "ab") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


# a process that writes 4 token steps (acknowledged, not checkpointed: the rows live in the .wal)
# and dies without closing the store; argv[1] = the DuckDB file
CRASH_AFTER_WRITES = """
import os, sys, numpy as np
from forksight.base.records import Records, tokens_table
from forksight.monitor.collector.store import Store
store = Store(sys.argv[1])
run = store.create_run("wal")
for step in range(4):
    n = 50_000
    store.write(run, Records(tokens=tokens_table({"sample_id": np.arange(n), "pos": np.zeros(n, np.int32)},
                                                 step=step))).result()
os._exit(0)      # acknowledged, not checkpointed: the rows live in the .wal
"""


def file_with_truncated_wal(tmp_path) -> Path:
    """A DuckDB file whose process died after 4 acknowledged token steps (200,000 rows, all in the
    .wal), with that .wal then cut in half: the rows past the cut are lost on the next open."""
    db = Path(tmp_path) / "w.duckdb"
    subprocess.run([sys.executable, "-c", CRASH_AFTER_WRITES, str(db)], check=True)
    wal = Path(str(db) + ".wal")
    with open(wal, "r+b") as f:
        f.truncate(wal.stat().st_size // 2)
    return db
