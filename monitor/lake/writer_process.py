"""The lake's writes in a child process at nice 10: Parquet encoding and pyiceberg's commit work then
share neither the collector's GIL nor its priority, so on a busy machine they take little of the CPU
ingest wants (a committer thread at nice 10 still held the GIL ingest waits for). The child
opens its own catalog from the collector's catalog properties, dies with the collector (Linux
PR_SET_PDEATHSIG: a commit under way is atomic in the catalog, so it lands whole or not at all), and
gets each commit's rows through a pipe."""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

log = logging.getLogger("forksight.lake")
CHILD_NICE = 10      # a tenth of a nice-0 process's share under contention: yields, never starves
START_TIMEOUT_S = 120.0
START_MIN_S = 20.0


class RemoteError(RuntimeError):
    """A commit failed in the child: its exception's type and message."""


class CatalogStalled(RemoteError):
    """The catalog did not answer within the deadline: the child was killed (a new one serves the next call)."""


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child(conn) -> None:
    """The child's loop: the catalog to open, then (method, args) in, ("ok", result) or
    ("err", "Type: message") out."""
    _die_with_parent()
    catalog_class, name, properties, collector = conn.recv()
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # a Ctrl-C is the collector's to handle
    import importlib

    from forksight.monitor.lake.writer import LakeWriter

    module, _, cls = catalog_class.rpartition(".")
    try:
        writer = LakeWriter(getattr(importlib.import_module(module), cls)(name, **properties), collector)
        try:
            os.nice(CHILD_NICE)        # started at the collector's priority: the commits themselves yield
        except OSError:
            pass
        conn.send(("ok", None))
    except Exception as exc:  # noqa: BLE001 - said to the parent, which refuses to start
        conn.send(("err", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return                                     # the collector is gone or closed the pipe
        if method == "close":
            return
        try:
            conn.send(("ok", getattr(writer, method)(*args)))
        except Exception as exc:  # noqa: BLE001 - the committer's retry and health handle it
            conn.send(("err", f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"))


class ProcessWriter:
    """LakeWriter's methods, run in a child process (one call at a time)."""

    def __init__(self, catalog, collector: str, deadline: float | None = None):
        """deadline: seconds one call (a commit, a load) may take before the child is killed and the call
        fails with CatalogStalled (a hung database answers nothing, ever); None: no deadline."""
        cls = type(catalog)
        self._args = (f"{cls.__module__}.{cls.__qualname__}", catalog.name, dict(catalog.properties), collector)
        self.deadline = deadline
        self._lock = threading.Lock()
        self._spawn()

    def _spawn(self) -> None:
        """Start the child (`python -m` this module: it imports only the lake's writer, not the
        collector's command line as multiprocessing's spawn would) and wait until it has opened the catalog."""
        mine, theirs = socket.socketpair()
        with theirs:
            self._proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        self._conn = Connection(mine.detach())
        self._conn.send(self._args)
        # the start imports pyiceberg (seconds) and opens the catalog: never less than START_MIN_S
        wait = START_TIMEOUT_S if self.deadline is None else max(self.deadline, START_MIN_S)
        if not self._conn.poll(wait):
            self._proc.kill()
            self._proc.wait(5)
            raise CatalogStalled(f"the lake writer process did not open the catalog within {wait:.0f} s")
        self._answer(self._conn.recv())

    @staticmethod
    def _answer(reply):
        state, value = reply
        if state == "err":
            raise RemoteError(value)
        return value

    def _call(self, method: str, *args):
        with self._lock:
            if self._proc.poll() is not None:      # killed (say by the OOM killer): a new one
                log.warning("lake: the writer process exited (code %s); starting another", self._proc.returncode)
                self._conn.close()
                self._spawn()
            self._conn.send((method, args))
            if self.deadline is not None and not self._conn.poll(self.deadline):
                self._proc.kill()         # abandoned: a commit under way lands whole or not at all
                self._proc.wait(5)
                raise CatalogStalled(f"the catalog did not answer {method} within {self.deadline:g} s; the "
                                     "writer process was replaced, the rows wait in the outbox")
            try:
                return self._answer(self._conn.recv())
            except EOFError:
                raise RemoteError(f"the lake writer process exited (code {self._proc.wait(5)})") from None

    def committed(self, name: str) -> int:
        return self._call("committed", name)

    def append(self, name: str, rows, lo: int, hi: int) -> int:
        return self._call("append", name, rows, lo, hi)

    def overwrite(self, name: str, rows, run_ids: list[str]) -> None:
        return self._call("overwrite", name, rows, run_ids)

    def expire(self, name: str) -> int:
        return self._call("expire", name)

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.send(("close", ()))
            except (OSError, ValueError):
                pass
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
            self._conn.close()


if __name__ == "__main__":
    _child(Connection(int(sys.argv[1])))
