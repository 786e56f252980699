"""Pivotal Token Search by bisection (hooks/metrics/probe_search.py). Exact where the values are
known: on hand-made value functions it finds every one-token jump at about log2 T values each, and
misses exactly what it says it misses (opposite jumps cancelling inside one segment). On a real
model (the shipped readable warm-up, near-greedy continuations so every value is determined by its
prefix) it agrees with the sweep over every position: the same values for the prefixes both
estimate, the same pivotal tokens, at a fraction of the continuations."""
from __future__ import annotations

import math
import random

import pytest
import torch

from forksight.hooks.metrics.probe_search import bisect
from forksight.hooks.metrics.probe_stats import TokenSignals, covered, probe_scalars
from forksight.hooks.metrics.probe_values import Value
from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings, probe, stop_ids


class KnownValues:
    """The Prefixes interface over values known exactly: V(prefix) = fn[i](len(prefix))."""

    def __init__(self, fns):
        self.fns, self.wanted, self.calls = fns, {}, 0

    def want(self, i, prefix):
        key = (i, tuple(prefix))
        self.wanted.setdefault(key, None)
        return key

    def estimate(self, progress=None):
        self.calls += 1
        for key in [k for k, v in self.wanted.items() if v is None]:
            self.wanted[key] = Value(self.fns[key[0]](len(key[1])), 0.0, 1)

    def __getitem__(self, key):
        return self.wanted[key]


def steps_at(jumps: dict[int, float], base: float = 0.0):
    """V(n) = base + the sum of the jumps at positions < n (a jump at t: V(t+1) - V(t))."""
    return lambda n: base + sum(d for t, d in jumps.items() if t < n)


def _pivots(leaves, fn, delta=0.2):
    return sorted(a for a, b in leaves if b == a + 1 and abs(fn(b) - fn(a)) >= delta)


@pytest.mark.parametrize("length, jumps", [
    (40, {5: 0.5}), (40, {0: -1.0}), (40, {39: 0.3}), (64, {7: 0.4, 30: 0.3, 50: -0.25}), (1000, {613: 1.0}),
])
def test_every_one_token_jump_is_found_at_about_log2_t_values_each(length, jumps):
    fn = steps_at(jumps, base=0.1)
    values = KnownValues({0: fn})
    leaves = bisect(values, {0: list(range(length))}, 0.2)[0]
    assert _pivots(leaves, fn) == sorted(jumps)
    # the leaves tile the completion
    assert leaves[0][0] == 0 and leaves[-1][1] == length and all(a[1] == b[0] for a, b in zip(leaves, leaves[1:]))
    # one path to each jump: at most 2 values per level of the bisection per jump, plus both ends
    assert len(values.wanted) <= 2 + 2 * len(jumps) * math.ceil(math.log2(length))
    assert values.calls <= 2 + math.ceil(math.log2(length))   # one batched estimate per level


def test_a_flat_completion_costs_its_two_ends_and_is_one_segment():
    values = KnownValues({0: steps_at({}, 0.7)})
    assert bisect(values, {0: list(range(50))}, 0.2) == {0: [(0, 50)]}
    assert len(values.wanted) == 2


def test_opposite_jumps_inside_one_segment_cancel_and_are_missed_as_documented():
    # +0.5 at 3 and -0.5 at 10: V(0) = V(40), the completion is never split
    fn = steps_at({3: 0.5, 10: -0.5})
    assert bisect(KnownValues({0: fn}), {0: list(range(40))}, 0.2)[0] == [(0, 40)]
    # opposite jumps that do not cancel are found, each in its own half
    fn = steps_at({3: 0.5, 30: -0.3})
    assert _pivots(bisect(KnownValues({0: fn}), {0: list(range(40))}, 0.2)[0], fn) == [3, 30]
    # a cancelling pair inside a half is missed even when the completion is split
    fn = steps_at({3: 0.5, 30: -0.5, 35: 0.5})
    assert _pivots(bisect(KnownValues({0: fn}), {0: list(range(40))}, 0.2)[0], fn) == [3]


