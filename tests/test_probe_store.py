"""Value probes reach the store the way other records do: an HttpSink batches them to a real
collector, a LocalSink writes them in-process; GET /api/runs/{id}/probes?step=S pages them as the
tokens route does, /probe_steps lists the probed steps, and a file from before probes opens with
the table added."""
from __future__ import annotations

import json

import duckdb
import httpx
import pytest

from collector_util import InProcessCollector
from forksight.compose.local import LocalSink
from forksight.monitor.collector.store import Store
from forksight.monitor.sinks.http import HttpSink


def _rows(n: int, sample_id: int = 0) -> list[dict]:
    alts = json.dumps([{"token_id": 7, "token": "7", "value": 0.25, "k": 4}])
    return [{"sample_id": sample_id, "pos": p, "token_id": 10 + p, "token": f"t{p}", "fork": p % 2 == 0,
             "entropy": 0.1 * p, "v_before": 0.5, "v_after": 0.5 + 0.01 * p, "delta": 0.01 * p,
             "se": 0.1, "se_before": 0.07, "se_after": 0.07, "k": 16, "pivotal": p == 3,
             "alternatives": alts if p % 2 == 0 else None} for p in range(n)]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with InProcessCollector(tmp_path_factory.mktemp("probes") / "p.duckdb") as collector:
        yield collector


def test_probe_rows_sent_by_an_http_sink_come_back_from_the_probes_route_page_by_page(srv, http):
    sink = HttpSink(srv.url, "probed")
    sink.log_probes(4, _rows(5, sample_id=1) + _rows(3, sample_id=0))
    sink.log_probes(9, _rows(2))
    sink.log_scalars(4, {"probe/fork_precision": 0.5})
    assert sink.finish() == {}
    run = sink.run_id
    assert http.get(f"/api/runs/{run}/probe_steps").json() == [4, 9]
    first = http.get(f"/api/runs/{run}/probes", params={"step": 4, "limit": 5})
    assert first.status_code == 200 and first.headers["X-Total-Count"] == "8"
    rest = http.get(f"/api/runs/{run}/probes",
                    params={"step": 4, "limit": 5, "cursor": first.headers["X-Next-Cursor"]})
    assert "X-Next-Cursor" not in rest.headers
    rows = first.json() + rest.json()
    assert [(r["sample_id"], r["pos"]) for r in rows] == [(0, p) for p in range(3)] + [(1, p) for p in range(5)]
    row = rows[3 + 3]          # sample 1, pos 3: the row as logged, every field by its name
    expected = _rows(5, sample_id=1)[3]
    assert {k: row[k] for k in expected} == pytest.approx(expected)
    assert json.loads(rows[0]["alternatives"]) == [{"token_id": 7, "token": "7", "value": 0.25, "k": 4}]
    assert row["step"] == 4 and row["rank"] == 0
    one = http.get(f"/api/runs/{run}/probes", params={"step": 4, "sample_id": 0}).json()
    assert len(one) == 3
    assert http.get(f"/api/runs/{run}/probes", params={"step": 5}).json() == []
    assert srv.collector.store.reader.row_counts(run)["probes"] == 10


def test_the_probe_routes_refuse_an_unknown_run_and_a_bad_step_with_a_clear_answer(srv, http):
    assert http.get("/api/runs/nope/probes", params={"step": 1}).status_code == 404
    assert http.get("/api/runs/nope/probe_steps").status_code == 404
    sink = HttpSink(srv.url, "bad-step")
    sink.finish()
    resp = http.get(f"/api/runs/{sink.run_id}/probes", params={"step": "x"})
    assert resp.status_code == 422 and "step" in resp.text
    assert http.get(f"/api/runs/{sink.run_id}/probes").status_code == 422     # step is required


def test_a_json_batch_with_a_bad_probe_row_is_refused_whole_naming_the_field(srv, http):
    run = http.post("/api/runs", json={"name": "refused"}).json()["run_id"]
    bad = {"batch_id": "b1", "probes": [{"step": 1, "sample_id": 0, "pos": 0, "k": 0}]}
    resp = http.post(f"/api/runs/{run}/ingest", json=bad)
    assert resp.status_code == 422 and "k" in resp.text
    assert srv.collector.store.reader.row_counts(run)["probes"] == 0


def test_a_local_sink_stores_probes_and_the_reader_reads_them(tmp_path):
    sink = LocalSink(str(tmp_path / "l.duckdb"), "local")
    sink.log_probes(2, _rows(4))
    sink.log_probes(2, [{**_rows(1)[0], "sample_id": 3, "delta": float("nan")}])   # NaN: stored as null
    sink.flush()
    df = sink.reader.read_probes(sink.run_id, 2)
    assert list(df["pos"]) == [0, 1, 2, 3, 0] and df["delta"].isna().tolist() == [False] * 4 + [True]
    assert sink.reader.probe_steps(sink.run_id) == [2]
    sink.finish()


def test_a_file_written_before_probes_existed_opens_with_the_table_added(tmp_path):
    path = str(tmp_path / "old.duckdb")
    Store(path).close()
    with duckdb.connect(path) as conn:            # as an older forksight left it
        conn.execute("DROP TABLE probes")
    with Store(path) as store:
        run = store.create_run("after")
        assert store.reader.probe_steps(run) == [] and store.reader.row_counts(run)["probes"] == 0


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client
