"""StepReporter: one step's tensors become scalars, a histogram, token rows and samples in a
real DuckDB file; every stored value is checked against an independent computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forksight.hooks.metrics import group_scalars
from forksight.hooks.capture.report import StepReporter
from forksight.hooks import metrics
from forksight.monitor.sinks.client import open_sink
from forksight.monitor.collector.store import Store


def _brute_pass_at_k(verdicts: list[list[bool]], k: int) -> float:
    """Enumerate every k-subset of each group: the fraction that holds a correct answer."""
    from itertools import combinations

    vals = []
    for group in verdicts:
        subsets = list(combinations(group, k))
        vals.append(sum(any(s) for s in subsets) / len(subsets))
    return float(np.mean(vals))


def test_group_scalars_match_brute_force_pass_at_k_and_reward_moments():
    group_ids = [0, 0, 0, 0, 1, 1, 1, 1]
    correct = [True, False, False, False, True, True, True, True]
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    out = group_scalars(group_ids, rewards, correct)
    verdicts = [correct[:4], correct[4:]]
    for k in range(1, 5):
        assert out[f"pass@{k}"] == pytest.approx(_brute_pass_at_k(verdicts, k))
    assert out["pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert out["reward/mean"] == pytest.approx(np.mean(rewards))
    assert out["reward/std"] == pytest.approx(np.std(rewards))
    assert out["groups/zero_var_frac"] == 0.5  # group 1 all rewards equal


def test_report_stores_what_the_step_computed(tmp_path, tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)
    B, T = 4, 6
    token_ids = torch.randint(0, len(tokenizer), (B, T))
    logits = torch.randn(B, T, len(tokenizer)) * 3
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    group_ids = [0, 0, 1, 1]
    stats = metrics.token_stats(logits, mask=mask, tokens=token_ids, group_ids=group_ids)
    selected = torch.zeros(B, T, dtype=torch.bool)
    selected[:, 0] = True
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    samples = [
        {"prompt": "1+1=", "completion": "<script>alert(1)</script>", "reward": 1.0, "correct": True, "source": "t"},
        {"prompt": "1+1=", "completion": "3", "reward": 0.0, "correct": False, "source": "t"},
        {"prompt": "2+2=", "completion": "4", "reward": 1.0, "correct": True, "source": "t"},
        {"prompt": "2+2=", "completion": "4", "reward": 1.0, "correct": True, "source": "t"},
    ]
    db = tmp_path / "r.duckdb"
    sink = open_sink(run="rep", db=str(db))
    reporter = StepReporter(sink, tokenizer, token_groups=1)
    scalars = reporter.report(3, stats, token_ids, selected=selected, group_ids=group_ids,
                              advantages=advantages, samples=samples, extra={"loss": 0.25})
    sink.finish()

    valid = mask.numpy()
    ent = stats.entropy.numpy()[valid]
    assert scalars["entropy/mean"] == pytest.approx(ent.mean(), abs=1e-6)
    assert scalars["selected/frac"] == pytest.approx(B / valid.sum())
    # the default rule (top:0.1): the step's 90th percentile of H, as numpy takes it
    from forksight.base.fork_rule import DEFAULT_FORK_RULE

    tau = np.quantile(ent.astype(np.float64), 1 - DEFAULT_FORK_RULE.value)
    assert scalars["fork/threshold"] == pytest.approx(tau, rel=1e-5)
    assert scalars["fork/frac"] == pytest.approx((ent >= scalars["fork/threshold"]).mean())
    assert scalars["fork/quantile"] == DEFAULT_FORK_RULE.value
    assert scalars["length/mean"] == pytest.approx(valid.sum(1).mean())
    logp = stats.logp.numpy()
    adv_tok = np.broadcast_to(advantages.numpy()[:, None], (B, T))[valid]
    cov = ((adv_tok - adv_tok.mean()) * (logp[valid] - logp[valid].mean())).mean()
    assert scalars["cov/logp_adv"] == pytest.approx(cov, rel=1e-5, abs=1e-7)
    assert scalars["pass@2"] == pytest.approx(_brute_pass_at_k([[True, False], [True, True]], 2))

    with Store(str(db)) as store:
        reader = store.reader
        run_id = reader.list_runs().run_id.iloc[0]
        stored = reader.read_scalars(run_id)
        got = dict(zip(stored.key, stored.value))
        assert got["loss"] == 0.25
        assert got["entropy/mean"] == pytest.approx(scalars["entropy/mean"], abs=1e-9)
        hist = reader.read_histograms(run_id)
        assert int(hist["count"].sum()) == int(valid.sum())
        tokens = reader.read_tokens(run_id, 3)
        # group 0 = rows 0 and 1: 6 + 4 valid tokens
        assert len(tokens) == valid[0].sum() + valid[1].sum()
        row1 = tokens[tokens.sample_id == 1].sort_values("pos")
        assert np.allclose(row1.entropy.to_numpy(), stats.entropy[1, :4].numpy(), atol=1e-6)
        assert row1.token.tolist() == [tokenizer.decode([i]) for i in token_ids[1, :4].tolist()]
        assert row1.selected.tolist() == [True, False, False, False]
        stored_samples = reader.read_samples(run_id, step=3).sort_values("sample_id")
        assert stored_samples.completion.iloc[0] == "<script>alert(1)</script>"
        assert stored_samples.group_id.tolist() == group_ids
        assert stored_samples.length.tolist() == valid.sum(1).tolist()
        assert math.isclose(float(stored_samples.reward.sum()), 3.0)


def test_environment_tokens_are_stored_in_place_with_null_statistics_and_never_counted(tmp_path):
    torch.manual_seed(1)
    B, T, V = 3, 6, 16
    logits = torch.randn(B, T, V) * 2
    model_tokens = torch.ones(B, T, dtype=torch.bool)
    model_tokens[0] = False  # row 0: another rank's row (no tokens here), its group listed first
    env = torch.zeros(B, T, dtype=torch.bool)
    env[1, 2:4] = True   # a tool's output inside a completion
    mask = model_tokens & ~env
    token_ids = torch.arange(B * T).view(B, T) % V
    stats = metrics.token_stats(logits, mask=mask, tokens=token_ids)
    sink = open_sink(run="env", db=str(tmp_path / "e.duckdb"))
    scalars = StepReporter(sink, token_groups=1).report(1, stats, token_ids, group_ids=[0, 1, 1], env_mask=env,
                                                        selected=torch.ones(B, T, dtype=torch.bool))
    sink.finish()
    h = stats.entropy.numpy()[mask.numpy()].astype(np.float64)
    assert scalars["tokens/count"] == 10 and scalars["entropy/mean"] == pytest.approx(h.mean(), abs=1e-9)
    assert scalars["length/mean"] == pytest.approx((4 + 6) / 2) and scalars["selected/frac"] == 1.0
    with Store(str(tmp_path / "e.duckdb")) as store:
        run_id = store.reader.list_runs().run_id.iloc[0]
        tokens = store.reader.read_tokens(run_id, 1).sort_values(["sample_id", "pos"])
        assert int(store.reader.read_histograms(run_id)["count"].sum()) == 10
    assert sorted(tokens.sample_id.unique()) == [1, 2]  # the group this rank has tokens for
    row = tokens[tokens.sample_id == 1]
    assert row.pos.tolist() == list(range(6)) and row.token_id.tolist() == token_ids[1].tolist()
    assert row.entropy.isna().tolist() == [False, False, True, True, False, False]
    assert row[["logp", "renyi2", "top1"]].iloc[2:4].isna().all().all()
    assert row.selected.tolist() == [True, True, False, False, True, True]
    assert not row.fork.iloc[2:4].any()
