"""Alerts on real runs of the tiny model (cached by bench/alerts_real.py in tests/data): runs
that collapse, stay healthy, learn nothing (a fair-coin reward) or explode. Ground truth comes
from the logged entropy, computed here, not by the detectors."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from forksight.monitor.alerts.hub import AlertConfig, AlertMonitor
from forksight.monitor.alerts.detectors import ExplosionDetector

pytestmark = pytest.mark.trajectory   # asserts on trained runs: `make test-kernels` runs it under each CPU kernel level

RUNS = json.loads((Path(__file__).parent / "data" / "alerts_real_runs.json").read_text())


def series(name: str) -> tuple[list[int], list[dict]]:
    columns = RUNS[name]["columns"]
    n = len(RUNS[name]["steps"])
    return RUNS[name]["steps"], [{k: v[i] for k, v in columns.items() if v[i] is not None} for i in range(n)]


def alerts_of(name: str):
    steps, rows = series(name)
    monitor = AlertMonitor(vocab_size=RUNS[name]["vocab_size"])
    return [a for step, row in zip(steps, rows) for a in monitor.observe(step, row)]


def entropy(name: str) -> np.ndarray:
    return np.array(RUNS[name]["columns"]["entropy/mean"], dtype=float)


def collapse_step(name: str) -> int | None:
    """First step below 10% of the first five steps' mean."""
    h = entropy(name)
    below = np.flatnonzero(h < 0.1 * h[:5].mean())
    return RUNS[name]["steps"][int(below[0])] if below.size else None


def doubled(name: str) -> bool:
    """Whether any 5-step mean of entropy reached twice the first five steps' mean."""
    h = entropy(name)
    return bool((np.convolve(h, np.ones(5) / 5, mode="valid") > 2 * h[:5].mean()).any())


def of_kind(kind: str) -> list[str]:
    return [name for name, run in RUNS.items() if run["kind"] == kind]


# ---------------------------------------------------------------------------- explosion
def starts_near_max(name: str) -> bool:
    """An untrained policy: the first five steps' entropy within 5% of log|V|."""
    return entropy(name)[:5].mean() > 0.95 * math.log(RUNS[name]["vocab_size"])


@pytest.mark.parametrize("name", [n for n in RUNS if starts_near_max(n)])
def test_run_starting_near_maximum_entropy_raises_no_explosion(name):
    h = entropy(name)
    assert h.max() < h[:10].mean() + AlertConfig().explosion.min_rise   # stays or falls, never rises
    assert [a for a in alerts_of(name) if a.detector == "entropy_explosion"] == []


def test_ceiling_from_log_vocab_never_sits_below_the_runs_own_start():
    detector = ExplosionDetector(AlertConfig().explosion, vocab_size=100)
    start = 0.99 * math.log(100)                              # a cold model's baseline
    assert detector.ceiling(start) == pytest.approx(start + 0.3)
    assert detector.ceiling(2.0) == pytest.approx(0.6 * math.log(100))   # lower start: log|V| still caps


@pytest.mark.parametrize("name", ["explode-lr0.0008-s0", "explode-lr0.0012-s0"])
def test_real_rise_from_baseline_with_falling_reward_is_a_critical_explosion(name):
    steps, rows = series(name)
    h = entropy(name)
    base = h[:10].mean()
    explosion = [a for a in alerts_of(name) if a.detector == "entropy_explosion"]
    assert doubled(name) and explosion, [(a.step, a.severity) for a in explosion]
    first = next(a for a in explosion if a.severity == "critical")
    assert "reward fell" in first.message
    assert first.threshold == pytest.approx(max(1.5 * base, base + 0.3), rel=1e-6)
    assert first.value > first.threshold
    # before it, at most one warning: the climb while reward falls, at the lower early level
    for warning in explosion[:explosion.index(first)]:
        assert warning.severity == "warning" and warning.step < first.step and "reward fell" in warning.message
        assert warning.threshold == pytest.approx(max(1.25 * base, base + 0.1), rel=1e-6)
        assert warning.value > warning.threshold
    # the reward really fell: its last 20 steps average under a quarter of where it started
    reward = np.array([r["reward/mean"] for r in rows])
    assert reward[-20:].mean() < 0.25 * reward[0]
    # raised while entropy was above its start for good: every later step stays above the baseline
    index = steps.index(first.step)
    assert (h[index:] > base).mean() > 0.9


# ---------------------------------------------------------------------------- false alarms
@pytest.mark.parametrize("name", of_kind("healthy") + of_kind("no_signal"))
def test_real_healthy_and_no_signal_runs_raise_no_false_alarm(name):
    allowed = set()
    if RUNS[name]["kind"] == "no_signal":
        allowed.add("stagnation")            # a coin for a reward: "check the reward function" is right
        if doubled(name):
            allowed.add("entropy_explosion")  # this run's entropy really doubled (ground truth)
    assert collapse_step(name) is None
    wrong = [(a.step, a.detector, a.severity) for a in alerts_of(name) if a.detector not in allowed]
    assert wrong == []


def test_no_signal_stagnation_names_a_plateau_the_data_show():
    seen = 0
    for name in of_kind("no_signal"):
        steps, rows = series(name)
        reward = np.array([r["reward/mean"] for r in rows])
        for alert in (a for a in alerts_of(name) if a.detector == "stagnation"):
            seen += 1
            end = steps.index(alert.step) + 1
            assert end >= 100
            gain = np.polyfit(np.arange(end - 100, end), reward[end - 100:end], 1)[0] * 99
            assert alert.value == pytest.approx(gain, abs=1e-6) and gain < 0.02
    assert seen >= 2


# ---------------------------------------------------------------------------- collapse lead
@pytest.mark.parametrize("name", of_kind("collapse"))
def test_real_collapse_is_forecast_at_least_20_steps_ahead(name):
    truth = collapse_step(name)
    assert truth is not None
    collapse = [a for a in alerts_of(name) if a.detector == "entropy_collapse"]
    first = collapse[0]
    assert first.severity == "warning" and first.forecast is not None
    assert first.step <= truth - 20, (first.step, truth)
    assert 0 < first.forecast - first.step <= AlertConfig().collapse.forecast_horizon


# ---------------------------------------------------------------------------- evidence in every message
def test_every_real_alert_names_its_signal_value_threshold_and_fix():
    count = 0
    for name in RUNS:
        keys = set(RUNS[name]["columns"]) | {"pass@8-pass@1"}
        for alert in alerts_of(name):
            count += 1
            assert alert.signal in keys and f"signal `{alert.signal}` = " in alert.message, alert.message
            assert f"= {alert.value:.4g}, threshold {alert.threshold:.4g}" in alert.message
            if alert.forecast is not None:
                assert f"forecast step {alert.forecast}" in alert.message
            assert "Fix: " in alert.message and alert.action
    assert count > 30
