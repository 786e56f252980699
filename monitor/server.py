"""The collector's HTTP API over one Store: ingest, runs and reads (routes only).

Routes are thin; the `*_impl` functions do the work and are what tests and the dashboard
could call directly. Every input is validated (monitor/schema.py holds the limits); a refused
request stores nothing, and the server keeps serving. forksight/app.py composes this API with
the guard and the dashboard.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from typing import Any

import pandas as pd
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import ValidationError
from starlette.background import BackgroundTask

from forksight.monitor.errors import ApiError, validation_message
from forksight.monitor.guard import read_body
from forksight.monitor.schema import (
    ARROW_MEDIA_TYPE, BATCH_ID_RE, MAX_RANK, RUN_ID_RE, Batch, RunCreate, RunUpdate, limits,
)
from forksight.monitor.store import (
    Records, RecordError, Store, histograms_table, samples_table, scalars_table, tokens_table,
)

log = logging.getLogger("forksight.server")


# ---------------------------------------------------------------------------- impl (pure)
def _require_run(store: Store, known: set, run_id: str) -> None:
    if run_id in known:
        return
    if not RUN_ID_RE.match(run_id) or not store.reader.has_run(run_id):
        raise ApiError(404, f"unknown run {run_id!r}: create it first with POST /api/runs")
    known.add(run_id)


def batch_records(batch: Batch) -> Records:
    """A validated JSON batch -> Arrow tables for the store."""
    rank = batch.rank
    tokens = None
    if batch.tokens:
        import pyarrow as pa

        tokens = pa.concat_tables([
            tokens_table({k: v for k, v in block.model_dump().items() if k != "step" and v is not None},
                         step=block.step, rank=rank) for block in batch.tokens])
    return Records(
        scalars=scalars_table([r.model_dump() for r in batch.scalars], rank) if batch.scalars else None,
        samples=samples_table([r.model_dump() for r in batch.samples], rank) if batch.samples else None,
        histograms=histograms_table([r.model_dump() for r in batch.histograms], rank) if batch.histograms else None,
        tokens=tokens,
    )


def parse_json_batch(body: bytes) -> Batch:
    """Bytes -> Batch; 400 for malformed JSON, 422 naming the field for anything else."""
    try:
        return Batch.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if errors and errors[0]["type"] == "json_invalid":
            raise ApiError(400, f"body is not valid JSON ({errors[0]['msg']}); send one JSON object") from None
        raise ApiError(422, validation_message(errors)) from None


def parse_arrow_tokens(body: bytes, rank: int) -> Records:
    """An Arrow IPC stream of per-token columns -> Records; 422 naming what is wrong."""
    import pyarrow as pa

    try:
        table = pa.ipc.open_stream(pa.py_buffer(body)).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
        raise ApiError(400, f"body is not an Arrow IPC stream ({exc}); send {ARROW_MEDIA_TYPE}") from None
    try:
        return Records(tokens=tokens_table(table, rank=rank))
    except RecordError as exc:
        raise ApiError(422, str(exc)) from None


async def ingest_impl(store: Store, known: set, run_id: str, records: Records, batch_id: str) -> dict:
    """Store one batch (once per batch id) and return what happened, with any alerts."""
    _require_run(store, known, run_id)
    try:
        result = await asyncio.wrap_future(store.write(run_id, records, batch_id))
    except Exception as exc:  # noqa: BLE001 - nothing of the batch was stored (one transaction)
        log.exception("write of batch %s for run %s failed", batch_id, run_id)
        raise ApiError(500, f"the store could not write batch {batch_id} ({type(exc).__name__}: {exc}); "
                       "nothing of it was stored: send it again") from None
    return {"run_id": run_id, "batch_id": batch_id, "stored": result.stored,
            "duplicate": not result.stored, "rows": result.rows, "alerts": result.alerts}


def frame_response(df: pd.DataFrame) -> Response:
    """A DataFrame as JSON records, floats exact (shortest round-trip repr), NaN/NA -> null."""
    import json

    import pyarrow as pa

    rows = pa.Table.from_pandas(df, preserve_index=False).to_pylist()   # NaN -> None
    return Response(json.dumps(rows, allow_nan=False), media_type="application/json")


def export_impl(store: Store, run_id: str) -> str:
    """Write the run's hive-partitioned Parquet into a temp dir, zip it; return the zip path."""
    from forksight.monitor.export import export_tables

    tmp = tempfile.mkdtemp(prefix="forksight-export-")
    with store.reader._lock:
        cur = store.reader._conn.cursor()
    try:
        export_tables(cur, run_id, os.path.join(tmp, run_id))
    finally:
        cur.close()
    return shutil.make_archive(os.path.join(tmp, run_id), "zip", root_dir=os.path.join(tmp, run_id))


