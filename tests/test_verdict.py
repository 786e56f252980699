"""The run health verdict on hand-made alert rows: each state, which one wins, recovery."""
from __future__ import annotations

import pandas as pd

from forksight.dashboard.verdict import RECENT_STEPS, verdict, verdicts_of_runs


def alert(detector: str, severity: str, step: int, value=None, threshold=None, forecast=None):
    return {"detector": detector, "severity": severity, "step": step, "value": value,
            "threshold": threshold, "forecast": forecast}


def test_no_alert_is_healthy_and_no_step_is_waiting():
    assert verdict([], {"entropy/mean": 0.9}, 40).state == "healthy"
    assert verdict([], {}, None).label == "waiting"


def test_collapse_forecast_reads_collapsing_with_its_step():
    v = verdict([alert("entropy_collapse", "warning", 25, 0.69, 0.09, forecast=52)],
                {"entropy/mean": 0.6}, 30)
    assert (v.state, v.forecast, v.step) == ("collapsing", 52, 25)
    assert v.label == "collapsing (forecast step 52)"


def test_the_newest_forecast_is_the_one_shown():
    rows = [alert("entropy_collapse", "warning", 25, 0.69, 0.09, forecast=60),
            alert("entropy_collapse", "warning", 35, 0.40, 0.09, forecast=48)]
    assert verdict(rows, {"entropy/mean": 0.3}, 36).forecast == 48


def test_critical_collapse_wins_over_its_earlier_warning_and_names_the_first_crossing():
    rows = [alert("entropy_collapse", "warning", 23, 0.7, 0.09, forecast=37),
            alert("entropy_collapse", "critical", 38, 0.08, 0.09),
            alert("entropy_collapse", "critical", 70, 0.01, 0.09)]
    v = verdict(rows, {"entropy/mean": 0.004}, 99)
    assert (v.state, v.step, v.label) == ("collapsed", 38, "collapsed at step 38")


def test_entropy_back_above_the_floor_is_not_collapsed():
    rows = [alert("entropy_collapse", "critical", 10, 0.08, 0.09)]
    # far past the alert and back above the level it fired at: healthy again
    assert verdict(rows, {"entropy/mean": 0.8}, 10 + RECENT_STEPS + 5).state == "healthy"
    # unknown latest entropy: the alert stands
    assert verdict(rows, {}, 200).state == "collapsed"


def test_old_collapse_warning_holds_while_entropy_stays_as_low():
    rows = [alert("entropy_collapse", "warning", 10, 0.5, 0.09, forecast=90)]
    late = 10 + RECENT_STEPS + 1
    assert verdict(rows, {"entropy/mean": 0.45}, late).state == "collapsing"
    assert verdict(rows, {"entropy/mean": 0.9}, late).state == "healthy"


def test_explosion_and_non_finite_read_exploding_only_while_recent():
    for det in ("entropy_explosion", "non_finite"):
        rows = [alert(det, "critical", 30, 5.0, 4.0)]
        assert verdict(rows, {"entropy/mean": 5.0}, 40).state == "exploding"
        assert verdict(rows, {"entropy/mean": 1.0}, 30 + RECENT_STEPS + 1).state == "healthy"


def test_worst_state_wins():
    stall = alert("stagnation", "warning", 40, 0.001, 0.01)
    warn = alert("entropy_collapse", "warning", 41, 0.6, 0.09, forecast=70)
    boom = alert("entropy_explosion", "warning", 42, 5.0, 4.0)
    assert verdict([stall], {}, 45).state == "stagnating"
    assert verdict([stall, warn], {}, 45).state == "collapsing"
    assert verdict([stall, warn, boom], {}, 45).state == "exploding"


def test_verdicts_of_runs_splits_the_frame_by_run():
    frame = pd.DataFrame([{**alert("entropy_collapse", "critical", 5, 0.01, 0.09), "run_id": "a"},
                          {**alert("stagnation", "warning", 8, 0.0, 0.01), "run_id": "b"}])
    out = verdicts_of_runs(frame, {"a": {"entropy/mean": 0.01}}, {"a": 9, "b": 9, "c": None})
    assert {k: v.state for k, v in out.items()} == {"a": "collapsed", "b": "stagnating",
                                                    "c": "waiting"}


def test_a_stagnation_warning_holds_for_the_detectors_cooldown():
    from forksight.dashboard.verdict import STAGNATION_HOLD_STEPS
    from forksight.monitor.alerts.config import StagnationConfig

    # the detector cannot warn again within its cooldown, so its one warning stands that long
    assert STAGNATION_HOLD_STEPS == StagnationConfig().cooldown == 200
    stall = alert("stagnation", "warning", 122, -0.0656, 0.02)
    # the demo's ICT run: stagnation at 122, an old explosion warning at 225, last step 300
    boom = alert("entropy_explosion", "warning", 225, 0.31, 0.29)
    v = verdict([stall, boom], {"entropy/mean": 0.1}, 300)
    assert (v.state, v.step) == ("stagnating", 122)
    assert verdict([stall], {"entropy/mean": 0.1}, 122 + 200 + 1).state == "healthy"


def test_length_hacking_reads_hacking_above_collapsing_and_below_collapsed():
    from forksight.dashboard.verdict import HACKING_HOLD_STEPS

    hack = alert("length_hacking", "warning", 40, 7.7, 5.4)
    warn = alert("entropy_collapse", "warning", 45, 0.3, 0.05, forecast=66)
    v = verdict([hack, warn], {"entropy/mean": 0.3}, 50)
    assert (v.state, v.step, v.label) == ("hacking", 40, "length hacking at step 40")
    assert verdict([hack, alert("entropy_collapse", "critical", 60, 0.01, 0.05)],
                   {"entropy/mean": 0.01}, 61).state == "collapsed"
    assert verdict([hack], {}, 40 + HACKING_HOLD_STEPS + 1).state == "healthy"


def test_an_inert_kl_term_or_a_one_sided_clip_reads_misconfigured_for_the_rest_of_the_run():
    for det in ("kl_inert", "clip_asymmetry"):
        v = verdict([alert(det, "warning", 20, 0.0, 1e-6)], {"entropy/mean": 1.0}, 2000)
        assert (v.state, v.label) == ("misconfigured", "misconfigured at step 20") and str(20) in v.why
    # a run that is also stagnating reads stagnating: the worse state wins
    rows = [alert("kl_inert", "warning", 20, 0.0, 1e-6), alert("stagnation", "warning", 150, 0.0, 0.02)]
    assert verdict(rows, {"entropy/mean": 1.0}, 160).state == "stagnating"
