"""Supervised warm-up: teach the model the task's answer format until its *sampled* pass@1
reaches a target (the jump is sharp and seed-dependent, so we stop on the measurement, not on
a step count). Results are cached next to the model, keyed by base model, task, loss, target
and seed; a file lock makes concurrent trainers (demo, torchrun) wait for one warm-up.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import torch

from forksight.trainer.loss import bounded_nll
from forksight.trainer.model import cache_root, load
from forksight.trainer.rollout import completion_logits, generate, token_logp
from forksight.trainer.shipped import find_warm, materialize
from forksight.trainer.tasks import Problem, Task, held_out


def warm_path(base: str | Path, task: Task, target_pass: float, loss: str, seed: int) -> Path:
    """Cache directory of a warm-up result."""
    base = Path(base).resolve()
    tag = hashlib.sha1(str(base).encode()).hexdigest()[:8]
    safe_task = task.name.replace(":", "-").replace("/", "-")
    return cache_root() / "warm" / f"{base.name}-{tag}-{safe_task}-{loss}-p{target_pass:g}-s{seed}"


def ensure_warm(base: str | Path, task: Task, *, target_pass: float = 0.3, loss: str = "ce",
                seed: int = 0, max_seconds: float = 180.0, progress: bool = True, shipped: bool = True,
                **train_kw) -> Path:
    """Path of a model warmed up on `task` to sampled pass@1 ≥ target_pass (cached);
    train_kw go to `supervised` (lr, batch, eval_every), over the task's own `warmup_settings`.
    A cached warm-up whose time ran out short of its target (a busy machine) is done again, once
    per call: reused, every later run of that seed would start from a weaker model.
    A shipped warm-up of this base, task, loss, target and seed (trainer/shipped.py) is used
    instead of warming up here, so every machine starts from the same weights; shipped=False
    warms up regardless (the ship builder)."""
    train_kw = {**getattr(task, "warmup_settings", {}), **train_kw}
    out = warm_path(base, task, target_pass, loss, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    asked = time.time()
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second trainer waits here and then reuses the cache
        name = find_warm(base, task.name, loss, target_pass, seed) if shipped else None
        if name is not None:
            return materialize(name, out)
        info_file = out / "warmup.json"
        if info_file.exists():
            cached = json.loads(info_file.read_text())
            # missed, and written before this call (not by a trainer this one waited for): again
            if cached.get("reached", True) or info_file.stat().st_mtime >= asked:
                return out
            print(f"forksight: the cached warm-up {out.name} stopped at pass@1 {cached.get('pass@1')} short of "
                  f"{target_pass:g} after {cached.get('seconds')} s (its time ran out); warming up again", flush=True)
        model, tokenizer = load(base)
        info = supervised(model, tokenizer, task, target_pass=target_pass, loss=loss, seed=seed,
                          max_seconds=max_seconds, progress=progress, **train_kw)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)           # a run killed while saving
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "warmup.json").write_text(json.dumps(info, indent=1))
        shutil.rmtree(out, ignore_errors=True)           # the missed one, if any
        tmp.replace(out)
    return out


def encode_targets(tokenizer, problems: list[Problem]) -> tuple[torch.Tensor, ...]:
    """Left-padded prompt+target+EOS ids, attention mask and a mask of the target tokens.
    Prompt and target are tokenized apart so the boundary is exactly where generation starts."""
    prompts = tokenizer([p.prompt for p in problems]).input_ids
    targets = tokenizer([p.target for p in problems]).input_ids
    rows = [(a, b + [tokenizer.eos_token_id]) for a, b in zip(prompts, targets)]
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    target_mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, (prompt, target) in enumerate(rows):
        seq = prompt + target
        ids[i, width - len(seq):] = torch.tensor(seq)
        attn[i, width - len(seq):] = 1
        target_mask[i, width - len(target):] = True
    return ids, attn, target_mask


def sampled_pass1(model, tokenizer, task: Task, problems: list[Problem], *, samples: int = 2,
                  temperature: float = 1.0, max_new_tokens: int | None = None) -> float:
    """Fraction of sampled completions (`samples` per problem) the verifier accepts; the length
    limit defaults to the task's own (`task.max_new_tokens`, else 8)."""
    if max_new_tokens is None:
        max_new_tokens = getattr(task, "max_new_tokens", 8)
    roll = generate(model, tokenizer, [p.prompt for p in problems], samples,
                    temperature=temperature, max_new_tokens=max_new_tokens)
    verdicts = [task.verify(problems[i // samples], text)[1] for i, text in enumerate(roll.texts)]
    return sum(verdicts) / len(verdicts)


def supervised(model, tokenizer, task: Task, *, target_pass: float, loss: str = "ce",
               seed: int = 0, lr: float = 2e-3, batch: int = 256, eval_every: int = 25,
               max_seconds: float = 180.0, progress: bool = True) -> dict:
    """Train in place until sampled pass@1 on held-out problems ≥ target_pass; return a summary."""
    from tqdm.auto import tqdm

    if loss not in ("ce", "bounded"):
        raise ValueError(f"warm-up loss must be 'ce' or 'bounded', got {loss!r}")
    torch.manual_seed(seed)
    rng = random.Random(f"warmup-{seed}")
    checks = held_out(task, 64, seed + 7919)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    start, step, measured = time.perf_counter(), 0, 0.0
    bar = tqdm(desc=f"warm-up {task.name} → pass@1 {target_pass:g}", disable=not progress,
               unit="step")
    model.train()
    while True:
        problems = [task.sample(rng) for _ in range(batch)]
        ids, attn, target_mask = encode_targets(tokenizer, problems)
        logits = completion_logits(model, ids, attn, 1)  # predicts ids[:, 1:]
        logp = token_logp(logits, ids[:, 1:], 1.0)
        mask = target_mask[:, 1:]
        per_token = bounded_nll(logp) if loss == "bounded" else -logp
        value = per_token[mask].mean()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        step += 1
        bar.update(1)
        if step % eval_every == 0:
            measured = sampled_pass1(model, tokenizer, task, checks)
            bar.set_postfix(loss=f"{value.item():.3f}", pass1=f"{measured:.2f}")
            if os.environ.get("FORKSIGHT_DEBUG_WARMUP"):
                print(f"warm-up step {step} t={time.perf_counter() - start:.1f}s loss={value.item():.3f} pass@1={measured:.3f}", flush=True)
            if measured >= target_pass or time.perf_counter() - start > max_seconds:
                break
    bar.close()
    return {"task": task.name, "loss": loss, "steps": step, "pass@1": measured,
            "target_pass": target_pass, "seconds": round(time.perf_counter() - start, 1),
            "reached": measured >= target_pass}
