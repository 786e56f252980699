"""The dashboard's pure pieces: figure builders, the live Patch, token spans (alerts drawn on
their charts: test_alert_figures.py).

Each test checks a figure against the DataFrame it was built from (or a hand computation),
and every figure is validated by plotly's own go.Figure.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from forksight.dashboard import compare_figures as C
from forksight.dashboard import figures as F
from forksight.dashboard import run_figures as R
from forksight.dashboard.live import extend_patch, trace_plan
from forksight.dashboard.tokens_view import pick_sample, token_spans

KEYS = ("entropy/mean", "entropy/p20", "entropy/p80", "renyi2/mean", "js/mean", "reward/mean",
        "pass@1", "pass@4", "pass@8", "loss", "fork/frac")


def scalars_frame(steps: int, seed: int = 0, keys=KEYS) -> pd.DataFrame:
    """The Reader's read_scalars shape: (key, step, value, wall_time), random values."""
    rng = np.random.default_rng(seed)
    parts = [pd.DataFrame({"key": k, "step": np.arange(steps), "value": rng.random(steps),
                           "wall_time": 1.7e9 + 0.5 * np.arange(steps)}) for k in keys]
    return pd.concat(parts, ignore_index=True)


def trace_for(fig: dict, key: str, role: str) -> dict:
    found = [t for t in fig["data"] if (t.get("meta") or {}).get("key") == key
             and t["meta"].get("role") == role]
    assert len(found) == 1, f"expected one {role} trace for {key}, found {len(found)}"
    return found[0]


def apply_patch(fig: dict, patch) -> dict:
    """Apply a dash Patch's operations to a figure dict, as the browser does."""
    out = copy.deepcopy(fig)
    for op in patch.to_plotly_json()["operations"]:
        *path, last = op["location"]
        target = out
        for part in path:
            target = target[part]
        value = op["params"]["value"]
        if op["operation"] == "Extend":
            target[last].extend(value)
        elif op["operation"] == "Append":
            target[last].append(value)
        elif op["operation"] == "Assign":
            target[last] = value
        else:
            raise AssertionError(f"unexpected patch operation {op['operation']}")
    return out


# ---------------------------------------------------------------- numbers
def test_ema_debiased_matches_a_hand_computation():
    # beta 0.5 on 1, 2, 3: acc 0.5, 1.25, 2.125; debiased by 1 - 0.5^t
    smoothed, acc, count = F.ema_debiased([1.0, 2.0, 3.0], 0.5)
    assert smoothed == pytest.approx([0.5 / 0.5, 1.25 / 0.75, 2.125 / 0.875])
    assert (acc, count) == (pytest.approx(2.125), 3)
    # resuming from the returned state gives what one pass over everything gives
    head, acc, count = F.ema_debiased([1.0, 2.0], 0.5)
    tail, _, _ = F.ema_debiased([3.0], 0.5, acc, count)
    assert tail[0] == pytest.approx(smoothed[2])


def test_ema_skips_nan_and_beta_zero_is_identity():
    smoothed, _, count = F.ema_debiased([2.0, math.nan, 4.0], 0.9)
    assert math.isnan(smoothed[1]) and count == 2
    assert smoothed[2] == pytest.approx((0.9 * 0.2 + 0.4) / (1 - 0.81))
    assert F.ema_debiased([3.0, 1.0], 0.0)[0].tolist() == [3.0, 1.0]


@pytest.mark.parametrize("n,max_points", [(10_007, 1000), (5, 1000), (2, 2), (999, 3)])
def test_downsampling_keeps_both_endpoints_and_the_bound(n, max_points):
    idx = F.downsample_indices(n, max_points)
    assert idx[0] == 0 and idx[-1] == n - 1
    assert len(idx) <= max_points and np.all(np.diff(idx) > 0)


def test_series_downsampled_keeps_first_and_last_step():
    rows = F.series(scalars_frame(5000), "entropy/mean", max_points=300)
    assert rows["step"].iloc[0] == 0 and rows["step"].iloc[-1] == 4999 and len(rows) <= 300


