"""The sink every producer logs through: in-process (LocalSink), HTTP (HttpSink, in
monitor/sinks/http.py) or nothing (NullSink); `open_sink` picks one. Logging never does I/O
on the caller's thread."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from typing import Any, Mapping, Sequence

from forksight.monitor.sinks.http import HttpSink
from forksight.monitor.sinks.base import (_finite_scalars, _histogram_item, _open_sinks,
                                         _sample_rows, _Sink, _track)

__all__ = ["open_sink", "NullSink", "LocalSink", "HttpSink", "collector_answers"]

log = logging.getLogger("forksight.client")

DEFAULT_URL = "http://127.0.0.1:8050"
DEFAULT_DB = "forksight.duckdb"


# ---------------------------------------------------------------------------- null
class NullSink(_Sink):
    """Same methods, does nothing (ranks > 0 without a collector, tests)."""

    def __init__(self, run_id: str = "null"):
        super().__init__()
        self.run_id = run_id

    def log_scalars(self, step: int, values: Mapping[str, Any], weight: float | None = None) -> None:
        pass

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        pass

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        pass

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        pass

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def undelivered(self) -> dict[str, int]:
        return {}                 # a NullSink stores nothing by design: nothing is owed

    def finish(self, status: str = "finished") -> dict[str, int]:
        self._finished = True
        return {}


# ---------------------------------------------------------------------------- local
class LocalSink(_Sink):
    """In-process: owns a Store on a DuckDB file and writes through an Ingest (alerts included)."""

    def __init__(self, db: str, run: str, *, project: str = "default", strategy: str | None = None,
                 model: str | None = None, config: dict | None = None, rank: int = 0,
                 stop_on_alert: bool = False, store=None, hub=None, alerts: bool = True,
                 resume: bool = False):
        from forksight.monitor.collector.ingest import Ingest
        from forksight.monitor.collector.store import Store

        super().__init__(stop_on_alert)
        self._owns_store = store is None
        self.store = store if store is not None else Store(db)
        self.ingest = Ingest(self.store, hub, alerts=alerts)
        self.reader = self.store.reader
        self.rank = rank
        self.run_id = self.store.create_run(run, project=project, strategy=strategy, model=model,
                                            config=config, run_id=run if resume else None)
        self._pending: dict = {}                 # write Future -> its rows per table
        self._failed: Counter = Counter()        # rows of writes the store could not do
        self._lock = threading.Lock()
        self._ended = threading.Event()
        threading.Thread(target=self._beat, name="forksight-heartbeat", daemon=True).start()
        _track(self)

    def _beat(self, interval: float = 30.0) -> None:
        # a step longer than the stale window must not make a live run read as crashed
        while not self._ended.wait(interval):
            try:
                self.store.heartbeat(self.run_id)
            except RuntimeError:          # the store was closed under us
                return

    def _submit(self, **tables) -> None:
        from forksight.monitor.collector.store import Records

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
        from forksight.monitor.collector.store import scalars_table

        rows = _finite_scalars(step, values, weight, self._warned)
        if rows:
            self._submit(scalars=scalars_table(rows, self.rank))

    def log_tokens(self, step: int, columns: Mapping[str, Any]) -> None:
        """Per-token columns of equal length (sample_id, pos, token_id, token, entropy, ...)."""
        from forksight.monitor.collector.store import tokens_table

        self._submit(tokens=tokens_table(columns, step=step, rank=self.rank))

    def log_samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        from forksight.monitor.collector.store import samples_table

        if rows:
            self._submit(samples=samples_table(_sample_rows(step, rows, self._warned), self.rank))

    def log_histogram(self, step: int, key: str, counts, edges) -> None:
        from forksight.monitor.collector.store import histograms_table

        self._submit(histograms=histograms_table([_histogram_item(step, key, counts, edges)], self.rank))

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
        _open_sinks.discard(self)
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


# ---------------------------------------------------------------------------- open
def collector_answers(url: str, token: str | None = None, timeout: float = 0.5) -> bool:
    """True when a forksight collector answers GET /api/health at url."""
    import httpx

    token = token or os.environ.get("FORKSIGHT_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/api/health", timeout=timeout, headers=headers)
        return resp.status_code == 200 and resp.json().get("service") == "forksight"
    except (httpx.HTTPError, ValueError):
        return False


def open_sink(run: str = "run", url: str | None = None, db: str | None = None, *,
              strategy: str | None = None, model: str | None = None, config: dict | None = None,
              project: str = "default", rank: int = 0, stop_on_alert: bool = False,
              embedded: bool = True, token: str | None = None, resume: bool = False) -> _Sink:
    """The sink for one run: HTTP to `url`, in-process on `db`, or (neither) $FORKSIGHT_URL, else an
    embedded collector that rank 0 starts on ./forksight.duckdb. resume: continue the run whose
    id is `run`, not a new `run-2`. Ranks > 0 never open a DuckDB file (one process owns it)."""
    from forksight.base.limits import RUN_ID_RE, slug_run_name

    if not RUN_ID_RE.match(str(run)):      # e.g. TRL's default run_name is the output dir path
        log.warning("forksight: run name %r is not a valid run id; using %r", run, slug_run_name(run))
        run = slug_run_name(run)
    meta = dict(project=project, strategy=strategy, model=model, config=config, rank=rank, resume=resume,
                stop_on_alert=stop_on_alert)
    if url:
        return HttpSink(url, run, token=token, **meta)
    if db:
        if rank:
            log.info("forksight: rank %d logs nothing with db=... (one process owns the file)", rank)
            return NullSink(run)
        return LocalSink(db, run, **meta)
    url = os.environ.get("FORKSIGHT_URL", DEFAULT_URL)
    if collector_answers(url, token):
        return HttpSink(url, run, token=token, **meta)
    if rank:
        for _ in range(20):                 # give rank 0 time to start the embedded collector
            time.sleep(0.5)
            if collector_answers(url, token):
                return HttpSink(url, run, token=token, **meta)
        log.warning("forksight: no collector at %s for rank %d; logging nothing", url, rank)
        return NullSink(run)
    if not embedded:
        raise RuntimeError(f"no forksight collector answers at {url}; start one with `forksight serve` "
                           "or pass db=PATH for an in-process store")
    from forksight.compose.app import start_embedded

    start_embedded(url, db=os.environ.get("FORKSIGHT_DB", DEFAULT_DB), token=token)
    return HttpSink(url, run, token=token, **meta)
