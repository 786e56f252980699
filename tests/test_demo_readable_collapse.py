"""The default demo's point, run for real (`forksight demo --strategies all`: the collector, the
dashboard and plain GRPO twice on the `readable` preset): at the common lr (the preset's) the run
collapses and the collector's collapse warning comes at least 10 steps before raw entropy falls under
20% of its start; at the lr the strategy sweep chose it holds longer (entropy never under 20% of its
start, no collapse warning before the common run has collapsed; on the demo's seed none at all, but
seeds 1 and 2 are warned late, so that is not asserted), and held-out pass@8 shows the cost.
Measured from the stored rows, and the demo's summary JSON says the same.

Run twice, each with an empty FORKSIGHT_HOME (so from the shipped base model, as on a new machine):
at this machine's own PyTorch CPU kernel level and at a second one (ATEN_CPU_CAPABILITY), which
rounds differently, as another CPU would. The thresholds come from bench/kernel_spread.py
(docs/kernel_spread.json: 3 kernel levels x 3 seeds, the demo's 300 steps); each margin is
written beside its threshold and checked against that file by the last test here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from forksight.monitor.collector.store import Store
from test_demo import _free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = [pytest.mark.slow, pytest.mark.trajectory]
SPREAD = json.loads((Path(__file__).resolve().parents[1] / "docs" / "kernel_spread.json").read_text())
# Each threshold with the spread it was chosen from (12 cells: 4 kernel paths x seeds 0-2) and the margin
STEPS = 300          # the demo's own; under 20% of the start at steps 74-224, critical at 70-222: >= 76 steps spare
LEAD = 10            # warning ahead of the under-20% step; measured leads 45-178 steps: margin 35
HELDOUT_DROP = 0.3   # held-out pass@8 lost by the common lr; measured 0.47-0.84: margin 0.17
HELDOUT_GAP = 0.1    # the sweep's held-out pass@8 above the common's at the end; measured 0.22-0.66: margin 0.12
# (not asserted: the sweep's lr unwarned; it is on seed 0 at every path, and warned at 146-203 on seeds 1-2,
# 44+ steps after the common run fell under 20%, which is what the test asserts instead)
# the next level down from this machine's own: another kernel path on the same CPU
SECOND = {"AVX512": "avx2", "AVX2": "default"}.get(torch.backends.cpu.get_cpu_capability())


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


@pytest.mark.parametrize("level", ["native", "second"])
def test_plain_grpo_collapses_at_the_common_lr_warned_ahead_and_holds_longer_at_the_sweeps(tmp_path, level):
    env = {**os.environ, "FORKSIGHT_HOME": str(tmp_path / "home")}
    if level == "second":
        if SECOND is None:
            pytest.skip(f"this CPU runs PyTorch's {torch.backends.cpu.get_cpu_capability()} kernels: no lower "
                        "level to stand in for another CPU")
        env["ATEN_CPU_CAPABILITY"] = SECOND
    db, summary_path = tmp_path / "demo.duckdb", tmp_path / "summary.json"
    argv = [sys.executable, "-m", "forksight", "demo", "--strategies", "all", "--steps", str(STEPS),
            "--db", str(db), "--port", str(_free_port()), "--exit-when-done", "--summary", str(summary_path)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
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
    assert common["warning"] is not None and common["under"] - common["warning"] >= LEAD, common
    # beside it, the sweep's lr: never under 20% of its start, and not warned before the common run collapsed
    assert swept["under"] is None, swept
    assert swept["warning"] is None or swept["warning"] > common["under"], (swept, common)
    # the cost on held-out problems, on the run page: evaluated at step 0 and every 25 steps
    assert common["eval_steps"][:2] == [0, 25] and common["pass8"][1] <= common["pass8"][0] - HELDOUT_DROP, common
    assert swept["pass8"][1] >= common["pass8"][1] + HELDOUT_GAP, (swept, common)
    doc = json.loads(summary_path.read_text())
    assert doc["meta"]["cpu_capability"] == (SECOND.upper() if level == "second" else
                                             torch.backends.cpu.get_cpu_capability())   # the level really ran
    summary = {r["name"]: r for r in doc["runs"]}
    assert summary["all-lr5e-4-common"]["under_20pct_step"] == common["under"]
    assert summary["all-lr5e-4-common"]["warning_step"] == common["warning"]
    assert summary["all-lr5e-4-common"]["warning_lead"] == common["under"] - common["warning"]
    assert summary["all-lr5e-4-common"]["verdict"]["state"] == "collapsed"
    assert summary["all-lr5e-4-common"]["entropy_start"] == pytest.approx(common["start"], abs=1e-4)
    assert np.isclose(summary["all-lr5e-4-common"]["heldout"]["pass@8"]["last"], common["pass8"][1], atol=1e-4)


def test_the_thresholds_hold_with_their_margins_on_every_cell_of_the_measured_spread():
    """The figures the thresholds above were chosen from: every kernel path x seed cell of
    docs/kernel_spread.json passes them (the margins the comments beside them state), and the
    bench judged its cells at the same thresholds (README's "every cell keeps the claims")."""
    import kernel_spread

    assert (kernel_spread.LEAD, kernel_spread.HELDOUT_DROP, kernel_spread.HELDOUT_GAP) == (LEAD, HELDOUT_DROP, HELDOUT_GAP)
    cells = SPREAD["cells"]
    assert {c["variant"] for c in cells} >= {"default", "avx2", "avx512"} and {c["seed"] for c in cells} >= {0, 1, 2}
    assert SPREAD["meta"]["steps"] == STEPS
    for cell in cells:
        common, swept = cell["runs"][kernel_spread.COMMON], cell["runs"][kernel_spread.SWEPT]
        assert common["under_20pct_step"] is not None and common["verdict"] == "collapsed", cell
        assert common["under_20pct_step"] - common["warning_step"] >= LEAD, cell
        assert swept["under_20pct_step"] is None, cell
        assert swept["warning_step"] is None or swept["warning_step"] > common["under_20pct_step"], cell
        assert common["eval_pass8_last"] <= common["eval_pass8_first"] - HELDOUT_DROP, cell
        assert swept["eval_pass8_last"] >= common["eval_pass8_last"] + HELDOUT_GAP, cell
        assert all(cell["holds"].values()), cell
    assert SPREAD["all_hold"]
