"""The `collapse` preset (`forksight demo --preset collapse`) from one seed and learning rate,
measured the way the README states it: plain GRPO (`all`) collapses within the demo's steps (raw entropy under 10% of its first five
steps' mean), `fork` and `ict` hold longer, and the collapse warning (the same AlertMonitor the
collector runs) comes at least 10 steps before the unsmoothed collapse."""
from __future__ import annotations

import numpy as np
import pytest

from forksight.monitor.alerts.hub import AlertMonitor
from forksight.trainer.config import load_config
from forksight.trainer.loop import train
from forksight.trainer.model import TinySpec
from trainer_util import Scalars

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread"), pytest.mark.trajectory]
STEPS = 75


def measure(strategy: str, out_dir) -> tuple[int | None, int | None]:
    """(first step whose raw entropy is under 10% of the first five steps' mean, first collapse warning)."""
    config = load_config(None, "collapse", {"strategy": strategy, "steps": STEPS, "progress": False,
                                            "token_groups": 0, "out_dir": str(out_dir)})
    sink = Scalars("collapse")
    train(config, sink=sink)
    steps = sorted(s for s in sink.rows if s > 0)      # step 0 holds the reference set's base (ref/*) only
    h = np.array([sink.rows[s]["entropy/mean"] for s in steps])
    below = np.flatnonzero(h < 0.1 * h[:5].mean())
    monitor = AlertMonitor(vocab_size=TinySpec().bpe_vocab_size)   # the log|V| the collector gets
    warnings = [s for s in steps for a in monitor.observe(s, sink.rows[s])
                if a.detector == "entropy_collapse" and a.severity == "warning"]
    return (steps[below[0]] if below.size else None), (warnings[0] if warnings else None)


def test_plain_grpo_collapses_first_and_is_warned_ten_steps_ahead(tmp_path):
    collapse = {s: measure(s, tmp_path) for s in ("all", "fork", "ict")}
    all_collapse, all_warning = collapse["all"]
    assert all_collapse is not None, collapse
    assert all_warning is not None and all_collapse - all_warning >= 10, collapse
    for strategy in ("fork", "ict"):
        held = collapse[strategy][0]
        assert held is None or held > all_collapse, collapse
