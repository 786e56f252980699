"""The sink every producer logs through: HTTP (HttpSink, in monitor/sinks/http.py), in-process
(LocalSink, provided by the composition root: this room never imports the collector) or nothing
(NullSink); `open_sink` picks one. Logging never does I/O on the caller's thread."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping, Sequence

from forksight.base.interfaces import Sink
from forksight.base.runspec import RunSpec
from forksight.base.wiring import provided
from forksight.monitor.sinks.base import SinkBase
from forksight.monitor.sinks.http import HttpSink
from forksight.monitor.sinks.transport import bearer

__all__ = ["open_sink", "NullSink", "HttpSink", "RunSpec", "collector_answers"]

log = logging.getLogger("forksight.client")

DEFAULT_URL = "http://127.0.0.1:8050"
DEFAULT_DB = "forksight.duckdb"


# ---------------------------------------------------------------------------- null
class NullSink(SinkBase):
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

    def log_probes(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        pass

    def log_reference(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        pass

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def undelivered(self) -> dict[str, int]:
        return {}                 # a NullSink stores nothing by design: nothing is owed

    def finish(self, status: str = "finished") -> dict[str, int]:
        self._finished = True
        return {}


# ---------------------------------------------------------------------------- open
def collector_answers(url: str, token: str | None = None, timeout: float = 0.5) -> bool:
    """True when a forksight collector answers GET /api/health at url (healthy or not)."""
    import httpx

    try:
        resp = httpx.get(url.rstrip("/") + "/api/health", timeout=timeout, headers=bearer(token))
        # 503: a collector whose store cannot write now (disk full); it answers, and takes the batches later
        return resp.status_code in (200, 503) and resp.json().get("service") == "forksight"
    except (httpx.HTTPError, ValueError):
        return False


def open_sink(run: str | RunSpec = "run", url: str | None = None, db: str | None = None, *,
              embedded: bool = True, **fields: Any) -> Sink:
    """The sink for one run: HTTP to `url`, in-process on `db`, or (neither) $FORKSIGHT_URL, else an
    embedded collector that rank 0 starts on ./forksight.duckdb. `run`: a RunSpec, or a run name
    (one that is not a valid run id becomes its nearest, with a warning) plus RunSpec fields:
    strategy, model, config, project="default", rank=0, stop_on_alert=False, token, resume=False
    (continue the run whose id is `run`, not a new `run-2`). Ranks > 0 never open a DuckDB file
    (one process owns it). Rank 0 prints one line: where to see the run (sinks/announce.py)."""
    spec = RunSpec.of(run, **fields)
    sink = _open(spec, url, db, embedded)
    if not spec.rank:
        from forksight.monitor.sinks.announce import announce

        announce(sink)
    return sink


def _open(spec: RunSpec, url: str | None, db: str | None, embedded: bool) -> Sink:
    if url:
        return HttpSink(url, spec)
    if db:
        if spec.rank:
            log.info("forksight: rank %d logs nothing with db=... (one process owns the file)", spec.rank)
            return NullSink(spec.name)
        return provided("local_sink")(db, spec)
    url = os.environ.get("FORKSIGHT_URL", DEFAULT_URL)
    if collector_answers(url, spec.token):
        return HttpSink(url, spec)
    if spec.rank:
        for _ in range(20):                 # give rank 0 time to start the embedded collector
            time.sleep(0.5)
            if collector_answers(url, spec.token):
                return HttpSink(url, spec)
        log.warning("forksight: no collector at %s for rank %d; logging nothing", url, spec.rank)
        return NullSink(spec.name)
    if not embedded:
        raise RuntimeError(f"no forksight collector answers at {url}; start one with `forksight serve` "
                           "or pass db=PATH for an in-process store")
    provided("embedded_collector")(url, db=os.environ.get("FORKSIGHT_DB", DEFAULT_DB), token=spec.token)
    return HttpSink(url, spec)
