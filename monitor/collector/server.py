"""The collector's HTTP API over one Store: runs, ingest, export (reads: routes_read.py).
Routes are thin over `*_impl` functions; forksight/app.py adds the guard and the dashboard."""
# Every input is validated (forksight.base.limits, monitor/collector/schema.py); a refused request stores
# nothing, and the server keeps serving.
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

import duckdb

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from forksight.base.limits import BATCH_ID_RE, MAX_RANK, limits
from forksight.base.errors import ApiError, unknown_run, validation_message
from forksight.monitor.collector.bodies import json_records, parse_arrow_tokens
from forksight.monitor.collector.ingest import Ingest, ingest_impl, require_run
from forksight.monitor.collector.faults import StoreUnavailable
from forksight.monitor.collector.openapi_errors import declare_errors
from forksight.monitor.collector.routes_read import read_routes
from forksight.base.constants import ARROW_MEDIA_TYPE
from forksight.monitor.collector.schema import Batch, RunCreate, RunUpdate, inline_json_schema
from forksight.monitor.collector.store import Store

log = logging.getLogger("forksight.server")


# ---------------------------------------------------------------------------- impl (pure)
def export_impl(store: Store, run_id: str) -> str:
    """Write the run's hive-partitioned Parquet into a temp dir, zip it; return the zip path."""
    from forksight.monitor.collector.export import export_tables

    tmp = tempfile.mkdtemp(prefix="forksight-export-")
    with store.reader._lock:
        cur = store.reader._conn.cursor()
    try:
        export_tables(cur, run_id, os.path.join(tmp, run_id))
    finally:
        cur.close()
    return shutil.make_archive(os.path.join(tmp, run_id), "zip", root_dir=os.path.join(tmp, run_id))


async def arrow_body(request: Request) -> bytes:
    """The body of an Arrow upload, its schema checked from the first bytes (a 60k-column schema
    is refused before the rest is read or anything is parsed)."""
    from forksight.monitor.collector.ipc import StreamRefused, check_schema

    chunks, size, checked = [], 0, False
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if not checked:
            if len(chunks) > 1:
                chunks = [b"".join(chunks)]          # only until the schema is whole (<= 64 KiB)
            try:
                checked = check_schema(chunks[0])
            except StreamRefused as exc:
                if exc.status != 400:
                    raise ApiError(exc.status, str(exc)) from None
                checked = True     # malformed: read it whole (or see the client leave); parsing says so
    return b"".join(chunks)


