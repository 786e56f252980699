"""Each selection strategy keeps the tokens it should, on hand-built batches."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from forksight.hooks.metrics import TokenStats, token_kl
from forksight.trainer.selection import select


def _stats(entropy, mask, js=None, logp=None) -> TokenStats:
    entropy = torch.as_tensor(entropy, dtype=torch.float32)
    mask = torch.as_tensor(mask, dtype=torch.bool)
    zeros = torch.zeros_like(entropy)
    return TokenStats(entropy=entropy * mask, renyi2=zeros, top1=zeros,
                      logp=None if logp is None else torch.as_tensor(logp, dtype=torch.float32),
                      js=None if js is None else torch.as_tensor(js, dtype=torch.float32) * mask,
                      mask=mask)


def _batch(rows=4, width=10, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.permutation(rows * width).reshape(rows, width) / 10.0  # distinct values
    mask = np.ones((rows, width), bool)
    mask[1, 6:] = False
    mask[3, 3:] = False
    return values, mask


def test_all_keeps_every_valid_token_with_token_normaliser():
    h, mask = _batch()
    sel = select("all", _stats(h, mask))
    assert torch.equal(sel.mask, torch.as_tensor(mask)) and sel.normalizer == "tokens"


@pytest.mark.parametrize("normalizer,expected_norm", [("paper", "tokens"), ("verl", "selected")])
def test_fork_keeps_exactly_the_top_rho_entropy_tokens(normalizer, expected_norm):
    h, mask = _batch()
    h_padded = h.copy()
    h_padded[~mask] = 99.0  # padding with huge entropy must never be chosen
    sel = select("fork", _stats(h_padded, mask), rho=0.2, normalizer=normalizer)
    valid_values = h[mask]
    n_keep = int(np.sum(valid_values >= np.quantile(valid_values, 0.8)))
    top = set(np.argsort(-np.where(mask, h, -1).ravel())[:n_keep])
    assert set(np.flatnonzero(sel.mask.numpy().ravel())) == top
    assert abs(int(sel.mask.sum()) - 0.2 * mask.sum()) <= 1     # ρ of the valid tokens, not of the padding
    assert sel.normalizer == expected_norm
    assert np.isclose(sel.info["selected/threshold"], np.quantile(valid_values, 0.8))


def test_ict_keeps_top_rho_js_per_response_and_at_least_one():
    js, mask = _batch(seed=1)
    sel = select("ict", _stats(np.zeros_like(js), mask, js=js), rho=0.1)
    chosen = sel.mask.numpy()
    for row in range(js.shape[0]):
        values = js[row][mask[row]]
        expected = set(np.flatnonzero(mask[row] & (js[row] >= np.quantile(values, 0.9))))
        assert set(np.flatnonzero(chosen[row])) == expected
        assert chosen[row].sum() >= 1
        assert np.argmax(np.where(mask[row], js[row], -1)) in expected
    assert sel.normalizer == "response"
    wider = select("ict", _stats(np.zeros_like(js), mask, js=js), rho=0.5).mask.numpy()
    assert wider[0].sum() == 5  # half of 10 valid tokens (distinct values)


def test_random_keeps_round_rho_of_valid_tokens():
    h, mask = _batch()
    g = torch.Generator().manual_seed(0)
    sel = select("random", _stats(h, mask), rho=0.2, generator=g)
    chosen = sel.mask.numpy()
    assert chosen.sum() == round(0.2 * mask.sum())
    assert not (chosen & ~mask).any()
    other = select("random", _stats(h, mask), rho=0.2, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(sel.mask, other.mask)  # really random, not the top tokens


def test_stapo_silences_only_tokens_meeting_all_three_conditions():
    # row 0: A > 0; row 1: A < 0. Entropy increasing along the row, so low-H = early positions.
    h = np.tile(np.arange(1, 21, dtype=float) / 10, (2, 1))
    mask = np.ones_like(h, bool)
    p = np.full_like(h, 0.5)
    p[:, 0] = 0.001   # improbable and lowest entropy: spurious where A > 0
    p[:, 15] = 0.001  # improbable but high entropy: kept
    adv = torch.tensor([1.0, -1.0])
    stats = _stats(h, mask, logp=np.log(p))
    sel = select("stapo", stats, advantages=adv, stapo_tau_p=0.01, stapo_entropy_q=0.05)
    silenced = mask & ~sel.mask.numpy()
    h_threshold = np.quantile(h[mask], 0.05)
    expected = (adv.numpy()[:, None] > 0) & (p < 0.01) & (h < h_threshold)
    assert np.array_equal(silenced, expected)
    assert silenced.sum() == 1 and silenced[0, 0]
    assert sel.normalizer == "selected"


def test_distillation_picks_argmax_argmin_or_one_random_valid_position():
    torch.manual_seed(0)
    student, teacher = torch.randn(3, 7, 11), torch.randn(3, 7, 11)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[2, 4:] = False
    kl = token_kl(student, teacher, mask)
    kl_padded = kl.clone()
    kl_padded[~mask] = 1e6  # padding never chosen even when its score is extreme
    stats = _stats(np.zeros((3, 7)), mask.numpy())
    masked = np.where(mask.numpy(), kl.numpy(), np.nan)
    hi = select("maxtok", stats, kl=kl_padded).mask.numpy()
    lo = select("mintok", stats, kl=kl_padded).mask.numpy()
    assert np.array_equal(hi.argmax(1), np.nanargmax(masked, 1)) and (hi.sum(1) == 1).all()
    assert np.array_equal(lo.argmax(1), np.nanargmin(masked, 1)) and (lo.sum(1) == 1).all()
    two = select("maxtok", stats, kl=kl_padded, distill_tokens=2).mask.numpy()
    assert (two.sum(1) == 2).all()
    assert set(np.flatnonzero(two[0])) == set(np.argsort(-kl[0].numpy())[:2])
    rnd = select("rand1tok", stats, kl=kl_padded, generator=torch.Generator().manual_seed(0))
    assert (rnd.mask.sum(1) == 1).all() and not (rnd.mask & ~mask).any()


def test_strategies_explain_missing_inputs():
    h, mask = _batch()
    with pytest.raises(ValueError, match="group_ids"):
        select("ict", _stats(h, mask))
    with pytest.raises(ValueError, match="teacher"):
        select("maxtok", _stats(h, mask))
    with pytest.raises(ValueError, match="unknown strategy"):
        select("everything", _stats(h, mask))
