"""Benchmark of the bundled trainer; prints one JSON object. Everything is measured side by
side in this run (ratios, never an absolute time to compare against):

1. monitoring overhead: the same step with token statistics + StepReporter + a real DuckDB sink
   vs without, interleaved, at the tiny shape and at a realistic shape (Qwen2.5-0.5B's output
   layer: vocab 151,936 × hidden 896, on one layer, so the vocabulary pass dominates);
2. tokens per second per strategy, and the backward time of sparse strategies vs `all`;
3. a short same-seed comparison of all / fork / ict from the same warm model.

    python bench/trainer.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forksight.trainer.config import DISTILL_STRATEGIES, STRATEGIES, load_config  # noqa: E402
from forksight.trainer.loop import setup  # noqa: E402
from forksight.trainer.step import _needs_stats, train_step  # noqa: E402
from forksight.trainer.model import TinySpec, build_tiny, load  # noqa: E402


def _progress(message: str) -> None:
    """Section progress on stderr (stdout is the JSON)."""
    print(f"[bench/trainer] {message}", file=sys.stderr, flush=True)


def realistic_model(tokenizer):
    """Qwen2.5-0.5B's vocabulary and width on a single layer, tied embeddings, random weights."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    eos = tokenizer.eos_token_id
    config = Qwen2Config(vocab_size=151_936, hidden_size=896, num_hidden_layers=1,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                         tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos,
                         pad_token_id=eos, max_position_embeddings=256)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _context(model, tokenizer, sink, teacher_model=None, **over):
    values = dict(warmup=False, stream=False, progress=False, eval_every=0, max_new_tokens=16,
                  prompts_per_step=2, group_size=4, token_groups=1)
    values.update(over)
    ctx, _ = setup(load_config(overrides=values), sink, model=model, tokenizer=tokenizer,
                   teacher=teacher_model if values.get("strategy") in DISTILL_STRATEGIES else None)
    return ctx


def overhead(model, tokenizer, pairs: int, strategy: str, **over) -> dict:
    """Median step time with monitoring vs without (interleaved pairs on one context), and the
    in-step share: token_stats + StepReporter time over the rest of the monitored step."""
    from forksight.monitor.sinks.client import open_sink

    with tempfile.TemporaryDirectory() as tmp:
        sink = open_sink(run=f"bench-{strategy}", db=str(Path(tmp) / "bench.duckdb"))
        ctx = _context(model, tokenizer, sink, strategy=strategy, **over)
        train_step(ctx, 0, report=True)  # warm caches, allocator, the writer thread
        train_step(ctx, 0, report=False)
        on, off, share = [], [], []
        for i in range(pairs):
            for report in ((True, False) if i % 2 == 0 else (False, True)):  # alternate order
                start = time.perf_counter()
                out = train_step(ctx, 1 + i, report=report)
                seconds = time.perf_counter() - start
                (on if report else off).append(seconds)
                if report:
                    # stats the strategy would need anyway are not monitoring cost
                    monitor_s = ctx.report_seconds + (0 if _needs_stats(strategy) else out["time/stats"])
                    share.append(monitor_s / (seconds - monitor_s))
        start = time.perf_counter()
        sink.finish()
        finish = time.perf_counter() - start
    med_on, med_off = statistics.median(on), statistics.median(off)
    return {"strategy": strategy, "pairs": pairs, "step_s_monitored": round(med_on, 4),
            "step_s_plain": round(med_off, 4),
            "overhead_pct_paired": round(100 * (med_on / med_off - 1), 2),
            "overhead_pct_in_step": round(100 * statistics.median(share), 2),
            "final_flush_s": round(finish, 3)}


def strategy_rates(model, tokenizer, steps: int, strategies, teacher=None, **over) -> dict:
    """Tokens/s (all valid tokens, and the ones trained on) and backward time per strategy."""
    out = {}
    for strategy in strategies:
        ctx = _context(model, tokenizer, None, strategy=strategy, teacher_model=teacher, **over)
        train_step(ctx, 0, report=False)
        rows = [train_step(ctx, 1 + i, report=False) for i in range(steps)]
        seconds = sum(r["time/step"] for r in rows)
        valid = sum(ctx.config.prompts_per_step * ctx.config.group_size for _ in rows)
        out[strategy] = {
            "step_s": round(seconds / steps, 4),
            "trained_tokens_per_step": round(statistics.mean(r["tokens/trained"] for r in rows), 1),
            "trained_tokens_per_s": round(sum(r["tokens/trained"] for r in rows) / seconds, 1),
            "sequences_per_s": round(valid / seconds, 2),
            "backward_s": round(statistics.median(r["time/backward"] for r in rows), 5),
        }
    base = out.get("all", {}).get("backward_s")
    for row in out.values():
        if base:
            row["backward_vs_all"] = round(row["backward_s"] / base, 3)
    return out


