"""Arrow bodies are judged by their schema first: more than MAX_COLUMNS columns is a 422 read from
the schema message before the rest of the body arrives (a 60k-column body once held a worker for
20 s and more); repeated columns are found in one pass and named in a short message."""
from __future__ import annotations

import socket

import httpx
import pyarrow as pa
import pytest

from collector_util import InProcessCollector
from forksight.base.constants import ARROW_MEDIA_TYPE
from forksight.monitor.collector.ipc import MAX_COLUMNS, duplicate_problem


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def wide(columns: int, rows: int = 1) -> bytes:
    base = {"step": pa.array([1] * rows, pa.int64()), "sample_id": pa.array([0] * rows, pa.int64()),
            "pos": pa.array([0] * rows, pa.int32())}
    extra = {f"c{i}": pa.array([0] * rows, pa.int8()) for i in range(columns - len(base))}
    return ipc(pa.table({**base, **extra}))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with InProcessCollector(tmp_path_factory.mktemp("schema") / "s.duckdb") as srv:
        yield srv


def _post(srv, body: bytes, run: str = "wide"):
    return httpx.post(f"{srv.url}/api/runs/{run}/tokens", params={"batch_id": f"b{len(body)}"}, content=body,
                      headers={"Content-Type": ARROW_MEDIA_TYPE}, timeout=60)


def test_a_schema_wider_than_the_cap_is_a_short_422_and_stores_nothing(srv):
    srv.collector.store.create_run("wide", run_id="wide")
    for columns in (MAX_COLUMNS + 1, 5_000):
        resp = _post(srv, wide(columns))
        assert resp.status_code == 422, resp.text
        detail = resp.json()["detail"]
        assert len(detail) < 300 and str(MAX_COLUMNS) in detail and "c17" not in detail, detail
    assert srv.collector.store.reader.row_counts("wide")["tokens"] == 0


def test_a_60k_column_schema_is_refused_before_the_rest_of_the_body_is_sent(srv):
    srv.collector.store.create_run("wide2", run_id="wide2")
    body = wide(60_000)
    head = (f"POST /api/runs/wide2/tokens?batch_id=w HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
            f"Content-Type: {ARROW_MEDIA_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(head + body[:4096])        # the schema's size is in its first 8 bytes; the rest never comes
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < int(
                answer.lower().partition(b"content-length: ")[2].split(b"\r\n")[0] or 0):
            answer += sock.recv(65536)
        answer = answer.decode("latin-1")
    assert answer.startswith("HTTP/1.1 422"), answer[:300]
    assert "schema message is" in answer and len(answer) < 1000


def test_repeated_columns_are_found_in_one_pass_and_named_briefly(srv):
    srv.collector.store.create_run("dup", run_id="dup")
    table = pa.table([pa.array([1], pa.int64()), pa.array([0], pa.int64()), pa.array([0], pa.int32()),
                      pa.array([0.5]), pa.array([0.5])], names=["step", "sample_id", "pos", "entropy", "entropy"])
    resp = _post(srv, ipc(table), run="dup")
    assert resp.status_code == 422 and "['entropy']" in resp.json()["detail"] and "once" in resp.json()["detail"]
    names = [f"n{i % 50_000}" for i in range(200_000)]          # 50k names, each 4 times
    problem = duplicate_problem(names)
    assert problem is not None and "and 49995 more" in problem and len(problem) < 200
    assert duplicate_problem([f"n{i}" for i in range(100_000)]) is None
