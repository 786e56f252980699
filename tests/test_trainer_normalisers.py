"""Each loss normaliser's per-token weight (docs/algorithms.md §8, "What each normaliser weighs"):
the gradient of the trainer's real loss with respect to every token's log p, by autograd, against
the formula written out here by hand, and the hand-worked example of the docs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from forksight.hooks.metrics import TokenStats
from forksight.trainer.loss import grpo_loss
from forksight.trainer.selection import select

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
# a fixed batch: 3 responses of 4, 6 and 2 valid tokens (N = 12), advantages of both signs
VALID = np.array([[1, 1, 1, 1, 0, 0],
                  [1, 1, 1, 1, 1, 1],
                  [1, 1, 0, 0, 0, 0]], bool)
SELECTED = np.array([[0, 1, 0, 1, 0, 1],   # the padding position (0, 5) must not count
                     [1, 1, 0, 1, 0, 0],
                     [1, 1, 0, 0, 0, 0]], bool)
ADV = np.array([1.5, -0.8, 0.6])
# log π − log π_old per token: most inside the clip range, two outside it on the side that clips
LOG_RATIO = np.array([[0.05, -0.10, 0.30, 0.02, 0.0, 0.0],     # A > 0: r = e^0.3 > 1.28 clips
                      [-0.40, 0.01, -0.03, 0.08, -0.05, 0.0],  # A < 0: r = e^-0.4 < 0.8 clips
                      [0.10, -0.02, 0.0, 0.0, 0.0, 0.0]])


def _autograd(normalizer: str, selected: np.ndarray = SELECTED) -> np.ndarray:
    """d loss / d log π per token, through trainer.loss.grpo_loss."""
    old = torch.linspace(-2.0, -0.1, VALID.size, dtype=torch.float32).view(VALID.shape)
    logp = (old + torch.tensor(LOG_RATIO, dtype=torch.float32)).requires_grad_(True)
    loss, _ = grpo_loss(logp, old, torch.tensor(ADV, dtype=torch.float32), torch.tensor(selected),
                        torch.tensor(VALID), clip_low=CLIP_LOW, clip_high=CLIP_HIGH, normalizer=normalizer)
    loss.backward()
    return logp.grad.double().numpy()


def _weights(normalizer: str, selected: np.ndarray) -> np.ndarray:
    """w_{i,t}, each token's weight in the loss, written out (M = selected ∧ valid):
    tokens: M/N_valid; selected: M/N_sel; response: M/(k_i · B'), k_i = Σ_t M_{i,t}, B' = rows with k_i > 0."""
    m = (selected & VALID).astype(float)
    if normalizer == "tokens":
        return m / VALID.sum()
    if normalizer == "selected":
        return m / m.sum()
    k = m.sum(1, keepdims=True)
    return np.divide(m, k * (k[:, 0] > 0).sum(), out=np.zeros_like(m), where=k > 0)


def _by_hand(normalizer: str, selected: np.ndarray = SELECTED) -> np.ndarray:
    """d/d log π of w·(−min(rA, clip(r)A)) = −w·A·r where the unclipped term is the min, else 0."""
    r = np.exp(LOG_RATIO)
    a = ADV[:, None]
    clipped = ((a > 0) & (r > 1 + CLIP_HIGH)) | ((a < 0) & (r < 1 - CLIP_LOW))
    return np.where(clipped, 0.0, -_weights(normalizer, selected) * a * r)


@pytest.mark.parametrize("normalizer", ["tokens", "selected", "response"])
def test_gradient_per_token_is_the_written_out_weight(normalizer):
    got = _autograd(normalizer)
    assert np.allclose(got, _by_hand(normalizer), atol=1e-7, rtol=1e-5)
    assert (got[~(SELECTED & VALID)] == 0).all()  # unselected and padding: no gradient at all
    assert got[0, 2] == 0 and got[1, 0] == 0        # the two clipped tokens


@pytest.mark.parametrize("normalizer", ["tokens", "selected", "response"])
def test_weight_relative_to_all(normalizer):
    """Per selected token, grad(normaliser) / grad(`all`) is 1 (tokens), N/N_sel (selected) or
    N/(B'·k_i) (response): the table in the docs."""
    everything = _autograd("tokens", VALID)  # `all`: every valid token, divided by N
    got = _autograd(normalizer)
    m = SELECTED & VALID
    n, k = VALID.sum(), m.sum(1)
    expected = {"tokens": np.ones(3), "selected": np.full(3, n / m.sum()), "response": n / (3 * k)}[normalizer]
    live = m & (everything != 0)
    rows = np.nonzero(live)[0]
    assert np.allclose(got[live] / everything[live], expected[rows], rtol=1e-5)
    # by hand: N = 12, N_sel = 7, k = (2, 3, 2) (the selected padding position (0, 5) does not count)
    by_hand = {"tokens": [1, 1, 1], "selected": [12 / 7] * 3, "response": [12 / 6, 12 / 9, 12 / 6]}[normalizer]
    ratio = got / np.where(everything == 0, 1, everything)
    assert np.allclose([ratio[i][live[i]][0] for i in range(3)], by_hand, rtol=1e-5)


def _doc_batch():
    """The docs' example: two responses of 10 and 30 valid tokens (N = 40). The score (entropy for
    fork, JS for ICT) puts the batch's top 8 as 2 tokens of response 1 and 6 of response 2."""
    valid = torch.zeros(2, 30, dtype=torch.bool)
    valid[0, :10] = True
    valid[1, :] = True
    score = torch.zeros(2, 30)
    score[0, :10] = torch.tensor([0.1 * j for j in range(8)] + [5.0, 5.1])
    score[1, :] = torch.tensor([0.1 + 0.01 * j for j in range(24)] + [6.0 + 0.1 * j for j in range(6)])
    zeros = torch.zeros_like(score)
    stats = TokenStats(entropy=score, renyi2=zeros, top1=zeros, logp=zeros, js=score, mask=valid)
    return stats, valid


def test_docs_hand_worked_example():
    """docs/algorithms.md: `all` 1/40 per token; fork (paper) 1/40 on its 8 tokens (×1);
    fork (verl) 1/8 (×5); ICT 1/(2·1) on response 1's one token (×20), 1/(2·3) on response 2's
    three (×6.67)."""
    stats, valid = _doc_batch()
    adv = torch.tensor([1.0, 1.0])
    fork_paper = select("fork", stats, rho=0.2)
    fork_verl = select("fork", stats, rho=0.2, normalizer="verl")
    ict = select("ict", stats, rho=0.1)
    assert fork_paper.mask[0].sum() == 2 and fork_paper.mask[1].sum() == 6
    assert ict.mask[0].sum() == 1 and ict.mask[1].sum() == 3

    def grads(sel_mask, normalizer):
        logp = torch.full(valid.shape, -0.5, requires_grad=True)
        loss, _ = grpo_loss(logp, logp.detach(), adv, sel_mask, valid, normalizer=normalizer)
        loss.backward()
        return -logp.grad  # at ratio 1 and A = 1, −dL/d log π is the token's weight

    every = grads(valid, select("all", stats).normalizer)
    assert torch.allclose(every[valid], torch.full((40,), 1 / 40))
    for sel, weight in ((fork_paper, [1 / 40, 1 / 40]), (fork_verl, [1 / 8, 1 / 8]), (ict, [1 / 2, 1 / 6])):
        w = grads(sel.mask, sel.normalizer)
        for row in range(2):
            assert torch.allclose(w[row][sel.mask[row]], torch.tensor(weight[row]))
        assert (w[~sel.mask] == 0).all()
    rel = grads(ict.mask, ict.normalizer)[ict.mask] / every[ict.mask]
    assert torch.allclose(rel, torch.tensor([20.0, 40 / 6, 40 / 6, 40 / 6]))
