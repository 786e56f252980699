"""Alerts on real runs of the bundled trainer (tiny model, real DuckDB file, the store's own hub):
the collapse preset raises the collapse warning before the collapse and stops on the critical
alert when asked; a healthy configuration raises nothing."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forksight.monitor.alerts.hub import AlertConfig
from forksight.monitor.collector.store import Store
from forksight.trainer.config import load_config
from forksight.trainer.loop import train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread"), pytest.mark.trajectory]


def _train(tmp_path, preset: str, **over):
    db = tmp_path / f"{preset}.duckdb"
    values = dict(db=str(db), out_dir=str(tmp_path / "runs"), progress=False, run=preset,
                  eval_problems=4, eval_samples=2, eval_every=0, token_groups=0)
    values.update(over)
    result = train(load_config(preset=preset, overrides=values))
    with Store(str(db)) as store:
        alerts = store.reader.read_alerts(result.run_id)
        frame = store.reader.read_scalars(result.run_id, keys=["entropy/mean"], downsample=10**9)
    entropy = frame.set_index("step")["value"].sort_index()
    return result, alerts, entropy


def test_collapse_preset_warns_before_the_collapse_and_stops_on_the_critical_alert(tmp_path):
    # the entropy-collapse detector's own critical alert: under the default fork rule (top:0.1) fork
    # starvation's critical (the top decile's H at 20% of its baseline) comes first and stops the run
    # before the smoothed mean is below 10% of the start, so the forks are counted as H >= 0.672 here
    result, alerts, entropy = _train(tmp_path, "collapse", steps=90, stop_on_alert=True, fork_rule="abs:0.672")
    cfg = AlertConfig().collapse
    smooth = pd.Series(entropy.to_numpy()).ewm(alpha=1 - cfg.smoothing, adjust=True).mean().to_numpy()
    initial = entropy.to_numpy()[:cfg.baseline_steps].mean()
    steps = entropy.index.to_numpy()
    truth = int(steps[np.argmax(smooth < 0.1 * initial)])       # first step below 10% of the start
    assert smooth.min() < 0.1 * initial                         # the run really collapsed

    collapse = alerts[alerts.detector == "entropy_collapse"].sort_values("step")
    warning = collapse[collapse.severity == "warning"].iloc[0]
    assert not pd.isna(warning.forecast) and warning.forecast > warning.step
    assert warning.step < truth - 5, (int(warning.step), truth)
    raw = int(steps[np.argmax(entropy.to_numpy() < 0.1 * initial)])   # the unsmoothed curve
    assert warning.step <= raw - 10, (int(warning.step), raw)       # seen coming, not after the fact
    index = int(np.flatnonzero(steps == warning.step)[0])
    assert warning.value == pytest.approx(smooth[index])       # the alert's number is the EMA

    critical = collapse[collapse.severity == "critical"]
    assert len(critical) == 1
    below = smooth < max(cfg.floor, 0.1 * initial)
    expected = next(int(steps[i]) for i in range(cfg.persist - 1, len(steps))
                    if below[i - cfg.persist + 1:i + 1].all())
    assert int(critical.step.iloc[0]) == expected
    # stop_on_alert: the trainer stopped soon after the critical alert came back
    assert result.stopped_early and expected <= result.steps < 90


def test_healthy_run_raises_no_alert(tmp_path):
    result, alerts, entropy = _train(tmp_path, "healthy", steps=30)
    assert result.steps == 30 and not result.stopped_early
    values = entropy.to_numpy()
    assert values[-10:].mean() > 0.5 * values[:10].mean()     # healthy by an independent measure
    assert alerts.empty, alerts[["step", "detector", "message"]].to_string()
