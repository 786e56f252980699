"""The reference set (issue 48): teacher-forced scoring against a float64 reference computed another way
(each completion alone, unpadded, softmax in float64), the ref/* comparison on a hand-worked example,
the rows through a real collector (HttpSink batches, GET /reference paged), `handle.rescore` in a plain
loop, and bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from collector_util import InProcessCollector
from forksight.base.fork_rule import ForkRule
from forksight.hooks.capture.reference import ReferenceScorer, set_from_rows
from forksight.hooks.metrics.reference import ReferenceSet, Scored, decile_of, pattern_scalars, score
from forksight.monitor.sinks.http import HttpSink

REF = ReferenceSet([[5, 9, 13], [7], [4, 4, 8, 2, 30]], [[11, 3, 3, 17], [21, 22], [1]])


def float64_scores(model, ref: ReferenceSet, temperature: float) -> list[dict[str, np.ndarray]]:
    out = []
    for prompt, completion in zip(ref.prompts, ref.completions):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].double() / temperature
        logp_all = torch.log_softmax(logits, -1)
        p = logp_all.exp()
        out.append({"entropy": -(p * logp_all).sum(-1).numpy(), "renyi2": (-torch.log((p * p).sum(-1))).numpy(),
                    "logp": logp_all.gather(-1, torch.tensor(completion)[:, None])[:, 0].numpy()})
    return out


def test_teacher_forced_scores_equal_each_completion_scored_alone_in_float64(tiny):
    model, _ = tiny
    for temperature in (1.0, 0.7):
        got = score(model.eval(), REF, temperature=temperature, batch_size=2)    # padding within a batch
        want = float64_scores(model, REF, temperature)
        for i, w in enumerate(want):
            for name in ("entropy", "renyi2", "logp"):
                assert getattr(got, name)[i] == pytest.approx(w[name], abs=1e-5), (i, name)
            assert np.all(got.renyi2[i] <= got.entropy[i] + 1e-6)              # 0 <= H2 <= H <= log V
            assert np.all((got.renyi2[i] >= 0) & (got.entropy[i] <= math.log(model.config.vocab_size)))


def test_pattern_scalars_on_a_hand_worked_example():
    base = Scored([np.array([0.1, 0.9, 0.8, 0.05])], [np.array([0.1, 0.5, 0.4, 0.0])],
                  [np.array([-0.1, -1.0, -0.9, -0.01])]).with_forks(ForkRule.parse("abs:0.5"))
    now = Scored([np.array([0.1, 0.2, 0.9, 0.7])], [np.array([0.05, 0.1, 0.5, 0.3])],
                 [np.array([-0.2, -0.3, -1.0, -0.5])]).with_forks(ForkRule.parse("abs:0.5"))
    out = pattern_scalars(base, now)
    # base forks {1, 2}, now {2, 3}: one shared of two base forks, of three in either
    assert out["ref/fork_overlap"] == pytest.approx(0.5) and out["ref/fork_jaccard"] == pytest.approx(1 / 3)
    assert out["ref/entropy/base_forks"] == pytest.approx((0.2 + 0.9) / 2)
    assert out["ref/entropy/base_rest"] == pytest.approx((0.1 + 0.7) / 2)
    assert out["ref/dh/mean"] == pytest.approx((0 + 0.7 + 0.1 + 0.65) / 4)
    assert out["ref/logp/mean"] == pytest.approx(-2.0 / 4) and out["ref/fork/frac"] == pytest.approx(0.5)
    # ranks: base (2, 4, 3, 1), now (1, 2, 4, 3): rho = 1 - 6·Σd² / (n(n²-1)) = 1 - 6·(1+4+1+4)/60
    assert out["ref/spearman"] == pytest.approx(1 - 6 * 10 / 60)
    # four positions by base H: 0.05 (d1), 0.1 (d3), 0.8 (d6), 0.9 (d8) — each its own decile
    assert decile_of(np.array([0.1, 0.9, 0.8, 0.05])).tolist() == [2, 7, 5, 0]
    assert out["ref/dh/d1"] == pytest.approx(0.65) and out["ref/dh/d8"] == pytest.approx(0.7)
    assert "ref/dh/d2" not in out
    # top:q picks its own threshold over the whole set at each step
    top = Scored([np.array([0.1, 0.9, 0.8, 0.05])], [np.zeros(4)], [np.zeros(4)]).with_forks(ForkRule.parse("top:0.5"))
    assert top.threshold == pytest.approx(np.quantile([0.1, 0.9, 0.8, 0.05], 0.5))
    assert top.fork[0].tolist() == [False, True, True, False]


def test_deciles_hold_a_tenth_each_even_when_most_entropies_tie():
    h = np.r_[np.zeros(70), np.linspace(0.1, 2, 30)]
    counts = np.bincount(decile_of(h), minlength=10)
    assert counts.tolist() == [10] * 10
    assert set(decile_of(h)[70:]) == {7, 8, 9}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    with InProcessCollector(tmp_path_factory.mktemp("reference") / "r.duckdb") as collector:
        yield collector


def test_rescore_in_any_loop_streams_rows_and_ref_scalars_through_a_real_collector(tiny, srv, http):
    import forksight

    model, tok = tiny
    handle = forksight.attach(model, "plain-loop", url=srv.url, tokenizer=tok, fork_rule="top:0.3")
    with pytest.raises(ValueError, match="set_reference"):
        handle.rescore()
    handle.set_reference(REF.prompts, REF.completions)
    with pytest.raises(ValueError, match="already has a reference set"):
        handle.set_reference(REF.prompts, REF.completions)
    base = handle.rescore(step=0)
    assert base["ref/fork_overlap"] == 1.0 and base["ref/dh/mean"] == 0.0 and base["ref/spearman"] == 1.0
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.tensor([REF.prompts[0] + REF.completions[0]])
    for _ in range(3):                                     # move the policy: the next scoring must differ
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    moved = handle.rescore(step=3)
    handle.detach()
    run = handle.sink.run_id
    assert http.get(f"/api/runs/{run}/reference_steps").json() == [0, 3]
    first = http.get(f"/api/runs/{run}/reference", params={"step": 0, "limit": 7})
    total = sum(len(p) + len(c) for p, c in zip(REF.prompts, REF.completions))
    assert first.status_code == 200 and first.headers["X-Total-Count"] == str(total)
    rows, cursor = first.json(), first.headers.get("X-Next-Cursor")
    while cursor:
        page = http.get(f"/api/runs/{run}/reference", params={"step": 0, "limit": 7, "cursor": cursor})
        rows, cursor = rows + page.json(), page.headers.get("X-Next-Cursor")
    ref, base_scored = set_from_rows(rows)                 # the set comes back whole from the base's rows
    assert (ref.prompts, ref.completions) == (REF.prompts, REF.completions)
    later = http.get(f"/api/runs/{run}/reference", params={"step": 3, "limit": 100}).json()
    assert all(r["pos"] >= 0 for r in later) and len(later) == sum(len(c) for c in REF.completions)
    # the stored statistics are the scorer's; the ref/* scalars recomputed from the rows agree
    want = float64_scores(model.eval(), REF, 1.0)
    for r in later:
        assert r["entropy"] == pytest.approx(want[r["sample_id"]]["entropy"][r["pos"]], abs=1e-5)
    rule = ForkRule.parse("top:0.3")
    now = Scored(*[[np.array([r[k] for r in later if r["sample_id"] == i]) for i in range(3)]
                   for k in ("entropy", "renyi2", "logp")]).with_forks(rule)
    again = pattern_scalars(base_scored.with_forks(rule), now)
    assert again["ref/dh/mean"] == pytest.approx(moved["ref/dh/mean"], abs=1e-5) and moved["ref/dh/mean"] > 1e-3
    assert again["ref/fork_overlap"] == pytest.approx(moved["ref/fork_overlap"])
    assert [bool(r["fork"]) for r in later] == np.concatenate(now.fork).tolist()
    keys = http.get(f"/api/runs/{run}/scalar_keys").json()
    assert {"ref/fork_overlap", "ref/fork_jaccard", "ref/spearman", "ref/dh/d1", "ref/logp/mean"} <= set(keys)


def test_a_checkpoint_of_another_vocabulary_is_refused_by_name(tiny):
    model, _ = tiny
    too_big = ReferenceSet([[1, 2]], [[model.config.vocab_size + 3]])
    with pytest.raises(ValueError, match=f"token id {model.config.vocab_size + 3}, outside this model's vocabulary"):
        score(model, too_big)
    with pytest.raises(ValueError, match="one prompt per completion"):
        ReferenceSet([[1]], [[2], [3]])
    with pytest.raises(ValueError, match="empty"):
        ReferenceScorer(None, ReferenceSet([], []))


def test_rows_without_prompts_are_not_a_base():
    with pytest.raises(ValueError, match="no prompt tokens"):
        set_from_rows([{"sample_id": 0, "pos": 0, "token_id": 3, "entropy": 0.1, "renyi2": 0.1, "logp": -1.0}])
