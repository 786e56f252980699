"""Build, cache and load the tiny offline model: a Qwen2-architecture causal LM and a
byte-level BPE tokenizer trained locally (no hub). Everything else loads them through the
ordinary `from_pretrained(path)`, so the same code takes any local HF causal LM.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

# Qwen2's own pre-tokenizer pattern: digits split one by one (one token per digit), so the
# tokenizer transformers rebuilds for model_type qwen2 behaves exactly like ours.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinySpec:
    """Shape of the tiny model; the defaults are what trains fastest on 2 CPU cores."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    bpe_vocab_size: int = 400
    seed: int = 0
    corpus: int = 2  # version of _corpus(): a new corpus is a new tokenizer, so a new cache key

    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]


def cache_root() -> Path:
    """Where built models live: $FORKSIGHT_HOME or ~/.cache/forksight."""
    return Path(os.environ.get("FORKSIGHT_HOME", Path.home() / ".cache" / "forksight"))


def _corpus() -> list[str]:
    """Text the BPE learns merges from: the task vocabulary (words, operators, digits)."""
    import random

    rng = random.Random(0)
    lines = []
    for _ in range(2000):
        a, b, c = rng.randint(0, 999), rng.randint(0, 999), rng.randint(1, 99)
        lines.append(f"Q: {a}+{b}= A: {a + b}")
        lines.append(f"Question: what is {a} - {b} * {c}? Answer: {a - b * c}")
        lines.append(f"Use the numbers {a} {b} {c} to make {a + c}. Answer: {a}+{c}")
        lines.append(f"Reverse the answer. The result is {a * c} so the answer is {str(a * c)[::-1]}")
        lines.append(f"{a}+{c}: {a % 10}+{c % 10}={a % 10 + c % 10} carry 1, answer {a + c}")
    return lines


def build_tokenizer(spec: TinySpec = TinySpec()):
    """A byte-level BPE (`tokenizers`) wrapped as a fast HF tokenizer, left padding."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.bpe_vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # padding_side must go to the constructor: set later it is lost on save (transformers 5)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        bos_token=None,
        padding_side="left",
        model_max_length=spec.max_position_embeddings,
    )


def build_tiny(path: str | os.PathLike | None = None, spec: TinySpec = TinySpec(), *,
               shipped: bool = True) -> Path:
    """The directory holding the tiny model + tokenizer. The default spec's are shipped
    (trainer/models/tiny: the same bits on every machine) and copied here; another spec, or
    shipped=False, is built (random init, BPE training) and cached."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from forksight.trainer import shipped as ship

    name = ship.base_name(spec.key()) if shipped else None
    if name is not None:
        tag = ship.weights_of(name)[:8]
        return ship.materialize(name, Path(path) if path else cache_root() / "models" / f"tiny-qwen2-{spec.key()}-{tag}")
    out = Path(path) if path else cache_root() / "models" / f"tiny-qwen2-{spec.key()}"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tokenizer = build_tokenizer(spec)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if out.exists():  # another process won the race: keep its copy, drop ours
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.replace(out)
    return out


def load(path: str | os.PathLike, dtype=None):
    """Load any local HF causal LM and its tokenizer (left padding, pad = eos if unset)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model, tokenizer
