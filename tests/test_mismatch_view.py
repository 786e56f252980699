"""The training–inference mismatch as the dashboard shows it: the tokens page's diverging colour
(log r = logp − sampler_logp on a run's fixed ± scale), the run page's charts (KL, out-of-band
fractions, fork vs non-fork, ESS; one step's ratio histogram with the 2×/5× bands) and the compare
page's mismatch keys. Figures are checked against values computed here by hand or read back from a
real DuckDB file that a real StepReporter wrote (tests/mismatch_util.py)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from forksight.base.constants import MISMATCH_EDGES, MISMATCH_LIMIT
from forksight.dashboard import mismatch_figures as M
from forksight.dashboard.token_figures import (MAX_ALPHA, position_step_heatmap, token_scale,
                                               with_log_ratio)
from forksight.dashboard.tokens_view import legend, token_spans

LOG2, LOG5 = math.log(2), math.log(5)
RED, BLUE = "178,24,43", "33,102,172"


def _text(component) -> str:
    """Every string in a Dash component tree."""
    if isinstance(component, str):
        return component
    children = getattr(component, "children", None)
    if isinstance(children, (list, tuple)):
        return " ".join(_text(c) for c in children)
    return _text(children) if children is not None else ""


# ---------------------------------------------------------------- tokens: the colour
def test_a_tokens_mismatch_colour_is_its_log_ratio_on_the_runs_scale_by_hand():
    # the run's early |log r| are all log 4: the scale is ±log 4 (the 95% quantile of a constant)
    scale = token_scale([math.log(4)] * 10 + [-math.log(4)] * 10, "mismatch", steps=[0, 1, 2])
    assert scale.top == pytest.approx(math.log(4)) and scale.low == pytest.approx(-math.log(4))
    tokens = pd.DataFrame({
        "sample_id": [0] * 4, "pos": [0, 1, 2, 3], "token": ["a", "b", "c", "d"],
        "logp": [math.log(0.5), math.log(0.5), math.log(0.1), math.log(0.3)],
        "sampler_logp": [math.log(0.25), math.log(0.4), math.log(0.8), np.nan],
        "fork": [False] * 4, "selected": [False] * 4, "env": [False] * 4})
    spans = token_spans(tokens, "mismatch", scale)
    # r = 2: log 2 is half of log 4 -> red at half the full opacity
    assert spans[0].style["backgroundColor"] == f"rgba({RED},{MAX_ALPHA * 0.5:.3f})"
    # r = 1.25: log 1.25 / log 4 of the way up
    assert spans[1].style["backgroundColor"] == \
        f"rgba({RED},{MAX_ALPHA * math.log(1.25) / math.log(4):.3f})"
    # r = 1/8 is past −log 4: saturated blue
    assert spans[2].style["backgroundColor"] == f"rgba({BLUE},{MAX_ALPHA:.3f})"
    # no sampler log p: uncoloured and greyed, not "the engines agree"
    assert spans[3].style["backgroundColor"] == "transparent" and "nolr" in spans[3].className
    assert "nolr" not in spans[0].className
    # the hover names both probabilities and their ratio
    assert "p_train 0.5000   p_sampler 0.2500   ratio p_train/p_sampler 2" in spans[0].title
    assert "ratio p_train/p_sampler 0.125" in spans[2].title and "log r -2.0794" in spans[2].title
    assert "p_sampler" not in spans[3].title


def test_the_mismatch_scale_is_symmetric_floored_at_the_2x_band_and_capped():
    early = np.random.default_rng(0).normal(0.0, 0.6, 2000)
    scale = token_scale(early, "mismatch")
    assert scale.top == pytest.approx(np.quantile(np.abs(early), 0.95))   # |log r|, both signs
    assert scale.strength(-scale.top) == -1.0 and scale.strength(2 * scale.top) == 1.0
    assert token_scale([0.01, -0.02] * 10, "mismatch").top == pytest.approx(LOG2)
    assert token_scale([30.0] * 10, "mismatch").top == MISMATCH_LIMIT
    assert token_scale([-3.0] * 10, "mismatch").top == pytest.approx(3.0)
    # the bands are marks on the legend, 0 sits in the middle
    ticks = dict((round(v, 6), t) for v, t in token_scale([3.0] * 10, "mismatch").ticks())
    assert ticks[round(LOG2, 6)] == "2×" and ticks[round(-LOG5, 6)] == "1/5×"
    assert ticks[0.0].startswith("0") and ticks[-3.0].startswith("−3")


def test_a_run_without_sampler_log_p_says_so_on_the_legend():
    empty = token_scale([np.nan] * 5, "mismatch", steps=[0, 1, 2])
    assert empty.empty and empty.top == pytest.approx(LOG2)
    assert "no sampler log p" in _text(legend(empty))
    assert "no sampler log p" not in _text(legend(token_scale([0.3], "mismatch")))
    # rows without the column at all (an old file) get an all-NaN log ratio, never a crash
    rows = with_log_ratio(pd.DataFrame({"logp": [-1.0, -2.0]}))
    assert rows["mismatch"].isna().all()
    spans = token_spans(pd.DataFrame({"pos": [0], "token": ["<i>"], "logp": [-1.0]}), "mismatch",
                        empty)
    assert spans[0].children == "<i>" and spans[0].style["backgroundColor"] == "transparent"


def test_the_position_step_heatmap_of_mismatch_diverges_around_zero():
    rows = with_log_ratio(pd.DataFrame({
        "step": [0, 0, 0, 1], "pos": [0, 0, 1, 0],
        "logp": [-1.0, -1.0, -2.0, -0.5], "sampler_logp": [-1.5, -0.7, -1.0, np.nan]}))
    scale = token_scale(rows["mismatch"], "mismatch")
    fig = position_step_heatmap(rows, scale)
    go.Figure(fig)
    trace = fig["data"][0]
    assert (trace["zmin"], trace["zmax"]) == (pytest.approx(-scale.top), pytest.approx(scale.top))
    # mean log r at (pos 0, step 0) = (0.5 + -0.3) / 2; (pos 1, step 0) = -1; step 1 unknown
    assert trace["z"][0][0] == pytest.approx(0.1) and trace["z"][1][0] == pytest.approx(-1.0)
    assert trace["x"] == ["0"]
    assert "no sampler log p" in str(position_step_heatmap(
        with_log_ratio(pd.DataFrame({"step": [0], "pos": [0], "logp": [-1.0]})), "mismatch"))


# ---------------------------------------------------------------- run page: over steps
def _frame(keys, steps=6, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.concat([pd.DataFrame({"key": k, "step": np.arange(steps), "value": rng.random(steps),
                                    "wall_time": 1.7e9 + np.arange(steps)}) for k in keys],
                     ignore_index=True)


def test_the_mismatch_chart_draws_each_stored_key_and_splits_fork_from_non_fork():
    frame = _frame(M.DRAWN_KEYS)
    fig = M.mismatch_figure(frame)
    go.Figure(fig)
    for key in M.DRAWN_KEYS:
        [trace] = [t for t in fig["data"] if t["meta"] == {"key": key, "role": "raw"}]
        want = frame[frame.key == key]
        assert trace["x"] == want.step.tolist() and trace["y"] == pytest.approx(want.value.tolist())
    by_key = {t["meta"]["key"]: t for t in fig["data"]}
    # fork and non-fork k3 share one panel (same axes), apart from the all-token KL
    fork, nonfork = by_key["mismatch/kl_k3/fork"], by_key["mismatch/kl_k3/nonfork"]
    assert (fork["xaxis"], fork["yaxis"]) == (nonfork["xaxis"], nonfork["yaxis"])
    assert fork["yaxis"] != by_key["mismatch/kl_k3"]["yaxis"]
    assert fork["line"]["color"] != nonfork["line"]["color"]
    # a run logging only the all-token keys gets only those panels; none: a one-line note
    only = M.mismatch_figure(_frame(["mismatch/kl_k3", "mismatch/frac_outside_2x"]))
    assert {t["meta"]["key"] for t in only["data"]} == {"mismatch/kl_k3", "mismatch/frac_outside_2x"}
    assert "not logged" in str(M.mismatch_figure(_frame(["entropy/mean"])))
    smooth = M.mismatch_figure(frame, smoothing=0.5)
    assert any(t["meta"]["role"] == "smooth" for t in smooth["data"])


# ---------------------------------------------------------------- run page: the ratio histogram
def _hist(step: int, counts: dict[int, float]) -> pd.DataFrame:
    """Rows of the mismatch histogram at `step`: counts by bin index into MISMATCH_EDGES."""
    return pd.DataFrame({"step": step, "bin_lo": [MISMATCH_EDGES[i] for i in counts],
                         "bin_hi": [MISMATCH_EDGES[i + 1] for i in counts],
                         "count": list(counts.values())})


def test_the_ratio_histogram_is_each_bins_share_per_nat_with_the_bands_marked():
    mid = int(np.searchsorted(MISMATCH_EDGES, 0.0))          # the bin [0, 1e-4)
    far = len(MISMATCH_EDGES) - 2                             # the last bin, past +LIMIT too
    first, last = _hist(0, {mid: 10.0}), _hist(7, {mid - 1: 6.0, mid: 2.0, far: 2.0})
    fig = M.ratio_histogram(pd.concat([first, last]), scalars_at={
        "mismatch/frac_outside_2x": 0.2, "mismatch/frac_outside_5x": 0.2, "mismatch/tokens": 10})
    go.Figure(fig)
    outline, points, baseline = fig["data"]
    assert outline["name"] == "step 7" and baseline["name"].startswith("step 0")
    widths = np.diff(MISMATCH_EDGES)
    want = {mid - 1: 0.6 / widths[mid - 1], mid: 0.2 / widths[mid], far: 0.2 / widths[far]}
    assert points["y"] == pytest.approx(list(want.values()))
    assert points["x"] == pytest.approx([(MISMATCH_EDGES[i] + MISMATCH_EDGES[i + 1]) / 2 for i in want])
    assert "60.000% of the step's tokens" in points["hovertext"][0]
    assert "every token past it" in points["hovertext"][2]
    # each bin's level is drawn across its whole width; the gap between bins drops to the floor
    base = min(want.values()) / 4
    for i, level in want.items():
        at = [y for x, y in zip(outline["x"], outline["y"])
              if MISMATCH_EDGES[i] <= x <= MISMATCH_EDGES[i + 1]]
        assert level in at
    assert base in outline["y"]
    lines = sorted(s["x0"] for s in fig["layout"]["shapes"] if s["type"] == "line")
    assert lines == pytest.approx([-LOG5, -LOG2, LOG2, LOG5])
    assert fig["layout"]["xaxis"]["range"][1] == pytest.approx(MISMATCH_LIMIT + 0.05)
    summary = fig["layout"]["annotations"][-1]["text"]
    assert summary == "step 7 · 10 tokens · outside 2×: 20.00% · outside 5×: 20.00%"
    # the newest step only when asked for a step it does not hold; nothing: a note
    assert M.ratio_histogram(last)["data"][0]["name"] == "step 7" and len(M.ratio_histogram(last)["data"]) == 2
    assert "no mismatch histogram" in str(M.ratio_histogram(None))


def test_a_bin_narrower_than_a_pixel_still_draws_as_a_stroke():
    xs, ys = M._outline(np.array([0.0]), np.array([1e-4]), np.array([1e4]), 0.1)
    assert xs == [0.0, 0.0, 1e-4, 1e-4] and ys == [0.1, 1e4, 1e4, 0.1]   # up, across, down


# ---------------------------------------------------------------- read back from a real store
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from forksight.compose.local import LocalSink
    from mismatch_util import report_steps

    db = tmp_path_factory.mktemp("mismatch") / "mm.duckdb"
    sink = LocalSink(str(db), "mm", strategy="all")
    scalars = report_steps(sink, 8, seed=1)
    plain = LocalSink(str(db), "plain", store=sink.store)
    report_steps(plain, 3, seed=2, with_sampler=False)
    sink.flush()
    plain.flush()
    yield sink.store, sink.run_id, plain.run_id, scalars
    plain.finish()
    sink.finish()


def test_the_histogram_read_gives_the_first_and_last_step_as_the_token_rows_count_them(store):
    st, run, _, scalars = store
    hist = st.reader.read_histogram_ends(run, M.HISTOGRAM_KEY)
    assert sorted(hist.step.unique()) == [0, 7]
    assert st.reader.read_histogram_ends(run, M.HISTOGRAM_KEY, at=4).step.unique().tolist() == [0, 4]
    for step in (0, 7):
        tokens = st.reader.read_tokens(run, step)
        lr = (tokens.logp.astype(np.float64) - tokens.sampler_logp.astype(np.float64)).dropna()
        want = np.histogram(np.clip(lr, MISMATCH_EDGES[0], MISMATCH_EDGES[-1]), MISMATCH_EDGES)[0]
        got = hist[hist.step == step]
        dense = np.zeros(len(MISMATCH_EDGES) - 1)
        dense[np.searchsorted(MISMATCH_EDGES, got.bin_lo.to_numpy()) ] = got["count"]
        assert dense.tolist() == want.tolist()
        assert dense.sum() == scalars[step]["mismatch/tokens"]


def test_the_histogram_ends_are_found_far_from_the_runs_first_and_last_steps(store):
    from forksight.compose.local import LocalSink

    st = store[0]
    sink = LocalSink("", "late", store=st)
    sink.log_scalars(0, {"loss": 1.0})
    a, b = np.zeros(len(MISMATCH_EDGES) - 1), np.zeros(len(MISMATCH_EDGES) - 1)
    a[3], b[40], b[41] = 5, 2, 7
    sink.log_histogram(600, M.HISTOGRAM_KEY, a, MISMATCH_EDGES)
    sink.log_histogram(700, M.HISTOGRAM_KEY, b, MISMATCH_EDGES)
    sink.log_scalars(5000, {"loss": 1.0})          # the run goes on long after its last one
    sink.flush()
    ends = st.reader.read_histogram_ends(sink.run_id, M.HISTOGRAM_KEY)
    assert ends.groupby("step")["count"].sum().to_dict() == {600: 5, 700: 9}
    held = ends[(ends.step == 700) & (ends["count"] > 0)]
    assert held.bin_lo.tolist() == pytest.approx(MISMATCH_EDGES[[40, 41]].tolist())
    assert st.reader.read_histogram_ends(sink.run_id, M.HISTOGRAM_KEY, at=650).step.unique().tolist() == [600]
    assert st.reader.read_histogram_ends(sink.run_id, M.HISTOGRAM_KEY, at=10).empty
    assert st.reader.read_histogram_ends("no-such-run", M.HISTOGRAM_KEY).empty
    sink.finish()


def test_the_run_page_draws_mismatch_only_for_a_run_that_logs_it(store):
    from forksight.dashboard.run_view import Controls, draw_run, other_keys, tick_run

    st, run, plain, _ = store
    out = draw_run(st.reader, run, Controls(smoothing=0.0))
    assert out["mismatch"] and out["state"]["mismatch"]
    stored = st.reader.read_scalars(run, ["mismatch/kl_k3/fork"])
    [trace] = [t for t in out["figures"]["mismatch"]["data"]
               if t["meta"] == {"key": "mismatch/kl_k3/fork", "role": "raw"}]
    assert trace["y"] == pytest.approx(stored.value.tolist())
    assert out["figures"]["ratios"]["data"][0]["name"] == "step 7"
    assert "mismatch/kl_k3" not in out["other_keys"] and "mismatch/seq_log_ratio_max" in out["other_keys"]
    assert set(other_keys(["mismatch/kl_k1", "lr"])) == {"lr"}
    # focused on an earlier step (an alert's link): the histogram shows that step
    focused = draw_run(st.reader, run, Controls(), focus=3)
    assert focused["figures"]["ratios"]["data"][0]["name"] == "step 3"
    assert not draw_run(st.reader, plain, Controls())["mismatch"]
    # the live tick: a new step's histogram replaces the drawn one
    state = {**out["state"], "last_step": 6}
    ticked = tick_run(st.reader, state, Controls(smoothing=0.0))
    assert ticked["figures"]["ratios"]["data"][0]["name"] == "step 7"
    assert ticked["figures"]["mismatch"] is not None       # a Patch appending step 7
    assert tick_run(st.reader, state, Controls(smoothing=0.0), focus=3)["figures"]["ratios"] is None


def test_the_tokens_page_colours_a_real_runs_tokens_on_its_early_scale(store):
    from forksight.dashboard.pages.tokens import prompt_history, render_step, run_scale

    st, run, plain, _ = store
    scale = run_scale(st.reader, run, "mismatch")
    early = pd.concat([st.reader.read_tokens(run, s) for s in (0, 1, 2)])
    lr = (early.logp.astype(np.float64) - early.sampler_logp.astype(np.float64)).abs().dropna()
    assert scale.top == pytest.approx(min(max(np.quantile(lr, 0.95), LOG2), MISMATCH_LIMIT))
    out = render_step(st.reader, run, 5, "0", "mismatch", scale=scale)
    rows = st.reader.read_tokens(run, 5, sample_id=0).sort_values("pos")
    spans = out["main"][0].children[1].children
    want = [scale.color(float(a) - float(b)) for a, b in zip(rows.logp, rows.sampler_logp)]
    assert [s.style["backgroundColor"] for s in spans] == want
    assert [s.children for s in spans] == rows.token.tolist()
    history, _ = prompt_history(st.reader, run, out["prompt"], "mismatch")
    assert history["mismatch"].notna().any()
    assert run_scale(st.reader, plain, "mismatch").empty
    with pytest.raises(ValueError, match="token statistic column"):
        st.reader.read_token_history(run, [0], ["logp", "token"])


def test_the_compare_page_lists_and_draws_mismatch_keys(store):
    from forksight.dashboard.pages.compare import compare_runs, metric_options

    st, run, plain, _ = store
    options = [o["value"] for o in metric_options(st.reader, [run, plain])]
    assert "mismatch/kl_k3/fork" in options and "mismatch/frac_outside_2x" in options
    panels = ["mismatch/kl_k3", "mismatch/kl_k3/fork"]
    fig = compare_runs(st.reader, [run], panels=panels, verdicts={})
    go.Figure(fig)
    for key in panels:
        [trace] = [t for t in fig["data"] if t["meta"].get("key") == key]
        assert trace["y"] == pytest.approx(st.reader.read_scalars(run, [key]).value.tolist())
