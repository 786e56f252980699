"""Legible charts (issue 22): threshold labels apart, honest heatmap bins up to the real max,
pass@k colours told apart, readable log and right-axis ticks, axis titles, wall time on every
chart, a focus line at a linked step."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from forksight.base.constants import ENTROPY_EDGES
from forksight.dashboard import alert_figures as A
from forksight.dashboard import figures as F
from forksight.dashboard import run_figures as R


def frame(steps: int, keys=("entropy/mean", "js/mean", "reward/mean", "pass@1", "pass@2",
                            "pass@3", "pass@4", "pass@5", "pass@6", "pass@7", "pass@8")):
    g = np.random.default_rng(0)
    return pd.DataFrame([{"key": k, "step": s, "value": float(g.uniform(0.001, 1)),
                          "wall_time": 1_700_000_000.0 + 2.0 * s}
                         for k in keys for s in range(steps)])


def binned(values_per_step: list[np.ndarray]) -> pd.DataFrame:
    """Histogram rows over ENTROPY_EDGES as producers bin them (past the end: the last bin)."""
    rows, nb = [], len(ENTROPY_EDGES) - 1
    for step, values in enumerate(values_per_step):
        idx = np.clip(np.searchsorted(ENTROPY_EDGES, values, side="right") - 1, 0, nb - 1)
        counts = np.bincount(idx, minlength=nb)
        rows += [{"step": step, "bin_lo": ENTROPY_EDGES[i], "bin_hi": ENTROPY_EDGES[i + 1],
                  "count": float(c)} for i, c in enumerate(counts) if c]
    return pd.DataFrame(rows)


def test_warning_and_critical_threshold_labels_sit_apart():
    alerts = pd.DataFrame([
        {"step": 40, "detector": "fork_starvation", "severity": "warning", "value": 0.04,
         "threshold": 0.05, "forecast": None, "action": "", "signal": "fork/frac",
         "message": "x [signal `fork/frac` = 0.04, threshold 0.05]"},
        {"step": 50, "detector": "fork_starvation", "severity": "critical", "value": 0.009,
         "threshold": 0.01, "forecast": None, "action": "", "signal": "fork/frac",
         "message": "x [signal `fork/frac` = 0.009, threshold 0.01]"}])
    fig = R.scalar_grid(frame(60, ("fork/frac",)), ["fork/frac"], alerts=alerts)
    notes = {n["y"]: n for n in fig["layout"]["annotations"] if "threshold" in n["text"]}
    warn, crit = notes[0.05], notes[0.01]
    # on opposite sides and each away from the other's line: they cannot overlap
    assert (warn["xanchor"], warn["yanchor"]) == ("right", "bottom")
    assert (crit["xanchor"], crit["yanchor"]) == ("left", "top")


def test_heatmap_top_bin_covers_the_real_max_and_ticks_name_whole_nats():
    g = np.random.default_rng(1)
    hist = binned([np.concatenate([g.exponential(0.5, 500), [5.7]]) for _ in range(3)])
    fig = R.entropy_heatmap(hist)
    go.Figure(fig)
    labels, ax = fig["data"][0]["y"], fig["layout"]["yaxis"]
    texts = dict(zip(ax["ticktext"], ax["tickvals"]))
    hot = next(lab for lab in labels if lab.startswith("5.5"))        # the 5.7-nat token's bin
    # 5.7 sits between the tick 4 and the top bin's tick, which names its range: it cannot
    # read as 4.6 (the old top tick was 4 and the bins above it were unlabelled)
    assert labels.index(texts["4"]) < labels.index(hot) <= labels.index(ax["tickvals"][-1])
    assert {"1", "2", "3", "4", "0.672"} <= set(texts)
    top_lo, top_hi = (float(x) for x in ax["ticktext"][-1].split("–"))
    assert top_lo <= 5.7 < top_hi             # the top drawn bin holds the real max


def test_values_past_the_last_edge_show_in_an_overflow_bin_named_as_such():
    hist = binned([np.array([0.5, 30.0])])
    fig = R.entropy_heatmap(hist)
    assert fig["data"][0]["y"][-1] == f"≥ {ENTROPY_EDGES[-2]:g}"
    z = np.array(fig["data"][0]["z"])
    assert z[0, -1] == 0.5                   # the 30-nat value counted there, not dropped


def test_pass_at_k_lines_get_distinct_colours():
    fig = R.passk_figure(frame(10))
    colors = {t["meta"]["key"]: t["line"]["color"] for t in fig["data"]
              if t.get("meta", {}).get("key", "").startswith("pass@")}
    assert len(colors) == 8 and len(set(colors.values())) == 8


def test_log_axes_print_powers_and_the_js_axis_its_own_round_ticks():
    fig = R.entropy_figure(frame(20), log_y=True)
    assert fig["layout"]["yaxis"]["exponentformat"] == "power"
    assert fig["layout"]["yaxis2"]["exponentformat"] == "power"
    lin = R.entropy_figure(frame(20))
    assert lin["layout"]["yaxis2"]["tickmode"] == "auto"
    grid = R.scalar_grid(frame(20, ("loss",)), ["loss"], log_y=True)
    assert grid["layout"]["yaxis"]["exponentformat"] == "power"


def test_every_run_chart_names_its_x_axis_and_follows_wall_time():
    scal = frame(12)
    hist = binned([np.array([0.2, 1.0, 2.0])] * 12)
    for x_axis, title in (("step", "step"), ("wall", "wall time (UTC)")):
        walls = F.series(scal, "entropy/mean")
        figs = [R.entropy_figure(scal, x_axis=x_axis), R.passk_figure(scal, x_axis=x_axis),
                R.entropy_heatmap(hist, x_axis=x_axis, walls=walls),
                R.scalar_grid(scal, ["reward/mean"], x_axis=x_axis)]
        for fig in figs:
            assert fig["layout"]["xaxis"]["title"]["text"] == title
    heat = R.entropy_heatmap(hist, x_axis="wall", walls=F.series(scal, "entropy/mean"))
    assert heat["layout"]["xaxis"]["type"] == "date"
    assert heat["data"][0]["x"] == F.x_values(F.series(scal, "entropy/mean"), "wall")


def test_steps_without_wall_time_are_placed_at_the_runs_pace():
    rows = pd.DataFrame({"step": [0, 10], "wall_time": [100.0, 120.0]})
    got = F.steps_x([0, 5, 20], rows, "wall")
    assert got == F.wall_strings(pd.Series([100.0, 110.0, 140.0]))


def test_focus_line_marks_the_linked_step_on_every_panel():
    grid = R.scalar_grid(frame(20, ("loss", "kl")), ["loss", "kl"])
    out = F.with_focus(grid, 7)
    focus = [s for s in out["layout"]["shapes"] if s.get("name") == "focus"]
    assert sorted(s["xref"] for s in focus) == ["x", "x2"] and {s["x0"] for s in focus} == {7}
    assert F.with_focus(grid, None) is grid and F.with_focus(grid, 7, "wall") is grid
    assert A.escape_markup("<b>") == "&lt;b&gt;"


def test_on_log_axes_labels_sit_at_their_lines_and_a_flat_series_stays_in_view():
    alerts = pd.DataFrame([{"step": 5, "detector": "entropy_collapse", "severity": "warning",
                            "value": 0.5, "threshold": 0.09, "forecast": None, "action": "",
                            "signal": "entropy/mean", "message": "m"}])
    fig = R.entropy_figure(frame(20), alerts=alerts, log_y=True)
    [note] = [n for n in fig["layout"]["annotations"] if "threshold 0.09" in n["text"]]
    assert np.isclose(note["y"], np.log10(0.09))        # plotly places it by log10 there
    [line] = [s for s in fig["layout"]["shapes"] if s.get("y0") == 0.09]
    assert line["y1"] == 0.09                           # a shape takes the value itself
    flat = R.scalar_grid(frame(10, ("selected/frac",)).assign(value=1.0), ["selected/frac"],
                         log_y=True)
    lo, hi = flat["layout"]["yaxis"]["range"]
    assert lo < 0 < hi                                  # log10(1) = 0 inside the range
