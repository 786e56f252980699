"""Why an alert fired, on the run page's charts: the marker sits on the chart of the alert's
signal at the detector's smoothed value, the dashed threshold line at the stored threshold,
the forecast line at the forecast step; stagnation as its fitted trend, non-finite as a line at
its step; every text escaped. Each figure is validated by plotly's go.Figure."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from forksight.dashboard import alert_figures as A
from forksight.dashboard import figures as F
from forksight.dashboard import run_figures as R
from forksight.dashboard import run_view

STEPS = 80


def scalars(steps: int = STEPS) -> pd.DataFrame:
    """A Reader frame: entropy falling, reward flat, pass@1/pass@8, cov and fork fraction."""
    step = np.arange(steps)
    values = {"entropy/mean": 1.0 * np.exp(-step / 40), "renyi2/mean": 0.7 * np.exp(-step / 40),
              "reward/mean": np.full(steps, 0.3), "pass@1": np.full(steps, 0.3),
              "pass@8": np.full(steps, 0.5), "cov/logp_adv": np.full(steps, 0.02),
              "fork/frac": np.linspace(0.2, 0.01, steps), "loss": np.zeros(steps)}
    return pd.concat([pd.DataFrame({"key": k, "step": step, "value": v,
                                    "wall_time": 1.7e9 + 2.0 * step}) for k, v in values.items()],
                     ignore_index=True)


def alert(step: int, detector: str, signal: str, value: float, threshold: float,
          forecast: int | None = None, severity: str = "warning", text: str = "",
          evidence: str | None = None) -> dict:
    """An alerts-table row as the store keeps it: signal and evidence (JSON text) are columns;
    the message is prose nothing here reads."""
    return {"step": step, "detector": detector, "severity": severity, "message": text or detector,
            "action": "act", "value": value, "threshold": threshold, "forecast": forecast,
            "signal": signal, "evidence": evidence}


def frame(*rows: dict) -> pd.DataFrame:
    out = pd.DataFrame(list(rows))
    return out.assign(forecast=out["forecast"].astype("Int64"))   # as the Reader returns it


def markers(fig: dict) -> list[dict]:
    return [t for t in fig["data"] if t["meta"].get("role") == "alerts"]


def hlines(fig: dict) -> list[dict]:
    return [s for s in fig["layout"].get("shapes", []) if s["y0"] == s["y1"]
            and str(s["xref"]).endswith("domain")]


def vlines(fig: dict) -> list[dict]:
    return [s for s in fig["layout"].get("shapes", []) if s["x0"] == s["x1"]
            and (s["yref"] == "paper" or str(s["yref"]).endswith("domain"))]


def test_collapse_alert_draws_its_value_threshold_and_forecast_on_the_entropy_chart():
    collapse = alert(25, "entropy_collapse", "entropy/mean", 0.6973, 0.09052, forecast=60)
    fig = R.entropy_figure(scalars(), alerts=frame(collapse))
    go.Figure(fig)
    [marks] = markers(fig)
    assert (marks["x"], marks["y"]) == ([25], [0.6973])   # the smoothed value, not the raw one
    [threshold] = [s for s in hlines(fig) if s["line"]["dash"] == "dash"]
    assert threshold["y0"] == 0.09052 and threshold["yref"] == "y"
    assert [s["x0"] for s in vlines(fig)] == [60]          # behind the curve: still drawn
    label = [a["text"] for a in fig["layout"]["annotations"] if a.get("y") == 0.09052]
    assert label == ["entropy_collapse warning: threshold 0.09052"]
    # a forecast ahead of the curve is drawn once, by the forecast path
    ahead = R.entropy_figure(scalars(), alerts=frame({**collapse, "forecast": 122}))
    assert [s["x0"] for s in vlines(ahead)] == [122]


def test_each_alert_sits_on_the_chart_that_shows_its_signal():
    alerts = frame(alert(20, "covariance", "cov/logp_adv", 0.016, 0.0),
                   alert(30, "lost_diversity", "pass@8-pass@1", 0.05, 0.08),
                   alert(40, "fork_starvation", "fork/frac", 0.04, 0.05, severity="critical"),
                   alert(50, "lost_diversity", "groups/zero_var_frac", 0.9, 0.6))
    keys = F.keys_of(scalars())
    routed = A.route_alerts(alerts, {"passk": R.passk_signals(keys),
                                     "signals": F.DIAGNOSTIC_KEYS, "custom": ()})
    assert routed["passk"]["step"].tolist() == [30]
    assert routed["signals"]["step"].tolist() == [20, 40]
    assert routed["rest"]["step"].tolist() == [50]          # on no chart: the entropy fallback
    grid = R.scalar_grid(scalars(), F.DIAGNOSTIC_KEYS, alerts=routed["signals"])
    go.Figure(grid)
    logged = [k for k in F.DIAGNOSTIC_KEYS if k in keys]     # an unlogged key gets no panel
    axes = {k: (f"x{i + 1}" if i else "x", f"y{i + 1}" if i else "y")
            for i, k in enumerate(logged)}
    placed = {(t["xaxis"], t["yaxis"]): (t["x"], t["y"]) for t in markers(grid)}
    assert placed == {axes["cov/logp_adv"]: ([20], [0.016]), axes["fork/frac"]: ([40], [0.04])}
    lines = {(s["yref"], s["y0"]) for s in hlines(grid)}
    assert lines == {(axes["cov/logp_adv"][1], 0.0), (axes["fork/frac"][1], 0.05)}
    passk = R.passk_figure(scalars(), alerts=routed["passk"])
    go.Figure(passk)
    [marks] = markers(passk)
    assert (marks["yaxis"], marks["x"], marks["y"]) == ("y2", [30], [0.05])   # the gap chart
    assert [(s["yref"], s["y0"]) for s in hlines(passk)] == [("y2", 0.08)]
    entropy = R.entropy_figure(scalars(), alerts=routed["rest"])
    [fallback] = markers(entropy)
    assert fallback["x"] == [50] and fallback["y"] == [pytest.approx(np.exp(-50 / 40))]
    assert not [s for s in hlines(entropy) if s["line"]["dash"] == "dash"]


def test_stagnation_draws_the_fitted_reward_trend_ending_at_the_alert():
    # the message names other numbers: the figure draws the stored evidence, never the prose
    text = "Stagnation: `reward/mean` gained +0.9 over the last 7 steps (now ≈0.5)."
    stag = alert(180, "stagnation", "reward/mean", 0.004, 0.02, text=text,
                 evidence='{"window": 100, "span": 99, "fitted": 0.312, "slope": 4.04e-05}')
    fig = R.passk_figure(scalars(200), alerts=frame(stag))
    go.Figure(fig)
    [trend] = [t for t in fig["data"] if t["meta"].get("role") == "trend"]
    assert trend["x"] == [81, 180] and trend["y"][1] == pytest.approx(0.312)
    slope = (trend["y"][1] - trend["y"][0]) / (trend["x"][1] - trend["x"][0])
    assert slope == pytest.approx(0.004 / 99) == trend["meta"]["slope"]
    assert markers(fig)[0]["x"] == [180] and not hlines(fig)   # a gain is not a level


def test_stagnation_without_a_stored_window_is_a_marker_at_the_reward_level():
    # a row whose evidence lacks the fitted window (an old file whose prose named none)
    stag = alert(180, "stagnation", "reward/mean", 0.004, 0.02,
                 text="over the last 100 steps (now ≈0.312)")
    fig = R.passk_figure(scalars(200), alerts=frame(stag))
    go.Figure(fig)
    assert not [t for t in fig["data"] if t["meta"].get("role") == "trend"] and not hlines(fig)
    [marks] = markers(fig)
    assert marks["x"] == [180] and marks["y"] == [pytest.approx(0.3)]     # the drawn reward


def test_non_finite_marks_the_named_key_at_its_step():
    bad = alert(33, "non_finite", "loss", 1.0, 0.0, severity="critical",
                text="Non-finite statistics at step 33: loss=nan.")
    fig = R.scalar_grid(scalars(), ["fork/frac", "loss"], alerts=frame(bad))
    go.Figure(fig)
    [marks] = markers(fig)
    assert (marks["xaxis"], marks["x"], marks["y"]) == ("x2", [33], [0.0])
    assert [(s["xref"], s["x0"]) for s in vlines(fig)] == [("x2", 33)] and not hlines(fig)


def test_forecast_on_a_wall_time_axis_is_placed_at_the_runs_pace():
    fig = R.entropy_figure(scalars(), x_axis="wall", alerts=frame(
        alert(25, "entropy_collapse", "entropy/mean", 0.7, 0.09, forecast=50)))
    [line] = vlines(fig)
    assert pd.Timestamp(line["x0"]) == pd.to_datetime(1.7e9 + 2.0 * 50, unit="s")


def test_alert_text_never_renders_as_markup():
    payload = "<script>alert(1)</script> & <img src=x>"
    hostile = alert(25, "entropy_collapse<b>", "entropy/mean", 0.7, 0.09, text=payload)
    fig = R.entropy_figure(scalars(), alerts=frame(hostile))
    hover = markers(fig)[0]["hovertext"][0]
    labels = " ".join(a["text"] for a in fig["layout"]["annotations"])
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;img src=x&gt;" in hover.replace(
        "<br>", " ")
    assert "<script" not in hover and "<img" not in hover
    assert "entropy_collapse&lt;b&gt; warning" in labels and "<b>" not in labels


class _Reader:
    """What tick_run reads: no new steps, and the alerts stored so far."""

    def __init__(self, alerts: pd.DataFrame):
        self.alerts = alerts

    def read_scalars(self, *a, **k):
        return scalars(0)

    def read_histograms(self, *a, **k):
        return pd.DataFrame(columns=["step", "bin_lo", "bin_hi", "count"])

    def read_alerts(self, run_id):
        return self.alerts

    def run_progress(self, run_id):
        return 79, len(self.alerts)


def test_a_new_alert_redraws_the_run_page_so_its_lines_appear():
    old = frame(alert(20, "covariance", "cov/logp_adv", 0.016, 0.0))
    state = {"run_id": "r", "last_step": 79, "last_hist_step": 79, "alerts_seen": 1,
             "forecast": None, "keys": [], "plans": {}}
    controls = run_view.Controls.from_inputs(0.0, "step", [], 1000, [])
    assert not run_view.tick_run(_Reader(old), state, controls)["redraw"]
    new = pd.concat([old, frame(alert(30, "fork_starvation", "fork/frac", 0.04, 0.05))])
    out = run_view.tick_run(_Reader(new), state, controls)
    assert out["redraw"] and out["state"]["alerts_seen"] == 2
