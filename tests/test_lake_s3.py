"""An object-store warehouse for real: moto's S3-compatible server runs as a local process, a real
`forksight serve --lake-warehouse s3://... --lake-option s3.endpoint=...` commits every row to it, the
data files are s3:// objects, and another collector's tiered reader reads the run (through pyiceberg's
scan: the non-local branch of run_views) with the values of the writer's DuckDB file."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import httpx
import pandas as pd
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from collector_util import REPO, ServeProcess, free_port  # noqa: E402
from lake_util import STEP_TABLES, batch, create_run, duck_rows, lake_rows, post, rows_of, wait_drained  # noqa: E402

from forksight.compose.lake_reads import tiered_reader  # noqa: E402
from forksight.monitor.collector.store import Store  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.run_views import plan_files  # noqa: E402
from forksight.monitor.lake.service import start_lake  # noqa: E402

pytestmark = pytest.mark.slow

BUCKET = "forksight-lake"
KEY_ID = "forksight-test-key-id"
SECRET = "s3cret-9f1c7e2a-never-shown"      # looked for in the health answer and the serve log
STEPS = (0, 1, 2, 3, 1500, 1501)            # two step blocks of 1000: two partitions per run


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on a free loopback port with one empty bucket; yields its endpoint URL."""
    if importlib.util.find_spec("moto.server") is None or importlib.util.find_spec("flask") is None:
        pytest.fail("moto's S3 server is missing: pip install -e '.[dev]' (it is in the dev extra: "
                    "moto[server])")
    port, log = free_port(), tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"moto's server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            try:
                httpx.get(endpoint, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    pytest.fail(f"moto's server did not answer on {endpoint} within 60 s")
                time.sleep(0.2)
        from pyarrow.fs import S3FileSystem

        S3FileSystem(endpoint_override=endpoint, access_key=KEY_ID, secret_key=SECRET, region="us-east-1",
                     allow_bucket_creation=True).create_dir(BUCKET)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def options(endpoint: str) -> dict[str, str]:
    return {"s3.endpoint": endpoint, "s3.access-key-id": KEY_ID, "s3.secret-access-key": SECRET,
            "s3.region": "us-east-1"}


@pytest.fixture(scope="module")
def written(s3, tmp_path_factory):
    """A real serve wrote one run to the s3:// warehouse and stopped; yields (catalog, the run, the
    DuckDB file, rows sent per table, the lake health JSON text, the serve log)."""
    tmp = tmp_path_factory.mktemp("lake-s3")
    uri, db = f"sqlite:///{tmp}/catalog.db", tmp / "b.duckdb"
    flags = [f for k, v in options(s3).items() for f in ("--lake-option", f"{k}={v}")]
    sent = {t: 0 for t in STEP_TABLES}
    with ServeProcess(db, args=("--lake-catalog", uri, "--lake-warehouse", f"s3://{BUCKET}/wh", *flags,
                                "--lake-commit-seconds", "0.5", "--collector-id", "box-b")) as srv:
        run = create_run(srv.url, "alpha")
        for step in STEPS:
            body = batch(step, tokens=30)
            post(srv.url, run, body)
            for t, n in rows_of(body).items():
                sent[t] += n
        wait_drained(srv.url)
        health = httpx.get(f"{srv.url}/api/health/lake", timeout=10).text
    catalog = open_catalog(uri, f"s3://{BUCKET}/wh", check=False, properties=options(s3))
    yield catalog, run, str(db), sent, health, srv.log()


def test_serve_commits_every_row_to_the_s3_warehouse_and_never_shows_the_secret(written):
    catalog, run, db, sent, health, log = written
    for name in STEP_TABLES:
        lake, duck = lake_rows(catalog, name, "box-b"), duck_rows(db, name)
        assert len(lake) == sent[name], name          # counted from what was sent
        assert lake == duck, name                     # and every value equal to DuckDB's
    assert lake_rows(catalog, "runs", "box-b") == duck_rows(db, "runs")
    files = [t.file.file_path for t in catalog.load_table("forksight.tokens").scan().plan_files()]
    assert len(files) >= 2 and all(f.startswith(f"s3://{BUCKET}/wh/") for f in files), files
    assert f"s3://{BUCKET}/wh" in health and SECRET not in health
    assert "forksight lake: collector box-b" in log and SECRET not in log


def test_another_collector_reads_the_s3_run_as_its_writer_file_does(written, tmp_path):
    catalog, run, db, _, _, _ = written
    a = Store(str(tmp_path / "a.duckdb"))
    own = Store(db)
    try:
        lake_a = start_lake(a, catalog, uri="sqlite://", warehouse="s3://", collector_id="box-a",
                            commit_seconds=3600)
        lake_a.stop()
        reader, rid = tiered_reader(a, lake_a), f"{run}@box-b"
        assert plan_files(catalog, "tokens", "box-b", run)[0] is None     # not local: read through pyiceberg
        assert rid in set(reader.list_runs()["run_id"])
        for downsample in (1000, 3):
            want = own.reader.read_scalars(run, downsample=downsample)
            assert len(want)
            pd.testing.assert_frame_equal(reader.read_scalars(rid, downsample=downsample).reset_index(drop=True),
                                          want.reset_index(drop=True), check_dtype=False)
        assert reader.token_steps(rid) == own.reader.token_steps(run) == list(STEPS)
        for step in STEPS:
            want = own.reader.read_tokens(run, step)
            assert len(want) == 30
            pd.testing.assert_frame_equal(reader.read_tokens(rid, step).reset_index(drop=True),
                                          want.reset_index(drop=True), check_dtype=False)
        assert reader.row_counts(rid) == own.reader.row_counts(run)
    finally:
        a.close()
        own.close()


def test_a_malformed_lake_option_is_refused_saying_the_form_and_secrets_are_redacted():
    from forksight.monitor.lake.catalog import redact_options

    for bad, said in (("s3.secret-access-key", "no '='"), ("=x", "the key before '=' is empty")):
        done = subprocess.run([sys.executable, "-m", "forksight", "lake", "compact", "--lake-catalog", "sqlite://",
                               "--lake-warehouse", "wh", "--lake-option", bad], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr and "KEY=VALUE" in done.stderr, done.stderr
    shown = redact_options({"s3.access-key-id": KEY_ID, "s3.secret-access-key": SECRET, "s3.session-token": "t",
                            "rest.password": "p", "s3.region": "us-east-1"})
    assert shown == {"s3.access-key-id": KEY_ID, "s3.secret-access-key": "***", "s3.session-token": "***",
                     "rest.password": "***", "s3.region": "us-east-1"}
