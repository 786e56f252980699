"""`forksight serve` alert flags: thresholds and the webhook reach the collector's hub, and
bad values are refused before anything is opened, with a message that says what to fix."""
from __future__ import annotations

import subprocess
import sys

from forksight.compose.cli import build_parser
from forksight.compose.serve_cli import _alert_hub


def _serve(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "forksight", "serve", "--db", str(tmp_path / "s.duckdb"),
            "--port", "1", *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_alert_flags_build_the_hub_the_collector_uses():
    args = build_parser().parse_args(["serve", "--alert", "collapse.floor=0.25",
                                      "--webhook", "http://127.0.0.1:9/hook"])
    hub = _alert_hub(args)
    try:
        assert hub.config.collapse.floor == 0.25
        assert hub.webhook is not None
    finally:
        hub.close()
    assert _alert_hub(build_parser().parse_args(["serve"])) is None  # env defaults apply


def test_bad_alert_settings_are_refused_with_the_reason_and_no_db_is_created(tmp_path):
    bad_key = _serve(tmp_path, "--alert", "collapse.no_such_field=1")
    assert bad_key.returncode == 2 and "no_such_field" in bad_key.stderr
    bad_url = _serve(tmp_path, "--webhook", "ftp://example/hook")
    assert bad_url.returncode == 2 and "http" in bad_url.stderr
    missing = _serve(tmp_path, "--alerts-config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
    assert not (tmp_path / "s.duckdb").exists()


def test_sigterm_closes_the_store_exactly_as_ctrl_c_does(tmp_path):
    # uvicorn raised SIGTERM again once it had shut down, and Python's default handler killed the
    # process before store.close(): exit -15, a .wal left behind, the alert hub never closed
    import signal

    import httpx

    from collector_util import ServeProcess
    from forksight.monitor.collector.store import Store

    for sig in (signal.SIGTERM, signal.SIGINT):
        db = tmp_path / f"{sig.name}.duckdb"
        srv = ServeProcess(db, args=("--webhook", "http://127.0.0.1:9/hook")).start()
        try:
            run = httpx.post(srv.url + "/api/runs", json={"name": "t"}).json()["run_id"]
            batch = {"batch_id": "b", "scalars": [{"step": s, "key": "loss", "value": 1.0} for s in range(50)]}
            assert httpx.post(f"{srv.url}/api/runs/{run}/ingest", json=batch).status_code == 200
            assert (tmp_path / f"{sig.name}.duckdb.wal").exists()       # acknowledged, not checkpointed yet
            srv.proc.send_signal(sig)
            assert srv.proc.wait(60) == 0, srv.log()[-2000:]
        finally:
            srv.stop()
        assert not (tmp_path / f"{sig.name}.duckdb.wal").exists(), f"{sig.name} left the .wal"
        assert f"{db} closed" in srv.log() and "Traceback" not in srv.log(), srv.log()[-2000:]
        with Store(db) as store:
            assert store.reader.row_counts(run)["scalars"] == 50
