"""Value probes on the pages (issue 40, item 4): the tokens page's "value Δ" colour mode (a
diverging scale fixed per run, pivotal tokens marked, V before/after ± SE and the alternatives in
the hover, model text as text), the run page's pivotal-tokens panel, the compare page drawing a
probe/* key. Probe rows go in through the real ingest path (Store.write of probes_table)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from forksight.base.records import Records, probes_table, samples_table, scalars_table, tokens_table
from forksight.dashboard import probe_figures as P
from forksight.dashboard.figures import by_key
from forksight.dashboard.pages.compare import compare_runs
from forksight.dashboard.pages.tokens import prompt_history, render_step, run_scale
from forksight.dashboard.run_view import Controls, draw_run
from forksight.dashboard.token_figures import token_scale
from forksight.dashboard.tokens_view import legend, token_spans
from forksight.monitor.collector.store import Store

TOKENS = ["7", "+", "<b>x</b>", "=", "1", "2"]
# (pos, delta, se, pivotal): a pivot that raised V, one that lowered it, a small Δ, one unprobed (pos 3)
PROBED = [(0, 0.05, 0.04, False), (1, 0.5, 0.1, True), (2, -0.4, 0.1, True), (4, 0.1, 0.2, False),
          (5, 0.3, 0.2, False)]


def _probe_row(step: int, pos: int, delta: float, se: float, pivotal: bool) -> dict:
    alts = [{"token_id": 9, "token": "<script>alert(1)</script>", "value": 0.75, "k": 8}] if pos == 1 else []
    return {"step": step, "sample_id": 0, "pos": pos, "token_id": 20 + pos, "token": TOKENS[pos],
            "fork": pos in (1, 2), "entropy": 1.0 if pos in (1, 2) else 0.1, "v_before": 0.25,
            "v_after": 0.25 + delta, "delta": delta, "se": se, "se_before": se / 2, "se_after": se / 2,
            "k": 8, "pivotal": pivotal, "alternatives": json.dumps(alts)}


@pytest.fixture()
def store(tmp_path):
    with Store(str(tmp_path / "p.duckdb")) as store:
        run = store.create_run("probed", strategy="fork")
        plain = store.create_run("plain", strategy="all")
        for step in (1, 2, 3):
            cols = {"sample_id": [0] * 6, "pos": list(range(6)), "token_id": [20 + i for i in range(6)],
                    "token": TOKENS, "entropy": [0.1, 1.0, 1.0, 0.1, 0.1, 0.1],
                    "fork": [False, True, True, False, False, False]}
            records = Records(
                tokens=tokens_table(cols, step=step),
                samples=samples_table([{"step": step, "sample_id": 0, "group_id": 0, "prompt": "7+5=",
                                        "completion": "".join(TOKENS), "reward": 1.0}]),
                probes=probes_table([_probe_row(step, *p) for p in PROBED]) if step in (1, 3) else None,
                scalars=scalars_table([{"step": step, "key": k, "value": v} for k, v in (
                    ("entropy/mean", 0.4), ("probe/fork_precision", 1.0), ("probe/pivot_fork_share", 1.0),
                    ("probe/pivotal_frac", 0.4), ("probe/recall/fork", 1.0), ("probe/recall/random", 0.5))
                    if step in (1, 3) or not k.startswith("probe/")]))
            store.write(run, records).result()
            store.write(plain, Records(scalars=scalars_table([{"step": step, "key": "entropy/mean",
                                                               "value": 0.5}]))).result()
        yield store, run, plain


def test_the_value_delta_scale_diverges_around_zero_from_the_first_probed_steps(store):
    store, run, _ = store
    scale = run_scale(store.reader, run, "delta")
    deltas = np.abs([d for _, d, _, _ in PROBED] * 2)          # probed steps 1 and 3, the same rows
    assert scale.diverging and scale.top == pytest.approx(np.quantile(deltas, 0.95))
    assert scale.low == -scale.top and "probed steps 1–3" in scale.source
    assert token_scale([0.01, -0.05], "delta").top == 0.2       # floor: the pivot threshold
    assert token_scale([], "delta").empty
    # green up, red down, alpha linear in |Δ| / top
    assert scale.color(0.25) == f"rgba(43,138,62,{0.85 * 0.25 / scale.top:.3f})"
    assert scale.color(-0.25) == f"rgba(201,42,42,{0.85 * 0.25 / scale.top:.3f})"


def test_tokens_in_value_delta_mode_are_coloured_marked_and_explained(store):
    store, run, _ = store
    scale = run_scale(store.reader, run, "delta")
    out = render_step(store.reader, run, 3, "0", "delta", None, scale)
    spans = out["main"][0].children[1].children
    assert [s.children for s in spans] == TOKENS                    # model text as text
    by_pos = {int(s._data_pos if hasattr(s, "_data_pos") else getattr(s, "data-pos")): s for s in spans}
    for pos, delta, se, pivotal in PROBED:
        span = by_pos[pos]
        assert span.style["backgroundColor"] == scale.color(delta)
        assert ("pivot" in span.className.split()) == pivotal
        assert f"value Δ {delta:+.3f} ± {se:.3f}" in span.title
        assert f"V before 0.25 ± {se / 2:.2f}   V after {0.25 + delta:.2f} ± {se / 2:.2f}" in span.title
    unprobed = by_pos[3]
    assert "nolr" in unprobed.className and unprobed.style["backgroundColor"] == "transparent"
    assert "value Δ" not in unprobed.title
    # the alternatives' branch values, their text shown as written (a title attribute: React escapes it)
    assert "alternatives here: '<script>alert(1)</script>' V 0.75 (K 8)" in by_pos[1].title
    notes = str(legend(scale))
    assert "pivotal" in notes and "V after − V before" in notes


def test_a_step_nobody_probed_leaves_every_token_uncoloured(store):
    store, run, plain = store
    scale = run_scale(store.reader, run, "delta")
    spans = render_step(store.reader, run, 2, "0", "delta", None, scale)["main"][0].children[1].children
    assert all(s.style["backgroundColor"] == "transparent" and "nolr" in s.className for s in spans)
    empty = run_scale(store.reader, plain, "delta")
    assert empty.empty and "no value probes" in str(legend(empty))


def test_the_history_in_value_delta_mode_reads_the_probed_steps(store):
    store, run, _ = store
    rows, mine = prompt_history(store.reader, run, "7+5=", "delta")
    assert not mine and sorted(rows["step"].unique()) == [1, 3]
    assert rows.sort_values(["step", "pos"])["delta"].tolist() == [d for _, d, _, _ in PROBED] * 2


def test_with_probes_joins_by_sample_and_position():
    tokens = pd.DataFrame({"rank": [0, 0, 0], "sample_id": [0, 0, 1], "pos": [0, 1, 0], "token": ["a", "b", "c"]})
    probes = pd.DataFrame({"rank": [0, 0], "sample_id": [1, 0], "pos": [0, 1], "delta": [0.3, -0.2],
                           "pivotal": [True, False], "v_before": [0.1, 0.5], "v_after": [0.4, 0.3]})
    joined = P.with_probes(tokens, probes)
    assert joined["token"].tolist() == ["a", "b", "c"]
    assert np.isnan(joined["delta"].iloc[0]) and joined["delta"].iloc[1:].tolist() == [-0.2, 0.3]
    assert P.alternatives("not json") == [] and P.alternatives(None) == []


def test_the_pivotal_panel_draws_each_rule_against_the_random_baseline():
    scalars = by_key(pd.DataFrame({
        "key": ["probe/fork_precision"] * 2 + ["probe/recall/fork"] * 2 + ["probe/recall/random"] * 2
               + ["probe/pivot_fork_share"] * 2,
        "step": [1, 50] * 4, "value": [0.2, 0.4, 0.6, 0.7, 0.2, 0.25, 0.5, 0.55],
        "wall_time": [0.0, 1.0] * 4}))
    fig = P.pivotal_figure(scalars)
    drawn = {t["meta"]["key"]: t for t in fig["data"]}
    assert set(drawn) == {"probe/fork_precision", "probe/recall/fork", "probe/recall/random",
                          "probe/pivot_fork_share"}
    assert drawn["probe/recall/fork"]["y"] == [0.6, 0.7] and drawn["probe/recall/fork"]["x"] == [1, 50]
    assert drawn["probe/recall/random"]["line"]["dash"] == "dash"       # the baseline
    assert drawn["probe/recall/fork"]["yaxis"] == "y2" and drawn["probe/fork_precision"]["yaxis"] == "y"
    # the panel names the run's fork rule: it decides which tokens the precision counts as forks
    titles = lambda f: [a["text"] for a in f["layout"]["annotations"]]  # noqa: E731
    assert "<b>are the forks pivotal? (fork: H ≥ 0.672 nats (abs:0.672))</b>" in titles(fig)
    top = P.pivotal_figure(scalars, fork_rule="top:0.2")
    assert "<b>are the forks pivotal? (fork: the step's top 20% of tokens by H (top:0.2))</b>" in titles(top)
    assert "no value probes" in str(P.pivotal_figure(by_key(pd.DataFrame(
        {"key": ["entropy/mean"], "step": [0], "value": [1.0], "wall_time": [0.0]}))))


def test_the_run_page_shows_the_pivotal_panel_only_for_a_probed_run(store):
    store, run, plain = store
    out = draw_run(store.reader, run, Controls())
    assert out["probes"] and out["state"]["probes"]
    drawn = {t["meta"]["key"]: t for t in out["figures"]["probes"]["data"]}
    assert drawn["probe/recall/fork"]["x"] == [1, 3] and drawn["probe/recall/random"]["y"] == [0.5, 0.5]
    assert not draw_run(store.reader, plain, Controls())["probes"]


def test_the_compare_page_plots_a_probe_key(store):
    store, run, _ = store
    fig = compare_runs(store.reader, [run], panels=["probe/recall/fork"])
    traces = [t for t in fig["data"] if (t.get("meta") or {}).get("key") == "probe/recall/fork"]
    assert traces and list(traces[0]["y"]) == [1.0, 1.0]


def test_a_probed_completion_without_token_rows_is_shown_from_a_full_sweep_of_its_probes():
    tokens = pd.DataFrame({"rank": [0, 0], "sample_id": [0, 0], "pos": [0, 1], "token": ["a", "b"]})
    sweep = pd.DataFrame({"rank": 0, "sample_id": 5, "pos": [1, 0, 2], "token": ["y", "x", "z"],
                          "delta": [0.3, 0.0, -0.1], "pivotal": [True, False, False]})
    gaps = pd.DataFrame({"rank": 0, "sample_id": 6, "pos": [0, 2], "token": ["p", "q"], "delta": [0.1, 0.2]})
    joined = P.with_probes(tokens, pd.concat([sweep, gaps], ignore_index=True))
    five = joined[joined["sample_id"] == 5].sort_values("pos")
    assert five["token"].tolist() == ["x", "y", "z"] and five["delta"].tolist() == [0.0, 0.3, -0.1]
    assert 6 not in set(joined["sample_id"])       # a partial sweep would drop text: left out
    assert joined[joined["sample_id"] == 0]["delta"].isna().all()
