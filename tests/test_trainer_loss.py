"""GRPO/DAPO loss pieces against hand-worked numbers and float64 numpy references."""
from __future__ import annotations

import math

import numpy as np
import torch

from forksight.trainer.loss import (bounded_nll, distill_loss, grpo_loss, group_advantages, k3_kl,
                          masked_normalise)


def test_group_advantages_hand_worked():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_advantages(rewards, groups, eps=0.0 + 1e-12)
    # group 0: mean 0.5, population std 0.5 → ±1; group 1 has no variance → 0
    assert torch.allclose(adv, torch.tensor([1.0, -1, -1, 1, 0, 0, 0, 0]), atol=1e-6)
    centred = group_advantages(rewards, groups, scale=False)
    assert torch.allclose(centred, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))


def test_clipped_surrogate_hand_worked_with_clip_higher():
    # four one-token responses: (ratio, A) = (1.5, +1), (0.5, -1), (0.5, +1), (1.5, -1)
    ratio = torch.tensor([[1.5], [0.5], [0.5], [1.5]])
    old = torch.zeros(4, 1)
    logp = torch.log(ratio).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    valid = torch.ones(4, 1, dtype=torch.bool)
    loss, info = grpo_loss(logp, old, adv, valid, valid, clip_low=0.2, clip_high=0.28)
    # -min(rA, clip(r)A): -1.28 (clipped high), +0.8 (clipped low), -0.5, +1.5
    assert math.isclose(loss.item(), (-1.28 + 0.8 - 0.5 + 1.5) / 4, rel_tol=1e-6)
    assert math.isclose(info["clip/frac"], 0.5)
    loss.backward()
    # clipped tokens get no gradient; unclipped ones get -A·r / N
    expected = torch.tensor([[0.0], [0.0], [-0.5 / 4], [1.5 / 4]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_loss_gradient_is_zero_on_unselected_tokens():
    torch.manual_seed(0)
    logp = (-torch.rand(3, 6) * 3).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0])
    valid = torch.ones(3, 6, dtype=torch.bool)
    valid[2, 4:] = False
    selected = torch.rand(3, 6) > 0.5
    for norm in ("tokens", "selected", "response"):
        logp.grad = None
        loss, _ = grpo_loss(logp, logp.detach(), adv, selected, valid, normalizer=norm)
        loss.backward()
        trained = selected & valid
        assert torch.all(logp.grad[~trained] == 0)
        assert torch.all(logp.grad[trained] != 0)


def test_normalisers_match_numpy():
    rng = np.random.default_rng(1)
    per_token = rng.normal(size=(3, 5))
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)
    selected = np.array([[1, 0, 0, 1, 0], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]], bool) & valid
    t = lambda a: torch.tensor(a)  # noqa: E731
    got = {n: masked_normalise(t(per_token), t(selected), t(valid), n).item()
           for n in ("tokens", "selected", "response")}
    assert math.isclose(got["tokens"], (per_token * selected).sum() / valid.sum(), rel_tol=1e-9)
    assert math.isclose(got["selected"], (per_token * selected).sum() / selected.sum(), rel_tol=1e-9)
    rows = [(per_token[i] * selected[i]).sum() / selected[i].sum() for i in range(2)]  # row 2 empty
    assert math.isclose(got["response"], float(np.mean(rows)), rel_tol=1e-9)


def test_k3_kl_is_nonnegative_and_zero_at_equality():
    logp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    ref = torch.log(torch.tensor([0.4, 0.5, 0.3]))
    kl = k3_kl(logp, ref)
    r = (ref - logp).double().numpy()
    assert np.allclose(kl.double().numpy(), np.exp(r) - r - 1, atol=1e-6)
    assert kl[1] == 0 and torch.all(kl >= 0)


def test_grpo_loss_adds_beta_times_k3():
    logp = torch.log(torch.tensor([[0.2, 0.5]]))
    ref = torch.log(torch.tensor([[0.4, 0.5]]))
    valid = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([0.0])  # surrogate is zero: only the KL term remains
    loss, info = grpo_loss(logp, logp, adv, valid, valid, ref_logp=ref, beta=0.5)
    expected_kl = (math.exp(math.log(2)) - math.log(2) - 1) / 2  # token 1: r = log 2; token 2: 0
    assert math.isclose(info["kl"], expected_kl, rel_tol=1e-5)
    assert math.isclose(loss.item(), 0.5 * expected_kl, rel_tol=1e-5)


def test_bounded_nll_is_bounded_and_tracks_cross_entropy_on_confident_tokens():
    p = torch.tensor([1e-9, 0.5, 0.999])
    values = bounded_nll(torch.log(p))
    assert torch.all(values <= math.log(2) + 1e-6)
    assert math.isclose(values[0].item(), math.log(2), rel_tol=1e-6)
    assert math.isclose(values[2].item(), -math.log(0.999), rel_tol=1e-2)


def test_distill_loss_is_mean_over_selected():
    kl = torch.tensor([[0.5, 2.0, 9.0], [1.0, 3.0, 0.0]])
    selected = torch.tensor([[False, True, False], [True, False, False]])
    assert math.isclose(distill_loss(kl, selected).item(), 1.5)