# ---------------------------------------------------------------------------- routes
def create_api(store: Store, *, hub=None, reader=None) -> FastAPI:
    """The collector's API over `store` (no guard, no dashboard: forksight/app.py adds those).

    hub: the AlertHub that judges ingested steps (None: one from the environment's defaults).
    reader: what the read routes read (None: the file's; a tiered reader over the file and the lake).
    """
    # Swagger UI and ReDoc served from the package's own copies: /docs works offline
    app = FastAPIOffline(title="forksight collector", version="0.1.0",
                         description="Ingest of per-step and per-token training diagnostics; reads for the dashboard.")
    app.state.store = store
    ingester = app.state.ingest = Ingest(store, hub)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect):
        # the client left mid-body (or sent a broken chunk): nothing was stored, and this is no
        # application error to log with a traceback; the answer reaches whoever still listens
        return JSONResponse({"detail": "the body did not arrive whole (the client disconnected); "
                                       "nothing of it was stored: send it again"}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"detail": "body is not valid JSON; send one JSON object"}, status_code=400)
        return JSONResponse({"detail": validation_message(errors)}, status_code=422)

    @app.exception_handler(StoreUnavailable)
    async def _unavailable(request: Request, exc: StoreUnavailable):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.exception_handler(duckdb.Error)
    async def _database_error(request: Request, exc: duckdb.Error):
        # a read on a full disk or an invalidated file: said as such (503/507), never a bare 500
        unavailable = store._note(exc)
        if unavailable is not None:
            return JSONResponse({"detail": str(unavailable)}, status_code=unavailable.status)
        log.error("database error on %s: %s", request.url.path, exc)
        return JSONResponse({"detail": f"the database failed ({type(exc).__name__}: {str(exc)[:300]})"},
                            status_code=500)

    @app.get("/api/health", responses={503: {"description": "the store cannot write now (see `store`)"}})
    def health() -> JSONResponse:
        """The collector's state: 200 while the store can write, 503 (with why) when it cannot."""
        state = store.health()
        lake = state.pop("lake", None)
        status = "ok" if state["writable"] else "unavailable"
        if status == "ok" and lake is not None and lake["state"] != "ok":
            status = "degraded"          # ingest is acknowledged; the lake's backlog waits (see `lake`)
        body = {"service": "forksight", "status": status, "db": store.path, "time": time.time(), "store": state,
                "limits": limits(), **({"lake": lake} if lake is not None else {})}
        return JSONResponse(body, status_code=200 if state["writable"] else 503)

    @app.get("/api/health/lake", responses={404: {"description": "no lake configured"},
                                            503: {"description": "the lake's catalog refuses commits (degraded) "
                                                  "or answers none within the deadline (stalled)"}})
    def lake_health() -> JSONResponse:
        """The lake's state (--lake-catalog): 200 while commits go through, 503 with the backlog
        waiting in DuckDB while the catalog refuses them (degraded) or answers none in time (stalled)."""
        if store.lake_health is None:
            return JSONResponse({"detail": "this collector writes no lake: start it with --lake-catalog"},
                                status_code=404)
        lake = store.lake_health()
        return JSONResponse(lake, status_code=200 if lake["state"] == "ok" else 503)

    @app.post("/api/lost_rows/acknowledge")
    def acknowledge_lost_rows() -> dict:
        """Stop reporting rows found lost from the file (health, dashboard); returns what was reported."""
        return {"acknowledged": store.acknowledge_lost()}

    @app.post("/api/runs", status_code=201)
    def create_run(body: RunCreate) -> dict:
        try:
            run_id = store.create_run(body.name, project=body.project, strategy=body.strategy,
                                      model=body.model, config=body.config, run_id=body.run_id, join=body.join)
        except LookupError as exc:
            raise ApiError(404, f"{exc}; rank 0 creates it (POST /api/runs without join)") from None
        return {"run_id": run_id}

    # reader: a tiered reader over the file and the lake (--lake-catalog); its runs are known to it
    known = ingester.has_run if reader is None else (lambda run_id: ingester.has_run(run_id) or reader.has_run(run_id))
    app.include_router(read_routes(reader or store.reader, known))

    @app.patch("/api/runs/{run_id}")
    def update_run(run_id: str, body: RunUpdate) -> dict:
        alerts = ingester.update_run(run_id, status=body.status, strategy=body.strategy, model=body.model,
                                     config=body.config)
        if alerts is None:
            raise unknown_run(run_id)
        return {"run_id": run_id, "status": body.status, "alerts": alerts}

    @app.post("/api/runs/{run_id}/heartbeat")
    def heartbeat(run_id: str) -> dict:
        if not store.heartbeat(run_id):
            raise unknown_run(run_id)
        return {"run_id": run_id, "time": time.time()}

    @app.post("/api/runs/{run_id}/ingest",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": inline_json_schema(Batch)}}}})
    async def ingest(run_id: str, request: Request) -> dict:
        """One JSON batch (scalars, samples, histograms, tokens); idempotent by batch_id."""
        require_run(ingester, run_id)
        # validation and Arrow building are CPU work: off the event loop, so other requests
        # (health checks, the dashboard) keep being answered while a large batch is checked
        records, batch_id = await run_in_threadpool(json_records, await request.body())  # the guard caps the size
        return await ingest_impl(ingester, run_id, records, batch_id)

    @app.post("/api/runs/{run_id}/tokens",
              openapi_extra={"requestBody": {"required": True, "content": {
                  ARROW_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}})
    async def ingest_tokens(run_id: str, request: Request,
                            batch_id: str = Query(..., description="idempotency key, [A-Za-z0-9._-]{1,64}"),
                            rank: int = Query(0, ge=0, le=MAX_RANK)) -> dict:
        """Per-token rows as an Arrow IPC stream (application/vnd.apache.arrow.stream)."""
        if not BATCH_ID_RE.match(batch_id):
            raise ApiError(422, "batch_id: must match [A-Za-z0-9._-]{1,64}")
        require_run(ingester, run_id)
        body = await arrow_body(request)          # size: the guard caps it; columns: checked first
        records = await run_in_threadpool(parse_arrow_tokens, body, rank)   # decode, check, hash: off the loop
        return await ingest_impl(ingester, run_id, records, batch_id)

    @app.get("/api/runs/{run_id}/export", response_class=FileResponse)
    def export(run_id: str):
        """The run's tables as hive-partitioned Parquet in a zip (works while the collector holds the file)."""
        require_run(ingester, run_id)
        path = export_impl(store, run_id)
        return FileResponse(path, media_type="application/zip", filename=f"{run_id}-parquet.zip",
                            background=BackgroundTask(shutil.rmtree, os.path.dirname(path), True))
    declare_errors(app)
    return app

