"""ICT end to end on a hand-built ragged batch: the JS score, the selection and the log p the loss
trains all sit on the same (row, token), with the advantage's sign, against a float64 reference
that runs the model on each unpadded prefix one at a time (docs/algorithms.md §3, §8)."""
from __future__ import annotations

import numpy as np
import torch

from forksight.trainer.config import TrainConfig
from forksight.trainer.rollout import Rollout, completion_mask
from forksight.trainer.step import Context, forward, selection, statistics, update
from forksight.trainer.tasks import make_task

TEMPERATURE = 0.7
RHO = 0.3
# group 0: three rows ending at 6 (no EOS), 3 and 5 tokens; group 1: 4, 6 and 2 tokens.
LENGTHS = [6, 3, 5, 4, 6, 2]
PROMPTS = ["12+34=", "5+7="]  # different lengths: the second is left-padded


def _rollout(tokenizer) -> Rollout:
    """Prompts left-padded as generate() does, hand-chosen completions padded with EOS after it."""
    eos, width, group = tokenizer.eos_token_id, max(LENGTHS), 3
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    gen = torch.Generator().manual_seed(3)
    completion = torch.full((len(LENGTHS), width), eos, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        completion[row, :length] = torch.randint(5, len(tokenizer), (length,), generator=gen)
        if length < width:
            completion[row, length - 1] = eos  # the EOS is the row's last valid token
    ids = enc.input_ids.repeat_interleave(group, 0)
    attn = enc.attention_mask.repeat_interleave(group, 0)
    mask = completion_mask(completion, eos)
    assert mask.sum(1).tolist() == LENGTHS
    return Rollout(torch.cat([ids, completion], 1), torch.cat([attn, mask.long()], 1), ids.shape[1],
                   completion, mask, torch.arange(2).repeat_interleave(group), ["?"] * len(LENGTHS))


def _reference_probs(model, tokenizer, roll: Rollout) -> list[np.ndarray]:
    """Per row, float64 softmax(z/T) [len, V] from the model run on prompt + completion[:t],
    unpadded, one prefix at a time: no padding, position ids or slicing can shift it."""
    out = []
    for row, length in enumerate(LENGTHS):
        prompt = tokenizer(PROMPTS[row // 3]).input_ids
        rows = []
        for t in range(length):
            ids = torch.tensor([prompt + roll.completion[row, :t].tolist()])
            with torch.no_grad():
                z = model(input_ids=ids).logits[0, -1].double().numpy() / TEMPERATURE
            p = np.exp(z - z.max())
            rows.append(p / p.sum())
        out.append(np.array(rows))
    return out


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def _reference_js(probs: list[np.ndarray]) -> np.ndarray:
    """JS(p_{i,t} ‖ P̄_t), P̄_t the mean over the group's rows still active at t; 0 when alone."""
    js = np.zeros((len(LENGTHS), max(LENGTHS)))
    for g in range(2):
        members = range(3 * g, 3 * g + 3)
        for t in range(max(LENGTHS)):
            active = [i for i in members if t < LENGTHS[i]]
            if len(active) < 2:
                continue
            mean = np.mean([probs[i][t] for i in active], axis=0)
            for i in active:
                p = probs[i][t]
                js[i, t] = _entropy((p + mean) / 2) - _entropy(p) / 2 - _entropy(mean) / 2
    return js


def _context(model, tokenizer) -> Context:
    config = TrainConfig(strategy="ict", rho=RHO, temperature=TEMPERATURE, warmup=False, stream=False,
                         progress=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the gradient is what is checked
    return Context(config, model, tokenizer, optimizer, make_task("arith"), split_head=True)


def test_ict_score_selection_and_trained_logp_share_positions(tiny):
    model, tokenizer = tiny
    model.train()
    roll = _rollout(tokenizer)
    ctx = _context(model, tokenizer)
    probs = _reference_probs(model, tokenizer, roll)
    js_ref = _reference_js(probs)
    valid = roll.mask.numpy()

    logits, hidden = forward(ctx, roll, sparse=True)  # the path ICT trains with
    stats = statistics(ctx, roll, logits, report=False)
    assert np.allclose(stats.js.numpy(), js_ref * valid, atol=2e-5)
    assert stats.js[0, 5] == 0 and stats.js[4, 5] == 0  # the only row of its group still active at t = 5
    logp_ref = np.zeros_like(js_ref)
    for row, length in enumerate(LENGTHS):
        logp_ref[row, :length] = np.log(probs[row][np.arange(length), roll.completion[row, :length].numpy()])
    assert np.allclose(stats.logp.numpy(), logp_ref, atol=2e-5)

    # selection: per row the valid tokens at or above the row's (1 - ρ) quantile of the reference JS
    adv = torch.tensor([1.0, -1.0, 0.5, -0.7, 0.7, 0.0])
    sel, _, _ = selection(ctx, 1, roll, logits, stats, adv)
    expected = np.zeros_like(valid)
    for row, length in enumerate(LENGTHS):
        expected[row, :length] = js_ref[row, :length] >= np.quantile(js_ref[row, :length], 1 - RHO) - 1e-6
    assert np.array_equal(sel.mask.numpy(), expected)
    assert sel.normalizer == "response"

    # the loss: the output layer runs on the selected rows only; capture its logits and their gradient
    picked: list[torch.Tensor] = []

    def keep(module, inputs, output):
        if output.requires_grad:
            output.retain_grad()
            picked.append(output)

    handle = model.get_output_embeddings().register_forward_hook(keep)
    try:
        update(ctx, roll, logits, hidden, adv, sel, None)
    finally:
        handle.remove()
    (z,) = picked
    rows, cols = sel.mask.nonzero(as_tuple=True)
    assert z.shape[0] == len(rows)
    counts = sel.mask.sum(1).double()
    for n, (b, t) in enumerate(zip(rows.tolist(), cols.tolist())):
        p = probs[b][t]
        # the trained logits are the ones that produced token t of row b ...
        assert np.allclose(torch.softmax(z[n].detach().double() / TEMPERATURE, -1).numpy(), p, atol=1e-5)
        # ... and d loss / d z = -(A_b / (B·k_b)) (onehot(y) - p) / T at ratio 1 (normaliser `response`)
        y = int(roll.completion[b, t])
        onehot = np.eye(len(p))[y]
        weight = float(adv[b]) / (len(LENGTHS) * float(counts[b]))
        grad_ref = -weight * (onehot - p) / TEMPERATURE
        assert np.allclose(z.grad[n].double().numpy(), grad_ref, atol=1e-6), (b, t)
        # the sign: gradient descent raises the sampled token's logit where A > 0, lowers it where A < 0
        assert np.sign(-z.grad[n, y].item()) == np.sign(float(adv[b]))
