"""A lake that cannot work is refused at start, and no catalog secret leaves forksight: real `forksight serve`
processes with a marker secret in every secret-bearing place (the REST `credential`, `token`, a FileIO key,
a header); the marker is searched for in the refusal, the start banner, the log, /api/health(/lake), the
OpenAPI and the dashboard's first page."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")

from collector_util import REPO, ServeProcess  # noqa: E402

MARKER = "s3cr3t-MARKER-7f1c"
SECRETS = ("credential=client:" + MARKER, "token=" + MARKER, "s3.secret-access-key=" + MARKER,
           "header.Authorization=Bearer " + MARKER, "adls.sas-token.acct=" + MARKER)


def _serve(tmp_path, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    argv = [sys.executable, "-m", "forksight", "serve", "--db", str(tmp_path / "s.duckdb"), "--port", "1", *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, **(env or {})})


def _options() -> list[str]:
    return [a for s in SECRETS for a in ("--lake-option", s)]


def test_a_lake_without_pyiceberg_core_is_refused_at_start_with_the_pip_line(tmp_path):
    """pyiceberg-core holds the partition transform every commit needs: without it serve used to start,
    acknowledge rows and fail each commit; now it refuses as for a bad catalog URI, and leaves no file."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['pyiceberg_core'] = None   # import fails\n")
    done = _serve(tmp_path, "--lake-catalog", f"sqlite:///{tmp_path}/catalog.db", "--lake-warehouse",
                  str(tmp_path / "wh"), env={"PYTHONPATH": str(blocker)})
    assert done.returncode == 2, done.stderr
    assert "pyiceberg-core" in done.stderr and "pip install 'forksight[lake]'" in done.stderr
    assert not (tmp_path / "s.duckdb").exists() and not (tmp_path / "catalog.db").exists()


def test_refusals_never_show_a_secret(tmp_path):
    rest = _serve(tmp_path, "--lake-catalog", "http://127.0.0.1:9/", "--lake-warehouse", "wh", *_options())
    assert rest.returncode == 2 and "cannot use the lake catalog" in rest.stderr
    pg = _serve(tmp_path, "--lake-catalog", f"postgresql+psycopg2://user:{MARKER}@127.0.0.1:9/db",
                "--lake-warehouse", str(tmp_path / "wh"), *_options())
    assert pg.returncode == 2 and "user:***@" in pg.stderr
    for done in (rest, pg):
        assert MARKER not in done.stdout + done.stderr


def test_a_running_lake_shows_no_secret_anywhere(tmp_path):
    srv = ServeProcess(tmp_path / "c.duckdb", dashboard=True, args=(
        "--lake-catalog", f"sqlite:///{tmp_path}/catalog.db", "--lake-warehouse", str(tmp_path / "wh"),
        "--collector-id", "box", *_options())).start()
    try:
        answers = [httpx.get(srv.url + path, timeout=60).text
                   for path in ("/api/health", "/api/health/lake", "/openapi.json", "/", "/docs")]
        assert '"collector_id":"box"' in answers[1]
        assert "***" in answers[1]                    # the options are shown, their secrets are not
    finally:
        srv.stop()
    log = srv.log_path.read_text()
    assert "forksight lake: collector box commits to" in log
    for text in (*answers, log):
        assert MARKER not in text


def test_a_failure_message_that_quotes_a_secret_is_scrubbed():
    """A driver's or catalog's message may quote the URI or an option: LakeSettings.scrub, which the
    committer's health, log and start errors go through, leaves none of them in it."""
    from forksight.monitor.lake.committer import Committer
    from forksight.monitor.lake.settings import LakeSettings

    settings = LakeSettings.of(catalog=f"postgresql+psycopg2://u:{MARKER}@h/db", warehouse="wh",
                               options={"credential": "client:" + MARKER + "2", "s3.region": "eu"})
    text = f"OperationalError: connecting to u:{MARKER}@h with credential client:{MARKER}2 in eu"
    assert settings.scrub(text) == "OperationalError: connecting to u:***@h with credential *** in eu"
    assert MARKER not in repr(settings) and MARKER not in str(settings.model_dump())
    assert settings.shown()["options"] == {"credential": "***", "s3.region": "eu"}

    class Failing:                      # the committer's own failure path, on a cycle that raises
        scrub = staticmethod(settings.scrub)
        _error = _failing_since = None
        _stalled = False

        def cycle(self, force):
            raise RuntimeError(text)
    failing = Failing()
    assert Committer._cycle_safely(failing) is False
    assert MARKER not in failing._error and "u:***@h" in failing._error


def test_lake_maintenance_refusals_never_show_a_secret(tmp_path):
    done = subprocess.run([sys.executable, "-m", "forksight", "lake", "expire", "--older-than", "7d",
                           "--lake-catalog", f"postgresql+psycopg2://user:{MARKER}@127.0.0.1:9/db",
                           "--lake-warehouse", str(tmp_path / "wh"), *_options()],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode in (1, 2) and "forksight lake expire:" in done.stderr
    assert MARKER not in done.stdout + done.stderr