# ---------------------------------------------------------------------------- routes
def create_api(store: Store) -> FastAPI:
    """The collector's API over `store` (no guard, no dashboard: forksight/app.py adds those)."""
    app = FastAPI(title="forksight collector", version="0.1.0",
                  description="Ingest of per-step and per-token training diagnostics; reads for the dashboard.")
    app.state.store = store
    known: set = set()
    reader = store.reader

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"detail": "body is not valid JSON; send one JSON object"}, status_code=400)
        return JSONResponse({"detail": validation_message(errors)}, status_code=422)

    @app.get("/api/health")
    def health() -> dict:
        return {"service": "forksight", "status": "ok", "db": store.path, "time": time.time(), "limits": limits()}

    @app.post("/api/runs", status_code=201)
    def create_run(body: RunCreate) -> dict:
        try:
            run_id = store.create_run(body.name, project=body.project, strategy=body.strategy,
                                      model=body.model, config=body.config, run_id=body.run_id, join=body.join)
        except LookupError as exc:
            raise ApiError(404, f"{exc}; rank 0 creates it (POST /api/runs without join)") from None
        known.add(run_id)
        return {"run_id": run_id}

    @app.get("/api/runs")
    def list_runs() -> Response:
        return frame_response(reader.list_runs())

    @app.get("/api/runs/{run_id}")
    def get_run(run_id: str) -> dict:
        run = reader.run(run_id)
        if run is None:
            raise ApiError(404, f"unknown run {run_id!r}: see GET /api/runs")
        return {k: (None if _isna(v) else v) for k, v in run.items()}

    @app.patch("/api/runs/{run_id}")
    def update_run(run_id: str, body: RunUpdate) -> dict:
        alerts = store.update_run(run_id, status=body.status, strategy=body.strategy, model=body.model,
                                  config=body.config)
        if alerts is None:
            raise ApiError(404, f"unknown run {run_id!r}: create it first with POST /api/runs")
        return {"run_id": run_id, "status": body.status, "alerts": alerts}

    @app.post("/api/runs/{run_id}/heartbeat")
    def heartbeat(run_id: str) -> dict:
        if not store.heartbeat(run_id):
            raise ApiError(404, f"unknown run {run_id!r}: create it first with POST /api/runs")
        return {"run_id": run_id, "time": time.time()}

    @app.post("/api/runs/{run_id}/ingest",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": Batch.model_json_schema()}}}})
    async def ingest(run_id: str, request: Request) -> dict:
        """One JSON batch (scalars, samples, histograms, tokens); idempotent by batch_id."""
        _require_run(store, known, run_id)
        body = await read_body(request)
        batch = parse_json_batch(body)
        try:
            records = batch_records(batch)
        except RecordError as exc:
            raise ApiError(422, str(exc)) from None
        return await ingest_impl(store, known, run_id, records, batch.batch_id)

    @app.post("/api/runs/{run_id}/tokens")
    async def ingest_tokens(run_id: str, request: Request,
                            batch_id: str = Query(..., description="idempotency key, [A-Za-z0-9._-]{1,64}"),
                            rank: int = Query(0, ge=0, le=MAX_RANK)) -> dict:
        """Per-token rows as an Arrow IPC stream (application/vnd.apache.arrow.stream)."""
        if not BATCH_ID_RE.match(batch_id):
            raise ApiError(422, "batch_id: must match [A-Za-z0-9._-]{1,64}")
        _require_run(store, known, run_id)
        body = await read_body(request)
        return await ingest_impl(store, known, run_id, parse_arrow_tokens(body, rank), batch_id)

    @app.get("/api/runs/{run_id}/scalar_keys")
    def scalar_keys(run_id: str) -> list[str]:
        return reader.scalar_keys(run_id)

    @app.get("/api/runs/{run_id}/scalars")
    def scalars(run_id: str, keys: str | None = Query(None, description="comma-separated keys"),
                downsample: int = Query(1000, ge=1, le=100_000), since_step: int | None = None) -> Response:
        key_list = [k for k in keys.split(",") if k] if keys else None
        return frame_response(reader.read_scalars(run_id, key_list, downsample=downsample, since_step=since_step))

    @app.get("/api/runs/{run_id}/histograms")
    def histograms(run_id: str, key: str = "entropy", downsample: int = Query(1000, ge=1, le=100_000),
                   since_step: int | None = None) -> Response:
        return frame_response(reader.read_histograms(run_id, key, downsample=downsample, since_step=since_step))

    @app.get("/api/runs/{run_id}/token_steps")
    def token_steps(run_id: str) -> list[int]:
        return reader.token_steps(run_id)

    @app.get("/api/runs/{run_id}/tokens")
    def tokens(run_id: str, step: int, sample_id: int | None = None) -> Response:
        return frame_response(reader.read_tokens(run_id, step, sample_id))

    @app.get("/api/runs/{run_id}/samples")
    def samples(run_id: str, step: int | None = None, group_id: int | None = None,
                limit: int = Query(10_000, ge=1, le=100_000)) -> Response:
        return frame_response(reader.read_samples(run_id, step, group_id, limit=limit))

    @app.get("/api/runs/{run_id}/counts")
    def counts(run_id: str) -> dict:
        return reader.row_counts(run_id)

    @app.get("/api/alerts")
    def alerts(run_id: str | None = None, since_step: int | None = None) -> Response:
        return frame_response(reader.read_alerts(run_id, since_step))

    @app.get("/api/runs/{run_id}/export", response_class=FileResponse)
    def export(run_id: str):
        """The run's tables as hive-partitioned Parquet in a zip (works while the collector holds the file)."""
        _require_run(store, known, run_id)
        path = export_impl(store, run_id)
        return FileResponse(path, media_type="application/zip", filename=f"{run_id}-parquet.zip",
                            background=BackgroundTask(shutil.rmtree, os.path.dirname(path), True))
    return app


def _isna(value: Any) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


