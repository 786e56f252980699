"""What an imported run brings besides scalars: samples (TRL's completions log) become per-step
pass@k and reward/mean where the log has none, and samples and tokens (prime-rl's token export) are
written to the store through the same Arrow builders the sinks use."""
from __future__ import annotations

import math
from collections import defaultdict

TOKENS_PER_BATCH = 1_000_000      # tokens-table rows per write (the store's batch limit is larger)


def merge_sample_scalars(steps: list[int], rows: list[dict], samples: list[dict]) -> tuple[list[int], list[dict]]:
    """steps/rows with pass@1..pass@G (groups of each step, correct = the sample's verdict), the
    samples' mean reward as reward/mean where a step has none, and groups/length_reward_corr where
    the samples carry token lengths; steps only the samples have are added."""
    from forksight.hooks.metrics.passk import pass_at_k_groups
    from forksight.hooks.metrics.summary import length_reward_corr

    groups: dict[int, dict[int, list[bool]]] = defaultdict(lambda: defaultdict(list))
    rewards: dict[int, list[float]] = defaultdict(list)
    sized: dict[int, list[tuple]] = defaultdict(list)      # (group, reward, length) of samples with a length
    for s in samples:
        if s.get("length") is not None and s.get("reward") is not None:
            sized[s["step"]].append((s.get("group_id") or 0, float(s["reward"]), float(s["length"])))
        if s.get("correct") is not None:
            groups[s["step"]][s.get("group_id") or 0].append(bool(s["correct"]))
        if s.get("reward") is not None and math.isfinite(s["reward"]):
            rewards[s["step"]].append(float(s["reward"]))
    by_step = {step: dict(row) for step, row in zip(steps, rows)}
    for step in sorted(set(groups) | set(rewards)):
        row = by_step.setdefault(step, {})
        if groups.get(step):
            for k, value in pass_at_k_groups(list(groups[step].values())).items():
                row.setdefault(f"pass@{k}", value)
        if rewards.get(step):
            row.setdefault("reward/mean", sum(rewards[step]) / len(rewards[step]))
        corr = length_reward_corr(*zip(*sized[step])) if sized.get(step) else None
        if corr is not None:
            row.setdefault("groups/length_reward_corr", corr)
    ordered = sorted(by_step)
    return ordered, [by_step[s] for s in ordered]


def decode_tokens(tokens: list, tokenizer_path: str) -> list:
    """Token tables with each token_id's text from a Hugging Face tokenizer (prime-rl exports ids only)."""
    import pyarrow as pa
    from transformers import AutoTokenizer

    from forksight.base.limits import MAX_TOKEN_CHARS

    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {tokenizer_path}: not a tokenizer directory or hub name ({exc})") from None
    out, text = [], {}
    for table in tokens:
        ids = table.column("token_id").to_pylist()
        for i in set(ids) - set(text):
            text[i] = None if i is None else tokenizer.decode([i])[:MAX_TOKEN_CHARS]
        out.append(table.append_column("token", pa.array([text[i] for i in ids], pa.string())))
    return out


def write_extras(store, run_id: str, samples: list[dict], tokens: list) -> dict[str, int]:
    """Samples and token tables into the store; counts written."""
    from forksight.base.records import Records, samples_table, tokens_table

    for start in range(0, len(samples), 10_000):
        store.write(run_id, Records(samples=samples_table(samples[start:start + 10_000])))
    n_tokens = 0
    for table in tokens:
        for start in range(0, table.num_rows, TOKENS_PER_BATCH):
            part = table.slice(start, TOKENS_PER_BATCH)
            store.write(run_id, Records(tokens=tokens_table(part)))
            n_tokens += part.num_rows
    return {"samples": len(samples), "tokens": n_tokens}
