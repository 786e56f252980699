"""Tiny offline stand-ins for the hub models TRL's own tests use: the tiny Qwen2 with a
Qwen chat template and Qwen's tool tokens, so GRPOTrainer's tool loop runs without a network."""
from __future__ import annotations

from pathlib import Path

CHAT_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
               "</tool_response>", "<think>", "</think>"]


def build_chat_tiny(base: Path, out: Path) -> Path:
    """The tiny model re-sized for Qwen's chat and tool tokens, eos = <|im_end|>, Qwen3's template."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen3_chat_template

    if (out / "config.json").exists():
        return out
    tokenizer = AutoTokenizer.from_pretrained(base, padding_side="left")
    tokenizer.add_special_tokens({"additional_special_tokens": CHAT_TOKENS})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = qwen3_chat_template
    torch.manual_seed(0)
    config = Qwen2Config.from_pretrained(base)
    config.vocab_size = len(tokenizer)
    config.max_position_embeddings = 2048  # Qwen3's tool system prompt alone is ~700 of these tokens
    config.eos_token_id = config.bos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


def scripted_generate(tokenizer, first: list[str], then: str):
    """A `model.generate` stand-in (as in TRL's test_train_with_tools): the first call of a
    generation batch answers `first` (cycled), the tool-loop calls that follow answer `then`."""
    import torch

    state = {"batch": None}

    def generate(input_ids, **kwargs):
        n = input_ids.shape[0]
        if state["batch"] is None or n == state["batch"]:
            state["batch"] = n
            texts = [first[i % len(first)] for i in range(n)]
        else:
            texts = [then] * n
        rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(r) for r in rows)
        pad = tokenizer.pad_token_id
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=input_ids.device)
        return torch.cat([input_ids, ids], dim=-1)

    return generate


ZEN = ["The quick brown fox", "Two plus two is", "Simple is better than", "Errors should never",
       "Flat is better than", "Readability counts because", "Now is better than", "In the face of"]


def build_trl_hub(base: Path, root: Path) -> Path:
    """Stand-ins for the hub ids TRL's GRPO tests load, as local folders under root (chdir there):
    trl-internal-testing/tiny-Qwen2ForCausalLM-2.5 (the chat tiny model) and a tiny reward model
    trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5 with the same tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    hub = root / "trl-internal-testing"
    policy = build_chat_tiny(base, hub / "tiny-Qwen2ForCausalLM-2.5")
    reward = hub / "tiny-Qwen2ForSequenceClassification-2.5"
    if not (reward / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(policy)
        config = Qwen2Config.from_pretrained(policy)
        config.num_labels = 1
        torch.manual_seed(1)
        Qwen2ForSequenceClassification(config).save_pretrained(reward)
        tokenizer.save_pretrained(reward)
    return root


def zen(config_name: str):
    """Stand-in for load_dataset("trl-internal-testing/zen", config_name, split="train")."""
    from datasets import Dataset

    if config_name == "standard_prompt_only":
        return Dataset.from_list([{"prompt": p} for p in ZEN])
    if config_name == "conversational_prompt_only":
        return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in ZEN])
    raise ValueError(f"no stand-in for zen/{config_name}")
