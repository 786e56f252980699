"""The composition root: the collector's API, its guard and the dashboard in one ASGI app, and
the collector running in a thread of this process (`serve`, `Collector`, the embedded default)."""
# monitor/ and dashboard/ know nothing of each other: this module wires them. Dash loads only
# when a dashboard is asked for.
from __future__ import annotations

import atexit
import logging
import threading
import time
from urllib.parse import urlparse

from fastapi import FastAPI

from forksight.base.interfaces import AlertHub, Reader
from forksight.monitor.collector.guard import GuardMiddleware, check_bind
from forksight.monitor.collector.server import create_api
from forksight.monitor.collector.store import Store

log = logging.getLogger("forksight.compose.app")


def create_app(store: Store, *, token: str | None = None, dashboard: bool = True, hub: AlertHub | None = None,
               lake=None, fork_rule: str | None = None) -> FastAPI:
    """The collector app over `store`: /api routes first, the Dash dashboard at /, all behind the guard.
    lake: the lake's committer (--lake-catalog): the dashboard and the read routes then read every run of
    the lake too. fork_rule: the rule the dashboard's tokens page outlines forks by (None: each run's own)."""
    reader = None
    if lake is not None:
        from forksight.compose.lake_reads import tiered_reader

        reader = tiered_reader(store, lake)
    app = create_api(store, hub=hub, reader=reader)      # hub: the AlertHub (None: the environment's defaults)
    if dashboard:
        _mount_dashboard(app, reader or store.reader, fork_rule)
    app.add_middleware(GuardMiddleware, token=token)
    return app


def _mount_dashboard(app: FastAPI, reader: Reader, fork_rule: str | None = None) -> None:
    # mounted after the /api routes, so they match first
    from a2wsgi import WSGIMiddleware
    from starlette.middleware.gzip import GZipMiddleware

    from forksight.compose.dash_guard import guard_callbacks
    from forksight.dashboard.app import create_dash

    try:
        dash_app = create_dash(reader, url_base="/", fork_rule=fork_rule)
    except Exception:  # noqa: BLE001 - a broken page must not take ingest down with it
        log.exception("forksight: the dashboard failed to start; serving the API only")
        return
    guard_callbacks(dash_app)
    app.mount("/", GZipMiddleware(WholeBody(WSGIMiddleware(dash_app.server)),
                                  minimum_size=DASH_GZIP_MIN_BYTES, compresslevel=DASH_GZIP_LEVEL))


DASH_BODY_TIMEOUT_S = 15.0   # a dashboard request's whole body must arrive within this
# The dashboard's answers go gzipped to a browser that accepts it (Starlette's GZipMiddleware):
# its scripts are ~6 MB (plotly.js 4.8) and a run page's figures ~1 MB, 3-4x smaller gzipped,
# which a browser behind an SSH tunnel or a VPN waits for. Level 1 (nginx's default): 4.8 MB of
# plotly.js in 0.12 s of collector CPU (level 6: 0.25 s, 14% smaller); the API is not compressed.
DASH_GZIP_LEVEL = 1
DASH_GZIP_MIN_BYTES = 1024


class WholeBody:
    """Reads a request's whole body on the event loop, within DASH_BODY_TIMEOUT_S, before the WSGI
    app sees it: a2wsgi's WSGI threads (10) read bodies synchronously, so 12 clients trickling
    bytes to /_dash-update-component froze every page; now a slow client holds a coroutine, and
    past the time limit gets 408. (The guard in front still caps the body's size.)"""

    def __init__(self, app, timeout: float = DASH_BODY_TIMEOUT_S):
        self.app, self.timeout = app, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        import anyio

        from forksight.monitor.collector.guard import send_json

        chunks: list[bytes] = []
        with anyio.move_on_after(self.timeout) as limit:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return                                   # the client left: nobody to answer
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        if limit.cancelled_caught:
            return await send_json(send, 408, f"the request body did not arrive within {self.timeout:.0f} s; "
                                   "send it again (the dashboard reads each body whole before answering)")
        body, given = b"".join(chunks), False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()                           # then only a disconnect can come

        await self.app(scope, replay, send)


# the collector's HTTP server, the same whatever else is installed: uvicorn picks httptools and a
# websockets library when they are there (trackio, MLflow pull them in), and httptools answers
# malformed headers differently from h11; the collector serves no websocket
SERVER_OPTIONS = {"http": "h11", "ws": "none", "log_level": "warning", "access_log": False}


class Collector:
    """A collector running in a daemon thread of this process (the embedded default, tests)."""

    def __init__(self, db: str, host: str = "127.0.0.1", port: int = 8050, token: str | None = None,
                 dashboard: bool = True):
        import uvicorn

        from forksight.compose.stack import CollectorParts

        check_bind(host, token)
        self.parts = CollectorParts(db)         # the same order of start and stop as `forksight serve`
        self.store = self.parts.store
        try:
            self.app = create_app(self.store, token=token, dashboard=dashboard, lake=self.parts.lake)
        except BaseException:
            self.parts.close()
            raise
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host or '127.0.0.1'}:{port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, host=host, port=port, timeout_graceful_shutdown=5,
                                                    **SERVER_OPTIONS))
        self.thread = threading.Thread(target=self.server.run, name="forksight-collector", daemon=True)

    def start(self, timeout: float = 20.0) -> "Collector":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.parts.close()
                raise RuntimeError(f"the embedded collector could not start on {self.url} (port in use?)")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving, then write what is queued and close the DuckDB file."""
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.parts.close()


def serve(db: str, host: str = "127.0.0.1", port: int = 8050, token: str | None = None,
          dashboard: bool = True) -> Collector:
    """Start a collector (API + dashboard) in a thread of this process; `.stop()` ends it."""
    return Collector(db, host=host, port=port, token=token, dashboard=dashboard).start()


_embedded: list[Collector] = []


def start_embedded(url: str, db: str, token: str | None = None) -> Collector:
    """Start a collector in this process at url (loopback), on `db`; stopped at exit."""
    parsed = urlparse(url)
    collector = Collector(db, host=parsed.hostname or "127.0.0.1", port=parsed.port or 8050, token=token).start()
    log.warning("forksight: started an embedded collector on %s (db %s); it lives as long as this process",
                collector.url, db)
    _embedded.append(collector)
    # after the Store imported duckdb, so it runs before DuckDB's exit hook (see sink_base._track),
    # and before any sink opened on it registers its own finish, which must run first
    atexit.unregister(_stop_embedded)
    atexit.register(_stop_embedded)
    return collector


def _stop_embedded() -> None:
    while _embedded:
        _embedded.pop().stop()
