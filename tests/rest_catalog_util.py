"""A small Iceberg REST catalog server for tests: no REST catalog server runs on these machines (no
Docker, no Maven for the Java reference one), so this one serves the part of the Iceberg REST
OpenAPI spec that pyiceberg's `RestCatalog` client uses (config, namespaces, tables, commits) with
real uvicorn on 127.0.0.1, backed by pyiceberg's real `SqlCatalog` on a SQLite file. Bodies are
parsed and answered with pyiceberg's own request/response models, and a commit is
`SqlCatalog.commit_table(table, requirements, updates)`: its requirement checks (optimistic
concurrency) are SqlCatalog's, a failed one a 409 the client raises as CommitFailedException.

    with RestCatalogServer(tmp_path) as rest:
        RestCatalog("x", uri=rest.url)
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from pyiceberg.catalog.rest import Capability, CreateTableRequest, TableResponse
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException, NamespaceAlreadyExistsError, NamespaceNotEmptyError, NoSuchNamespaceError,
    NoSuchTableError, TableAlreadyExistsError,
)
from pyiceberg.table import CommitTableRequest

from collector_util import free_port

SEPARATOR = "\x1f"     # pyiceberg's default namespace separator in a path (sent as %1F)
# the endpoints this server answers, advertised by GET /v1/config (so HEAD exists checks are used)
ENDPOINTS = (Capability.V1_LIST_NAMESPACES, Capability.V1_LOAD_NAMESPACE, Capability.V1_NAMESPACE_EXISTS,
             Capability.V1_CREATE_NAMESPACE, Capability.V1_LIST_TABLES, Capability.V1_LOAD_TABLE,
             Capability.V1_TABLE_EXISTS, Capability.V1_CREATE_TABLE, Capability.V1_UPDATE_TABLE,
             Capability.V1_DELETE_TABLE)
# pyiceberg's exception -> (HTTP status, the spec's error type, as the Java reference server names it)
ERRORS = {NoSuchTableError: (404, "NoSuchTableException"), NoSuchNamespaceError: (404, "NoSuchNamespaceException"),
          TableAlreadyExistsError: (409, "AlreadyExistsException"),
          NamespaceAlreadyExistsError: (409, "AlreadyExistsException"),
          NamespaceNotEmptyError: (409, "NamespaceNotEmptyException"),
          CommitFailedException: (409, "CommitFailedException"), ValidationError: (400, "BadRequestException"),
          ValueError: (400, "BadRequestException")}


def error(code: int, kind: str, message: str) -> JSONResponse:
    """The spec's ErrorModel body, which the client's _handle_non_200_response parses."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=code)


def _json(model) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")     # by alias, like the client


async def _body(request: Request) -> bytes:
    return await request.body()


def make_app(catalog: SqlCatalog, stats: dict) -> FastAPI:
    """The REST routes over `catalog`; stats counts the answers by status code (e.g. the 409s)."""
    app = FastAPI()
    v1 = "/v1"

    @app.middleware("http")
    async def count(request: Request, call_next):
        response = await call_next(request)
        stats[response.status_code] = stats.get(response.status_code, 0) + 1
        return response

    for exc_type, (code, kind) in ERRORS.items():
        app.add_exception_handler(exc_type, lambda _req, exc, code=code, kind=kind: error(code, kind, str(exc)))

    def ns(namespace: str) -> tuple[str, ...]:
        return tuple(namespace.split(SEPARATOR))

    def response(table) -> Response:
        return _json(TableResponse(metadata_location=table.metadata_location, metadata=table.metadata, config={}))

    @app.get(f"{v1}/config")
    def config():
        return {"defaults": {}, "overrides": {}, "endpoints": [str(e) for e in ENDPOINTS]}   # "GET /v1/{prefix}/..."

    @app.get(f"{v1}/namespaces")
    def list_namespaces(parent: str | None = None):
        return {"namespaces": [list(n) for n in catalog.list_namespaces(ns(parent) if parent else ())]}

    @app.post(f"{v1}/namespaces")
    def create_namespace(body: dict):
        catalog.create_namespace(tuple(body["namespace"]), body.get("properties") or {})
        return {"namespace": body["namespace"], "properties": body.get("properties") or {}}

    @app.get(v1 + "/namespaces/{namespace}")
    def load_namespace(namespace: str):
        return {"namespace": list(ns(namespace)), "properties": catalog.load_namespace_properties(ns(namespace))}

    @app.head(v1 + "/namespaces/{namespace}")
    def namespace_exists(namespace: str):
        return Response(status_code=204 if catalog.namespace_exists(ns(namespace)) else 404)

    @app.get(v1 + "/namespaces/{namespace}/tables")
    def list_tables(namespace: str):
        return {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]}
                                for t in catalog.list_tables(ns(namespace))]}

    @app.post(v1 + "/namespaces/{namespace}/tables")
    def create_table(namespace: str, body: bytes = Depends(_body)):
        # the client leaves out its None fields (exclude_none) that its own model declares required
        req = CreateTableRequest.model_validate({"location": None, "partition-spec": None, "write-order": None,
                                                 **json.loads(body)})
        if req.stage_create:
            return error(501, "NotImplementedException", "stage-create is not served by this test server")
        kwargs = {"partition_spec": req.partition_spec} if req.partition_spec else {}
        if req.write_order:
            kwargs["sort_order"] = req.write_order
        return response(catalog.create_table((*ns(namespace), req.name), req.table_schema, location=req.location,
                                             properties=req.properties, **kwargs))

    @app.get(v1 + "/namespaces/{namespace}/tables/{table}")
    def load_table(namespace: str, table: str):
        return response(catalog.load_table((*ns(namespace), table)))

    @app.head(v1 + "/namespaces/{namespace}/tables/{table}")
    def table_exists(namespace: str, table: str):
        return Response(status_code=204 if catalog.table_exists((*ns(namespace), table)) else 404)

    @app.post(v1 + "/namespaces/{namespace}/tables/{table}")
    def commit_table(namespace: str, table: str, body: bytes = Depends(_body)):
        req = CommitTableRequest.model_validate_json(body)
        current = catalog.load_table((*ns(namespace), table))        # 404 when missing (no create by commit)
        return _json(catalog.commit_table(current, req.requirements, req.updates))

    @app.delete(v1 + "/namespaces/{namespace}/tables/{table}")
    def drop_table(namespace: str, table: str, purgeRequested: str = "false"):  # noqa: N803 - the spec's name
        drop = catalog.purge_table if purgeRequested.lower() == "true" else catalog.drop_table
        drop((*ns(namespace), table))
        return Response(status_code=204)

    return app


class RestCatalogServer:
    """The server on a free 127.0.0.1 port over tmp_path/rest-catalog.db, its tables' files under
    `warehouse` (default tmp_path/rest-warehouse: a REST server, not the client, places tables).
    `.url`, `.catalog` (the backing SqlCatalog), `.stats` (answers per status code)."""

    def __init__(self, tmp_path, warehouse: str | Path | None = None):
        tmp_path = Path(tmp_path)
        self.warehouse = Path(warehouse or tmp_path / "rest-warehouse").resolve()
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self.catalog = SqlCatalog("rest-backing", uri=f"sqlite:///{tmp_path / 'rest-catalog.db'}",
                                  warehouse=f"file://{self.warehouse}")
        self.stats: dict[int, int] = {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(make_app(self.catalog, self.stats), host="127.0.0.1",
                                                     port=self.port, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="rest-catalog", daemon=True)

    def __enter__(self) -> "RestCatalogServer":
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the REST catalog server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self.catalog.engine.dispose()
