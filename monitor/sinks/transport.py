"""The HttpSink's wire: one HTTP request per `Item`, what each answer means (`verdict`), retries within
one send, and the backoff between sends while the collector is down. Knows nothing of buffers or the
spool; counts what was acknowledged and what was refused for good."""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from forksight.base.env import token_or_env
from forksight.base.constants import ARROW_MEDIA_TYPE
from forksight.monitor.sinks.spool import Item

log = logging.getLogger("forksight.client")

MAX_SERVER_ERRORS = 20   # a batch the collector keeps failing on (5xx) must not block the rest
MAX_BACKOFF_S = 2.0      # a refused connect costs nothing; a collector back up is found within 2 s
FIRST_BACKOFF_S = 0.5
REFUSED = frozenset({400, 401, 403, 404, 409, 413, 422})   # retrying cannot help


def verdict(status: int | None, kind: str) -> str:
    """What the collector's answer (None: it could not be reached) means for a request of `kind`:
    'ack' stored; 'wait' a rank > 0 joining before rank 0 created the run (try later); 'lost-run'
    the run is gone (a fresh collector on a new file: create it again, then retry); 'refuse' for
    good; 'retry' unreachable or failing (5xx; at most MAX_SERVER_ERRORS times per batch)."""
    if status is None:
        return "retry"
    if status < 400:
        return "ack"
    if status == 404:
        return "wait" if kind == "run" else "lost-run"
    return "refuse" if status in REFUSED else "retry"


class Backoff:
    """When to try again while the collector is down: FIRST_BACKOFF_S after a failed try, doubling
    to MAX_BACKOFF_S; `reset()` once a backlog went through."""

    def __init__(self, first: float = FIRST_BACKOFF_S, most: float = MAX_BACKOFF_S,
                 clock: Callable[[], float] = time.monotonic):
        self.first, self.most, self.clock = first, most, clock
        self.delay = first
        self.next_try = 0.0
        self.failures = 0          # failed tries so far (flush counts them to give up)

    def down(self) -> bool:
        """True while waiting out the delay after a failed try."""
        return self.clock() < self.next_try

    def failed(self) -> None:
        self.failures += 1
        self.next_try = self.clock() + self.delay
        self.delay = min(self.delay * 2, self.most)

    def reset(self) -> None:
        self.delay = self.first


@dataclass(frozen=True)
class Reply:
    """An answer to POST /api/runs: the status and the JSON body (None when it was not JSON)."""

    status: int
    body: Any
    text: str


def bearer(token: str | None) -> dict[str, str]:
    """The Authorization header for `token`, or $FORKSIGHT_TOKEN; none without either."""
    token = token_or_env(token)
    return {"Authorization": f"Bearer {token}"} if token else {}


class Transport:
    """Sends requests to one collector for one run and rank. on_alerts gets the alerts each answer
    carries; on_lost_run is asked to create the run again when the collector no longer knows it."""

    def __init__(self, url: str, *, rank: int = 0, token: str | None = None, retries: int = 3,
                 retry_delay: float = 0.1, on_alerts: Callable[[list], None] = lambda alerts: None,
                 on_lost_run: Callable[[], bool] = lambda: False, transport=None):
        import httpx

        self.url = url.rstrip("/")
        self.rank = rank
        self.retries = retries
        self.retry_delay = retry_delay
        self.on_alerts = on_alerts
        self.on_lost_run = on_lost_run
        self.run_id = ""                   # set once the run is opened; the collector's id after an offline create
        self.client = httpx.Client(base_url=self.url, headers=bearer(token), transport=transport,
                                   timeout=httpx.Timeout(60.0, connect=2.0))
        self.sent_rows = 0                 # token/scalar/... rows the collector acknowledged
        self.rejected: list[str] = []      # messages of batches the collector refused (4xx)
        self.refused: Counter = Counter()  # their rows, per table
        self.last_contact = time.monotonic()
        self._server_errors: dict[str, int] = {}
        self._lock = threading.Lock()      # two senders may finish at once

    def post_run(self, body: dict) -> Reply | None:
        """POST /api/runs; None when the collector cannot be reached."""
        import httpx

        try:
            resp = self.client.post("/api/runs", json=body)
        except httpx.TransportError as exc:
            log.debug("forksight: POST /api/runs to %s failed: %s", self.url, exc)
            return None
        try:
            data = resp.json()
        except ValueError:
            data = None
        return Reply(resp.status_code, data, resp.text)

    def request(self, item: Item):
        """One HTTP request for `item` (raises httpx.TransportError when unreachable)."""
        base = f"/api/runs/{self.run_id}"
        if item.kind == "arrow":
            return self.client.post(f"{base}/tokens", content=item.body,
                                    headers={"Content-Type": ARROW_MEDIA_TYPE},
                                    params={"batch_id": item.batch_id, "rank": self.rank})
        if item.kind == "heartbeat":
            return self.client.post(f"{base}/heartbeat")
        method, path = {"json": ("POST", f"{base}/ingest"), "run": ("POST", "/api/runs"),
                        "status": ("PATCH", base)}[item.kind]
        return self.client.request(method, path, content=item.body, headers={"Content-Type": "application/json"})

    def send(self, item: Item, retries: int | None = None) -> bool:
        """True when the collector acknowledged `item` (or refused it for good: see `rejected`);
        False: try again later. Up to `retries` tries, retry_delay apart, doubling."""
        import httpx

        retries = self.retries if retries is None else retries
        delay = self.retry_delay
        for attempt in range(max(1, retries)):
            try:
                resp = self.request(item)
            except httpx.TransportError:
                resp = None
            status = None if resp is None else resp.status_code
            what = verdict(status, item.kind)
            if what == "ack":
                self._acknowledged(item, resp)
                return True
            if what == "wait":
                return False
            if what == "lost-run" and self.on_lost_run():
                continue
            if what in ("lost-run", "refuse"):
                self.refuse(item, f"{item.kind} batch {item.batch_id}: {status} {resp.text[:500]}")
                return True
            if resp is not None:           # the collector answers but fails (5xx): not forever
                failures = self._server_errors[item.batch_id] = self._server_errors.get(item.batch_id, 0) + 1
                if failures >= MAX_SERVER_ERRORS:
                    self.refuse(item, f"{item.kind} batch {item.batch_id}: gave up after {failures} answers "
                                      f"{status} {resp.text[:300]}")
                    return True
            if attempt + 1 < retries:
                time.sleep(delay)
                delay *= 2
        return False

    def _acknowledged(self, item: Item, resp) -> None:
        item.done = True
        self.last_contact = time.monotonic()
        if item.kind in ("json", "arrow"):
            with self._lock:
                self.sent_rows += item.rows
        if item.kind in ("json", "arrow", "status"):
            self.on_alerts(resp.json().get("alerts", []))
        if item.kind == "run":             # created while offline: the collector chose the id
            self.run_id = resp.json()["run_id"]

    def refuse(self, item: Item, message: str) -> None:
        """Give up on `item` for good, counting its rows as refused."""
        self.rejected.append(message)
        log.error("forksight: collector refused %s", message)
        with self._lock:
            self.refused.update(item.tables())
        item.done = True

    def close(self) -> None:
        self.client.close()
