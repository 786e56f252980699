"""Rollouts sample from the distribution whose statistics are reported, and the sparse
(selected-rows-only) output layer gives exactly the dense gradient."""
from __future__ import annotations

import torch

from forksight.trainer.rollout import (completion_hidden, completion_logits, completion_mask, generate,
                             head_is_plain, token_logp)


def test_completion_mask_runs_through_the_first_eos():
    eos = 0
    completion = torch.tensor([[5, 6, 0, 0, 0], [5, 0, 7, 0, 8], [5, 6, 7, 8, 9]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(completion_mask(completion, eos), expected)


def test_generate_samples_from_the_logits_the_loss_sees(tiny):
    """Untruncated sampling (top_k=0): the teacher-forced logits equal generate's own logits."""
    model, tokenizer = tiny
    prompts = ["12+34=", "5+7=", "99+99="]
    torch.manual_seed(0)
    roll = generate(model, tokenizer, prompts, 3, temperature=0.7, max_new_tokens=5)
    torch.manual_seed(0)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    out = model.generate(input_ids=enc.input_ids.repeat_interleave(3, 0),
                         attention_mask=enc.attention_mask.repeat_interleave(3, 0),
                         do_sample=True, top_k=0, top_p=1.0, temperature=0.7, max_new_tokens=5,
                         min_new_tokens=1, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, output_logits=True,
                         return_dict_in_generate=True)
    assert torch.equal(out.sequences, roll.input_ids)
    raw = torch.stack(out.logits, 1)  # before temperature and any warper
    with torch.no_grad():
        ours = completion_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    assert torch.allclose(raw[roll.mask], ours[roll.mask], atol=1e-4)
    assert roll.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len(roll.texts) == 9


def test_sparse_output_layer_gives_the_dense_gradient(tiny):
    model, tokenizer = tiny
    assert head_is_plain(model)
    torch.manual_seed(1)
    roll = generate(model, tokenizer, ["1+2=", "30+40="], 2, temperature=1.0, max_new_tokens=4)
    selected = roll.mask & (torch.rand(roll.mask.shape) > 0.6)
    selected[0, 0] = True
    rows = selected.nonzero(as_tuple=True)
    weights = torch.randn(len(rows[0]))

    def grads(sparse: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        if sparse:
            hidden = completion_hidden(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
            picked = model.get_output_embeddings()(hidden[rows])
        else:
            picked = completion_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)[rows]
        (token_logp(picked, roll.completion[rows], 1.0) * weights).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    for sparse_grad, dense_grad in zip(grads(True), grads(False)):
        assert torch.allclose(sparse_grad, dense_grad, atol=1e-6, rtol=1e-4)
