"""Alert webhook: a Slack-compatible POST from a background thread that never blocks ingest.

The body is `{"text": "<one line for humans>", "alert": {<the alerts-table row>}}`: Slack
incoming webhooks show `text`; other receivers read the structured `alert`.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
from urllib.parse import urlsplit

logger = logging.getLogger("forksight.alerts")
_STOP = object()


def validate_webhook_url(url: str) -> str:
    """Return `url` if it is http(s) with a host; else a ValueError that says what to pass."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("webhook URL is empty: pass an http:// or https:// URL, e.g. https://hooks.slack.com/services/...")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"webhook URL must start with http:// or https://, got scheme {parts.scheme or '(none)'!r} "
                         f"in {_redact(url)!r}")
    if not parts.hostname:
        raise ValueError(f"webhook URL {_redact(url)!r} has no host: pass e.g. https://hooks.slack.com/services/...")
    return url.strip()


def _redact(url: str) -> str:
    # webhook paths are secrets (Slack puts the token in the path): show scheme and host only
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}/…" if parts.hostname else url[:16] + "…"


def slack_body(row: dict) -> dict:
    """The JSON body for one alert row: Slack `text` plus the row with JSON-safe numbers."""
    icon = ":rotating_light:" if row.get("severity") == "critical" else ":warning:"
    text = (f"{icon} forksight {row.get('severity', '').upper()} {row.get('detector')} — run "
            f"{row.get('run_id')} step {row.get('step')}: {row.get('message')}\n*Action:* {row.get('action')}")
    safe = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    return {"text": text, "alert": safe}


class WebhookSink:
    """Posts alert rows from a daemon thread; a bounded queue drops (and counts) on overflow."""

    def __init__(self, url: str, *, timeout: float = 5.0, retries: int = 3, backoff: float = 0.5,
                 max_queue: int = 256) -> None:
        self.url = validate_webhook_url(url)
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="forksight-webhook", daemon=True)
        self._thread.start()

    def post(self, row: dict) -> bool:
        """Queue one alert row; never blocks. False when the queue was full (the alert is dropped)."""
        try:
            self._queue.put_nowait(slack_body(row))
            return True
        except queue.Full:
            self.dropped += 1
            logger.warning("webhook queue full (%d): dropped an alert for %s", self._queue.maxsize, _redact(self.url))
            return False

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (waiting at most `timeout` s), then stop the thread."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            self._closing.set()  # no room even for the stop marker: give up on the backlog
        self._thread.join(timeout)
        self._closing.set()

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=self.timeout) as client:
            while True:
                body = self._queue.get()
                if body is _STOP or self._closing.is_set():
                    return
                self._deliver(client, body)

    def _deliver(self, client, body: dict) -> None:
        import httpx

        for attempt in range(self.retries + 1):
            try:
                response = client.post(self.url, json=body)
                if response.status_code < 400:
                    self.sent += 1
                    return
                problem = f"HTTP {response.status_code}"
                if response.status_code < 500 and response.status_code not in (408, 429):
                    break  # the receiver refuses this body: retrying will not help
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries and self._closing.wait(self.backoff * 2 ** attempt):
                break  # closing: stop backing off
        self.failed += 1
        logger.warning("webhook %s failed after %d attempt(s): %s", _redact(self.url), attempt + 1, problem)
