"""hooks.attach on a plain PyTorch/HF loop: stats equal a float64 reference, hooks change nothing,
samples give pass@k, detach removes everything. Real tiny model, real DuckDB file."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import forksight
from forksight.compose.local import LocalSink

TEXTS = ["Q: 12+34= A: 46", "Q: 1+2= A: 3", "Q: 55+5= A: 60", "Q: 9+9= A: 18"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _batch(tokenizer):
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    labels[:, :4] = -100  # the first tokens act as a prompt: not scored
    return enc, labels


def _loss_and_grads(model, enc, labels):
    model.zero_grad(set_to_none=True)
    loss = model(**enc, labels=labels).loss
    loss.backward()
    return loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _reference(logits: np.ndarray, tokens: np.ndarray, groups: list[int], mask: np.ndarray):
    """float64 H, H2, log p and JS to the group mean (active rollouts only), by the book."""
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    logp_all = np.log(p)
    H = -(p * logp_all).sum(-1)
    H2 = -np.log((p ** 2).sum(-1))
    logp = np.take_along_axis(logp_all, tokens[..., None], -1)[..., 0]
    js = np.zeros_like(H)
    for t in range(p.shape[1]):
        for g in set(groups):
            rows = [b for b in range(p.shape[0]) if groups[b] == g and mask[b, t]]
            if len(rows) < 2:
                continue
            mean = p[rows, t].mean(0)
            for b in rows:
                m = 0.5 * (p[b, t] + mean)
                kl = lambda a, c: float(np.sum(np.where(a > 0, a * np.log(a / c), 0.0)))  # noqa: E731
                js[b, t] = 0.5 * kl(p[b, t], m) + 0.5 * kl(mean, m)
    return H, H2, logp, js


def test_hooks_leave_loss_and_grads_bit_identical(tiny):
    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    loss_plain, grads_plain = _loss_and_grads(model, enc, labels)
    from forksight.monitor.sinks.client import NullSink

    with forksight.attach(model, sink=NullSink(), group_size=2, js_groups="all") as handle:
        loss_hooked, grads_hooked = _loss_and_grads(model, enc, labels)
        assert handle.step == 1  # the forward was observed and reported
    loss_after, grads_after = _loss_and_grads(model, enc, labels)
    assert torch.equal(loss_plain, loss_hooked) and torch.equal(loss_plain, loss_after)
    for name in grads_plain:
        assert torch.equal(grads_plain[name], grads_hooked[name]), name
        assert torch.equal(grads_plain[name], grads_after[name]), name


def test_stored_tokens_equal_float64_reference_and_pass_at_k(tiny, tmp_path):
    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    sink = LocalSink(str(tmp_path / "plain.duckdb"), "plain")
    handle = forksight.attach(model, sink=sink, tokenizer=tokenizer, group_size=2, js_groups="all", sample=2)
    rewards, correct = [1.0, 0.0, 1.0, 1.0], [True, False, True, True]
    handle.log_samples(None, TEXTS, ["46", "4", "60", "18"], rewards, correct)  # before the forward, like GRPO
    model(**enc, labels=labels).loss.backward()
    handle.detach()
    sink.flush()

    with torch.no_grad():
        logits = model(**enc).logits[:, :-1].double().numpy()
    target = labels[:, 1:].numpy()
    mask = target != -100
    start = int(np.argmax(mask.any(0)))
    logits, target, mask = logits[:, start:], target[:, start:], mask[:, start:]
    H, H2, logp, js = _reference(logits, np.where(mask, target, 0), [0, 0, 1, 1], mask)

    tokens = sink.reader.read_tokens(sink.run_id, 0)
    assert len(tokens) == int(mask.sum())  # two groups stored: every valid token of the batch
    for row in tokens.itertuples():
        b, t = row.sample_id, row.pos + int(np.flatnonzero(mask[row.sample_id])[0])
        assert row.entropy == pytest.approx(H[b, t], abs=1e-4)
        assert row.renyi2 == pytest.approx(H2[b, t], abs=1e-4)
        assert row.logp == pytest.approx(logp[b, t], abs=1e-4)
        assert row.js == pytest.approx(js[b, t], abs=1e-5)
        assert row.token_id == target[b, t]
    scalars = sink.reader.read_scalars(sink.run_id).set_index("key")["value"]
    assert scalars["entropy/mean"] == pytest.approx(H[mask].mean(), abs=1e-4)
    # pass@k by the book: group 0 has 1 of 2 correct, group 1 has 2 of 2
    by_hand = {1: (0.5 + 1.0) / 2, 2: (1 - math.comb(1, 2) / math.comb(2, 2) + 1.0) / 2}
    assert scalars["pass@1"] == pytest.approx(by_hand[1])
    assert scalars["pass@2"] == pytest.approx(by_hand[2])
    samples = sink.reader.read_samples(sink.run_id, 0)
    assert samples["reward"].tolist() == rewards and samples["group_id"].tolist() == [0, 0, 1, 1]
    assert samples["length"].tolist() == mask.sum(1).tolist()
    sink.finish()


def test_optimizer_mode_makes_one_step_of_accumulated_forwards(tiny, tmp_path):
    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sink = LocalSink(str(tmp_path / "acc.duckdb"), "acc")
    with forksight.attach(model, sink=sink, optimizer=opt, js_groups=0) as handle:
        for half in (slice(0, 2), slice(2, 4)):  # gradient accumulation over two micro-batches
            sub = {k: v[half] for k, v in enc.items()}
            model(**sub, labels=labels[half]).loss.backward()
        opt.step()
        assert handle.step == 1
        sink.flush()
        scalars = sink.reader.read_scalars(sink.run_id).set_index("key")["value"]
        assert scalars["tokens/count"] == int((labels[:, 1:] != -100).sum())  # both halves in step 0
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not model.get_output_embeddings()._forward_hooks and not model.model._forward_hooks
    sink.finish()  # a sink the caller passed is the caller's to finish (left open, atexit met a dying interpreter)


def test_eval_forwards_without_grad_are_not_steps(tiny):
    from forksight.monitor.sinks.client import NullSink

    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    with forksight.attach(model, sink=NullSink()) as handle, torch.no_grad():
        model(**enc, labels=labels)
        model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        assert handle.step == 0


def test_bad_arguments_say_what_to_do(tiny):
    from forksight.monitor.sinks.client import NullSink

    model, _ = tiny
    with pytest.raises(ValueError, match="js_groups"):
        forksight.attach(model, sink=NullSink(), js_groups="some")
    with pytest.raises(ValueError, match="no output embedding"):
        forksight.attach(torch.nn.Linear(2, 2), sink=NullSink())
    handle = forksight.attach(model, sink=NullSink())
    with pytest.raises(ValueError, match="group_ids"):
        handle.log_samples(0, ["p"], ["c"], [1.0])
    with pytest.raises(ValueError, match="one entry per sample"):
        handle.log_samples(0, ["p", "q"], ["c"], [1.0], group_ids=[0])
    handle.detach()


def test_an_integration_hands_its_row_map_to_the_handle_at_construction(tiny, tmp_path):
    from forksight.hooks.capture.attach import AttachHandle, Integration

    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    sink = LocalSink(str(tmp_path / "rows.duckdb"), "rows")
    forwards = []

    def reversed_rows(input_ids):           # as TRL's shuffled micro-batches: row b is sample 3 - b
        forwards.append(input_ids.shape[0])
        return list(range(input_ids.shape[0]))[::-1]
    handle = AttachHandle(model, sink, owns_sink=False, group_size=2, sample=2, js_groups=0,
                          integration=Integration(row_index=reversed_rows, num_rows=lambda: 4))
    model(**enc, labels=labels).loss.backward()
    handle.detach()
    sink.flush()
    target = labels[:, 1:].numpy()
    tokens = sink.reader.read_tokens(sink.run_id, 0)
    assert forwards == [4]
    for s in range(4):
        row = 3 - s
        stored = tokens[tokens.sample_id == s].sort_values("pos").token_id.tolist()
        assert stored == target[row][target[row] != -100].tolist()
    sink.finish()