def test_sub_delta_steps_that_add_up_are_split_until_each_is_below_delta():
    fn = steps_at({t: 0.05 for t in range(0, 40, 4)})       # ten steps of 0.05: ends differ by 0.5
    leaves = bisect(KnownValues({0: fn}), {0: list(range(40))}, 0.2)[0]
    assert _pivots(leaves, fn) == []                          # no single token moves V by 0.2
    assert all(abs(fn(b) - fn(a)) < 0.2 for a, b in leaves)


def test_covered_completions_count_every_unsearched_token_as_not_pivotal():
    rows = [{"sample_id": 0, "pos": 0, "span": 5, "pivotal": False, "fork": None, "delta": 0.0},
            {"sample_id": 0, "pos": 5, "span": 1, "pivotal": True, "fork": True, "delta": 0.6, "entropy": 1.0},
            {"sample_id": 0, "pos": 6, "span": 4, "pivotal": False, "fork": None, "delta": 0.1},
            {"sample_id": 1, "pos": 0, "span": 1, "pivotal": False, "fork": False, "delta": 0.0, "entropy": 0.1}]
    h0 = [0.1, 0.1, 0.1, 0.1, 0.1, 1.0, 0.1, 0.1, 0.1, 0.9]
    signals = [TokenSignals(0, h0), TokenSignals(1, [0.1, 0.2, 0.3])]
    assert covered(rows, signals) == {0}                      # sample 1: only its first token accounted for
    out = probe_scalars(rows, signals, 2)
    assert out["probe/positions"] == 2.0 and out["probe/pivotal_per_completion"] == 0.5
    # top 20% of H over both completions' 13 tokens: 1.0, 0.9 (sample 0) and 0.3 (sample 1);
    # on the covered completion the rule picks positions 5 and 9, one of them pivotal
    assert out["probe/recall/fork"] == 1.0 and out["probe/precision/fork"] == pytest.approx(0.5)


@pytest.fixture(scope="module")
def readable(tmp_path_factory, one_torch_thread):
    from forksight.trainer.model import load
    from forksight.trainer.shipped import materialize
    from forksight.trainer.tasks import make_task

    model, tok = load(str(materialize("readable-s0", tmp_path_factory.mktemp("readable") / "m")))
    model.eval()
    task = make_task("steps", level=1, graded=False)
    rng = random.Random(7)
    problems = [task.sample(rng) for _ in range(8)]
    torch.manual_seed(0)
    inputs = []
    for j, problem in enumerate(problems):            # completions sampled at the run's temperature
        ids = tok(problem.prompt).input_ids
        out = model.generate(torch.tensor([ids]), do_sample=True, temperature=1.0, top_k=0, max_new_tokens=40,
                             pad_token_id=tok.pad_token_id)
        comp = out[0, len(ids):].tolist()
        comp = comp[:comp.index(tok.eos_token_id) + 1] if tok.eos_token_id in comp else comp
        inputs.append(ProbeInput(j, ids, comp))

    def reward(i, ids):
        return task.verify(problems[i], tok.decode(ids, skip_special_tokens=True))[0]

    return model, tok, inputs, reward