def test_sparkline_follows_the_values():
    line = F.sparkline([0, 1, 2, 3, 4, 5, 6, 7])
    assert line == F.SPARK_CHARS and F.sparkline([]) == ""
    # from a floor of 0, a nearly flat run stays high and flat; min..max magnifies noise
    assert set(F.sparkline([1.0, 1.02, 0.99, 1.01])) == {"█"}
    assert F.sparkline([1.0, 1.02, 0.99], floor=None)[2] == "▁"


# ---------------------------------------------------------------- run page figures
def test_entropy_figure_holds_the_input_values():
    scal = scalars_frame(200)
    fig = R.entropy_figure(scal, smoothing=0.0, vocab_size=3)
    go.Figure(fig)                          # plotly accepts it
    for key in ("entropy/mean", "renyi2/mean", "js/mean", "entropy/p20", "entropy/p80"):
        rows = scal[scal.key == key].sort_values("step")
        trace = trace_for(fig, key, "raw")
        assert trace["x"] == rows["step"].tolist()
        assert np.allclose(trace["y"], rows["value"].to_numpy())
    assert trace_for(fig, "js/mean", "raw")["yaxis"] == "y2"       # JS on its own axis
    ys = sorted(s["y0"] for s in fig["layout"]["shapes"] if s["yref"] == "y")
    assert ys == pytest.approx([F.FORK_THRESHOLD, math.log(3)])   # fork and log|V| lines


def test_smoothed_trace_is_the_debiased_ema_of_the_raw_one():
    scal = scalars_frame(100)
    fig = R.entropy_figure(scal, smoothing=0.8)
    raw = scal[scal.key == "entropy/mean"].sort_values("step")["value"].to_numpy()
    want = F.ema_debiased(raw, 0.8)[0]
    assert np.allclose(trace_for(fig, "entropy/mean", "smooth")["y"], want)
    assert trace_for(fig, "entropy/mean", "raw")["opacity"] < 0.5   # raw stays, faint


