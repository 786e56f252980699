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