def comparison(steps: int, lr: float) -> dict:
    """all vs fork vs ict: same warm model, seed, steps; entropy endpoints, pass@1/pass@G."""
    from forksight.trainer import loop
    from forksight.trainer.config import PRESETS

    out = {}
    for strategy in ("all", "fork", "ict"):
        config = load_config(preset="healthy", overrides=dict(
            strategy=strategy, steps=steps, lr=lr, stream=False, progress=False, eval_every=0,
            eval_problems=64, eval_samples=8))
        ctx, _ = setup(config, None)
        start = time.perf_counter()
        rows = [train_step(ctx, step) for step in range(1, steps + 1)]
        seconds = time.perf_counter() - start
        ev = loop.evaluate(ctx)
        head, tail = rows[: max(1, steps // 10)], rows[-max(1, steps // 10):]
        mean = lambda rs, k: round(statistics.mean(r[k] for r in rs), 4)  # noqa: E731
        g = config.group_size
        out[strategy] = {
            "entropy_first": mean(head, "entropy/mean"), "entropy_last": mean(tail, "entropy/mean"),
            "train_pass@1_first": mean(head, "pass@1"), "train_pass@1_last": mean(tail, "pass@1"),
            f"train_pass@{g}_last": mean(tail, f"pass@{g}"),
            "eval_pass@1": round(ev["eval/pass@1"], 4), f"eval_pass@{g}": round(ev[f"eval/pass@{g}"], 4),
            "seconds": round(seconds, 1),
        }
    out["settings"] = {"steps": steps, "lr": lr, "preset": "healthy", "seed": 0,
                       "warm_start": PRESETS["healthy"]["warmup_pass"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewest steps (smoke run)")
    parser.add_argument("--compare-steps", type=int, default=None,
                        help="steps per strategy in the comparison (default 40, 4 with --quick)")
    parser.add_argument("--compare-lr", type=float, default=3e-4)
    args = parser.parse_args()
    # sized for ~3 min on 2 free cores: one realistic step is several seconds on a CPU
    pairs, rate_steps, cmp_steps = (2, 2, 4) if args.quick else (2, 4, 40)
    cmp_steps = args.compare_steps or cmp_steps
    started = time.perf_counter()
    report: dict = {"torch_threads": torch.get_num_threads()}

    tiny_model, tokenizer = load(build_tiny())
    _progress("overhead at the tiny shape")
    report["overhead_tiny"] = [overhead(tiny_model, tokenizer, pairs * 4, s) for s in ("all", "fork")]
    teacher, _ = load(build_tiny(spec=TinySpec(seed=1)))
    _progress("tokens/s per strategy at the tiny shape")
    report["strategies_tiny"] = strategy_rates(tiny_model, tokenizer, rate_steps * 2, STRATEGIES,
                                               teacher=teacher)

    big = realistic_model(tokenizer)
    _progress("overhead and backward at the realistic shape (vocab 151,936 x hidden 896)")
    shape = dict(prompts_per_step=2, group_size=4, max_new_tokens=8)
    report["realistic_shape"] = {"vocab": 151_936, "hidden": 896, "layers": 1,
                                 "params_m": round(sum(p.numel() for p in big.parameters()) / 1e6, 1),
                                 **shape}
    report["overhead_realistic"] = [overhead(big, tokenizer, pairs, s, **shape) for s in ("all", "fork")]
    report["strategies_realistic"] = strategy_rates(big, tokenizer, 1, ("all", "fork", "ict"),
                                                    **shape)
    del big

    _progress(f"all vs fork vs ict, {cmp_steps} steps each, from the cached warm-up")
    report["comparison_tiny"] = comparison(cmp_steps, args.compare_lr)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
