"""The default demo's point, run for real (`forksight demo --strategies all`: the collector, the
dashboard and plain GRPO twice on the `readable` preset): at the common lr (the preset's) the run
collapses and the collector's collapse warning comes at least 10 steps before raw entropy falls under
20% of its start; at the lr the strategy sweep chose it stays healthy (no collapse warning, entropy
never under 20%). Measured from the stored rows, and the demo's summary JSON says the same.
Uses the cached warm-up (built once, ~2-4 minutes)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from forksight.monitor.collector.store import Store
from test_demo import _free_port

pytestmark = [pytest.mark.slow]
STEPS = 220          # the demo runs 300; measured on this machine (seed 0): under 20% at step 182


def measured(reader, run_id: str) -> dict:
    """From the stored rows: entropy's start (first 10 steps), its first raw step under 20% of it,
    the first collapse warning, and held-out pass@8 first and last."""
    h = reader.read_scalars(run_id, ["entropy/mean"], downsample=10**6).sort_values("step")
    start = float(h.value.iloc[:10].mean())
    under = h.step[h.value < 0.2 * start]
    alerts = reader.read_alerts(run_id)
    warned = alerts.step[(alerts.detector == "entropy_collapse") & (alerts.severity == "warning")]
    p8 = reader.read_scalars(run_id, ["eval/pass@8"], downsample=10**6).sort_values("step")
    return {"start": start, "under": int(under.min()) if len(under) else None,
            "warning": int(warned.min()) if len(warned) else None, "steps": int(h.step.max()),
            "eval_steps": p8.step.tolist(), "pass8": (float(p8.value.iloc[0]), float(p8.value.iloc[-1]))}


def test_plain_grpo_collapses_at_the_common_lr_warned_ahead_and_stays_healthy_at_the_sweeps(tmp_path):
    db, summary_path = tmp_path / "demo.duckdb", tmp_path / "summary.json"
    argv = [sys.executable, "-m", "forksight", "demo", "--strategies", "all", "--steps", str(STEPS),
            "--db", str(db), "--port", str(_free_port()), "--exit-when-done", "--summary", str(summary_path)]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "forksight demo: summary" in out and "all · lr 5e-4 (common)" in out
    with Store(str(db)) as store:
        runs = store.reader.list_runs().set_index("name")
        assert set(runs.index) == {"all-lr5e-4-common", "all-lr5.56e-5-sweep-best"}
        common = measured(store.reader, runs.loc["all-lr5e-4-common", "run_id"])
        swept = measured(store.reader, runs.loc["all-lr5.56e-5-sweep-best", "run_id"])
    assert common["steps"] == swept["steps"] == STEPS
    assert common["under"] is not None, common                       # collapsed within the steps
    assert common["warning"] is not None and common["under"] - common["warning"] >= 10, common
    assert swept["under"] is None and swept["warning"] is None, swept  # healthy beside it
    # the cost on held-out problems, on the run page: evaluated at step 0 and every 25 steps
    assert common["eval_steps"][:2] == [0, 25] and common["pass8"][1] < common["pass8"][0] - 0.3, common
    assert swept["pass8"][1] > common["pass8"][1] + 0.3, (swept, common)
    summary = {r["name"]: r for r in json.loads(summary_path.read_text())["runs"]}
    assert summary["all-lr5e-4-common"]["under_20pct_step"] == common["under"]
    assert summary["all-lr5e-4-common"]["warning_step"] == common["warning"]
    assert summary["all-lr5e-4-common"]["warning_lead"] == common["under"] - common["warning"]
    assert summary["all-lr5e-4-common"]["verdict"]["state"] == "collapsed"
    assert summary["all-lr5.56e-5-sweep-best"]["verdict"]["state"] != "collapsed"
    assert summary["all-lr5e-4-common"]["entropy_start"] == pytest.approx(common["start"], abs=1e-4)
    assert np.isclose(summary["all-lr5e-4-common"]["heldout"]["pass@8"]["last"], common["pass8"][1], atol=1e-4)
