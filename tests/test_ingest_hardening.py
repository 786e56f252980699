"""The collector under malformed and hostile writes (issue 13): bounded Arrow decoding, 4xx for
every malformed input, batch ids bound to their content, honest messages for damaged files."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import numpy as np
import pyarrow as pa
import pytest

from collector_util import file_with_truncated_wal, ServeProcess
from forksight.base.limits import MAX_CONFIG_CHARS, MAX_STEP, RUN_ID_RE
from forksight.monitor.collector.export import export_file
from forksight.base.constants import ARROW_MEDIA_TYPE
from forksight.base.records import Records, scalars_table, tokens_table
from forksight.monitor.collector.store import Store


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("hard") / "h.duckdb") as server:
        yield server



def _run(http, name: str) -> str:
    resp = http.post("/api/runs", json={"name": name})
    assert resp.status_code == 201, resp.text
    return resp.json()["run_id"]


def _ipc(table: pa.Table, compression: str | None = "zstd", chunk: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table, max_chunksize=chunk)
    return sink.getvalue().to_pybytes()


def _post_arrow(http, run: str, body: bytes, batch_id: str = "b1", rank: int = 0) -> httpx.Response:
    return http.post(f"/api/runs/{run}/tokens", content=body, params={"batch_id": batch_id, "rank": rank},
                     headers={"Content-Type": ARROW_MEDIA_TYPE})


def _counts(http, run: str) -> dict:
    return http.get(f"/api/runs/{run}/counts").json()


# ---------------------------------------------------------------------------- bounded decoding
_PEAK = """
import sys, pyarrow as pa
from forksight.base.errors import ApiError
from forksight.monitor.collector.bodies import parse_arrow_tokens
try:
    parse_arrow_tokens(open(sys.argv[1], "rb").read(), 0)
    status = 200
except ApiError as exc:
    status = exc.status