def test_search_agrees_with_every_position_on_a_real_model_at_a_fraction_of_the_continuations(readable):
    model, tok, inputs, reward = readable
    # near-greedy continuations, one prefix per generate call: each value is fixed by its prefix
    runs = {}
    for positions in ("all", "search"):
        settings = ProbeSettings(k=2, positions=positions, temperature=1e-3, max_new_tokens=40, batch_rows=2,
                                 first_token_eos=False, alternatives=0)
        counts = {}
        rows = probe(model, inputs, reward, settings, eos_id=stop_ids(model, tok), pad_id=tok.pad_token_id,
                     counts=counts)
        runs[positions] = rows, counts
    every, searched = runs["all"][0], runs["search"][0]
    value = {}
    for r in every:                              # V of every prefix length, as the sweep estimated it
        value[(r["sample_id"], r["pos"])] = r["v_before"]
        value[(r["sample_id"], r["pos"] + 1)] = r["v_after"]
    for r in searched:                           # the same prefixes, the same values
        assert r["v_before"] == value[(r["sample_id"], r["pos"])]
        assert r["v_after"] == value[(r["sample_id"], r["pos"] + r["span"])]
    found = {(r["sample_id"], r["pos"]) for r in searched if r["pivotal"]}
    truth = {(r["sample_id"], r["pos"]) for r in every if r["pivotal"]}
    assert truth, "the constructed run must hold pivotal tokens"
    assert found <= truth
    for sid, pos in truth - found:               # a miss lies in a segment whose ends cancel
        seg = next(r for r in searched if r["sample_id"] == sid and r["pos"] <= pos < r["pos"] + r["span"])
        assert abs(seg["delta"]) < 0.2 and seg["span"] > 1
    assert runs["search"][1]["continuations"] * 4 <= runs["all"][1]["continuations"]


def test_auto_searches_long_completions_and_probes_short_ones_by_forks(readable):
    model, tok, inputs, reward = readable
    long_one = max(inputs, key=lambda x: len(x.completion_ids))
    short_one = min(inputs, key=lambda x: len(x.completion_ids))
    assert len(short_one.completion_ids) < len(long_one.completion_ids)
    settings = ProbeSettings(k=2, temperature=1e-3, max_new_tokens=40, batch_rows=2, first_token_eos=False,
                             alternatives=0, search_above=len(short_one.completion_ids), fork_entropy=0.0)
    rows = probe(model, [short_one, long_one], reward, settings, eos_id=stop_ids(model, tok), pad_id=tok.pad_token_id)
    spans = {r["sample_id"]: set() for r in rows}
    for r in rows:
        spans[r["sample_id"]].add(r["span"])
    # the long one is tiled by segments from 0 (bisection), the short one has one-token rows only
    assert spans[short_one.sample_id] == {1}
    long_rows = sorted((r for r in rows if r["sample_id"] == long_one.sample_id), key=lambda r: r["pos"])
    assert long_rows[0]["pos"] == 0 and sum(r["span"] for r in long_rows) == len(long_one.completion_ids)


@pytest.mark.parametrize("delta", [0.0, -0.1, 1.0, 2.0])
def test_a_search_with_a_delta_outside_0_1_is_refused_naming_it(delta):
    with pytest.raises(ValueError, match="the pivotal delta must be between 0 and 1"):
        ProbeSettings(positions="search", pivot_delta=delta).check()
    ProbeSettings(positions="all", pivot_delta=delta if delta >= 0 else 0.0).check()   # the sweep does not split


def test_the_tokens_page_colours_only_tokens_the_search_reached():
    import pandas as pd

    from forksight.dashboard.probe_figures import probe_history, with_probes

    tokens = pd.DataFrame({"rank": 0, "sample_id": 0, "pos": range(6), "entropy": 0.5, "fork": False})
    probes = pd.DataFrame({"step": 3, "rank": 0, "sample_id": 0, "pos": [0, 4, 5], "span": [4, 1, 1],
                           "delta": [0.05, 0.6, 0.0], "v_before": [0.1, 0.15, 0.75], "v_after": [0.15, 0.75, 0.75],
                           "pivotal": [False, True, False]})
    shown = with_probes(tokens, probes).sort_values("pos")
    assert shown.delta.isna().tolist() == [True, True, True, True, False, False]   # inside the segment: grey
    assert shown.delta.tolist()[4:] == [0.6, 0.0]
    assert probe_history([probes]).pos.tolist() == [4, 5]
