"""`forksight demo`, run for real with a small configuration: a collector with the dashboard,
three training processes (all, fork, ict) streaming to it, and clean shutdown. The store must
hold all three runs with steps, token rows and samples, and an alert on the collapsing run; the
summary printed at the end and written as JSON says what the stored rows say."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from forksight.monitor.collector.store import Store

pytestmark = pytest.mark.slow
NAMES = ("all-lr3e-3-preset", "fork-lr3e-3-preset", "ict-lr3e-3-preset")   # the collapse preset's lr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_trains_three_strategies_live_and_alerts_on_the_collapsing_one(tmp_path):
    import json

    db = tmp_path / "demo.duckdb"
    port = _free_port()
    argv = [sys.executable, "-m", "forksight", "demo", "--preset", "collapse", "--db", str(db), "--port", str(port),
            "--steps", "45", "--exit-when-done", "--duration", "400"]
    env = dict(os.environ, FORKSIGHT_URL=f"http://127.0.0.1:{port}")
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"http://127.0.0.1:{port}/" in out
    assert "all runs ended" in out

    with Store(str(db)) as store:
        reader = store.reader
        runs = reader.list_runs().set_index("name")
        assert set(NAMES) <= set(runs.index)
        for name in NAMES:
            run_id = runs.loc[name, "run_id"]
            assert runs.loc[name, "strategy"] == name.split("-")[0]
            assert runs.loc[name, "status"] in ("finished", "stopped")
            steps = reader.read_scalars(run_id, ["entropy/mean"], downsample=10_000).step
            assert steps.max() == 45 and steps.nunique() == 45
            token_steps = reader.token_steps(run_id)
            assert token_steps and len(reader.read_tokens(run_id, token_steps[-1])) > 0
            assert len(reader.read_samples(run_id, step=int(steps.max()))) > 0
        alerts = reader.read_alerts(runs.loc[NAMES[0], "run_id"])
        assert "entropy_collapse" in set(alerts.detector), alerts
        # the collapse is real: entropy of plain GRPO fell by more than 90%
        ent = reader.read_scalars(runs.loc[NAMES[0], "run_id"], ["entropy/mean"], downsample=10_000)
        assert ent.value.iloc[-1] < 0.1 * ent.value.iloc[0]
        # the summary (printed, and as JSON in the run dir) says what the stored rows say
        summary = json.loads((tmp_path / ".forksight" / "demo" / "summary.json").read_text())
        row = {r["name"]: r for r in summary["runs"]}[NAMES[0]]
        assert row["steps"] == 45 and row["lr"] == 3e-3 and row["label"] == "all · lr 3e-3 (preset's)"
        assert row["entropy_end"] == pytest.approx(ent.value.iloc[-10:].mean(), abs=1e-4)
        first_warning = alerts.step[(alerts.detector == "entropy_collapse") & (alerts.severity == "warning")].min()
        assert row["warning_step"] == first_warning
    assert "forksight demo: summary" in out and "all · lr 3e-3 (preset's)" in out
    # the demo's collector is gone: nothing left listening
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1)


def _latest_step(port: int, run_id: str) -> int:
    try:
        resp = httpx.get(f"http://127.0.0.1:{port}/api/runs/{run_id}/scalars",
                         params={"keys": "entropy/mean"}, timeout=2)
    except httpx.HTTPError:
        return -1
    if resp.status_code != 200 or not resp.json():
        return -1
    body = resp.json()
    steps = body["step"] if isinstance(body, dict) else [row["step"] for row in body]
    return max(steps) if steps else -1


def test_ctrl_c_stops_the_demo_cleanly_and_loses_no_stored_step(tmp_path):
    import json
    import signal
    import time

    db = tmp_path / "demo.duckdb"
    port = _free_port()
    argv = [sys.executable, "-m", "forksight", "demo", "--preset", "collapse", "--db", str(db), "--port", str(port),
            "--steps", "100000"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        names = NAMES
        while min(_latest_step(port, n) for n in names) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "the demo never streamed 3 steps"
            time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)       # a terminal's Ctrl-C goes to the whole group
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "stopping after the current step" in out
    assert "forksight demo: summary" in out        # stopped early: the summary of what was trained
    with Store(str(db)) as store:
        runs = store.reader.list_runs().set_index("name")
        for name in names:
            assert runs.loc[name, "status"] == "stopped"
            # what each trainer says it trained is exactly what the store holds
            log = (tmp_path / ".forksight" / "demo" / f"{name}.log").read_text()
            summary = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
            stored = store.reader.read_scalars(runs.loc[name, "run_id"], ["entropy/mean"], downsample=10**6)
            assert stored.step.max() == summary["steps"] and stored.step.nunique() == summary["steps"]
            assert (tmp_path / "runs" / name / "checkpoint.pt").exists()


def test_demo_refuses_a_non_loopback_host_before_opening_anything(tmp_path):
    argv = [sys.executable, "-m", "forksight", "demo", "--db", str(tmp_path / "d.duckdb"), "--host", "",
            "--port", str(_free_port())]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "loopback" in proc.stderr and "--token" in proc.stderr
    assert not (tmp_path / "d.duckdb").exists()
