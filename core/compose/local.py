"""LocalSink: a run written in this process, into a Store it owns (or is given), through an
Ingest, alerts included. It wires the sinks' interface to the collector, so it lives in the
composition root; `open_sink(db=...)` gets it through `forksight.base.wiring`."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Mapping, Sequence

from forksight.base.records import (
    Records, histograms_table, probes_table, reference_table, samples_table, scalars_table, tokens_table,
)
from forksight.base.runspec import RunSpec
from forksight.monitor.collector.ingest import Ingest
from forksight.monitor.collector.store import Store
from forksight.monitor.sinks.base import (
    SinkBase, finite_scalars, histogram_item, keyed_rows, probe_rows, sample_rows, track, untrack,
)

log = logging.getLogger("forksight.client")


class LocalSink(SinkBase):
    """In-process: owns a Store on a DuckDB file and writes through an Ingest (alerts included)."""

    def __init__(self, db: str, run: RunSpec | str = "run", *, store=None, hub=None, alerts: bool = True,
                 **fields: Any):
        """`run`: a RunSpec, or a run name plus RunSpec fields (project=, strategy=, config=, ...)."""
        spec = RunSpec.of(run, **fields)
        super().__init__(spec.stop_on_alert)
        self.spec = spec
        self._owns_store = store is None
        self.store = store if store is not None else Store(db)
        self.ingest = Ingest(self.store, hub, alerts=alerts)
        self.reader = self.store.reader
        self.rank = spec.rank
        self.run_id = self.store.create_run(**spec.create_body(), run_id=spec.name if spec.resume else None)
        self._pending: dict = {}                 # write Future -> its rows per table
        self._failed: Counter = Counter()        # rows of writes the store could not do
        self._lock = threading.Lock()
        self._ended = threading.Event()
        threading.Thread(target=self._beat, name="forksight-heartbeat", daemon=True).start()
        track(self)

    def _beat(self, interval: float = 30.0) -> None:
        # a step longer than the stale window must not make a live run read as crashed
        while not self._ended.wait(interval):
            try:
                self.store.heartbeat(self.run_id)
            except RuntimeError:          # the store was closed under us
                return

    def _submit(self, **tables) -> None:
        records = Records(**tables)
        fut = self.ingest.write(self.run_id, records)
        with self._lock:
            self._pending[fut] = records.num_rows()
        fut.add_done_callback(self._done)

    def _done(self, fut) -> None:
        with self._lock:
            rows = self._pending.pop(fut, {})
            if fut.exception() is not None:
                self._failed.update(rows)
        if fut.exception() is not None:
            log.error("forksight: a write to %s failed (%s rows not stored): %s", self.store.path, rows,
                      fut.exception())
        else:
            self._on_alerts(fut.result().alerts)

    def log_scalars(self, step: int, values: Mapping[str, Any], weight: float | None = None) -> None:
        """Per-step numbers; weight = token count, used when ranks are merged."""
        rows = finite_scalars(step, values, weight, self._warned)
        if rows:
            self._submit(scalars=scalars_table(rows, self.rank))

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        """Per-token columns of equal length (sample_id, pos, token_id, token, entropy, ...)."""
        self._submit(tokens=tokens_table(columns, step=step, rank=self.rank))

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._submit(samples=samples_table(sample_rows(step, rows, self._warned), self.rank))

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        self._submit(histograms=histograms_table([histogram_item(step, key, counts, edges)], self.rank))

    def log_probes(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._submit(probes=probes_table(probe_rows(step, rows, self._warned), self.rank))

    def log_reference(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._submit(reference=reference_table(keyed_rows("reference", step, rows, self._warned), self.rank))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything logged so far is stored (and its alerts received); False when a
        write failed (see `undelivered()`) or on timeout."""
        try:
            self.store.flush()
        except RuntimeError:      # closed: what was queued has been written or has failed
            pass
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:               # done-callbacks may still be running on the writer thread
            with self._lock:
                if not self._pending:
                    return not self._failed
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def undelivered(self) -> dict[str, int]:
        """Rows per table not stored: still queued, or failed."""
        with self._lock:
            total = Counter(self._failed)
            for rows in self._pending.values():
                total.update(rows)
        return dict(+total)

    def finish(self, status: str = "finished") -> dict[str, int]:
        """Flush, mark the run, close the store if this sink opened it; returns `undelivered()`."""
        if self._finished:
            return self.undelivered()
        self._finished = True
        self._ended.set()
        untrack(self)
        self.flush()
        try:
            self._on_alerts(self.ingest.update_run(self.run_id, status=status) or [])
        except RuntimeError as exc:          # the store was closed under us
            log.error("forksight: could not mark run %s %s: %s", self.run_id, status, exc)
        if self._owns_store:
            self.store.close()
        left = self.undelivered()
        if left:
            log.warning("forksight: rows of run %s not stored: %s", self.run_id, left)
        return left
