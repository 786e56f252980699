"""The failure classes beyond entropy, each on a real run of the bundled trainer made to show it
(cached by bench/alerts_breadth.py in tests/data): its detector fires there, and no detector fires
on a scenario made for another; the new detectors stay quiet on every healthy real run.
All-correct groups, reward–eval divergence, reward composition and gradient spikes are shown on
real TRL runs made for them (tests/test_doctor.py, tests/data/trl_logs); here also hand-worked
series for those detectors' rules."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from forksight.monitor.alerts.breadth import REFERENCES
from forksight.monitor.alerts.hub import AlertConfig, AlertMonitor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import alerts_breadth  # noqa: E402
import alerts_real  # noqa: E402

pytestmark = pytest.mark.trajectory   # asserts on trained runs: `make test-kernels` runs it under each CPU kernel level

SCENARIOS = json.loads((ROOT / "tests" / "data" / "alerts_breadth_runs.json").read_text())
REAL = json.loads((ROOT / "tests" / "data" / "alerts_real_runs.json").read_text())
NEW = {"degenerate_groups", "truncation", "clip_saturation", "kl_drift", "gradient", "reward_eval_divergence",
       "reward_composition"}
OWN = {"all_correct": "degenerate_groups", "all_wrong": "degenerate_groups", "truncation": "truncation",
       "clip": "clip_saturation", "kl_drift": "kl_drift"}


def alerts_of(run: dict, config: AlertConfig | None = None):
    monitor = AlertMonitor(config, vocab_size=run["vocab_size"])
    rows = alerts_real._rows(run["columns"])
    return [a for step, row in zip(run["steps"], rows) for a in monitor.observe(step, row)]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_scenario_raises_its_own_detector_and_no_other(name):
    run = SCENARIOS[name]
    fired = alerts_of(run)
    assert OWN[run["kind"]] in {a.detector for a in fired}, [a.message for a in fired]
    allowed = alerts_breadth.allowed(run, alerts_breadth.EXPECTED)
    assert {a.detector for a in fired} <= allowed, [a.message for a in fired if a.detector not in allowed]
    for a in fired:
        if a.detector in NEW:
            assert a.evidence["reference"] == REFERENCES[a.detector] and a.action and "Fix: " in a.message


def test_all_correct_and_all_wrong_get_opposite_fixes():
    """All-wrong: the bundled trainer's scenario; all-correct: TRL's real lr 1e-2 run, whose reward
    is 1.0 for every sample from step ~35 (tests/data/trl_logs/collapse: the logged reward says so)."""
    from forksight.compose.doctor import diagnose

    [wrong, *_] = [a for a in alerts_of(SCENARIOS["allwrong-warm-s0"]) if a.detector == "degenerate_groups"]
    assert wrong.evidence["regime"] == "too_hard" and "too hard" in wrong.action
    trl = diagnose(str(ROOT / "tests" / "data" / "trl_logs" / "collapse" / "trainer_state.json"))
    [right, *_] = [a for a in trl.alerts if a["detector"] == "degenerate_groups"]
    assert right["evidence"]["regime"] == "too_easy" and "too easy" in right["action"]
    solved = [r["reward/mean"] for s, r in zip(trl.steps, trl.rows) if s <= right["step"]][-10:]
    assert np.mean(solved) >= AlertConfig().degenerate.saturated_pass


@pytest.mark.parametrize("name", sorted(REAL))
def test_new_detectors_stay_within_what_the_real_runs_show(name):
    """On the collapse / explosion / healthy / no-signal runs the new detectors add nothing, except
    degenerate groups where the log shows a run that starts all-wrong or ends solved."""
    run = REAL[name]
    fired = {a.detector for a in alerts_of(run)} & NEW
    extra = {"degenerate_groups"} if (alerts_breadth.starts_all_wrong(run["columns"])
                                      or alerts_breadth.ends_solved(run["columns"])) else set()
    assert fired <= extra, (name, fired)


def test_truncation_level_is_the_smoothed_share_the_log_shows():
    run = next(r for r in SCENARIOS.values() if r["kind"] == "truncation")
    [first, *_] = [a for a in alerts_of(run) if a.detector == "truncation"]
    share = np.array(run["columns"]["length/clip_frac"], dtype=np.float64)
    i = run["steps"].index(first.step)
    beta = AlertConfig().truncation.smoothing
    weights = beta ** np.arange(i, -1, -1)                       # debiased EMA, written out
    assert first.value == pytest.approx(float((weights * share[:i + 1]).sum() / weights.sum()), rel=1e-9)


# ---------------------------------------------------------------------------- hand-worked series
def feed(rows: list[dict], config: AlertConfig | None = None):
    monitor = AlertMonitor(config)
    return [a for step, row in enumerate(rows) for a in monitor.observe(step, row)]


def test_reward_rising_while_held_out_score_falls_is_divergence():
    # reward climbs 0.2 → 0.8 over 100 steps; held-out pass@1 evaluated every 10 steps falls 0.5 → 0.3
    rows = [{"reward/mean": 0.2 + 0.006 * s, **({"eval/pass@1": 0.5 - 0.002 * s} if s % 10 == 0 else {})}
            for s in range(101)]
    fired = [a for a in feed(rows) if a.detector == "reward_eval_divergence"]
    assert fired and fired[0].severity == "critical" and fired[0].signal == "eval/pass@1"
    # the fitted held-out gain over the window, by hand: slope −0.002/step over (evals−1)·10 steps
    window = AlertConfig().divergence.evals
    assert fired[0].value == pytest.approx(-0.002 * 10 * (min(window, fired[0].step // 10 + 1) - 1), rel=1e-6)
    # both rising together: quiet
    together = [{"reward/mean": 0.2 + 0.006 * s, **({"eval/pass@1": 0.3 + 0.004 * s} if s % 10 == 0 else {})}
                for s in range(101)]
    assert not [a for a in feed(together) if a.detector == "reward_eval_divergence"]


def test_a_constant_component_beside_a_moving_one_is_flagged():
    rng = np.random.default_rng(0)
    rows = [{"rewards/format/mean": float(np.clip(0.5 + 0.01 * s + rng.normal(0, 0.05), 0, 1)),
             "rewards/correct/mean": 0.0, "reward/mean": 0.5} for s in range(60)]
    [alert] = [a for a in feed(rows) if a.detector == "reward_composition"]
    assert alert.signal == "rewards/format/mean" and alert.evidence["dead"] == ["rewards/correct/mean"]
    both = [{"rewards/format/mean": float(rng.normal(0.5, 0.05)), "rewards/correct/mean": float(rng.normal(0.3, 0.05))}
            for _ in range(60)]
    assert not [a for a in feed(both) if a.detector == "reward_composition"]


def test_kl_exactly_zero_is_no_kl_term_and_stays_quiet():
    rows = [{"kl": 0.0, "reward/mean": 0.1} for _ in range(200)]
    assert not [a for a in feed(rows) if a.detector == "kl_drift"]
    # the same flat reward with KL growing exponentially: past `high` and accelerating (the recent
    # 20-step slope e ≈ 2.7 times the previous one) warns; past `extreme` with reward stalled is critical
    growing = [{"kl": 0.01 * float(np.exp(s / 20)), "reward/mean": 0.1} for s in range(160)]
    fired = [a for a in feed(growing) if a.detector == "kl_drift"]
    assert fired[0].severity == "warning" and fired[0].evidence["accelerating"]
    assert any(a.severity == "critical" and a.value >= AlertConfig().kl_drift.extreme for a in fired)


def test_gradient_spikes_warn_and_degenerate_zero_updates_do_not():
    rng = np.random.default_rng(1)
    norms = [float(np.exp(rng.normal(0.0, 0.2))) for _ in range(120)]   # ≈ 1, geometric spread 20%
    for s in (40, 55, 70):
        norms[s] = 12.0                                                 # 12× the running level
    fired = [a for a in feed([{"grad_norm": g} for g in norms]) if a.detector == "gradient"]
    assert [(a.step, a.evidence["kind"], a.evidence["spikes"]) for a in fired] == [(70, "spikes", [40, 55, 70])]
    # exactly-zero updates because every group agrees: degenerate_groups' case, not the optimiser's
    zero = [{"grad_norm": 0.0 if s > 20 else 1.0, "groups/zero_var_frac": 1.0 if s > 20 else 0.2}
            for s in range(120)]
    assert not [a for a in feed(zero) if a.detector == "gradient"]
    # the same zeros while groups still disagree: the loss mask or the advantage is broken
    broken = [{"grad_norm": 0.0 if s > 20 else 1.0, "groups/zero_var_frac": 0.2} for s in range(120)]
    [alert] = [a for a in feed(broken) if a.detector == "gradient"]
    assert alert.evidence["kind"] in ("zero", "vanishing")