def test_scattergl_only_past_the_threshold():
    small = R.entropy_figure(scalars_frame(100))
    big = R.entropy_figure(scalars_frame(F.SCATTERGL_AFTER // 3))
    assert {t["type"] for t in small["data"] if t["meta"]["role"] == "raw"} == {"scatter"}
    assert {t["type"] for t in big["data"] if t["meta"]["role"] == "raw"} == {"scattergl"}
    go.Figure(big)


def test_wall_time_axis_uses_the_stored_times():
    scal = scalars_frame(10)
    fig = R.entropy_figure(scal, x_axis="wall")
    x = pd.to_datetime(trace_for(fig, "entropy/mean", "raw")["x"])
    assert (x - pd.Timestamp(0)).total_seconds().tolist() == pytest.approx(
        (1.7e9 + 0.5 * np.arange(10)).tolist())
    assert fig["layout"]["xaxis"]["type"] == "date"


def test_histogram_heatmap_shows_each_steps_share_per_bin():
    hist = pd.DataFrame({"step": [0, 0, 0, 5, 5, 5], "bin_lo": [0.0, 0.1, 1.0] * 2,
                         "bin_hi": [0.1, 1.0, 2.0] * 2, "count": [1, 1, 2, 6, 2, 0]})
    fig = R.entropy_heatmap(hist)
    go.Figure(fig)
    z = np.array(fig["data"][0]["z"])
    assert fig["data"][0]["x"] == [0, 5]
    assert np.allclose(z, [[0.25, 0.25, 0.5], [0.75, 0.25, 0.0]])
    # the median token's bin: half the mass reached in bin 1 at step 0, in bin 0 at step 5
    labels = R.bin_labels([0.0, 0.1, 1.0], [0.1, 1.0, 2.0])
    assert fig["data"][1]["y"] == [labels[1], labels[0]]


def test_passk_figure_orders_k_and_draws_the_gap():
    scal = scalars_frame(50)
    fig = R.passk_figure(scal)
    go.Figure(fig)
    names = [t["meta"]["key"] for t in fig["data"] if t["meta"]["role"] == "raw"]
    assert names[1:4] == ["pass@1", "pass@4", "pass@8"]
    gap = trace_for(fig, "gap", "raw")
    p1 = scal[scal.key == "pass@1"].sort_values("step")["value"].to_numpy()
    p8 = scal[scal.key == "pass@8"].sort_values("step")["value"].to_numpy()
    assert np.allclose(gap["y"], p8 - p1)


def test_scalar_grid_has_one_panel_per_logged_key_and_names_missing_ones_in_its_title():
    fig = R.scalar_grid(scalars_frame(30), ["loss", "fork/frac", "kl"], smoothing=0.0)
    go.Figure(fig)
    # no empty axes for a signal the run does not log: the title names it instead
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["loss", "fork/frac"]
    assert len({t["xaxis"] for t in fig["data"]}) == 2
    assert "not logged: kl" in fig["layout"]["title"]["text"]
    none = R.scalar_grid(scalars_frame(30), ["kl"])
    assert none["data"] == [] and "none logged" in none["layout"]["annotations"][0]["text"]


def test_compare_colours_by_strategy():
    runs = [{"run_id": r, "label": r, "strategy": s, "scalars": scalars_frame(20, seed=i)}
            for i, (r, s) in enumerate([("a", "all"), ("b", "fork"), ("c", "fork")])]
    fig = C.compare_figure(runs)
    go.Figure(fig)
    colours = {t["meta"]["run"]: t["line"]["color"] for t in fig["data"]
               if t["meta"]["role"] == "compare"}
    assert colours["b"] == colours["c"] == F.strategy_color("fork") != colours["a"]


# ---------------------------------------------------------------- live patch
@pytest.mark.parametrize("smoothing", [0.0, 0.7])
def test_live_patch_appends_exactly_what_a_full_redraw_shows(smoothing):
    scal = scalars_frame(90)
    first = scal[scal.step < 60]
    for build in (lambda s: R.entropy_figure(s, smoothing=smoothing),
                  lambda s: R.passk_figure(s, smoothing=smoothing),
                  lambda s: R.scalar_grid(s, ["loss", "fork/frac"], smoothing=smoothing)):
        drawn = build(first)
        patch, plan = extend_patch(trace_plan(drawn), scal[scal.step >= 55], last_step=59,
                                   smoothing=smoothing, x_axis="step")
        grown, full = apply_patch(drawn, patch), build(scal)
        for got, want in zip(grown["data"], full["data"]):
            if want["meta"]["role"] in ("raw", "smooth"):
                assert got["x"] == want["x"]
                assert np.allclose(got["y"], want["y"])
        # the plan's EMA state moved on: a second tick with nothing new changes nothing
        assert extend_patch(plan, scal, last_step=89, smoothing=smoothing,
                            x_axis="step")[0] is None


def test_live_patch_extends_the_heatmap():
    edges = [0.0, 0.1, 1.0, 2.0]
    hist = pd.DataFrame({"step": np.repeat([0, 1, 2], 3), "bin_lo": edges[:-1] * 3,
                         "bin_hi": edges[1:] * 3, "count": [1, 1, 2, 3, 1, 0, 0, 0, 4]})
    drawn = R.entropy_heatmap(hist[hist.step < 2])
    patch, _ = extend_patch(trace_plan(drawn), scalars_frame(0), last_step=1, smoothing=0,
                            x_axis="step", hist=hist)
    grown = apply_patch(drawn, patch)
    assert grown["data"][0]["x"] == [0, 1, 2]
    assert grown["data"][0]["z"][2] == pytest.approx([0.0, 0.0, 1.0])
    assert grown["data"][1]["y"] == R.entropy_heatmap(hist)["data"][1]["y"]


# ---------------------------------------------------------------- tokens
def test_token_spans_carry_text_marks_and_every_number():
    payload = '<script>window.__xss=1</script>'
    tokens = pd.DataFrame({"pos": [2, 0, 1], "token": [payload, "4", "2"],
                           "token_id": [9, 20, 18], "entropy": [1.5, 0.01, 0.8],
                           "renyi2": [1.1, 0.01, 0.5], "js": [0.2, 0.0, 0.1],
                           "logp": [-2.0, -0.01, -0.7], "top1": [0.3, 0.99, 0.6],
                           "fork": [True, False, True], "selected": [True, False, False]})
    spans = token_spans(tokens, "entropy")
    assert [s.children for s in spans] == ["4", "2", payload]     # by position, text as is
    assert [s.className for s in spans] == ["tok", "tok fork", "tok fork sel"]
    title = spans[2].title
    for number in ("1.5000", "1.1000", "0.2000", "-2.0000", "0.3000"):
        assert number in title
    assert spans[0].style["backgroundColor"] != spans[2].style["backgroundColor"]


def test_environment_text_is_marked_and_left_uncoloured():
    # a tool response inside a completion: null statistics, env=True (what StepReporter stores)
    tokens = pd.DataFrame({"pos": [0, 1, 2], "token": ["x", "<tool_response>", "y"],
                           "entropy": [0.9, None, 0.4], "fork": [True, False, False],
                           "selected": [False, False, True], "env": [False, True, False]})
    spans = token_spans(tokens, "entropy")
    assert [s.className for s in spans] == ["tok fork", "tok env", "tok sel"]
    assert "environment text" in spans[1].title and "environment text" not in spans[0].title
    assert spans[1].style["backgroundColor"] == "transparent"   # no number, no colour


def test_pick_sample_lowest_and_highest_reward_of_a_group():
    samples = pd.DataFrame({"sample_id": [0, 1, 2, 3], "group_id": [0, 0, 0, 1],
                            "reward": [0.5, 0.0, 1.0, 0.2]})
    assert pick_sample(samples, "low:0") == 1
    assert pick_sample(samples, "high:0") == 2
    assert pick_sample(samples, "3") == 3
    assert pick_sample(samples, "9") is None


# ---------------------------------------------------------------- run page work on a real store
def test_run_view_draws_from_the_store_and_ticks_only_new_steps(tmp_path):
    import numpy as np

    from forksight.dashboard.run_view import Controls, draw_run, tick_run
    from synthetic import seed_run, write_steps
    from forksight.monitor.collector.store import Store

    with Store(str(tmp_path / "r.duckdb")) as store:
        run_id = seed_run(store, "r", 12, steps_total=40, seed=3)
        drawn = draw_run(store.reader, run_id, Controls(smoothing=0.5))
        mean = trace_for(drawn["figures"]["entropy"], "entropy/mean", "raw")
        stored = store.reader.read_scalars(run_id, ["entropy/mean"])
        assert mean["x"] == stored["step"].tolist()
        assert np.allclose(mean["y"], stored["value"])
        quiet = tick_run(store.reader, drawn["state"], Controls(smoothing=0.5))
        assert all(p is None for p in quiet["figures"].values())
        write_steps(store, run_id, range(12, 15), 40, np.random.default_rng(4))
        out = tick_run(store.reader, drawn["state"], Controls(smoothing=0.5))
        grown = apply_patch(drawn["figures"]["entropy"], out["figures"]["entropy"])
        assert trace_for(grown, "entropy/mean", "raw")["x"] == list(range(15))
        assert out["state"]["last_step"] == 14
        heat = apply_patch(drawn["figures"]["heatmap"], out["figures"]["heatmap"])
        assert heat["data"][0]["x"] == list(range(15))


def test_controls_refuse_bad_input_with_the_reason():
    from forksight.dashboard.run_view import Controls

    with pytest.raises(ValueError, match="smoothing must be in"):
        Controls.from_inputs(1.5, "step", [], 1000, [])
    with pytest.raises(ValueError, match="x_axis must be"):
        Controls.from_inputs(0.5, "time", [], 1000, [])
    assert Controls.from_inputs(0.5, "wall", ["log"], "all", ["lr"]).log_y is True


# ---------------------------------------------------------------- tokens: one fixed scale per run
def _alpha(css: str) -> float:
    return 0.0 if css == "transparent" else float(css.rsplit(",", 1)[1].rstrip(")"))


def test_token_scale_is_fixed_by_the_early_steps_so_a_collapsed_step_looks_pale():
    from forksight.dashboard.token_figures import MAX_ALPHA, token_scale

    rng = np.random.default_rng(0)
    early = rng.gamma(1.5, 0.8, 500)                       # a healthy run's first steps
    scale = token_scale(early, "entropy", vocab_size=311, steps=[0, 1, 2])
    assert scale.top == pytest.approx(np.sort(early)[int(round(0.95 * (len(early) - 1)))],
                                      rel=0.02)            # their 95th percentile
    healthy = pd.DataFrame({"pos": range(6), "token": list("abcdef"),
                            "entropy": [0.2, 1.1, 2.5, 0.7, 1.8, 0.05]})
    collapsed = healthy.assign(entropy=5e-5)               # what a collapsed run stores
    pale = [_alpha(s.style["backgroundColor"]) for s in token_spans(collapsed, "entropy", scale)]
    strong = [_alpha(s.style["backgroundColor"]) for s in token_spans(healthy, "entropy", scale)]
    assert max(pale) == pytest.approx(MAX_ALPHA * 5e-5 / scale.top, abs=1e-3) and max(pale) < 0.01
    assert strong == pytest.approx([min(MAX_ALPHA * h / scale.top, MAX_ALPHA)
                                    for h in healthy["entropy"]], abs=1e-3)
    # the old per-step normalisation painted both steps alike; a fixed scale cannot
    assert np.mean(strong) > 20 * np.mean(pale)


def test_token_scale_floors_caps_and_marks():
    from forksight.dashboard.token_figures import FLOOR, token_scale

    assert token_scale([1e-4] * 50, "entropy").top == FLOOR["entropy"]   # born collapsed
    assert token_scale([40.0] * 50, "entropy", vocab_size=311).top == pytest.approx(math.log(311))
    assert token_scale([5.0] * 50, "js").top == pytest.approx(math.log(2))   # JS ≤ ln 2
    surprise = token_scale([-3.0, -1.0, -2.0], "logp")                       # by −log p
    assert surprise.top == pytest.approx(np.quantile([3.0, 1.0, 2.0], 0.95))
    assert surprise.strength(-surprise.top) == 1.0 and surprise.strength(0.0) == 0.0
    ticks = token_scale([2.0] * 10, "entropy").ticks()
    assert [v for v, _ in ticks] == pytest.approx([0.0, F.FORK_THRESHOLD, 2.0])
    assert "fork" in ticks[1][1]


def test_position_heatmap_uses_the_token_colours_and_numbers():
    from forksight.dashboard.token_figures import position_step_heatmap, token_scale

    rows = pd.DataFrame({"step": [0, 0, 9, 9], "pos": [0, 1, 0, 1],
                         "entropy": [1.2, 0.4, 5e-5, 6e-5], "logp": [-1.0, -0.2, -1e-5, 0.0]})
    scale = token_scale([0.5, 1.0, 1.5, 2.0], "entropy")
    fig = position_step_heatmap(rows, scale)
    go.Figure(fig)
    trace = fig["data"][0]
    assert (trace["zmin"], trace["zmax"]) == (0.0, scale.top)
    assert trace["colorscale"] == [[0.0, scale.color(0.0)], [1.0, scale.color(scale.top)]]
    assert trace["colorbar"]["tickvals"] == pytest.approx([v for v, _ in scale.ticks()])
    assert np.allclose(trace["z"], [[1.2, 5e-5], [0.4, 6e-5]], rtol=1e-9)   # pos × step
    surprise = position_step_heatmap(rows, token_scale(rows["logp"], "logp"))
    assert surprise["data"][0]["z"][0] == pytest.approx([1.0, 1e-5])    # drawn as −log p


def test_the_entropy_chart_draws_the_runs_own_fork_threshold():
    frame = scalars_frame(30, keys=(*KEYS, "fork/threshold"))
    # top:q: the step's stored threshold, step by step (it moves with the step's entropies)
    fig = R.entropy_figure(frame, fork_rule="top:0.1")
    line = trace_for(fig, "fork/threshold", "raw")
    stored = frame[frame.key == "fork/threshold"].sort_values("step").value.to_numpy()
    assert np.allclose(line["y"], stored) and "top:0.1" in line["name"]
    assert not any(s.get("y0") == 0.672 for s in fig["layout"].get("shapes", []))
    # abs:τ: one line at τ; a run that records no rule was stored under abs:0.672
    for rule, tau in (("abs:0.3", 0.3), (None, 0.672)):
        fig = R.entropy_figure(frame, fork_rule=rule)
        assert not [t for t in fig["data"] if (t.get("meta") or {}).get("key") == "fork/threshold"]
        assert [s["y0"] for s in fig["layout"]["shapes"] if s.get("line", {}).get("dash") == "dot"] == [tau]
        assert f"fork threshold {tau:g}" in [a["text"] for a in fig["layout"]["annotations"]]
