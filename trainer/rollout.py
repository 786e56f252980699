"""Rollouts: G samples per prompt from the full softmax (top_k=0, top_p=1), the completion
mask (up to and including EOS), and the teacher-forced logits the loss and statistics use.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """A batch of B = prompts × G sequences; completion tensors are [B, T]."""

    input_ids: torch.Tensor       # [B, P + T] prompt (left-padded) + completion
    attention_mask: torch.Tensor  # [B, P + T] 1 on real prompt tokens and on completion tokens
    prompt_len: int               # P
    completion: torch.Tensor      # [B, T] sampled token ids (pad after EOS)
    mask: torch.Tensor            # [B, T] bool: completion tokens up to and including EOS
    group_ids: torch.Tensor       # [B] group index of each row
    texts: list[str]              # decoded completions (EOS stripped)
    sampler_logp: torch.Tensor | None = None  # [B, T] the sampler's log p of each token (NaN past the mask)


def completion_mask(completion: torch.Tensor, eos_id: int) -> torch.Tensor:
    """True up to and including the first EOS of each row (all True when no EOS)."""
    is_eos = completion == eos_id
    # count of EOS strictly before t: zero means t is at or before the first EOS
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()
    return before == 0


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], group_size: int, *, temperature: float,
             max_new_tokens: int, group_offset: int = 0, capture_logp: bool = False) -> Rollout:
    """Sample `group_size` completions for each prompt from the untruncated softmax; with
    capture_logp, also the sampling model's log p of each sampled token (`Rollout.sampler_logp`)."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    device = next(model.parameters()).device
    ids = enc.input_ids.repeat_interleave(group_size, dim=0).to(device)
    attn = enc.attention_mask.repeat_interleave(group_size, dim=0).to(device)
    was_training = model.training
    model.eval()
    out = model.generate(
        input_ids=ids, attention_mask=attn, do_sample=True, temperature=temperature,
        top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, min_new_tokens=1,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        return_dict_in_generate=capture_logp, output_logits=capture_logp,
    )
    model.train(was_training)
    sequences = out.sequences if capture_logp else out
    prompt_len = ids.shape[1]
    completion = sequences[:, prompt_len:]
    mask = completion_mask(completion, tokenizer.eos_token_id)
    full_attn = torch.cat([attn, mask.long()], dim=1)
    texts = [tokenizer.decode(row[m], skip_special_tokens=True) for row, m in zip(completion, mask)]
    groups = torch.arange(len(prompts), device=device).repeat_interleave(group_size) + group_offset
    sampler_logp = sampled_logp(out.logits, completion, mask, temperature) if capture_logp else None
    return Rollout(sequences, full_attn, prompt_len, completion, mask, groups, texts, sampler_logp)


def sampled_logp(step_logits: tuple[torch.Tensor, ...], completion: torch.Tensor, mask: torch.Tensor,
                 temperature: float) -> torch.Tensor:
    """[B, T] log p of each sampled token under softmax(logits / T) of the logits `generate` sampled
    it from (its float32 copies, before the min-length rule, as an engine reports logprobs); NaN
    past the mask. One position at a time: no [B, T, V] copy."""
    out = torch.full(completion.shape, float("nan"), dtype=torch.float32, device=completion.device)
    for t, logits in enumerate(step_logits):
        scaled = logits.float() / temperature if temperature != 1.0 else logits.float()
        out[:, t] = scaled.gather(-1, completion[:, t : t + 1]).squeeze(-1) - torch.logsumexp(scaled, -1)
    return out.masked_fill_(~mask, float("nan"))


def completion_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      prompt_len: int) -> torch.Tensor:
    """Logits [B, T, V] that produced each completion token (position ids skip left padding,
    so they are the logits `generate` sampled from)."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids).logits
    return logits[:, prompt_len - 1 : -1]


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(sampled token) under softmax(logits / T), differentiable (the loss's own pass)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def completion_hidden(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      prompt_len: int) -> torch.Tensor:
    """Final hidden states [B, T, H] that the output layer turns into the completion logits;
    lets a sparse strategy run the (vocabulary-sized) output layer with grad on its few
    selected tokens only."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids)
    return out.last_hidden_state[:, prompt_len - 1 : -1]


def head_is_plain(model) -> bool:
    """True when logits == output_embeddings(base_model hidden states) (no soft-capping or
    scaling between them), checked numerically on a short input."""
    head = model.get_output_embeddings()
    if head is None or model.base_model is model:
        return False
    ids = torch.arange(1, 7, device=next(model.parameters()).device).unsqueeze(0) % model.config.vocab_size
    attn = torch.ones_like(ids)
    with torch.no_grad():
        direct = completion_logits(model, ids, attn, 1)
        split = head(completion_hidden(model, ids, attn, 1))
    return bool(torch.allclose(direct, split, atol=1e-4, rtol=1e-4))
