"""The probe/* step scalars on hand-built rows: precision, shares and recalls counted by hand,
Spearman's rho against scipy's, and a number with nothing to count left out (never 0 or NaN)."""
from __future__ import annotations

import pytest
from scipy.stats import spearmanr

from forksight.hooks.metrics.probe_stats import TokenSignals, probe_scalars, rule_masks


def _row(sample_id, pos, delta, fork, pivotal, entropy):
    return {"sample_id": sample_id, "pos": pos, "delta": delta, "fork": fork, "pivotal": pivotal, "entropy": entropy}


ENTROPY = {0: [0.1, 0.9, 0.05, 1.4, 0.2], 1: [0.8, 0.01, 0.3, 0.02]}
JS = {0: [0.0, 0.2, 0.0, 0.1, 0.05], 1: [0.3, 0.0, 0.01, 0.0]}
OWN = {0: [False, True, False, True, False], 1: [True, False, False, False]}
# every position probed; pivotal: sample 0 pos 1 and 3, sample 1 pos 2
DELTA = {0: [0.01, -0.5, 0.0, 0.3, 0.05], 1: [0.1, 0.0, 0.4, -0.02]}
PIVOTAL = {(0, 1), (0, 3), (1, 2)}
ROWS = [_row(s, t, DELTA[s][t], ENTROPY[s][t] >= 0.672, (s, t) in PIVOTAL, ENTROPY[s][t])
        for s in (0, 1) for t in range(len(DELTA[s]))]
SIGNALS = [TokenSignals(s, ENTROPY[s], JS[s], OWN[s]) for s in (0, 1)]


def test_the_rules_select_what_their_definitions_say():
    masks = rule_masks(SIGNALS, seed=0)
    # top 20% entropy of all 9 tokens: the 0.8 quantile (numpy linear) is 0.84, so 0.9 and 1.4
    assert masks["fork"] == {0: {1, 3}, 1: set()}
    # top 10% JS per response: each response's largest
    assert masks["ict"] == {0: {1}, 1: {0}}
    assert masks["own"] == {0: {1, 3}, 1: {0}}
    assert [len(masks["random"][s]) for s in (0, 1)] == [2, 0]     # as many as the fork rule


def test_step_scalars_count_what_they_say():
    out = probe_scalars(ROWS, SIGNALS, completions=2, seed=0)
    forks = [r for r in ROWS if r["fork"]]                      # (0,1) 0.9, (0,3) 1.4, (1,0) 0.8
    assert out["probe/fork_precision"] == pytest.approx(2 / 3)
    assert out["probe/pivot_fork_share"] == pytest.approx(2 / 3)      # (1,2) is no fork
    assert out["probe/pivotal_per_completion"] == 1.5
    assert out["probe/delta_abs_fork"] == pytest.approx(sum(abs(r["delta"]) for r in forks) / 3)
    assert out["probe/delta_abs_nonfork"] == pytest.approx((0.01 + 0.0 + 0.05 + 0.0 + 0.4 + 0.02) / 6)
    assert out["probe/recall/fork"] == pytest.approx(2 / 3)
    assert out["probe/recall/own"] == pytest.approx(2 / 3)
    assert out["probe/recall/ict"] == pytest.approx(1 / 3)
    expected = spearmanr([r["entropy"] for r in ROWS], [abs(r["delta"]) for r in ROWS]).statistic
    assert out["probe/spearman_entropy_delta"] == pytest.approx(expected)


def test_nothing_to_count_leaves_the_number_out():
    flat = [{**r, "pivotal": False, "fork": False, "delta": 0.0} for r in ROWS]
    out = probe_scalars(flat, SIGNALS, completions=2)
    assert out["probe/pivotal_per_completion"] == 0.0
    for key in ("probe/fork_precision", "probe/pivot_fork_share", "probe/spearman_entropy_delta",
                "probe/recall/fork"):
        assert key not in out


def test_each_rule_has_a_random_baseline_of_its_own_count():
    """fork picks 20% of tokens, ict 10% per response, own whatever the run trained on: a rule is
    compared with random picks of its own count per completion (issue 50, item 0). A run that trains
    on every token recalls every pivot, and so does its matched baseline: no lift."""
    import random

    masks = rule_masks(SIGNALS, seed=0)
    for rule, base in (("fork", "random"), ("ict", "random/ict"), ("own", "random/own")):
        assert {s: len(p) for s, p in masks[base].items()} == {s: len(p) for s, p in masks[rule].items()}, rule
        for s, picked in masks[base].items():
            assert picked <= set(range(len(ENTROPY[s]))), rule
    rng = random.Random(0)                            # fork's baseline keeps the draws it always had
    assert masks["random"] == {0: set(rng.sample(range(5), 2)), 1: set(rng.sample(range(4), 0))}
    everything = [TokenSignals(s, ENTROPY[s], JS[s], [True] * len(ENTROPY[s])) for s in (0, 1)]
    out = probe_scalars(ROWS, everything, completions=2, seed=0)
    assert out["probe/recall/own"] == 1.0 and out["probe/recall/random/own"] == 1.0
    assert out["probe/recall/random"] <= 1.0 and "probe/recall/random/ict" in out
