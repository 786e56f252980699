"""HttpSink: streams to a collector from a background thread; spools to disk while it is down.

Batches go as JSON (scalars, samples, histograms) and Arrow IPC (per-token rows), each with an
id the collector stores once. Retries with backoff, then one file per batch under
.forksight/spool/, replayed in order when the collector answers again.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from forksight.monitor.sink_base import _finite_scalars, _histogram_item, _open_sinks, _sample_rows, _Sink, _track

log = logging.getLogger("forksight.client")

SPOOL_ROOT = Path(".forksight") / "spool"
MAX_SERVER_ERRORS = 20   # a batch the collector keeps failing on (5xx) must not block the rest
MAX_BACKOFF_S = 2.0      # a refused connect costs nothing; a collector back up is found within 2 s


class _Item:
    """One request to the collector; `body` is exactly what is sent (and spooled)."""

    __slots__ = ("kind", "batch_id", "body", "rows", "path", "done")

    def __init__(self, kind: str, batch_id: str, body: bytes, rows: int = 0, path: Path | None = None):
        self.kind, self.batch_id, self.body, self.rows, self.path = kind, batch_id, body, rows, path
        self.done = False            # acknowledged; never sent or spooled again


class HttpSink(_Sink):
    """Streams to a collector from a background thread; spools to disk while it is down."""

    def __init__(self, url: str, run: str, *, project: str = "default", strategy: str | None = None,
                 model: str | None = None, config: dict | None = None, rank: int = 0,
                 stop_on_alert: bool = False, token: str | None = None,
                 flush_interval: float = 0.25, max_batch_rows: int = 262_144,
                 spool_dir: str | os.PathLike | None = None, retries: int = 3,
                 heartbeat_interval: float = 10.0, resume: bool = False):
        import httpx

        super().__init__(stop_on_alert)
        self.url = url.rstrip("/")
        self.rank = rank
        self.flush_interval = flush_interval
        self.max_batch_rows = max_batch_rows
        self.retries = retries
        self.heartbeat_interval = heartbeat_interval
        token = token or os.environ.get("FORKSIGHT_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers,
                                  timeout=httpx.Timeout(60.0, connect=2.0))
        self.sent_rows = 0                 # token/scalar/... rows the collector acknowledged
        self.rejected: list[str] = []      # messages of batches the collector refused (4xx)
        self._server_errors: dict[str, int] = {}
        self._run_meta = {"name": run, "project": project, "strategy": strategy, "model": model,
                          "config": config}
        self._resume = resume
        self.run_id = self._open_run(run, rank)
        self._spool = Path(spool_dir) if spool_dir else SPOOL_ROOT / f"{self.run_id}.r{rank}.{uuid.uuid4().hex[:8]}"
        self._spool_seq = 0
        self._lock = threading.Lock()
        self._buf: dict[str, list] = {"scalars": [], "samples": [], "histograms": [], "tokens": []}
        self._buf_rows = 0
        self._outbox: deque[_Item] = deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._next_try = 0.0
        self._backoff = 0.5
        self._failures = 0
        self._last_contact = time.monotonic()
        if spool_dir is None:
            self._adopt_old_spools()
        if self._pending_create is not None:
            self._spool_item(self._pending_create)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="forksight-send")
        self._thread = threading.Thread(target=self._loop, name=f"forksight-sink-{self.run_id}", daemon=True)
        self._thread.start()
        _track(self)

    def _adopt_old_spools(self) -> None:
        """Take over what an earlier process of this run and rank left undelivered (it ended
        while the collector was down): its batches go first, in their order."""
        old = sorted((d for d in SPOOL_ROOT.glob(f"{self.run_id}.r{self.rank}.*") if d.is_dir()),
                     key=lambda d: d.stat().st_mtime)
        for directory in old:
            for path in sorted(directory.glob("*.req")):
                item = self._read_spooled(path)
                if item.kind in ("json", "arrow", "run"):     # its status/heartbeat are stale now
                    self._spool_item(item)
                path.unlink()
            shutil.rmtree(directory, ignore_errors=True)
            log.warning("forksight: replaying batches of run %s left undelivered in %s", self.run_id, directory)

    # -- run creation: name unless taken; ranks > 0 join the live run of that name
    def _open_run(self, name: str, rank: int) -> str:
        import httpx

        self._pending_create = None
        body = {k: v for k, v in self._run_meta.items() if v is not None}
        deadline = time.monotonic() + (30.0 if rank else 0.0)
        while True:
            try:
                # resume: rank 0 continues the run with exactly this id (upsert), not name-2
                first = {**body, "run_id": name} if self._resume and not rank else {**body, "join": rank > 0}
                resp = self._http.post("/api/runs", json=first)
            except httpx.TransportError as exc:
                log.warning("forksight: collector %s unreachable (%s); spooling run %r to disk until it answers",
                            self.url, exc, name)
                self._pending_create = _Item("run", "run", json.dumps({**body, "run_id": name}).encode())
                return name
            if resp.status_code == 404 and rank and time.monotonic() < deadline:
                time.sleep(0.5)              # rank 0 has not created the run yet
                continue
            if resp.status_code == 404 and rank:
                resp = self._http.post("/api/runs", json=body)
            if resp.status_code >= 400:
                raise RuntimeError(f"collector refused run {name!r}: {resp.status_code} {resp.text}")
            return resp.json()["run_id"]

    # -- logging API: append to buffers under a lock, never I/O
    def _append(self, kind: str, items: list, rows: int) -> None:
        with self._lock:
            self._buf[kind].extend(items)
            self._buf_rows += rows
            self._idle.clear()
            full = self._buf_rows >= self.max_batch_rows
        if full:
            self._wake.set()

    def log_scalars(self, step: int, values: Mapping[str, Any], weight: float | None = None) -> None:
        """Per-step numbers; weight = token count, used when ranks are merged."""
        rows = _finite_scalars(step, values, weight, self._warned)
        self._append("scalars", rows, len(rows))

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        """Per-token columns of equal length; validated now, sent as Arrow IPC."""
        from forksight.monitor.store import tokens_table

        table = tokens_table(columns, step=step, rank=self.rank)
        table = table.drop_columns(["rank"])      # the rank travels once per request, as a parameter
        self._append("tokens", [table], table.num_rows)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        rows = _sample_rows(step, rows, self._warned)
        self._append("samples", rows, len(rows))

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        self._append("histograms", [_histogram_item(step, key, counts, edges)], 1)

    def flush(self, timeout: float | None = 30.0, *, give_up_after_failures: int | None = None) -> bool:
        """Wait until everything logged so far is acknowledged; False on timeout (kept in spool).

        give_up_after_failures: stop waiting once that many retries failed and all is spooled
        (finish() uses it so a script whose collector is gone exits in seconds, not 30 s).
        """
        self._wake.set()
        failures_before = self._failures
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._idle.wait(0.05):
            self._wake.set()
            if deadline is not None and time.monotonic() > deadline:
                return False
            if give_up_after_failures is not None and self._failures - failures_before >= give_up_after_failures:
                with self._lock:
                    if not self._outbox and not any(self._buf.values()):
                        return False
        return True

    def finish(self, status: str = "finished", timeout: float = 30.0) -> None:
        """Flush, mark the run, stop the thread. Undelivered batches stay in the spool dir."""
        if self._finished:
            return
        self._finished = True
        _open_sinks.discard(self)
        self.flush(timeout, give_up_after_failures=2)
        with self._lock:
            self._outbox.append(_Item("status", "status", json.dumps({"status": status}).encode()))
            self._idle.clear()
        self.flush(min(timeout, 5.0), give_up_after_failures=1)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._pool.shutdown(wait=False)
        left = self.spooled()
        if left:
            log.warning("forksight: %d batch(es) for run %s not delivered; kept in %s", left, self.run_id, self._spool)
        elif self._spool.exists():
            shutil.rmtree(self._spool, ignore_errors=True)
        self._http.close()

    def spooled(self) -> int:
        """Batches waiting on disk."""
        return len(list(self._spool.glob("*.req"))) if self._spool.exists() else 0

    # -- the background thread
    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                # while the collector is down, batch up until the next retry: a few big spool
                # files replay much faster than one tiny file per tick
                down = time.monotonic() < self._next_try and self.spooled()
                if down and self._buf_rows < self.max_batch_rows:
                    continue
                self._take_buffers()
                self._pump()
                if time.monotonic() - self._last_contact > self.heartbeat_interval:
                    self._send(_Item("heartbeat", "heartbeat", b""))
            except Exception:  # noqa: BLE001 - the sender must survive anything
                log.exception("forksight: sender error (will retry)")
            with self._lock:
                if not self._outbox and not any(self._buf.values()) and not self.spooled():
                    self._idle.set()

    def _take_buffers(self) -> None:
        with self._lock:
            buf, self._buf = self._buf, {"scalars": [], "samples": [], "histograms": [], "tokens": []}
            self._buf_rows = 0
        items: list[_Item] = []
        if buf["scalars"] or buf["samples"] or buf["histograms"]:
            batch_id = uuid.uuid4().hex
            body = {"batch_id": batch_id, "rank": self.rank, "scalars": buf["scalars"],
                    "samples": buf["samples"], "histograms": buf["histograms"]}
            rows = len(buf["scalars"]) + len(buf["samples"]) + len(buf["histograms"])
            items.append(_Item("json", batch_id, json.dumps(body).encode(), rows))
        if buf["tokens"]:
            import pyarrow as pa

            table = pa.concat_tables(buf["tokens"])
            for start in range(0, table.num_rows, self.max_batch_rows):
                part = table.slice(start, self.max_batch_rows)
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, part.schema) as writer:
                    writer.write_table(part)
                items.append(_Item("arrow", uuid.uuid4().hex, sink.getvalue().to_pybytes(), part.num_rows))
        with self._lock:
            self._outbox.extend(items)

    def _pump(self) -> None:
        # order is sacred: the spool (older) drains before the outbox (newer)
        if self.spooled():
            if time.monotonic() < self._next_try:
                self._spool_outbox()
                return
            for path in sorted(self._spool.glob("*.req")):
                item = self._read_spooled(path)
                if not self._send(item, retries=1):
                    self._retry_later()
                    self._spool_outbox()
                    return
                path.unlink()
            self._backoff = 0.5
        while True:
            with self._lock:
                if not self._outbox:
                    return
                group = [self._outbox[0]]
                # two token batches in flight at once: the client serialises and sends one while
                # the collector writes the other. Token rows carry their own step, so their order
                # does not matter; scalars (which drive alerts) stay strictly in order.
                if len(self._outbox) > 1 and group[0].kind == self._outbox[1].kind == "arrow":
                    group.append(self._outbox[1])
            if len(group) == 2:
                second = self._pool.submit(self._send, group[1], self.retries)
                self._send(group[0], self.retries)
                second.result()
            else:
                self._send(group[0], self.retries)
            with self._lock:
                while self._outbox and self._outbox[0].done:
                    self._outbox.popleft()
            if not all(item.done for item in group):
                self._retry_later()
                self._spool_outbox()
                return

    def _retry_later(self) -> None:
        self._failures += 1
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    def _spool_outbox(self) -> None:
        while True:
            with self._lock:
                if not self._outbox:
                    return
                item = self._outbox.popleft()
            if not item.done:
                self._spool_item(item)

    def _spool_item(self, item: _Item) -> None:
        self._spool.mkdir(parents=True, exist_ok=True)
        self._spool_seq += 1
        path = self._spool / f"{self._spool_seq:012d}.{item.kind}.{item.batch_id}.{item.rows}.req"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(item.body)
        os.replace(tmp, path)        # a file is either absent or whole

    @staticmethod
    def _read_spooled(path: Path) -> _Item:
        _, kind, batch_id, rows, _ = path.name.split(".")
        return _Item(kind, batch_id, path.read_bytes(), int(rows), path)

    def _request(self, item: _Item):
        base = f"/api/runs/{self.run_id}"
        if item.kind == "json":
            return self._http.post(f"{base}/ingest", content=item.body,
                                   headers={"Content-Type": "application/json"})
        if item.kind == "arrow":
            from forksight.monitor.schema import ARROW_MEDIA_TYPE

            return self._http.post(f"{base}/tokens", content=item.body,
                                   params={"batch_id": item.batch_id, "rank": self.rank},
                                   headers={"Content-Type": ARROW_MEDIA_TYPE})
        if item.kind == "run":
            return self._http.post("/api/runs", content=item.body, headers={"Content-Type": "application/json"})
        if item.kind == "status":
            return self._http.patch(base, content=item.body, headers={"Content-Type": "application/json"})
        return self._http.post(f"{base}/heartbeat")

    def _send(self, item: _Item, retries: int = 3) -> bool:
        """True when the collector acknowledged (or refused for good); False: try again later."""
        import httpx

        delay = 0.1
        for attempt in range(max(1, retries)):
            try:
                resp = self._http_send(item)
            except httpx.TransportError:
                resp = None
            if resp is not None and resp.status_code < 400:
                item.done = True
                self._last_contact = time.monotonic()
                if item.kind in ("json", "arrow"):
                    with self._lock:         # two senders may finish at once
                        self.sent_rows += item.rows
                if item.kind in ("json", "arrow", "status"):
                    self._on_alerts(resp.json().get("alerts", []))
                return True
            if resp is not None and resp.status_code == 404 and item.kind != "run" and self._recreate_run():
                continue                     # a fresh collector on a new file: the run comes back
            if resp is not None and resp.status_code in (400, 401, 403, 404, 413, 422):
                message = f"{item.kind} batch {item.batch_id}: {resp.status_code} {resp.text[:500]}"
                self.rejected.append(message)
                log.error("forksight: collector refused %s", message)
                item.done = True
                return True                  # retrying cannot help; do not block the rest
            if resp is not None:               # the collector answers but fails (5xx): not forever
                failures = self._server_errors[item.batch_id] = self._server_errors.get(item.batch_id, 0) + 1
                if failures >= MAX_SERVER_ERRORS:
                    message = f"{item.kind} batch {item.batch_id}: gave up after {failures} answers " \
                              f"{resp.status_code} {resp.text[:300]}"
                    self.rejected.append(message)
                    log.error("forksight: %s", message)
                    item.done = True
                    return True
            if attempt + 1 < retries:
                time.sleep(delay)
                delay *= 2
        return False

    def _http_send(self, item: _Item):
        return self._request(item)

    def _recreate_run(self) -> bool:
        import httpx

        body = {k: v for k, v in self._run_meta.items() if v is not None}
        try:
            resp = self._http.post("/api/runs", json={**body, "run_id": self.run_id})
        except httpx.TransportError:
            return False
        return resp.status_code < 400
