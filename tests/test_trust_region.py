"""Where the trust region binds (issue 49): the divergences against float64 references computed
another way, the ratio clip as TRL counts it, DPPO's mask and its gradient on a hand-worked example,
the trust/* split scalars against numpy, TV exactly 0 where the policy has not moved, and real
bundled-trainer runs under each region with their scalars stored; bad flags exit 2 naming them."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from forksight.hooks.metrics import trust
from forksight.monitor.collector.store import Store
from forksight.trainer import loss as losses
from forksight.trainer.config import load_config
from forksight.trainer.loop import train

REPO = Path(__file__).resolve().parents[1]


def _probs(rng, n, v):
    p = rng.dirichlet(np.ones(v) * 0.3, size=n)
    return p


def test_binary_tv_and_binary_kl_against_float64():
    rng = np.random.default_rng(0)
    p_old, p = rng.uniform(1e-4, 0.999, 200), rng.uniform(1e-4, 0.999, 200)
    got_tv = trust.binary_tv(torch.tensor(np.log(p)), torch.tensor(np.log(p_old))).numpy()
    assert np.allclose(got_tv, np.abs(p - p_old), atol=1e-6)
    want_kl = p_old * np.log(p_old / p) + (1 - p_old) * np.log((1 - p_old) / (1 - p))
    got_kl = trust.binary_kl(torch.tensor(np.log(p), dtype=torch.float32),
                             torch.tensor(np.log(p_old), dtype=torch.float32)).numpy()
    assert np.allclose(got_kl, want_kl, rtol=1e-4, atol=1e-5)
    # the policy did not move: both exactly 0
    same = torch.log(torch.tensor(p_old, dtype=torch.float32))
    assert trust.binary_tv(same, same).max().item() == 0.0 and trust.binary_kl(same, same).max().item() == 0.0


def test_topk_and_full_kl_against_float64_and_each_other():
    rng = np.random.default_rng(1)
    n, v, t = 12, 50, 0.7
    old_logits, logits = rng.normal(size=(n, v)) * 2, rng.normal(size=(n, v)) * 2
    log_old = old_logits / t - np.log(np.exp(old_logits / t).sum(-1, keepdims=True))
    log_new = logits / t - np.log(np.exp(logits / t).sum(-1, keepdims=True))
    want_full = (np.exp(log_old) * (log_old - log_new)).sum(-1)
    got_full = trust.full_kl(torch.tensor(logits, dtype=torch.float32),
                             torch.tensor(log_old, dtype=torch.float32), t).numpy()
    assert np.allclose(got_full, want_full, rtol=1e-4, atol=1e-5)
    # top-k: π_old's k largest kept, the rest one bucket (computed here from the definition)
    k = 5
    ids, lp = trust.old_topk(torch.tensor(old_logits, dtype=torch.float32), t, k)
    got_k = trust.topk_kl(torch.tensor(logits, dtype=torch.float32), ids, lp, t).numpy()
    for row in range(n):
        top = np.argsort(-log_old[row])[:k]
        assert set(ids[row].tolist()) == set(top.tolist())
        po, pn = np.exp(log_old[row]), np.exp(log_new[row])
        rest_o, rest_n = 1 - po[top].sum(), 1 - pn[top].sum()
        want = (po[top] * np.log(po[top] / pn[top])).sum() + rest_o * np.log(rest_o / rest_n)
        assert got_k[row] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert (got_k <= got_full + 1e-5).all()                      # a lower bound of the full KL (data processing)
    ids_all, lp_all = trust.old_topk(torch.tensor(old_logits, dtype=torch.float32), t, v)
    assert np.allclose(trust.topk_kl(torch.tensor(logits, dtype=torch.float32), ids_all, lp_all, t).numpy(),
                       want_full, rtol=1e-3, atol=1e-5)           # k = V: exactly the full KL


def test_ratio_clip_counts_as_trl_does():
    ratio = torch.tensor([0.7, 0.7, 1.3, 1.3, 1.0, 0.85])
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0, 1.0, -1.0])
    # below 0.8 with A<0: clipped; below with A>0: not; above 1.28 with A>0: clipped; with A<0: not
    assert trust.ratio_clipped(ratio, adv, 0.2, 0.28).tolist() == [True, False, True, False, False, False]


def test_dppo_mask_cuts_only_the_direction_that_leaves_the_region():
    p_old = torch.tensor([0.50, 0.50, 0.50, 0.50, 0.10, 0.10])
    p = torch.tensor([0.70, 0.70, 0.30, 0.30, 0.20, 0.20])
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])
    lp, olp = torch.log(p), torch.log(p_old)
    keep = trust.dppo_keep(trust.binary_tv(lp, olp), lp, olp, adv, 0.15)
    # TV 0.2 > 0.15: cut where the advantage pushes further out (up with A>0, down with A<0);
    # TV 0.1 < 0.15 (the last two): kept whatever the direction
    assert keep.tolist() == [False, True, False, True, True, True]


def test_the_masked_loss_gradient_on_a_hand_worked_example():
    """-ρA per kept token (token-level mean over valid tokens): d loss / d logp_t = -ρ_t A_t / N_valid
    where kept, exactly 0 where cut."""
    old = torch.log(torch.tensor([[0.5, 0.5, 0.1]]))
    logp = torch.log(torch.tensor([[0.7, 0.3, 0.2]])).requires_grad_(True)
    adv = torch.tensor([1.0])                                        # one row, A = 1 on every token
    sel = valid = torch.ones(1, 3, dtype=torch.bool)
    keep = trust.dppo_keep(trust.binary_tv(logp.detach(), old), logp.detach(), old, adv[:, None], 0.15)
    assert keep.tolist() == [[False, True, True]]                    # 0.5 → 0.7 with A > 0: out, cut
    loss, _ = losses.grpo_loss(logp, old, adv, sel, valid, keep=keep)
    loss.backward()
    ratio = torch.exp(logp.detach() - old)
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -ratio[0, 1] / 3, -ratio[0, 2] / 3]]), atol=1e-7)
    # the ratio clip instead: token 3's ratio 2.0 > 1.28 with A > 0 → clipped, no gradient; token 1's 1.4 too
    logp.grad = None
    loss, _ = losses.grpo_loss(logp, old, adv, sel, valid)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -ratio[0, 1] / 3, 0.0]]), atol=1e-7)


def test_step_scalars_against_numpy():
    rng = np.random.default_rng(2)
    n = 101
    tv, h = rng.uniform(0, 0.4, n), rng.exponential(0.5, n)
    clipped = rng.uniform(size=n) < 0.3
    fork = h >= 0.672
    got = trust.step_scalars(clipped=torch.tensor(clipped), tv=torch.tensor(tv), entropy=torch.tensor(h),
                             tv_delta=0.15)
    out = tv > 0.15
    assert got["trust/clip_frac"] == pytest.approx(clipped.mean())
    assert got["trust/tv_mean"] == pytest.approx(tv.mean(), rel=1e-6)
    assert got["trust/tv_outside_frac"] == pytest.approx(out.mean())
    assert got["trust/clipped_inside_frac"] == pytest.approx((~out[clipped]).mean())
    assert got["trust/unclipped_outside_frac"] == pytest.approx(out[~clipped].mean())
    assert got["trust/clip_frac/fork"] == pytest.approx(clipped[fork].mean())
    assert got["trust/tv_outside_frac/nonfork"] == pytest.approx(out[~fork].mean())
    edges = np.argsort(np.argsort(h, kind="stable"), kind="stable") * 4 // n + 1   # quartile by rank
    for q in range(1, 5):
        assert got[f"trust/clip_frac/q{q}"] == pytest.approx(clipped[edges == q].mean())
        assert got[f"trust/tv_mean/q{q}"] == pytest.approx(tv[edges == q].mean(), rel=1e-6)
    assert sorted(np.bincount(edges)[1:]) in ([25, 25, 25, 26], [25, 25, 26, 25])
    assert h[edges == 4].min() >= h[edges == 1].max()


def test_mean_of_averages_each_key_over_the_updates_that_have_it():
    assert trust.mean_of([{"a": 1.0, "b": 2.0}, {"a": 3.0}]) == {"a": 2.0, "b": 2.0}


def _stored(tmp_path, name, **over):
    db = tmp_path / f"{name}.duckdb"
    # the collapse task grades every completion (advantages are not all 0), so updates move the policy
    values = dict(db=str(db), out_dir=str(tmp_path / "runs"), run=name, steps=3, progress=False, lr=3e-2,
                  task="collapse", max_new_tokens=6)
    values.update(over)
    train(load_config(preset="tiny-test", overrides=values))
    with Store(str(db)) as store:
        rows = store.reader.read_scalars(name, downsample=10**6)
    return {k: g.sort_values("step").value.to_numpy() for k, g in rows.groupby("key")}


def test_tv_is_exactly_zero_on_the_first_update_of_each_batch_where_the_policy_has_not_moved(tmp_path, monkeypatch):
    from forksight.trainer.trust_region import TrustTracker

    seen: list[list[dict]] = []
    original = TrustTracker.scalars
    monkeypatch.setattr(TrustTracker, "scalars", lambda self: (seen.append(list(self.updates)), original(self))[1])
    got = _stored(tmp_path, "first-update", updates_per_batch=3)
    assert len(seen) == 3 and all(len(updates) == 3 for updates in seen)
    for updates in seen:
        assert updates[0]["trust/tv_mean"] == 0.0 and updates[0]["trust/tv_max"] == 0.0
        assert updates[0]["trust/clip_frac"] == 0.0
    assert max(u["trust/tv_max"] for updates in seen for u in updates[1:]) > 0
    # the stored step value is the mean over its three updates
    for step, updates in enumerate(seen):
        assert got["trust/tv_mean"][step] == pytest.approx(np.mean([u["trust/tv_mean"] for u in updates]), rel=1e-5)


def test_one_update_under_the_ratio_clip_stores_no_trust_scalars(tmp_path):
    got = _stored(tmp_path, "one-update")
    assert not [k for k in got if k.startswith("trust/")]
    assert "trust/updates" in _stored(tmp_path, "one-update-tv", trust_region="tv")   # a DPPO region reports


@pytest.mark.parametrize("region", ["ratio", "tv", "binary-kl", "topk-kl", "kl"])
def test_each_region_trains_and_stores_its_trust_scalars(tmp_path, region):
    got = _stored(tmp_path, f"region-{region}", updates_per_batch=3, trust_region=region)
    assert (got["trust/updates"] == 3.0).all()
    assert got["trust/tv_mean"].max() > 0                            # later updates moved the policy
    assert all(0 <= v <= 1 for v in got["trust/clip_frac"])
    if region == "ratio":
        assert "trust/masked_frac" not in got
    else:
        assert "trust/masked_frac" in got and all(0 <= v <= 1 for v in got["trust/masked_frac"])
        assert got["trust/divergence_mean"].max() > 0


def test_the_region_is_recorded_in_the_runs_config(tmp_path):
    db = tmp_path / "c.duckdb"
    train(load_config(preset="tiny-test", overrides=dict(db=str(db), out_dir=str(tmp_path / "runs"), run="cfg",
                                                          steps=1, trust_region="tv", trust_delta=0.1)))
    with Store(str(db)) as store:
        config = store.reader.list_runs().set_index("name").loc["cfg", "config"]
    text = config if isinstance(config, str) else str(config)
    assert '"trust_region": "tv"' in text.replace("'", '"') and '"trust_delta": 0.1' in text.replace("'", '"')


@pytest.mark.parametrize("flags, named", [(["--trust-region", "clip"], "trust_region"),
                                           (["--trust-delta", "0"], "trust_delta"),
                                           (["--trust-delta", "-0.5"], "trust_delta")])
def test_bad_trust_flags_exit_2_naming_them(flags, named):
    out = subprocess.run([sys.executable, "-m", "forksight", "train", "--preset", "tiny-test", *flags],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert named.replace("_", "-") in out.stderr or named in out.stderr, out.stderr[-2000:]


def test_default_deltas_are_dppos():
    assert trust.DEFAULT_DELTA == {"tv": 0.15, "binary-kl": 0.05, "topk-kl": 0.05, "kl": 0.05}
    assert load_config(preset="tiny-test").effective_trust_delta == 0.15
    assert load_config(preset="tiny-test", overrides={"trust_region": "kl"}).effective_trust_delta == 0.05
    assert math.isclose(load_config(preset="tiny-test", overrides={"trust_delta": 0.3}).effective_trust_delta, 0.3)


def test_stored_token_columns_agree_with_the_stored_log_p_and_the_group_rewards(tmp_path):
    """ratio, tv and clipped of the last of three updates, stored per token, checked against what
    else is stored: tv = π_old(y)·|r − 1| with π_old(y) = exp(logp) (the rollout's statistics), and
    clipped = the ratio outside the clip range on the side the sample's advantage (the sign of its
    reward minus its group's mean) pushes."""
    name = "token-columns"
    scalars = _stored(tmp_path, name, updates_per_batch=3, token_groups=8)
    step = 1 + int(np.argmax(scalars["trust/clip_frac"]))     # steps count from 1; the one the clip bound most
    cfg = load_config(preset="tiny-test")
    with Store(str(tmp_path / f"{name}.duckdb")) as store:
        tokens = store.reader.read_tokens(name, step)
        samples = store.reader.read_samples(name, step=step)
    trained = tokens[tokens.selected & ~tokens.env]
    assert len(trained) and trained.tv.notna().all() and trained.clipped.notna().all()
    assert tokens[~tokens.selected].tv.isna().all()         # untrained: unknown, not 0
    ratio, logp = trained.ratio.to_numpy(np.float64), trained.logp.to_numpy(np.float64)
    np.testing.assert_allclose(trained.tv.to_numpy(np.float64), np.exp(logp) * np.abs(ratio - 1), atol=2e-5)
    assert trained.tv.max() > 0                              # the policy moved by the third update
    mean = samples.groupby("group_id").reward.transform("mean")
    sign = dict(zip(samples.sample_id, np.sign(samples.reward - mean)))
    a = trained.sample_id.map(sign).to_numpy()
    expected = ((ratio < 1 - cfg.clip_low) & (a < 0)) | ((ratio > 1 + cfg.clip_high) & (a > 0))
    np.testing.assert_array_equal(trained.clipped.to_numpy(bool), expected)
    assert expected.any() and not expected.all()             # the clip bound some tokens, not all
