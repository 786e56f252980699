"""HttpSink: batches to a collector from a background thread (JSON; Arrow IPC for tokens), each
with an id stored once; retries, then .forksight/spool/ while the collector is down, then bounded
memory with backpressure when the disk refuses too: `undelivered()` says what is not stored.

A composition of three parts, each tested on its own: `RunOpener` (run_open.py: create, join or
resume the run, and create it again when a fresh collector lost it), `Outbox` (outbox.py: buffers,
the request queue, the spool, backpressure) and `Transport` (transport.py: requests, what an answer
means, retries, backoff). This file runs the sender thread that moves requests from one to the other."""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Mapping, Sequence

from forksight.base.runspec import RunSpec
from forksight.monitor.sinks import spool as spool_mod
from forksight.monitor.sinks.base import (
    SinkBase, finite_scalars, histogram_item, keyed_rows, probe_rows, sample_rows, track, untrack,
)
from forksight.monitor.sinks.outbox import DeliveryError, Outbox
from forksight.monitor.sinks.run_open import RunOpener
from forksight.monitor.sinks.spool import Item, Spool
from forksight.monitor.sinks.transport import Backoff, Transport

__all__ = ["HttpSink", "DeliveryError"]

log = logging.getLogger("forksight.client")


class HttpSink(SinkBase):
    """Streams one run to a collector from a background thread; spools to disk while it is down.
    `run`: a RunSpec, or a run name plus RunSpec fields (project=, strategy=, config=, rank=, ...)."""

    def __init__(self, url: str, run: RunSpec | str = "run", *, flush_interval: float = 0.25,
                 max_batch_rows: int = 262_144, spool_dir: str | os.PathLike | None = None, retries: int = 3,
                 heartbeat_interval: float = 10.0, max_memory_bytes: int = 256 * 1024 * 1024,
                 backpressure_timeout: float = 60.0, **fields: Any):
        spec = RunSpec.of(run, **fields)
        super().__init__(spec.stop_on_alert)
        self.spec = spec
        self.url = url.rstrip("/")
        self.rank = spec.rank
        self.flush_interval = flush_interval
        self.heartbeat_interval = heartbeat_interval
        self._wake = threading.Event()
        self._closing = False
        self.backoff = Backoff()
        self.transport = Transport(self.url, rank=spec.rank, token=spec.token, retries=retries,
                                   on_alerts=self._on_alerts, on_lost_run=self._recreate_run)
        self.opener = RunOpener(spec, self.transport.post_run, where=self.url)
        try:
            self.transport.run_id, create = self.opener.open()
        except BaseException:
            self.transport.close()
            raise
        spool = Spool(Path(spool_dir) if spool_dir else
                      spool_mod.SPOOL_ROOT / f"{self.run_id}.r{self.rank}.{uuid.uuid4().hex[:8]}")
        self.outbox = Outbox(spool, rank=self.rank, max_batch_rows=max_batch_rows,
                             max_memory_bytes=max_memory_bytes, backpressure_timeout=backpressure_timeout,
                             wake=self._wake.set, where=self.url)
        if create is not None:          # this process's run first, then adopted batches
            self.outbox.spool_or_hold(create)
        if spool_dir is None:
            spool.adopt(self.run_id, self.rank)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="forksight-send")
        self._thread = threading.Thread(target=self._loop, name=f"forksight-sink-{self.run_id}", daemon=True)
        self._thread.start()
        track(self)

    @property
    def run_id(self) -> str:
        """The run's id: its name unless taken; the collector's choice once a run filed offline is created."""
        return self.transport.run_id

    @property
    def sent_rows(self) -> int:
        """Rows the collector acknowledged."""
        return self.transport.sent_rows

    @property
    def rejected(self) -> list[str]:
        """Messages of batches the collector refused for good."""
        return self.transport.rejected

    def _recreate_run(self) -> bool:
        return self.opener.recreate(self.run_id)

    # -- logging API: append to buffers under a lock, never I/O
    def log_scalars(self, step: int, values: Mapping[str, Any], weight: float | None = None) -> None:
        """Per-step numbers; weight = token count, used when ranks are merged."""
        rows = finite_scalars(step, values, weight, self._warned)
        self.outbox.append("scalars", rows, len(rows))

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        """Per-token columns of equal length; validated now, sent as Arrow IPC."""
        from forksight.base.records import tokens_table

        table = tokens_table(columns, step=step, rank=self.rank)
        table = table.drop_columns(["rank"])      # the rank travels once per request, as a parameter
        self.outbox.append("tokens", [table], table.num_rows)

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        rows = sample_rows(step, rows, self._warned)
        self.outbox.append("samples", rows, len(rows))

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        self.outbox.append("histograms", [histogram_item(step, key, counts, edges)], 1)

    def log_probes(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        rows = probe_rows(step, rows, self._warned)
        self.outbox.append("probes", rows, len(rows))

    def log_reference(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        rows = keyed_rows("reference", step, rows, self._warned)
        self.outbox.append("reference", rows, len(rows))

    def await_alerts(self, timeout: float = 10.0) -> None:
        """As SinkBase.await_alerts, but a collector known to be down (backing off) costs nothing, and
        one that goes down while waiting costs one failed try, not `timeout`."""
        if self.backoff.down():
            return
        self.flush(timeout=timeout, give_up_after_failures=1)

    def flush(self, timeout: float | None = 30.0, *, give_up_after_failures: int | None = None) -> bool:
        """True once everything logged so far is stored; False on timeout or if anything was refused
        (see `undelivered()`). give_up_after_failures: stop once that many retries failed and
        nothing can move (finish() uses it: a script whose collector is gone exits in seconds)."""
        self._wake.set()
        failures_before = self.backoff.failures
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.outbox.idle.wait(0.05):
            self._wake.set()
            if deadline is not None and time.monotonic() > deadline:
                return False
            if (give_up_after_failures is not None
                    and self.backoff.failures - failures_before >= give_up_after_failures and self.outbox.stuck()):
                return False
        return not self.transport.refused

    def undelivered(self) -> dict[str, int]:
        """Rows per table that have not reached the store: buffered, in memory, spooled or refused."""
        total = self.outbox.undelivered()
        total.update(self.transport.refused)
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
        self.outbox.push([Item("status", "status", json.dumps({"status": status}).encode())])
        self.flush(min(timeout, 5.0), give_up_after_failures=1)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._pool.shutdown(wait=False)
        left = self.undelivered()
        if left:
            log.warning("forksight: rows of run %s not delivered: %s (refused: %s; kept in %s: %d batch(es); "
                        "only in memory, lost at exit: %d batch(es))", self.run_id, left,
                        dict(self.transport.refused), self.outbox.spool.directory, self.spooled(),
                        self.outbox.held_in_memory())
        if not self.spooled():
            self.outbox.spool.remove()
        self.transport.close()
        return left

    def spooled(self) -> int:
        """Batches waiting on disk."""
        return self.outbox.spool.count()

    # -- the background thread
    def _loop(self) -> None:
        while not self._closing:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                # while the collector is down, batch up until the next retry: a few big spool
                # files replay much faster than one tiny file per tick
                if self.backoff.down() and self.outbox.buffered_rows < self.outbox.max_batch_rows:
                    continue
                self.outbox.take_buffers()
                self._pump()
                if time.monotonic() - self.transport.last_contact > self.heartbeat_interval:
                    self._send(Item("heartbeat", "heartbeat", b""))
            except Exception:  # noqa: BLE001 - the sender must survive anything
                log.exception("forksight: sender error (will retry)")
            self.outbox.settle()

    def _pump(self) -> None:
        # order is sacred: the spool (older) drains before the queue (newer)
        if self.backoff.down():
            self.outbox.spool_queue()
            return
        spool = self.outbox.spool
        paths = spool.paths()
        for path in paths:
            if not self._send(spool.read(path), retries=1):
                self._retry_later()
                return
            path.unlink()
        if paths:
            self.backoff.reset()
        retries = self.transport.retries
        while group := self.outbox.next_group():
            if len(group) == 2:       # two token batches: serialise one while the collector writes the other
                second = self._pool.submit(self._send, group[1], retries)
                self._send(group[0], retries)
                second.result()
            else:
                self._send(group[0], retries)
            self.outbox.drop_done()
            if not all(item.done for item in group):
                self._retry_later()
                return

    def _retry_later(self) -> None:
        self.backoff.failed()
        self.outbox.spool_queue()

    def _send(self, item: Item, retries: int = 3) -> bool:
        """True when the collector acknowledged (or refused for good); False: try again later."""
        return self.transport.send(item, retries)
