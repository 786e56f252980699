"""Property-based fuzzing of the collector's HTTP API (issue 13): every OpenAPI operation with
schemathesis' valid and invalid requests, then hypothesis-built JSON batches, Arrow IPC bodies,
query integers and hostile headers, against the real app over a real DuckDB file; last, a short
pass against `forksight serve`. Whatever comes in: never a 5xx nor a crash, every 4xx says why in
`detail`, a refused write stores nothing, an accepted one stores exactly what was sent, and the
collector keeps answering /api/health.

Budget: CI runs a fixed, derandomized set of examples (well under a minute);
FORKSIGHT_FUZZ_SCALE=20 runs 20x as many with fresh seeds (tests/fuzz_util.py)."""
from __future__ import annotations

import functools
import itertools
import json
import socket
import time

import httpx
import pyarrow as pa
import pytest
import requests
import schemathesis
from hypothesis import assume, given
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_headers_conformance, response_schema_conformance, status_code_conformance,
)
from starlette.testclient import TestClient

from collector_util import ServeProcess
from forksight.compose.app import create_app
from forksight.base.limits import MAX_RANK
from forksight.base.tables import DATA_TABLES
from forksight.monitor.collector.ipc import MAX_COLUMNS
from forksight.base.constants import ARROW_MEDIA_TYPE
from forksight.monitor.collector.store import Store
from fuzz_util import (
    TOKEN, budget, data_rows, expected_rows, fingerprint, header_sets, hostile_arrow, invalid_batches, ipc,
    json_body, run_bodies, run_rows, valid_arrow, valid_batches,
)

RESPONSE_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance,
                   response_headers_conformance]
BASE = "http://127.0.0.1:8050"          # the Host the in-process client sends: a loopback name
JSON = {"Content-Type": "application/json"}
ARROW = {"Content-Type": ARROW_MEDIA_TYPE}
WRITES = ("POST", "PUT", "PATCH", "DELETE")
_ids = itertools.count()


@schemathesis.serializer(ARROW_MEDIA_TYPE)
def _arrow_body(ctx, value):
    # the OpenAPI says "binary": schemathesis' bytes go out as they are (Arrow is fuzzed below)
    return value if isinstance(value, bytes) else str(value).encode()


class Target:
    """The collector app (API + guard, as `forksight serve` builds it) over a real file, in process:
    an exception in the app fails the test instead of turning into a 500."""

    def __init__(self, path, token: str | None = None):
        self.store = Store(str(path))
        self.app = create_app(self.store, token=token, dashboard=False)
        self.client = TestClient(self.app, base_url=BASE, raise_server_exceptions=True)
        self.auth = {"Authorization": f"Bearer {token}"} if token else {}

    def new_run(self) -> str:
        return self.store.create_run(f"fz{next(_ids)}")

    def close(self) -> None:
        self.client.close()
        self.store.close()


