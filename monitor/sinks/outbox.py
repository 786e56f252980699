"""What an HttpSink holds that the collector has not stored: rows as logged (per table), the requests
made of them waiting in memory, and the spool on disk. Memory is bounded: past `max_memory_bytes`
of requests neither the collector nor the disk took, `append` waits for room (backpressure), then
raises `DeliveryError` rather than drop a row. Thread-safe; the logging thread never does I/O here."""
from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Callable

from forksight.monitor.sinks.spool import DATA_KINDS, Item, Spool, requests_of

TABLES = ("scalars", "samples", "histograms", "probes", "reference", "tokens")


class DeliveryError(RuntimeError):
    """The sink can neither send nor spool, and its memory buffer is full: logging would lose data."""


class Outbox:
    """Rows buffered per table -> requests (oldest first) -> sent, or spooled while the collector is
    down. wake: called when the sender should run now (a full batch, or no room left)."""

    def __init__(self, spool: Spool, *, rank: int = 0, max_batch_rows: int = 262_144,
                 max_memory_bytes: int = 256 * 1024 * 1024, backpressure_timeout: float = 60.0,
                 wake: Callable[[], None] = lambda: None, where: str = "the collector"):
        self.spool = spool
        self.rank = rank
        self.max_batch_rows = max_batch_rows
        self.max_memory_bytes = max_memory_bytes          # undelivered, unspoolable bodies held in memory
        self.backpressure_timeout = backpressure_timeout  # a full memory buffer blocks append this long, then raises
        self.wake = wake
        self.where = where
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)        # notified when the queue shrinks
        self.idle = threading.Event()                     # set by the sender once nothing is left
        self.idle.set()
        self.spool_refused = False                        # the disk refused the last request offered
        self._buf: dict[str, list] = {t: [] for t in TABLES}
        self.buffered_rows = 0
        self._queue: deque[Item] = deque()
        self.queued_bytes = 0

    # -- the logging thread
    def append(self, table: str, items: list, rows: int) -> None:
        """Buffer rows of `table`; waits for room while memory is full (see DeliveryError)."""
        with self.lock:
            if self.queued_bytes > self.max_memory_bytes:
                self._wait_for_room()
            self._buf[table].extend(items)
            self.buffered_rows += rows
            self.idle.clear()
            full = self.buffered_rows >= self.max_batch_rows
        if full:
            self.wake()

    def _wait_for_room(self) -> None:
        # under self.lock. Backpressure: neither the collector nor the disk takes requests, memory is full
        self.wake()
        if not self.room.wait_for(lambda: self.queued_bytes <= self.max_memory_bytes,
                                  timeout=self.backpressure_timeout):
            raise DeliveryError(
                f"forksight: the collector at {self.where} is unreachable, the spool {self.spool.directory} "
                f"cannot be written and {self.queued_bytes} bytes wait in memory (limit {self.max_memory_bytes}); "
                "refusing more rows rather than losing them: free the disk or restart the collector")

    def push(self, items: list[Item]) -> None:
        """Queue requests made elsewhere (the run's status at the end), after everything buffered."""
        with self.lock:
            self._push(items)
            self.idle.clear()

    # -- the sender thread
    def take_buffers(self) -> None:
        """Turn what is buffered into requests at the end of the queue (one JSON batch, Arrow for tokens)."""
        with self.lock:
            buf, self._buf = self._buf, {t: [] for t in TABLES}
            self.buffered_rows = 0
        items = requests_of(buf, self.rank, self.max_batch_rows)
        with self.lock:
            self._push(items)

    def _push(self, items: list[Item]) -> None:
        self._queue.extend(items)
        self.queued_bytes += sum(len(i.body) for i in items)

    def _pop(self) -> Item:
        item = self._queue.popleft()
        self.queued_bytes -= len(item.body)
        return item

    def next_group(self) -> list[Item]:
        """The oldest request, plus the next when both carry tokens (two token batches may be in
        flight at once: token rows carry their own step; scalars, which drive alerts, stay in
        order); [] when nothing is queued."""
        with self.lock:
            if not self._queue:
                return []
            group = [self._queue[0]]
            if len(self._queue) > 1 and group[0].kind == self._queue[1].kind == "arrow":
                group.append(self._queue[1])
            return group

    def drop_done(self) -> None:
        """Forget the requests at the head that were acknowledged (or refused for good)."""
        with self.lock:
            while self._queue and self._queue[0].done:
                self._pop()

    def spool_queue(self) -> None:
        """Move queued requests to the disk, in order, until it refuses one (that one and the rest
        stay in memory, in order, until they can go somewhere)."""
        while True:
            with self.lock:
                if not self._queue:
                    return
                item = self._queue[0]
            if not item.done and not self.spool.put(item):
                self.spool_refused = True
                return
            self.spool_refused = False
            with self.lock:
                self._pop()

    def spool_or_hold(self, item: Item) -> None:
        """Spool `item` now (e.g. the run's creation while the collector is down), else queue it."""
        if not self.spool.put(item):
            self.spool_refused = True
            with self.lock:
                self._push([item])

    def settle(self) -> None:
        """After a round of the sender: idle when nothing is left anywhere; wake writers waiting for room."""
        with self.lock:
            if not self._queue and not any(self._buf.values()) and not self.spool.count():
                self.idle.set()
            self.room.notify_all()

    # -- state
    def stuck(self) -> bool:
        """Nothing buffered, and nothing queued that could move (the queue is empty, or the disk
        refuses it): waiting longer for a collector that is down cannot help."""
        with self.lock:
            return not any(self._buf.values()) and (not self._queue or self.spool_refused)

    def undelivered(self) -> Counter:
        """Rows per table buffered, queued in memory or spooled (tables with none left out)."""
        with self.lock:
            total = Counter({k: len(v) for k, v in self._buf.items() if k != "tokens"})
            total["tokens"] += sum(t.num_rows for t in self._buf["tokens"])
            for item in self._queue:
                if not item.done:
                    total.update(item.tables())
        total.update(self.spool.rows())
        return +total

    def held_in_memory(self) -> int:
        """Data requests only memory holds (lost if the process ends now)."""
        with self.lock:
            return sum(not i.done and i.kind in DATA_KINDS for i in self._queue)
