"""The compare figure: health in the legend, a collapsed run faded and listed last, alert
markers and the forecast drawn, all-zero panels hidden and named, log y, picked metrics."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from forksight.dashboard import compare_figures as C
from forksight.dashboard.verdict import Verdict


def scalars(values: dict[str, list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"key": k, "step": s, "value": v, "wall_time": 1000.0 + s}
                         for k, vs in values.items() for s, v in enumerate(vs)])


def run(rid: str, strategy: str, entropy, reward, verdict=None, alerts=None, pass1=None):
    vals = {"entropy/mean": entropy, "reward/mean": reward,
            "pass@1": pass1 if pass1 is not None else [0.0] * len(entropy)}
    return {"run_id": rid, "label": rid, "strategy": strategy, "scalars": scalars(vals),
            "verdict": verdict, "alerts": alerts}


def lines(fig):
    return [t for t in fig["data"] if t["meta"]["role"] == "compare"]


def test_a_collapsed_run_is_faded_listed_last_and_says_so_in_the_legend():
    collapsed = run("grpo", "all", list(np.linspace(1, 0.01, 20)), [0.7] * 20,
                    Verdict("collapsed", step=12))
    healthy = run("ict", "ict", [0.9] * 20, [0.01] * 20, Verdict("healthy"))
    fig = C.compare_figure([collapsed, healthy], panels=["entropy/mean", "reward/mean"])
    go.Figure(fig)
    legend = [t["name"] for t in lines(fig) if t["showlegend"]]
    assert legend == ["ict (ict) · healthy", "grpo (all) · collapsed at step 12"]
    opacity = {t["meta"]["run"]: t["opacity"] for t in lines(fig)}
    assert opacity == {"grpo": 0.45, "ict": 1.0}
    # where it was lost, on every panel: its reward past that line is no win
    lost = [(s["xref"], s["x0"]) for s in fig["layout"]["shapes"]
            if s.get("name") == "collapsed:grpo"]
    assert lost == [("x", 12), ("x2", 12)]


def test_all_zero_and_unlogged_panels_are_hidden_and_named():
    a = run("a", "all", [0.5] * 10, [0.2] * 10)            # pass@1 all zero
    fig = C.compare_figure([a], panels=["entropy/mean", "pass@1", "kl"])
    assert {t["meta"]["key"] for t in lines(fig)} == {"entropy/mean"}
    assert "pass@1, kl" in fig["layout"]["title"]["text"]
    none = C.compare_figure([a], panels=["pass@1"])
    assert none["data"] == [] and "pass@1" in none["layout"]["annotations"][0]["text"]
    fresh = {**a, "scalars": a["scalars"].iloc[:0]}
    wait = C.compare_figure([fresh], panels=["entropy/mean"])
    assert "waiting for the first step" in wait["layout"]["annotations"][0]["text"]


def test_alerts_are_markers_on_their_signals_panel_and_the_forecast_a_line():
    alerts = pd.DataFrame([
        {"step": 5, "detector": "entropy_collapse", "severity": "warning", "value": 0.6,
         "threshold": 0.09, "forecast": 15, "action": "", "signal": "entropy/mean",
         "message": "forecast"},
        {"step": 8, "detector": "stagnation", "severity": "warning", "value": 0.0,
         "threshold": 0.01, "forecast": None, "action": "", "signal": "reward/mean",
         "message": "flat"}])
    entropy = list(np.linspace(1, 0.3, 10))
    r = run("a", "all", entropy, [0.1 * i for i in range(10)],
            Verdict("collapsing", step=5, forecast=15), alerts)
    fig = C.compare_figure([r], panels=["entropy/mean", "reward/mean"])
    marks = {t["yaxis"]: t for t in fig["data"] if t["meta"]["role"] == "alerts"}
    assert (marks["y"]["x"], marks["y"]["y"]) == ([5], [entropy[5]])      # entropy panel
    assert (marks["y2"]["x"], marks["y2"]["y"]) == ([8], [0.8])            # reward panel
    [fc] = [s for s in fig["layout"]["shapes"] if s.get("name", "").startswith("forecast")]
    assert (fc["x0"], fc["xref"]) == (15, "x")


def test_log_y_drops_non_positive_values_and_wall_time_moves_every_panel():
    r = run("a", "all", [1.0, 0.0, 0.1], [0.0, 0.5, 1.0])
    fig = C.compare_figure([r], panels=["entropy/mean", "reward/mean"], log_y=True,
                           x_axis="wall")
    ent = next(t for t in lines(fig) if t["meta"]["key"] == "entropy/mean")
    assert ent["y"] == [1.0, None, 0.1]
    assert fig["layout"]["yaxis"]["type"] == fig["layout"]["yaxis2"]["type"] == "log"
    assert fig["layout"]["xaxis"]["type"] == fig["layout"]["xaxis2"]["type"] == "date"
    assert fig["layout"]["xaxis2"]["title"]["text"] == "wall time (UTC)"


def test_the_gap_panel_is_pass_at_g_minus_pass_at_1():
    vals = {"entropy/mean": [1.0] * 4, "pass@1": [0.1, 0.2, 0.3, 0.4],
            "pass@4": [0.5, 0.5, 0.6, 0.9]}
    r = {"run_id": "a", "label": "a", "strategy": "all", "scalars": scalars(vals)}
    fig = C.compare_figure([r], panels=["gap"])
    [gap] = lines(fig)
    assert np.allclose(gap["y"], [0.4, 0.3, 0.3, 0.5])