SEED_BATCH = {"batch_id": "seed", "scalars": [{"step": s, "key": k, "value": 0.5 * s} for s in range(4)
                                              for k in ("entropy/mean", "loss")],
              "samples": [{"step": 1, "sample_id": 0, "group_id": 0, "prompt": "p", "completion": "c"}],
              "histograms": [{"step": 1, "key": "entropy", "counts": [1.0, 2.0], "edges": [0.0, 1.0, 2.0]}],
              "tokens": [{"step": 1, "sample_id": [0, 0], "pos": [0, 1], "entropy": [0.1, 0.2]}]}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The tokenless loopback default, with one run ('seed') that holds rows of every table."""
    target = Target(tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb")
    assert target.client.post("/api/runs", json={"name": "seed"}).json()["run_id"] == "seed"
    assert target.client.post("/api/runs/seed/ingest", json=SEED_BATCH).status_code == 200
    yield target
    assert target.client.get("/api/health").status_code == 200
    target.close()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """The collector with a token (what any non-loopback bind needs)."""
    target = Target(tmp_path_factory.mktemp("fuzz-token") / "fuzz.duckdb", token=TOKEN)
    yield target
    target.close()


def check_answer(resp, what: str = "") -> None:
    """Never a 5xx; a 4xx says why in a non-empty `detail` string."""
    assert resp.status_code < 500, f"{what}: {resp.status_code} {resp.text[:500]}"
    if resp.status_code >= 400:
        detail = resp.json().get("detail")
        assert isinstance(detail, str) and detail.strip(), f"{what}: {resp.status_code} without a detail: {resp.text}"


# ---------------------------------------------------------------------------- every OpenAPI operation
def test_every_reference_in_the_openapi_document_resolves(api):
    # the ingest body's schema once carried pydantic's '#/$defs/...' references, which point at
    # nothing in an OpenAPI document: /docs and schemathesis saw a body of unknown shape
    spec = api.app.openapi()

    def refs(node):
        if isinstance(node, dict):
            yield from ([node["$ref"]] if "$ref" in node else [])
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)
    for ref in set(refs(spec)):
        node = spec
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(node, dict) and part in node, f"{ref} points at nothing"
            node = node[part]
    body = spec["paths"]["/api/runs/{run_id}/ingest"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"]["properties"]["scalars"]["items"]["properties"]["value"]["type"] == "number"


def test_the_openapi_document_declares_the_errors_the_collector_answers(api):
    # it declared only 200 and FastAPI's list-shaped 422, while every error is {"detail": "text"}
    spec = api.app.openapi()
    error = {"$ref": "#/components/schemas/Error"}
    assert spec["components"]["schemas"]["Error"]["properties"]["detail"]["type"] == "string"
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            for status in ("400", "401", "403", "404", "409", "413", "415", "422", "503", "507"):
                if path == "/api/health" and status == "503":
                    continue
                assert op["responses"][status]["content"]["application/json"]["schema"] == error, (method, path, status)
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    schema = schemathesis.openapi.from_dict(spec)
    operation = schema["/api/runs/{run_id}/counts"]["GET"]
    case = operation.Case(path_parameters={"run_id": "nope"})
    resp = api.client.get("/api/runs/nope/counts")
    assert resp.status_code == 404
    case.validate_response(resp, checks=RESPONSE_CHECKS)       # raised: 404 undeclared


def _prepare(case) -> requests.PreparedRequest:
    kwargs = case.as_transport_kwargs(base_url=BASE)
    fields = {k: kwargs[k] for k in ("method", "url", "headers", "params", "json", "data", "files", "cookies")
              if k in kwargs}
    try:
        return requests.Request(**fields).prepare()
    except (TypeError, ValueError, UnicodeError):
        assume(False)        # a request no HTTP client can send (e.g. a dict as a query value)
        raise


def test_every_openapi_operation_answers_without_a_5xx_and_refusals_store_nothing(api):
    schema = schemathesis.openapi.from_dict(api.app.openapi())
    operations = {(op.method.upper(), op.path) for op in (r.ok() for r in schema.get_all_operations())}
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    cases = st.one_of(*[schema.as_strategy(mode, **fixed) for mode in modes
                        for fixed in ({}, {"path_parameters": {"run_id": "seed"}})])
    seen: set = set()

    @budget(400)
    @given(cases)
    def fuzz(case):
        request = _prepare(case)
        before = fingerprint(api.store)
        resp = api.client.request(request.method, request.url, headers=dict(request.headers), content=request.body)
        what = f"{request.method} {request.url} {(request.body or b'')[:300]!r}"
        check_answer(resp, what)
        # every answer is one the document declares, in the shape it declares ({"detail": text}
        # for errors): generated clients parse what they were told to expect
        case.validate_response(resp, checks=RESPONSE_CHECKS)
        seen.add((case.operation.method.upper(), case.operation.path))
        after = fingerprint(api.store)
        if request.method not in WRITES or resp.status_code >= 300:
            assert after == before, f"{what} -> {resp.status_code} changed the store"
        elif case.operation.path.endswith("/ingest"):
            answer = resp.json()
            sent = {} if answer["duplicate"] else expected_rows(json.loads(request.body))
            assert answer["rows"] == sent
            data = len(DATA_TABLES)          # the fingerprint counts the data tables first
            assert sum(after[:data]) - sum(before[:data]) == sum(sent.values()), f"{what} stored other rows than sent"

    fuzz()
    assert seen == operations, f"operations never fuzzed: {sorted(operations - seen)}"


# ---------------------------------------------------------------------------- JSON batches
def _post_json(api, run: str, body: bytes):
    return api.client.post(f"/api/runs/{run}/ingest", content=body, headers=JSON)


@budget(60)
@given(batch=valid_batches)
def test_a_valid_json_batch_is_stored_exactly_once(api, batch):
    run = api.new_run()
    resp = _post_json(api, run, json_body(batch))
    check_answer(resp, repr(json_body(batch)[:300]))
    assert resp.status_code == 200, resp.text
    assert data_rows(api.store, run) == expected_rows(batch) == resp.json()["rows"]
    stored = api.store.call(lambda cur: cur.execute(
        "SELECT step, key, value FROM scalars WHERE run_id = ? ORDER BY ALL", [run]).fetchall())
    assert stored == sorted((r["step"], r["key"], r["value"]) for r in batch.get("scalars", []))
    again = _post_json(api, run, json_body(batch))                 # a retry: acknowledged, not stored twice
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert data_rows(api.store, run) == expected_rows(batch)


@budget(150)
@given(batch=invalid_batches())
def test_a_batch_with_one_invalid_field_is_refused_whole(api, batch):
    run = api.new_run()
    before = fingerprint(api.store)
    resp = _post_json(api, run, json_body(batch))
    check_answer(resp, repr(json_body(batch)[:300]))
    assert 400 <= resp.status_code < 500, f"accepted: {json_body(batch)[:300]!r}"
    assert run_rows(api.store, run) == {} and fingerprint(api.store) == before


# ---------------------------------------------------------------------------- runs
RUN_FIELDS = ("name", "project", "strategy", "model", "config", "status")


def _run_fields(api, run: str) -> dict:
    resp = api.client.get(f"/api/runs/{run}")
    check_answer(resp, f"GET /api/runs/{run}")
    assert resp.status_code == 200
    return {k: resp.json()[k] for k in RUN_FIELDS}


def test_a_run_without_a_config_reads_back_while_another_run_has_one(api):
    # found by the fuzzer: pandas reads a missing config as NaN once any run has one, and
    # GET /api/runs/{id} of every run without a config was a 500 (json.loads(nan))
    plain = api.new_run()
    configured = api.client.post("/api/runs", json={"name": "configured", "config": {"lr": 0.1}}).json()["run_id"]
    assert _run_fields(api, plain)["config"] is None
    assert _run_fields(api, configured)["config"] == {"lr": 0.1}


@pytest.mark.parametrize("config, problem", [
    ({"note": "\ud800"}, "valid Unicode"),
    ({"deep": functools.reduce(lambda inner, _: [inner], range(200), 0)}, "nests 201 levels"),
])
def test_a_config_stored_before_the_write_rule_is_served_as_its_text(api, config, problem):
    # files written before the config rule can hold a config the API cannot send back as JSON:
    # the run still reads (no 500), the config comes back as the stored text with the reason
    run = api.store.create_run(f"old{next(_ids)}", config=config)     # the store itself, no rule
    fields = api.client.get(f"/api/runs/{run}")
    check_answer(fields, "old config")
    assert fields.status_code == 200
    body = fields.json()
    assert body["config"] is None and problem in body["config_error"]
    assert json.loads(body["config_text"]) == config
    # and the write rule refuses the same config through the API
    refused = api.client.post("/api/runs", content=json_body({"name": "again2", "config": config}), headers=JSON)
    assert refused.status_code == 422 and problem in refused.text


@budget(60)
@given(create=run_bodies(patch=False), update=run_bodies(patch=True))
def test_a_run_body_is_refused_whole_or_stored_exactly(api, create, update):
    # a config GET could not serve back (a lone surrogate, 200 levels) was stored: then a 500 on every read
    body, valid = create
    before = fingerprint(api.store)
    resp = api.client.post("/api/runs", content=json_body(body), headers=JSON)
    check_answer(resp, repr(body)[:500])
    if valid:
        assert resp.status_code == 201, resp.text
        run = resp.json()["run_id"]
        sent = {"project": "default", "strategy": None, "model": None, "config": None, **body, "status": "live"}
        assert _run_fields(api, run) == sent
    else:
        assert 400 <= resp.status_code < 500 and fingerprint(api.store) == before, f"accepted {body}"
        run = api.new_run()
    body, valid = update
    stored, before = _run_fields(api, run), fingerprint(api.store)
    resp = api.client.patch(f"/api/runs/{run}", content=json_body(body), headers=JSON)
    check_answer(resp, repr(body)[:500])
    if valid:
        assert resp.status_code == 200, resp.text
        assert _run_fields(api, run) == {**stored, **{k: v for k, v in body.items() if v is not None}}
    else:
        assert 400 <= resp.status_code < 500 and fingerprint(api.store) == before, f"accepted {body}"
        assert _run_fields(api, run) == stored


# ---------------------------------------------------------------------------- Arrow bodies
def _post_arrow(api, run: str, body: bytes, rank: int | str = 0, batch_id: str | None = None):
    params = {"batch_id": batch_id or f"a{next(_ids)}", "rank": rank}
    return api.client.post(f"/api/runs/{run}/tokens", content=body, params=params, headers=ARROW)


def _token_keys(store, run: str) -> list[tuple]:
    return store.call(lambda cur: cur.execute(
        "SELECT step, sample_id, pos FROM tokens WHERE run_id = ? ORDER BY ALL", [run]).fetchall())


@budget(50)
@given(sent=valid_arrow(), rank=st.integers(0, MAX_RANK))
def test_a_valid_arrow_body_is_stored_exactly(api, sent, rank):
    table, body = sent
    run = api.new_run()
    resp = _post_arrow(api, run, body, rank)
    check_answer(resp, repr(body[:300]))
    assert resp.status_code == 200, resp.text
    assert data_rows(api.store, run) == ({"tokens": table.num_rows} if table.num_rows else {})
    keys = zip(*(table[c].to_pylist() for c in ("step", "sample_id", "pos")))
    assert _token_keys(api.store, run) == sorted(keys)


@budget(300)
@given(sent=hostile_arrow(), rank=st.one_of(st.integers(0, 3), st.sampled_from([-1, MAX_RANK + 1, 2**64, "x"])))
def test_a_hostile_arrow_body_is_refused_whole_or_stored_whole(api, sent, rank):
    table, body = sent
    run = api.new_run()
    before = fingerprint(api.store)
    resp = _post_arrow(api, run, body, rank)
    check_answer(resp, repr(body[:300]))
    if resp.status_code >= 400:
        assert run_rows(api.store, run) == {} and fingerprint(api.store) == before
        return
    stored = data_rows(api.store, run)
    assert stored == resp.json()["rows"]
    if table is not None:                           # undamaged: exactly the table's rows
        assert stored == ({"tokens": table.num_rows} if table.num_rows else {})


def _damaged_text() -> bytes:
    body = ipc(pa.table({"step": pa.array([1], pa.int64()), "sample_id": [0], "pos": [0], "token": ["QQQQ"]}))
    at = body.index(b"QQQQ")
    return body[:at] + b"\xff\xfe" + body[at + 2:]


def _name_not_utf8() -> bytes:
    body = ipc(pa.table({"step": pa.array([1], pa.int64()), "sample_id": [0], "QQ": [0]}))
    at = body.index(b"QQ")
    return body[:at] + b"\xa3\x80" + body[at + 2:]


def _dictionary_past_its_end() -> bytes:
    token = pa.DictionaryArray.from_arrays(pa.array([5], pa.int32()), pa.array(["a"]), safe=False)
    return ipc(pa.table({"step": pa.array([1], pa.int64()), "sample_id": [0], "pos": [0], "token": token}))


@pytest.mark.parametrize("body", [_damaged_text(), _name_not_utf8(), _dictionary_past_its_end()],
                         ids=["text", "column-name", "dictionary"])
def test_an_arrow_body_with_damaged_buffers_is_a_400_and_stores_nothing(api, body):
    # found by the fuzzer: invalid UTF-8 text failed DuckDB's insert (500, "send it again": a sink
    # would retry forever); a column name not UTF-8 and a dictionary index past its end raised
    run = api.new_run()
    resp = _post_arrow(api, run, body)
    assert resp.status_code == 400 and "not a valid Arrow IPC stream" in resp.json()["detail"], resp.text
    assert run_rows(api.store, run) == {}


def _schema_only(names: list[str]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, pa.schema([(n, pa.int8()) for n in names])):
        pass
    return sink.getvalue().to_pybytes()


@budget(25)
@given(columns=st.one_of(st.integers(MAX_COLUMNS + 1, 3_000), st.sampled_from([MAX_COLUMNS + 1, 20_000, 60_000])),
       repeat=st.integers(1, 4))
def test_a_wide_arrow_schema_is_a_short_422_and_stores_nothing(api, columns, repeat):
    # 60k columns once held a worker past 20 s (a quadratic duplicate check) and 20k answered 200 kB
    names = [f"col{i // repeat}" for i in range(columns)]
    run = api.new_run()
    before = fingerprint(api.store)
    resp = _post_arrow(api, run, _schema_only(names))
    check_answer(resp, f"{columns} columns")
    assert resp.status_code == 422 and len(resp.json()["detail"]) < 300, resp.text[:500]
    assert fingerprint(api.store) == before


# ---------------------------------------------------------------------------- query integers
INT64 = 2**63
# (route, parameter, smallest, largest accepted); other parameters of the route left out
QUERY_INTS = [
    ("/api/runs/seed/scalars", "since_step", -INT64, INT64 - 1), ("/api/runs/seed/scalars", "downsample", 1, 100_000),
    ("/api/runs/seed/histograms", "since_step", -INT64, INT64 - 1),
    ("/api/runs/seed/histograms", "downsample", 1, 100_000),
    ("/api/runs/seed/tokens", "sample_id", -INT64, INT64 - 1), ("/api/runs/seed/tokens", "step", -INT64, INT64 - 1),
    ("/api/runs/seed/samples", "step", -INT64, INT64 - 1), ("/api/runs/seed/samples", "group_id", -INT64, INT64 - 1),
    ("/api/runs/seed/samples", "limit", 1, 100_000), ("/api/alerts", "since_step", -INT64, INT64 - 1),
]
huge_ints = st.one_of(st.integers(-(2**70), 2**70),
                      st.sampled_from([INT64 - 1, INT64, -INT64, -INT64 - 1, 2**127, -(2**127), 10**40, 0, -1]))


@budget(80)
@given(where=st.sampled_from(QUERY_INTS),
       value=st.one_of(huge_ints, st.sampled_from(["", "1.5", "1e3", "nan", "0x10"])))
def test_query_integers_outside_their_range_are_a_422_never_a_500(api, where, value):
    path, name, low, high = where
    before = fingerprint(api.store)
    fixed = {"step": 1} if path.endswith("/tokens") else {}       # the route's required parameter
    resp = api.client.get(path, params={**fixed, name: str(value)})
    check_answer(resp, f"{path} {name}={value}")
    ok = isinstance(value, int) and low <= value <= high
    assert resp.status_code == (200 if ok else 422), resp.text
    if not ok:
        assert name in resp.json()["detail"]
    assert fingerprint(api.store) == before


# ---------------------------------------------------------------------------- headers
def _expected_refusal(target_has_token: bool, case: dict, method: str) -> int | None:
    """The status the guard must answer for these headers (None: it may let them through)."""
    headers = case["headers"]
    if target_has_token:
        if not case["authorized"]:
            return 401
    elif case["host_ok"] is False or (case["host_ok"] and case["origin_ok"] is False):
        return 403
    elif case["host_ok"] is None or case["origin_ok"] is None:
        return None                                 # random Host or Origin: any 4xx, or through
    if method in WRITES:
        given_type = headers.get("content-type")
        if given_type is None:
            return 400
        if given_type.split(";")[0].strip().lower() != "application/json":
            return 415
    return None


@pytest.mark.parametrize("with_token", [False, True], ids=["tokenless", "token"])
def test_hostile_headers_are_refused_with_the_right_4xx_and_store_nothing(api, guarded, with_token):
    target = guarded if with_token else api
    run = target.new_run()

    @budget(150)
    @given(case=header_sets(), request=st.sampled_from(["ingest", "patch", "read", "health"]))
    def fuzz(case, request):
        batch = {"batch_id": f"h{next(_ids)}", "scalars": [{"step": 1, "key": "k", "value": 1.0}]}
        method, path, body = {"ingest": ("POST", f"/api/runs/{run}/ingest", json.dumps(batch).encode()),
                              "patch": ("PATCH", f"/api/runs/{run}", b'{"model": "m"}'),
                              "read": ("GET", f"/api/runs/{run}/counts", None),
                              "health": ("GET", "/api/health", None)}[request]
        headers = {k: v.encode("latin-1") for k, v in case["headers"].items()}
        before = run_rows(target.store, run)
        resp = target.client.request(method, path, content=body, headers=headers)
        check_answer(resp, f"{method} {path} {case['headers']}")
        expected = _expected_refusal(with_token, case, method)
        if expected is not None:
            assert resp.status_code == expected, f"{case['headers']}: {resp.status_code} {resp.text}"
        elif with_token:
            assert resp.status_code != 401
        after = run_rows(target.store, run)
        if request == "ingest" and resp.status_code == 200:
            assert after["scalars"] == before.get("scalars", 0) + 1
        else:
            assert after == before

    fuzz()
    assert target.client.get("/api/health", headers=target.auth).status_code == 200


# ---------------------------------------------------------------------------- a real server
@pytest.mark.parametrize("path", ["/api/runs/seed/ingest", "/api/runs/seed/tokens?batch_id=gone"])
def test_a_client_gone_mid_body_gets_a_4xx_and_nothing_is_stored(api, path):
    # was an uncaught ClientDisconnect: a traceback in the server log and a 500 for a broken chunk
    import anyio

    route, _, query = path.partition("?")
    kind = ARROW_MEDIA_TYPE if route.endswith("/tokens") else "application/json"
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": route,
             "raw_path": route.encode(), "query_string": query.encode(), "root_path": "",
             "server": ("127.0.0.1", 8050), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"127.0.0.1:8050"), (b"content-type", kind.encode()), (b"content-length", b"1000")]}
    parts = [{"type": "http.request", "body": b'{"batch_id": "gone", "scalars": [', "more_body": True},
             {"type": "http.disconnect"}]
    sent: list = []

    async def receive():
        return parts.pop(0) if parts else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    before = fingerprint(api.store)
    anyio.run(api.app, scope, receive, send)
    assert sent[0]["status"] == 400
    assert "did not arrive whole" in json.loads(sent[1]["body"])["detail"]
    assert fingerprint(api.store) == before


_RAW = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: abc\r\n\r\n", b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        b"application/json\r\nContent-Length: 100\r\n\r\n{\"name\"",
        b"GET /api/health HTTP/1.1\r\nHost: \xff\xfe\r\n\r\n",
        b"POST /api/runs/seed/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /api/runs/seed/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{\"batch_id\": \"cut\", \"scalars\": [",
        b"POST /api/runs/seed/tokens?batch_id=cut HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
        b"application/vnd.apache.arrow.stream\r\nContent-Length: 1000\r\n\r\n\xff\xff\xff\xff"]


def _raw(port: int, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass


def test_a_real_server_survives_a_short_fuzz_pass(tmp_path, api):
    schema = schemathesis.openapi.from_dict(api.app.openapi())
    cases = st.one_of(*[schema.as_strategy(mode, path_parameters={"run_id": "seed"})
                        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)])
    with ServeProcess(tmp_path / "real.duckdb") as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        assert http.post("/api/runs", json={"name": "seed"}).status_code == 201
        assert http.post("/api/runs/seed/ingest", json=SEED_BATCH).status_code == 200

        @budget(60)
        @given(case=cases, arrow=hostile_arrow())
        def fuzz(case, arrow):
            request = _prepare(case)
            url = request.url.replace(BASE, srv.url, 1)
            before = http.get("/api/runs/seed/counts").json()
            resp = http.request(request.method, url, headers=dict(request.headers), content=request.body)
            check_answer(resp, f"{request.method} {url} {(request.body or b'')[:300]!r}")
            tokens = http.post("/api/runs/seed/tokens", content=arrow[1], headers=ARROW,
                               params={"batch_id": f"r{next(_ids)}"})
            check_answer(tokens, f"Arrow body {arrow[1][:400]!r}")
            if resp.status_code >= 300 and tokens.status_code >= 300:
                assert http.get("/api/runs/seed/counts").json() == before

        fuzz()
        for data in _RAW:                  # not HTTP, or broken HTTP, on the socket itself
            # the allowlisted Host (with the bound port): the broken part is what gets exercised
            _raw(srv.port, data.replace(b"Host: 127.0.0.1\r\n", f"Host: 127.0.0.1:{srv.port}\r\n".encode()))
        assert srv.proc.poll() is None, srv.log()[-2000:]
        assert http.get("/api/health").status_code == 200
        valid = ipc(pa.table({"step": pa.array([9], pa.int64()), "sample_id": [0], "pos": [0]}))
        assert http.post("/api/runs/seed/tokens", content=valid, headers=ARROW,
                         params={"batch_id": "after"}).json()["rows"] == {"tokens": 1}
    assert "Traceback" not in srv.log(), srv.log()[-3000:]


# ---------------------------------------------------------------------------- slow bodies
def _send_slowly(port: int, path: str, kind: str, body: bytes, cuts: list[int], pause: float) -> int:
    """POST `body` in pieces cut at `cuts`, pausing between them (a slow client); the status."""
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        at = 0
        for cut in sorted(set(cuts)) + [len(body)]:
            sock.sendall(body[at:cut])
            at = cut
            time.sleep(pause)                      # the client is slow: that is the case fuzzed
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


@pytest.fixture(scope="module")
def dash_srv(tmp_path_factory):
    from collector_util import InProcessCollector

    with InProcessCollector(tmp_path_factory.mktemp("slow") / "slow.duckdb", dashboard=True) as srv:
        httpx.post(srv.url + "/api/runs", json={"name": "slow"})
        yield srv


@budget(12)
@given(route=st.sampled_from(["dash", "ingest"]), valid=st.booleans(),
       cuts=st.lists(st.integers(0, 400), max_size=6), pause=st.sampled_from([0.0, 0.01, 0.05]), slow=st.integers(1, 12))
def test_slow_bodies_get_the_answer_a_whole_body_gets_while_pages_keep_answering(dash_srv, route, valid, cuts,
                                                                                  pause, slow):
    import threading

    srv = dash_srv
    if route == "dash":
        deps = httpx.get(srv.url + "/_dash-dependencies").json()
        table = next(d for d in deps if d["output"] == "runs-table.data")
        call = {"output": "runs-table.data", "outputs": {"id": "runs-table", "property": "data"},
                "inputs": [{"id": i["id"], "property": i["property"], "value": 1} for i in table["inputs"]],
                "changedPropIds": [], "state": []}
        path, body = "/_dash-update-component", json.dumps(call if valid else {**call, "output": "nope"}).encode()
    else:
        batch = {"batch_id": f"s{next(_ids)}", "scalars": [{"step": 1, "key": "k", "value": 1.0}]}
        path, body = "/api/runs/slow/ingest", json.dumps(batch if valid else {**batch, "scalars": "x"}).encode()
    whole = httpx.post(srv.url + path, content=body, headers=JSON)
    if route == "ingest" and valid:          # the same batch id again: a duplicate, still a 200
        assert whole.status_code == 200
    statuses: list = []
    clients = [threading.Thread(target=lambda: statuses.append(
        _send_slowly(srv.port, path, "application/json", body, [c % max(1, len(body)) for c in cuts], pause)))
        for _ in range(slow)]
    for t in clients:
        t.start()
    page = httpx.get(srv.url + "/", timeout=60)           # the dashboard answers meanwhile
    for t in clients:
        t.join(120)
    assert page.status_code == 200
    assert statuses == [whole.status_code] * slow, (statuses, whole.status_code, whole.text[:200])
