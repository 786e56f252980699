"""The tiny offline model: built locally, reloaded through from_pretrained, one token per digit."""
from __future__ import annotations

import torch


def test_tokenizer_splits_every_digit_and_round_trips(tiny):
    model, tokenizer = tiny
    text = "Q: 9072+15= A: 9087"
    pieces = tokenizer.tokenize(text)
    digits = [p for p in pieces if p.strip("Ġ").isdigit()]
    assert all(len(p.strip("Ġ")) == 1 for p in digits)
    assert sum(len(p.strip("Ġ")) for p in digits) == sum(ch.isdigit() for ch in text)
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text


def test_model_is_qwen2_with_left_padding_and_matching_vocab(tiny):
    model, tokenizer = tiny
    assert model.config.model_type == "qwen2"
    assert tokenizer.padding_side == "left"
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    batch = tokenizer(["1+2=", "12+34="], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch.input_ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
