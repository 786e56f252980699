"""The collector over real HTTP: a `forksight serve` subprocess on 127.0.0.1 and a DuckDB file."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
import zipfile

import duckdb
import httpx
import numpy as np
import pyarrow as pa
import pytest

from collector_util import REPO, InProcessCollector, ServeProcess, create_run, free_port
from forksight.monitor.sinks.client import open_sink
from forksight.base.limits import MAX_BODY_BYTES, MAX_SCALAR_ROWS
from forksight.base.constants import ARROW_MEDIA_TYPE

HOSTILE = ["<script>alert('x')</script>", "'); DROP TABLE scalars; --", "\" OR 1=1 --", "&lt;b&gt;", "é✓\u0000z"]


@pytest.fixture(autouse=True)
def _own_spool(tmp_path, monkeypatch):
    """Each test's sinks spool under its own tmp dir (./.forksight is relative to the cwd)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("srv") / "a.duckdb") as server:
        yield server



def _run(http, name="r") -> str:
    return create_run(http, name, config={"vocab_size": 311})


def _arrow(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _counts(http, run):
    return http.get(f"/api/runs/{run}/counts").json()


def test_health_openapi_and_docs_answer(http):
    health = http.get("/api/health").json()
    assert health["service"] == "forksight" and health["limits"]["max_body_bytes"] == MAX_BODY_BYTES
    spec = http.get("/openapi.json").json()
    assert "/api/runs/{run_id}/ingest" in spec["paths"] and "/api/health" in spec["paths"]
    assert "swagger" in http.get("/docs").text.lower()


def test_http_sink_round_trips_every_record_kind_exactly(srv, http):
    rng = np.random.default_rng(3)
    n = 40
    cols = {"sample_id": np.repeat([0, 1], n // 2), "pos": np.tile(np.arange(n // 2), 2),
            "token_id": rng.integers(0, 311, n), "token": [HOSTILE[i % len(HOSTILE)] for i in range(n)],
            "entropy": rng.random(n).astype(np.float32), "renyi2": rng.random(n).astype(np.float32),
            "js": rng.random(n).astype(np.float32), "logp": -rng.random(n).astype(np.float32),
            "top1": rng.random(n).astype(np.float32), "fork": rng.random(n) > 0.5,
            "selected": rng.random(n) > 0.3}
    samples = [{"sample_id": i, "group_id": 7, "prompt": HOSTILE[i], "completion": HOSTILE[-1 - i],
                "reward": 0.25 * i, "correct": bool(i % 2), "length": 3 + i, "source": "sampled"} for i in range(3)]
    counts, edges = rng.integers(0, 9, 5).astype(float), np.linspace(0, 1, 6)
    sink = open_sink("round", url=srv.url, strategy="ict", model="tiny", config={"vocab_size": 311})
    sink.log_scalars(2, {"entropy/mean": 0.123456789012345, "kl": 1e-9}, weight=40)
    sink.log_tokens(2, cols)
    sink.log_samples(2, samples)
    sink.log_histogram(2, "entropy", counts, edges)
    assert sink.flush(20)
    sink.finish()
    run = sink.run_id
    assert sink.rejected == [] and sink.sent_rows == 2 + n + 3 + 1
    scal = http.get(f"/api/runs/{run}/scalars").json()
    assert {r["key"]: r["value"] for r in scal} == {"entropy/mean": 0.123456789012345, "kl": 1e-9}
    tok = http.get(f"/api/runs/{run}/tokens", params={"step": 2}).json()
    for name, values in cols.items():
        got = [row[name] for row in tok]
        if isinstance(values, np.ndarray) and values.dtype.kind == "f":
            np.testing.assert_array_equal(np.asarray(got, np.float32), values)
        else:
            assert got == list(values)                       # HTML/SQL text back verbatim
    got_samples = http.get(f"/api/runs/{run}/samples", params={"step": 2}).json()
    assert [{k: s[k] for k in samples[0]} for s in got_samples] == samples
    hist = http.get(f"/api/runs/{run}/histograms", params={"key": "entropy"}).json()
    assert [h["count"] for h in hist] == counts.tolist() and [h["bin_hi"] for h in hist] == edges[1:].tolist()
    info = http.get(f"/api/runs/{run}").json()
    assert (info["status"], info["strategy"], info["last_step"]) == ("finished", "ict", 2)
    assert http.get(f"/api/runs/{run}/token_steps").json() == [2]


def test_json_token_blocks_and_idempotent_resend(http):
    run = _run(http, "idem")
    batch = {"batch_id": "b-1", "rank": 0,
             "scalars": [{"step": 1, "key": "entropy/mean", "value": 1.5}],
             "tokens": [{"step": 1, "sample_id": [0, 0, 0], "pos": [0, 1, 2], "token": HOSTILE[:3],
                         "entropy": [0.5, 0.25, 0.125]}]}
    first = http.post(f"/api/runs/{run}/ingest", json=batch).json()
    again = http.post(f"/api/runs/{run}/ingest", json=batch).json()
    assert (first["stored"], again["stored"], again["duplicate"]) == (True, False, True)
    table = pa.table({"step": [1, 1], "sample_id": [1, 1], "pos": [0, 1], "entropy": pa.array([1.0, 2.0], pa.float32())})
    for expect in (True, False):
        resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": "t-1"}, content=_arrow(table),
                         headers={"Content-Type": ARROW_MEDIA_TYPE})
        assert resp.json()["stored"] is expect
    assert _counts(http, run) == {"scalars": 1, "tokens": 5, "samples": 0, "histograms": 0, "probes": 0, "reference": 0, "alerts": 0}
    tok = http.get(f"/api/runs/{run}/tokens", params={"step": 1, "sample_id": 0}).json()
    assert [t["token"] for t in tok] == HOSTILE[:3] and [t["entropy"] for t in tok] == [0.5, 0.25, 0.125]


def _good_batch(**over):
    batch = {"batch_id": uuid.uuid4().hex, "scalars": [{"step": 1, "key": "ok", "value": 1.0}],
             "histograms": [{"step": 1, "key": "entropy", "counts": [1, 2], "edges": [0, 1, 2]}]}
    batch.update(over)
    return batch


BAD_JSON = [
    # (body, status, words the message must contain)
    (b'{"batch_id": "x", "scalars": [', 400, "not valid JSON"),
    (b'[1, 2, 3]', 422, "should be an object"),
    (json.dumps(_good_batch(scalars=[{"step": 1, "key": "a", "value": "1.5"}])).encode(), 422, "scalars[0].value"),
    (json.dumps(_good_batch(scalars=[{"step": "one", "key": "a", "value": 1.0}])).encode(), 422, "scalars[0].step"),
    (b'{"batch_id": "n1", "scalars": [{"step": 1, "key": "a", "value": NaN}]}', 422, "finite"),
    (b'{"batch_id": "n2", "scalars": [{"step": 1, "key": "a", "value": 1.0}], '
     b'"histograms": [{"step": 1, "key": "h", "counts": [Infinity], "edges": [0, 1]}]}', 422, "histograms[0].counts[0]"),
    (json.dumps(_good_batch(scalars=[{"step": 1, "key": "k" * 201, "value": 1.0}])).encode(), 422, "at most 200"),
    (json.dumps(_good_batch(samples=[{"step": 1, "sample_id": 0, "completion": "c" * 70_000}])).encode(), 422,
     "samples[0].completion"),
    (json.dumps(_good_batch(histograms=[{"step": 1, "key": "h", "counts": [1, 2], "edges": [0, 1]}])).encode(), 422,
     "len(counts)+1"),
    (json.dumps(_good_batch(tokens=[{"step": 1, "sample_id": [0, 0], "pos": [0]}])).encode(), 422, "equal length"),
    (json.dumps(_good_batch(batch_id="../../etc")).encode(), 422, "batch_id"),
    (json.dumps(_good_batch(extra_field=1)).encode(), 422, "extra_field"),
    (json.dumps(_good_batch(scalars=[{"step": 1, "key": "k", "value": 1.0}] * (MAX_SCALAR_ROWS + 1))).encode(), 422,
     "at most 100000"),
]


@pytest.mark.parametrize("body, status, words", BAD_JSON, ids=[w for *_, w in BAD_JSON])
def test_bad_json_batches_get_a_clear_4xx_and_store_nothing(http, body, status, words):
    run = _run(http, "bad")
    resp = http.post(f"/api/runs/{run}/ingest", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    assert words in resp.json()["detail"]
    assert _counts(http, run) == {"scalars": 0, "tokens": 0, "samples": 0, "histograms": 0, "probes": 0, "reference": 0, "alerts": 0}
    assert http.get("/api/health").status_code == 200


BAD_ARROW = [
    (pa.table({"step": [1], "sample_id": [0], "pos": [0], "entropy": [float("nan")]}), "tokens.entropy"),
    (pa.table({"step": [1], "sample_id": [0], "pos": [0], "logp": [float("-inf")]}), "tokens.logp"),
    (pa.table({"step": [1], "sample_id": [0], "pos": [0], "evil": [1]}), "unknown column"),
    (pa.table({"step": [1], "sample_id": [0]}), "missing required"),
    (pa.table({"step": [1], "sample_id": [-1], "pos": [0]}), "tokens.sample_id"),
    (pa.table({"step": [1], "sample_id": [0], "pos": ["x"]}), "tokens.pos"),
    (pa.table({"step": [1], "sample_id": [0], "pos": [0], "token": ["t" * 2000]}), "tokens.token"),
]


@pytest.mark.parametrize("table, words", BAD_ARROW, ids=[w for _, w in BAD_ARROW])
def test_bad_arrow_token_batches_get_422_and_store_nothing(http, table, words):
    run = _run(http, "badarrow")
    resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": "a"}, content=_arrow(table),
                     headers={"Content-Type": ARROW_MEDIA_TYPE})
    assert resp.status_code == 422 and words in resp.json()["detail"], resp.text
    assert _counts(http, run)["tokens"] == 0


def test_not_arrow_unknown_run_oversize_and_run_names(http):
    run = _run(http, "misc")
    resp = http.post(f"/api/runs/{run}/tokens", params={"batch_id": "a"}, content=b"<html>not arrow</html>")
    assert resp.status_code == 400 and "Arrow IPC" in resp.json()["detail"]
    for path in ("/api/runs/ghost/ingest", "/api/runs/ghost/heartbeat"):
        resp = http.post(path, json=_good_batch())
        assert resp.status_code == 404 and "creates its run first with POST /api/runs" in resp.json()["detail"]
    resp = http.post(f"/api/runs/{run}/ingest", content=b"x" * (MAX_BODY_BYTES + 1),
                     headers={"Content-Type": "application/json"})
    assert resp.status_code == 413 and "limit" in resp.json()["detail"]

    def chunks():                                   # no Content-Length: counted while streaming
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 1):
            yield b" " * (1 << 20)
    resp = http.post(f"/api/runs/{run}/ingest", content=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status_code == 413
    resp = http.post("/api/runs", json={"name": "'); DROP TABLE runs; --"})
    assert resp.status_code == 422 and "name" in resp.json()["detail"]
    assert http.get("/api/health").status_code == 200
    assert _counts(http, run)["scalars"] == 0


def test_sql_looking_keys_are_data(http):
    run = _run(http, "sqlish")
    keys = ["x'); DELETE FROM scalars; --", "a\" OR \"1\"=\"1", "<img src=x onerror=alert(1)>"]
    batch = {"batch_id": "s1", "scalars": [{"step": 0, "key": k, "value": float(i)} for i, k in enumerate(keys)]}
    assert http.post(f"/api/runs/{run}/ingest", json=batch).status_code == 200
    assert http.get(f"/api/runs/{run}/scalar_keys").json() == sorted(keys)
    got = http.get(f"/api/runs/{run}/scalars", params={"keys": keys[0]}).json()
    assert [(g["key"], g["value"]) for g in got] == [(keys[0], 0.0)]


def test_two_ranks_join_one_run_and_merge_by_weight(srv, http):
    rank0 = open_sink("ddp", url=srv.url)
    rank1 = open_sink("ddp", url=srv.url, rank=1)
    assert rank1.run_id == rank0.run_id
    rank0.log_scalars(4, {"entropy/mean": 1.0, "loss": 0.5}, weight=300)
    rank1.log_scalars(4, {"entropy/mean": 2.0, "loss": 0.7}, weight=100)
    rank1.finish()
    rank0.finish()
    got = {r["key"]: r["value"] for r in http.get(f"/api/runs/{rank0.run_id}/scalars").json()}
    assert got["entropy/mean"] == pytest.approx((1.0 * 300 + 2.0 * 100) / 400)
    assert got["loss"] == pytest.approx((0.5 * 300 + 0.7 * 100) / 400)


def test_alerts_come_back_in_the_ingest_response_and_are_stored(srv, http):
    sink = open_sink("alerting", url=srv.url, config={"vocab_size": 311}, stop_on_alert=True)
    for step in range(50):
        sink.log_scalars(step, {"entropy/mean": max(0.001, 1.5 * np.exp(-step / 5)), "reward/mean": 0.5})
    sink.finish()
    stored = http.get("/api/alerts", params={"run_id": sink.run_id}).json()
    assert stored and [a["detector"] for a in stored] == [a["detector"] for a in sink.alerts]
    assert any(a["severity"] == "critical" for a in sink.alerts) and sink.should_stop


def _log_export_run(sink):
    for step in range(3):
        sink.log_scalars(step, {"entropy/mean": step / 2})
        sink.log_tokens(step, {"sample_id": [0, 0], "pos": [0, 1], "token": HOSTILE[:2]})
    sink.finish()


def _assert_parquet_reads_back(root, run_id):
    tok = duckdb.sql(f"SELECT run_id, step, token FROM read_parquet('{root}/tokens/**/*.parquet', "
                     "hive_partitioning=true) ORDER BY step, pos").fetchall()
    assert tok == [(run_id, s, t) for s in range(3) for t in HOSTILE[:2]]
    sc = duckdb.sql(f"SELECT step, value FROM read_parquet('{root}/scalars/**/*.parquet', "
                    "hive_partitioning=true) ORDER BY step").fetchall()
    assert sc == [(0, 0.0), (1, 0.5), (2, 1.0)]


def _export_cli(db, run, out):
    return subprocess.run([sys.executable, "-m", "forksight", "export", "--db", str(db), "--run", run,
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True)


def test_export_endpoint_zip_reads_back_and_cli_says_when_the_file_is_held(srv, tmp_path):
    sink = open_sink("exp", url=srv.url)
    _log_export_run(sink)
    resp = httpx.get(f"{srv.url}/api/runs/{sink.run_id}/export", timeout=30)
    assert resp.status_code == 200
    zipfile.ZipFile(io.BytesIO(resp.content)).extractall(tmp_path / "zip")
    _assert_parquet_reads_back(tmp_path / "zip", sink.run_id)
    locked = _export_cli(srv.db, sink.run_id, tmp_path / "x")
    assert locked.returncode == 1 and "stop `forksight serve`" in locked.stderr and "/export" in locked.stderr


def test_export_cli_writes_hive_parquet_duckdb_reads_back(tmp_path):
    db = tmp_path / "e.duckdb"
    _log_export_run(open_sink("exp", db=str(db)))
    out = _export_cli(db, "exp", tmp_path / "pq")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"]["tokens"] == 6
    assert (tmp_path / "pq" / "tokens" / "run_id=exp").is_dir()
    _assert_parquet_reads_back(tmp_path / "pq", "exp")
    unknown = _export_cli(db, "nope", tmp_path / "n")
    assert unknown.returncode == 1 and "runs there: exp" in unknown.stderr


def test_token_auth_refuses_missing_or_wrong_token(tmp_path, monkeypatch, capsys):
    with InProcessCollector(tmp_path / "t.duckdb", token="s3cret-token") as server:
        assert httpx.get(f"{server.url}/api/health").status_code == 401
        wrong = httpx.get(f"{server.url}/api/runs", headers={"Authorization": "Bearer s3cret-tokeX"})
        assert wrong.status_code == 401 and "wrong token" in wrong.json()["detail"]
        assert httpx.post(f"{server.url}/api/runs", json={"name": "x"}).status_code == 401
        assert httpx.get(f"{server.url}/api/runs", headers=server.headers).status_code == 200
        with httpx.Client(base_url=server.url) as browser:      # ?token= once, then the cookie
            assert browser.get("/api/runs", params={"token": "s3cret-token"}).status_code == 200
            assert browser.get("/api/runs").status_code == 200
        sink = open_sink("authed", url=server.url, token="s3cret-token")
        sink.log_scalars(0, {"a": 1.0})
        sink.finish()
        assert sink.rejected == [] and sink.sent_rows == 1
    from forksight.compose.cli import main

    monkeypatch.delenv("FORKSIGHT_TOKEN", raising=False)
    assert main(["serve", "--db", str(tmp_path / "o.duckdb"), "--host", "0.0.0.0", "--port", str(free_port())]) == 2
    assert "--token" in capsys.readouterr().err and not (tmp_path / "o.duckdb").exists()


def test_dashboard_mounts_at_root_behind_the_api_and_the_token(tmp_path):
    with InProcessCollector(tmp_path / "d.duckdb", dashboard=True, token="tok") as server:
        assert httpx.get(f"{server.url}/").status_code == 401
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            page = browser.get("/", params={"token": "tok"})
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            assert browser.get("/_dash-layout").status_code == 200          # the cookie carries on
            assert browser.get("/api/health").json()["service"] == "forksight"
            assert "/api/runs" in browser.get("/openapi.json").json()["paths"]
