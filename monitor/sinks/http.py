"""HttpSink: batches to a collector from a background thread (JSON; Arrow IPC for tokens), each
with an id stored once; retries, then .forksight/spool/ while the collector is down, then bounded
memory with backpressure when the disk refuses too: `undelivered()` says what is not stored."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from forksight.monitor.sinks import spool as spool_mod
from forksight.monitor.sinks.base import SinkBase, finite_scalars, histogram_item, sample_rows, track, untrack
from forksight.monitor.sinks.spool import DATA_KINDS, Item as _Item, Spool, requests_of

log = logging.getLogger("forksight.client")

MAX_SERVER_ERRORS = 20   # a batch the collector keeps failing on (5xx) must not block the rest
MAX_BACKOFF_S = 2.0      # a refused connect costs nothing; a collector back up is found within 2 s


class DeliveryError(RuntimeError):
    """The sink can neither send nor spool, and its memory buffer is full: logging would lose data."""


class HttpSink(SinkBase):
    """Streams to a collector from a background thread; spools to disk while it is down."""

    def __init__(self, url: str, run: str, *, project: str = "default", strategy: str | None = None,
                 model: str | None = None, config: dict | None = None, rank: int = 0,
                 stop_on_alert: bool = False, token: str | None = None,
                 flush_interval: float = 0.25, max_batch_rows: int = 262_144,
                 spool_dir: str | os.PathLike | None = None, retries: int = 3,
                 heartbeat_interval: float = 10.0, resume: bool = False,
                 max_memory_bytes: int = 256 * 1024 * 1024, backpressure_timeout: float = 60.0):
        import httpx

        super().__init__(stop_on_alert)
        self.url = url.rstrip("/")
        self.rank = rank
        self.flush_interval = flush_interval
        self.max_batch_rows = max_batch_rows
        self.retries = retries
        self.heartbeat_interval = heartbeat_interval
        self.max_memory_bytes = max_memory_bytes          # undelivered, unspoolable bodies held in memory
        self.backpressure_timeout = backpressure_timeout  # a full memory buffer blocks log_* this long, then raises
        token = token or os.environ.get("FORKSIGHT_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers,
                                  timeout=httpx.Timeout(60.0, connect=2.0))
        self.sent_rows = 0                 # token/scalar/... rows the collector acknowledged
        self.rejected: list[str] = []      # messages of batches the collector refused (4xx)
        self._refused: Counter = Counter()  # their rows, per table
        self._server_errors: dict[str, int] = {}
        self._run_meta = {"name": run, "project": project, "strategy": strategy, "model": model,
                          "config": config}
        self._resume = resume
        self.run_id = self._open_run(run, rank)
        self._spool = Spool(Path(spool_dir) if spool_dir else
                            spool_mod.SPOOL_ROOT / f"{self.run_id}.r{rank}.{uuid.uuid4().hex[:8]}")
        self._lock = threading.Lock()
        self._buf: dict[str, list] = {"scalars": [], "samples": [], "histograms": [], "tokens": []}
        self._buf_rows = 0
        self._outbox: deque[_Item] = deque()
        self._outbox_bytes = 0
        self._room = threading.Condition(self._lock)     # signalled when the outbox shrinks
        self._spool_refused = False
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._next_try = 0.0
        self._backoff = 0.5
        self._failures = 0
        self._last_contact = time.monotonic()
        if self._pending_create is not None:       # this process's run first, then adopted batches
            self._spool_or_hold(self._pending_create)
        if spool_dir is None:
            self._spool.adopt(self.run_id, rank)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="forksight-send")
        self._thread = threading.Thread(target=self._loop, name=f"forksight-sink-{self.run_id}", daemon=True)
        self._thread.start()
        track(self)

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
                # replayed like the online path: name unless taken (never into an old run of that
                # name), the exact id on resume, the live run of that name for ranks > 0
                self._pending_create = _Item("run", "run", json.dumps(first).encode())
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
            if self._outbox_bytes > self.max_memory_bytes:
                self._wait_for_room()
            self._buf[kind].extend(items)
            self._buf_rows += rows
            self._idle.clear()
            full = self._buf_rows >= self.max_batch_rows
        if full:
            self._wake.set()

    def _wait_for_room(self) -> None:
        # backpressure: neither the collector nor the disk takes batches, and memory is full
        self._wake.set()
        if not self._room.wait_for(lambda: self._outbox_bytes <= self.max_memory_bytes,
                                   timeout=self.backpressure_timeout):
            raise DeliveryError(
                f"forksight: the collector at {self.url} is unreachable, the spool {self._spool.directory} "
                f"cannot be written and {self._outbox_bytes} bytes wait in memory (limit {self.max_memory_bytes}); "
                "refusing more rows rather than losing them: free the disk or restart the collector")

    def log_scalars(self, step: int, values: Mapping[str, Any], weight: float | None = None) -> None:
        """Per-step numbers; weight = token count, used when ranks are merged."""
        rows = finite_scalars(step, values, weight, self._warned)
        self._append("scalars", rows, len(rows))

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        """Per-token columns of equal length; validated now, sent as Arrow IPC."""
        from forksight.base.records import tokens_table

        table = tokens_table(columns, step=step, rank=self.rank)
        table = table.drop_columns(["rank"])      # the rank travels once per request, as a parameter
        self._append("tokens", [table], table.num_rows)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        rows = sample_rows(step, rows, self._warned)
        self._append("samples", rows, len(rows))

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        self._append("histograms", [histogram_item(step, key, counts, edges)], 1)

    def await_alerts(self, timeout: float = 10.0) -> None:
        """As SinkBase.await_alerts, but a collector known to be down (backing off) costs nothing, and
        one that goes down while waiting costs one failed try, not `timeout`."""
        if time.monotonic() < self._next_try:
            return
        self.flush(timeout=timeout, give_up_after_failures=1)

    def flush(self, timeout: float | None = 30.0, *, give_up_after_failures: int | None = None) -> bool:
        """True once everything logged so far is stored; False on timeout or if anything was refused
        (see `undelivered()`). give_up_after_failures: stop once that many retries failed and
        nothing can move (finish() uses it: a script whose collector is gone exits in seconds)."""
        self._wake.set()
        failures_before = self._failures
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._idle.wait(0.05):
            self._wake.set()
            if deadline is not None and time.monotonic() > deadline:
                return False
            if give_up_after_failures is not None and self._failures - failures_before >= give_up_after_failures:
                with self._lock:
                    if not any(self._buf.values()) and (not self._outbox or self._spool_refused):
                        return False
        return not self._refused

    def undelivered(self) -> dict[str, int]:
        """Rows per table that have not reached the store: buffered, in memory, spooled or refused."""
        with self._lock:
            total = Counter({k: len(v) for k, v in self._buf.items() if k != "tokens"})
            total["tokens"] += sum(t.num_rows for t in self._buf["tokens"])
            for item in self._outbox:
                if not item.done:
                    total.update(item.tables())
        total.update(self._spool.rows())
        total.update(self._refused)
        return dict(+total)

    def finish(self, status: str = "finished", timeout: float = 30.0) -> dict[str, int]:
        """Flush, mark the run, stop the thread; returns `undelivered()` ({} when all is stored).
        Spooled batches stay on disk for the next process of this run; what only memory held (the
        spool could not be written) is lost at exit, and the log says so with the counts."""
        if self._finished:
            return self.undelivered()
        self._finished = True
        untrack(self)
        self.flush(timeout, give_up_after_failures=2)
        with self._lock:
            self._push([_Item("status", "status", json.dumps({"status": status}).encode())])
            self._idle.clear()
        self.flush(min(timeout, 5.0), give_up_after_failures=1)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._pool.shutdown(wait=False)
        left = self.undelivered()
        if left:
            log.warning("forksight: rows of run %s not delivered: %s (refused: %s; kept in %s: %d batch(es); "
                        "only in memory, lost at exit: %d batch(es))", self.run_id, left, dict(self._refused),
                        self._spool.directory, self.spooled(),
                        sum(not i.done and i.kind in DATA_KINDS for i in list(self._outbox)))
        if not self.spooled():
            self._spool.remove()
        self._http.close()
        return left

    def spooled(self) -> int:
        """Batches waiting on disk."""
        return self._spool.count()

    # -- the background thread
    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                # while the collector is down, batch up until the next retry: a few big spool
                # files replay much faster than one tiny file per tick
                down = time.monotonic() < self._next_try
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
                self._room.notify_all()

    def _take_buffers(self) -> None:
        with self._lock:
            buf, self._buf = self._buf, {"scalars": [], "samples": [], "histograms": [], "tokens": []}
            self._buf_rows = 0
        items = requests_of(buf, self.rank, self.max_batch_rows)
        with self._lock:
            self._push(items)

    def _push(self, items: list[_Item]) -> None:
        # under self._lock
        self._outbox.extend(items)
        self._outbox_bytes += sum(len(i.body) for i in items)

    def _pop(self) -> _Item:
        # under self._lock
        item = self._outbox.popleft()
        self._outbox_bytes -= len(item.body)
        return item

    def _pump(self) -> None:
        # order is sacred: the spool (older) drains before the outbox (newer)
        if time.monotonic() < self._next_try:
            self._spool_outbox()
            return
        paths = self._spool.paths()
        for path in paths:
            if not self._send(self._spool.read(path), retries=1):
                self._retry_later()
                self._spool_outbox()
                return
            path.unlink()
        if paths:
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
                    self._pop()
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
                item = self._outbox[0]
            if not item.done and not self._spool.put(item):
                self._spool_refused = True
                return                       # kept in memory, in order, until it can go somewhere
            self._spool_refused = False
            with self._lock:
                self._pop()

    def _spool_or_hold(self, item: _Item) -> None:
        if not self._spool.put(item):
            self._spool_refused = True
            with self._lock:
                self._push([item])

    def _request(self, item: _Item):
        base = f"/api/runs/{self.run_id}"
        if item.kind == "arrow":
            from forksight.base.constants import ARROW_MEDIA_TYPE

            return self._http.post(f"{base}/tokens", content=item.body, headers={"Content-Type": ARROW_MEDIA_TYPE},
                                   params={"batch_id": item.batch_id, "rank": self.rank})
        if item.kind == "heartbeat":
            return self._http.post(f"{base}/heartbeat")
        method, path = {"json": ("POST", f"{base}/ingest"), "run": ("POST", "/api/runs"), "status": ("PATCH", base)}[item.kind]
        return self._http.request(method, path, content=item.body, headers={"Content-Type": "application/json"})

    def _send(self, item: _Item, retries: int = 3) -> bool:
        """True when the collector acknowledged (or refused for good); False: try again later."""
        import httpx

        delay = 0.1
        for attempt in range(max(1, retries)):
            try:
                resp = self._request(item)
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
                if item.kind == "run":       # created while offline: the collector chose the id
                    self.run_id = resp.json()["run_id"]
                return True
            if resp is not None and resp.status_code == 404 and item.kind == "run":
                return False                 # a rank > 0 joining: rank 0 has not created the run yet
            if resp is not None and resp.status_code == 404 and self._recreate_run():
                continue                     # a fresh collector on a new file: the run comes back
            if resp is not None and resp.status_code in (400, 401, 403, 404, 409, 413, 422):
                self._refuse(item, f"{item.kind} batch {item.batch_id}: {resp.status_code} {resp.text[:500]}")
                return True                  # retrying cannot help; do not block the rest
            if resp is not None:               # the collector answers but fails (5xx): not forever
                failures = self._server_errors[item.batch_id] = self._server_errors.get(item.batch_id, 0) + 1
                if failures >= MAX_SERVER_ERRORS:
                    self._refuse(item, f"{item.kind} batch {item.batch_id}: gave up after {failures} answers "
                                       f"{resp.status_code} {resp.text[:300]}")
                    return True
            if attempt + 1 < retries:
                time.sleep(delay)
                delay *= 2
        return False

    def _refuse(self, item: _Item, message: str) -> None:
        self.rejected.append(message)
        log.error("forksight: collector refused %s", message)
        with self._lock:
            self._refused.update(item.tables())
        item.done = True

    def _recreate_run(self) -> bool:
        import httpx

        body = {k: v for k, v in self._run_meta.items() if v is not None}
        try:
            resp = self._http.post("/api/runs", json={**body, "run_id": self.run_id})
        except httpx.TransportError:
            return False
        return resp.status_code < 400