print(status, pa.default_memory_pool().max_memory())
"""


def _peak(tmp_path, body: bytes) -> tuple[int, int]:
    """(status, peak bytes Arrow allocated) of decoding `body` in a fresh process."""
    path = tmp_path / "body.arrow"
    path.write_bytes(body)
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, check=True)
    status, peak = out.stdout.split()
    return int(status), int(peak)


def test_a_row_bomb_is_refused_from_its_headers_before_anything_is_decoded(tmp_path, http):
    n = 3_000_000                                     # the limit is 2M rows; 60 MB once decoded
    bomb = pa.table({"step": pa.array(np.zeros(n, np.int64)), "sample_id": pa.array(np.zeros(n, np.int64)),
                     "pos": pa.array(np.zeros(n, np.int32))})
    body = _ipc(bomb, chunk=1_000_000)
    assert len(body) < 100_000                        # zstd: a few KB on the wire
    status, peak = _peak(tmp_path, body)
    assert status == 422
    assert peak < n * 20 / 4                          # decoding it would allocate n * 20 bytes
    run = _run(http, "bomb")
    resp = _post_arrow(http, run, body)
    assert resp.status_code == 422 and "2000000" in resp.json()["detail"]
    assert _counts(http, run)["tokens"] == 0


def test_a_dictionary_column_is_refused_by_its_expanded_size(tmp_path, http):
    n = 300_000                                       # one 1,000-char token 300k times: 300 MB expanded
    token = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["x" * 1000]))
    table = pa.table({"step": pa.array(np.ones(n, np.int64)), "sample_id": pa.array(np.arange(n)),
                      "pos": pa.array(np.zeros(n, np.int32)), "token": token})
    body = _ipc(table)
    status, peak = _peak(tmp_path, body)
    assert status == 413 and peak < n * 1000 / 4
    run = _run(http, "dict")
    resp = _post_arrow(http, run, body)
    assert resp.status_code == 413 and "tokens.token" in resp.json()["detail"]
    small = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["a", "b"]))
    ok = pa.table({"step": pa.array([1, 1, 1], pa.int64()), "sample_id": [0, 0, 0], "pos": [0, 1, 2], "token": small})
    assert _post_arrow(http, run, _ipc(ok), batch_id="small").status_code == 200
    assert http.get(f"/api/runs/{run}/tokens", params={"step": 1}).json()[1]["token"] == "b"


@pytest.mark.parametrize("declared, status", [(1 << 40, 413), (-5, 400)])
def test_a_forged_decompressed_length_is_refused_before_any_allocation(http, declared, status):
    import struct

    n = 12345                                         # its data buffer declares n * 8 bytes once decompressed
    body = _ipc(pa.table({"step": pa.array(np.arange(n), pa.int64()), "sample_id": pa.array(np.zeros(n, np.int64)),
                          "pos": pa.array(np.zeros(n, np.int32))}))
    prefix = struct.pack("<q", n * 8)
    assert body.count(prefix) == 2                    # step and sample_id
    run = _run(http, "forged")
    resp = _post_arrow(http, run, body.replace(prefix, struct.pack("<q", declared)))
    assert resp.status_code == status, resp.text
    assert _counts(http, run)["tokens"] == 0


# ---------------------------------------------------------------------------- 4xx, never 500
def test_duplicate_arrow_column_names_are_a_422(http):
    run = _run(http, "dup")
    table = pa.Table.from_arrays([pa.array([1], pa.int64()), pa.array([0]), pa.array([0]), pa.array([1])],
                                 names=["step", "sample_id", "pos", "pos"])
    resp = _post_arrow(http, run, _ipc(table))
    assert resp.status_code == 422 and "'pos'" in resp.json()["detail"]


@pytest.mark.parametrize("mutate, field", [
    (lambda b: b["samples"][0].update(sample_id=2**64), "samples[0].sample_id"),
    (lambda b: b["samples"][0].update(group_id=2**63), "samples[0].group_id"),
    (lambda b: b["tokens"][0].update(token_id=[2**31]), "tokens[0].token_id"),
    (lambda b: b["tokens"][0].update(sample_id=[2**70]), "tokens[0].sample_id"),
])
def test_integers_past_their_stored_width_are_a_422_naming_the_field(http, mutate, field):
    run = _run(http, "wide")
    body = {"batch_id": "w", "samples": [{"step": 1, "sample_id": 0, "group_id": 0}],
            "tokens": [{"step": 1, "sample_id": [0], "pos": [0], "token_id": [5]}]}
    mutate(body)
    resp = http.post(f"/api/runs/{run}/ingest", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert resp.status_code == 422 and field in resp.json()["detail"], resp.text
    assert _counts(http, run)["samples"] == 0


def test_patch_config_is_as_strict_as_post(http):
    run = _run(http, "patch")
    assert http.patch(f"/api/runs/{run}", json={"config": {"lr": 0.1}}).status_code == 200
    nan = http.patch(f"/api/runs/{run}", content='{"config": {"lr": NaN}}', headers={"Content-Type": "application/json"})
    assert nan.status_code == 422 and "config" in nan.json()["detail"]
    huge = {"config": {"blob": "x" * (MAX_CONFIG_CHARS + 1)}}
    resp = http.patch(f"/api/runs/{run}", json=huge)
    assert resp.status_code == 422 and str(MAX_CONFIG_CHARS) in resp.json()["detail"]
    assert http.post("/api/runs", json={"name": "patch-post", **huge}).status_code == 422   # the same limit
    assert http.get(f"/api/runs/{run}").json()["config"] == {"lr": 0.1}


@pytest.mark.parametrize("columns, rank, fragment", [
    ({"pos": pa.array(["1"])}, 0, "tokens.pos"),                     # no string -> number casts
    ({"entropy": pa.array(["0.5"])}, 0, "tokens.entropy"),
    ({"fork": pa.array([1], pa.int8())}, 0, "tokens.fork"),          # no number -> bool
    ({"pos": pa.array([0.5])}, 0, "tokens.pos"),                     # no float -> int
    ({"step": pa.array([MAX_STEP], pa.int64())}, 0, "tokens.step"),  # step < MAX_STEP, like JSON
    ({"rank": pa.array([-7], pa.int32())}, 0, "tokens.rank"),        # a rank column must match ?rank=
    ({"rank": pa.array([3], pa.int32())}, 0, "tokens.rank"),
])
def test_the_arrow_route_is_as_strict_as_the_json_route(http, columns, rank, fragment):
    run = _run(http, "strict")
    base = {"step": pa.array([1], pa.int64()), "sample_id": pa.array([0], pa.int64()), "pos": pa.array([0], pa.int32())}
    resp = _post_arrow(http, run, _ipc(pa.table({**base, **columns})), rank=rank)
    assert resp.status_code == 422 and fragment in resp.json()["detail"], resp.text
    assert _counts(http, run)["tokens"] == 0


# ---------------------------------------------------------------------------- batch ids
def test_a_reused_batch_id_with_other_content_is_a_409_and_the_first_content_stays(http):
    run = _run(http, "reuse")
    first = {"batch_id": "same", "scalars": [{"step": 1, "key": "loss", "value": 1.0}]}
    other = {"batch_id": "same", "scalars": [{"step": 1, "key": "loss", "value": 2.0}]}
    post = lambda body: http.post(f"/api/runs/{run}/ingest", json=body)  # noqa: E731
    assert post(first).json()["stored"] is True
    again = post(first)
    assert again.status_code == 200 and again.json()["duplicate"] is True         # a retry is fine
    clash = post(other)
    assert clash.status_code == 409 and "'same'" in clash.json()["detail"]
    assert [r["value"] for r in http.get(f"/api/runs/{run}/scalars").json()] == [1.0]
    table = pa.table({"step": pa.array([1], pa.int64()), "sample_id": [0], "pos": [0]})
    assert _post_arrow(http, run, _ipc(table), batch_id="tok").status_code == 200
    moved = pa.table({"step": pa.array([1], pa.int64()), "sample_id": [0], "pos": [1]})
    assert _post_arrow(http, run, _ipc(moved), batch_id="tok").status_code == 409
    assert _post_arrow(http, run, _ipc(table), batch_id="tok").json()["duplicate"] is True


def test_run_ids_refuse_a_trailing_newline(tmp_path):
    assert RUN_ID_RE.match("run") and not RUN_ID_RE.match("run\n")
    with Store(tmp_path / "n.duckdb") as store:
        with pytest.raises(ValueError, match="must match"):
            store.create_run("run\n")
        assert store.reader.list_runs().empty


# ---------------------------------------------------------------------------- damaged files
def _data_block_offset(path) -> int:
    """Where in the file a block of the tokens table's entropy data lies (DuckDB's layout: three
    4 KiB headers, then 256 KiB blocks), so the test garbles data, not the metadata read on open."""
    import duckdb

    with duckdb.connect(str(path), read_only=True) as con:
        block_size = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()[0]
        block = con.execute("SELECT max(block_id) FROM pragma_storage_info('tokens') "
                            "WHERE column_name = 'entropy' AND segment_type = 'FLOAT' AND block_id >= 0"
                            ).fetchone()[0]
    assert block is not None
    return 3 * 4096 + block * block_size + 4096


def _stored_file(path) -> int:
    with Store(path) as store:
        run = store.create_run("keep")
        n = 400_000
        store.write(run, Records(tokens=tokens_table({"sample_id": np.arange(n), "pos": np.zeros(n, np.int32),
                                                      "entropy": np.random.default_rng(0).random(n).astype(np.float32)},
                                                     step=1))).result()
        store.write(run, Records(scalars=scalars_table([{"step": 1, "key": "loss", "value": 1.0}]))).result()
    return os.path.getsize(path)


def test_damaged_unreadable_and_held_files_each_get_their_own_message(tmp_path, capsys):
    good = tmp_path / "good.duckdb"
    size = _stored_file(good)
    garbled = tmp_path / "garbled.duckdb"
    shutil.copy(good, garbled)
    with open(garbled, "r+b") as f:                   # a garbled data block inside a valid file
        f.seek(_data_block_offset(good))
        f.write(os.urandom(64 * 1024))
    truncated = tmp_path / "truncated.duckdb"
    shutil.copy(good, truncated)
    with open(truncated, "r+b") as f:
        f.truncate(size // 2)
    for path in (garbled, truncated):
        with pytest.raises(RuntimeError) as err:
            Store(path)
        assert "damaged" in str(err.value) and "another process" not in str(err.value), str(err.value)
        with pytest.raises(RuntimeError, match="damaged"):            # `forksight export` says the same
            export_file(str(path), "keep", str(tmp_path / "out"))
    from forksight.compose.cli import main

    assert main(["serve", "--db", str(garbled), "--port", "9"]) == 1      # refused before it serves
    assert "damaged" in capsys.readouterr().err
    (tmp_path / "dir.duckdb").mkdir()
    with pytest.raises(RuntimeError, match="check the path") as err:
        Store(tmp_path / "dir.duckdb")
    assert "another process" not in str(err.value)
    with Store(good) as store:                        # the intact file still opens, whole
        assert store.reader.row_counts("keep")["tokens"] == 400_000


def test_serve_skip_verify_starts_on_a_file_a_full_check_refuses(tmp_path):
    # a big file the owner knows is sound can start without the block-by-block read
    db = tmp_path / "big.duckdb"
    _stored_file(db)
    offset = _data_block_offset(db)
    with open(db, "r+b") as f:                        # the same garbled block as above
        f.seek(offset)
        f.write(os.urandom(64 * 1024))
    with pytest.raises(RuntimeError, match="damaged"):
        Store(db)
    with ServeProcess(db, args=("--skip-verify",)) as srv:
        runs = httpx.get(srv.url + "/api/runs").json()
        assert [run["run_id"] for run in runs] == ["keep"]


def test_serve_says_it_checks_a_big_file_before_the_check(tmp_path, capsys):
    from forksight.compose.cli import main
    from forksight.compose.serve_cli import SAY_VERIFY_BYTES

    big = tmp_path / "big.duckdb"
    with open(big, "wb") as f:                        # sparse: no disk used, and no DuckDB file
        f.truncate(SAY_VERIFY_BYTES)
    assert main(["serve", "--db", str(big), "--port", "9"]) == 1
    err = capsys.readouterr().err
    assert err.index("checking every block") < err.index("damaged"), err
    small = tmp_path / "small.duckdb"
    small.write_bytes(b"x" * 4096)
    assert main(["serve", "--db", str(small), "--port", "9"]) == 1
    assert "checking every block" not in capsys.readouterr().err


def _settings(store) -> tuple:
    return store.call(lambda cur: cur.execute(
        "SELECT current_setting('memory_limit'), current_setting('threads')").fetchone())


def test_duckdb_memory_and_threads_are_capped_as_asked_and_typos_refused(tmp_path, capsys):
    import duckdb

    with Store(tmp_path / "capped.duckdb", memory_limit="256MB", threads=1) as store:
        capped = _settings(store)
    reference = duckdb.connect(config={"memory_limit": "256MB", "threads": 1})   # DuckDB's own reading
    assert capped == reference.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
    with Store(tmp_path / "default.duckdb") as store:
        assert _settings(store) != capped                         # the default is DuckDB's own
    from forksight.compose.cli import main

    for bad in (["--memory-limit", "lots"], ["--memory-limit", "2"], ["--memory-limit", "10KB"], ["--threads", "0"]):
        db = tmp_path / f"never-{bad[1]}.duckdb"
        assert main(["serve", "--db", str(db), "--port", "9", *bad]) == 2
        err = capsys.readouterr().err
        assert ("not a size" in err and "2GB" in err) or "threads must be" in err or "below 64 MiB" in err, err
        assert not db.exists()                                    # refused before the file is touched
    with ServeProcess(tmp_path / "served.duckdb", args=("--memory-limit", "512MiB", "--threads", "1")) as srv:
        assert httpx.get(srv.url + "/api/health").status_code == 200
    from forksight.monitor.collector.dbfile import connect

    with pytest.raises(RuntimeError, match="ran out of memory.*raise --memory-limit"):   # why the floor exists
        connect(str(tmp_path / "starved.duckdb"), config={"memory_limit": "1KB"})
    with Store(tmp_path / "least.duckdb", memory_limit="64MiB") as store:     # the smallest allowed still works
        run = store.create_run("least")
        store.write(run, Records(scalars=scalars_table([{"step": 1, "key": "loss", "value": 1.0}]))).result()
        assert store.reader.row_counts(run)["scalars"] == 1


def test_rows_lost_with_a_truncated_wal_are_reported_not_served_silently(tmp_path, caplog):
    db = file_with_truncated_wal(tmp_path)
    with Store(db) as store:
        kept = store.reader.row_counts("wal")["tokens"]
        assert kept < 200_000                          # DuckDB replays what is left, silently
        assert store.missing_rows == {"tokens": 200_000 - kept}
    assert "acknowledged earlier are not in the file" in caplog.text
    with Store(db) as store:                           # said once; the file is consistent again
        assert store.missing_rows == {}
