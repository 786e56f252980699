"""forksight's per-step cost in a verl run, attached vs bare, measured side by side; prints JSON.

Two measurements, each alternating bare / attached so machine load hits both alike:

- "cpu_loop": verl's own RayPPOTrainer.fit() with its actor worker (FSDP2 engine) on CPU
  (tests/verl_run.py: tiny model, vocabulary 316, 16 responses of <= 8 tokens per step), runs
  alternating `trainer.logger=[file]` and `[file,forksight]`. Worker ms/step: verl's own
  `timing_s/old_log_prob` (the pass where the workers add top-1/JS) and `timing_s/step`;
  driver ms/step: the time forksight's driver hooks took, timed inside them.
- "vocab_151936": one old-log-prob micro-batch at Qwen2.5's vocabulary (rows x tokens x 151,936
  float32 logits): worker ms for what verl's FSDP engine computes on it (log p and entropy,
  verl.utils.torch_functional) bare vs plus forksight's top-1/JS (hooks/integrations/verl_worker.py),
  alternated per repetition; and the driver's ms to report a step of that many tokens
  (ForksightLogger.report into a DuckDB file: samples, token rows, summaries).
- "v1_transfer_queue": the v1 trainer's step in a real TransferQueue; the driver's read per step,
  bare (the fields verl's own metric pass reads) vs plus forksight's read of its fields.

Runs its verl parts in .venv/verl (`make verl-env`).

    python bench/verl_overhead.py [--pairs 2] [--steps 4] [--rows 8] [--tokens 128] [--reps 5] [--out result.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERL_PY = REPO / ".venv" / "verl" / "bin" / "python"
VOCAB = 151_936


def _median_ms(values) -> float:
    return round(1000 * statistics.median(values), 2) if values else float("nan")


def cpu_loop(pairs: int, steps: int) -> dict:
    """Alternating bare / attached runs of tests/verl_run.py; medians over steps 2.. of each."""
    per = {"bare": {"old_log_prob": [], "step": []}, "attached": {"old_log_prob": [], "step": [], "driver": []}}
    for pair in range(pairs):
        for mode in ("bare", "attached"):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp)
                args = [str(VERL_PY), str(REPO / "tests" / "verl_run.py"), str(out), str(steps)]
                if mode == "bare":
                    args.append("--without-forksight")
                proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=1200,
                                      env={**os.environ, "FORKSIGHT_HOME": str(out / "home")})
                if proc.returncode:
                    raise RuntimeError(proc.stderr[-3000:])
                lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
                for line in lines[1:]:                       # step 1 warms up
                    per[mode]["old_log_prob"].append(line["data"]["timing_s/old_log_prob"])
                    per[mode]["step"].append(line["data"]["timing_s/step"])
                if mode == "attached":
                    summary = json.loads((out / "summary.json").read_text())
                    per[mode]["driver"].append(summary["overhead_s"] / max(1, summary["steps_reported"]))
    bare, att = per["bare"], per["attached"]
    return {"shape": "tiny model, vocab 316, 16 responses x <= 8 tokens per step", "runs_per_mode": pairs,
            "steps_per_run": steps,
            "worker_old_log_prob_ms_per_step": {"bare": _median_ms(bare["old_log_prob"]),
                                                "attached": _median_ms(att["old_log_prob"])},
            "step_ms": {"bare": _median_ms(bare["step"]), "attached": _median_ms(att["step"])},
            "driver_ms_per_step": {"bare": 0.0, "attached": _median_ms(att["driver"])}}


def tq_read_bench(rows: int, tokens: int, reps: int) -> dict:
    """Runs in .venv/verl: a step's rows in a real TransferQueue (Ray, one storage unit); the
    driver's read per step, bare = the fields verl's own _compute_metrics reads, attached = that
    plus forksight's read_step (hooks/integrations/verl_v1.py), alternated."""
    import ray
    import torch
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from forksight.hooks.integrations.verl_v1 import read_step

    prompt = 16
    g = torch.Generator().manual_seed(0)
    fields, keys, tags = [], [], []
    for i in range(rows):
        fields.append({"prompts": torch.randint(3, 300, (prompt,), generator=g),
                       "responses": torch.randint(3, 300, (tokens,), generator=g),
                       "response_mask": torch.ones(tokens, dtype=torch.int64), "rm_scores": torch.rand(tokens),
                       "uid": f"u{i // 4}", "extra_fields": {"reward_extra_info": {"acc": bool(i % 2)}},
                       "entropy": torch.rand(tokens), "old_log_probs": -torch.rand(tokens),
                       "advantages": torch.randn(tokens), "sum_pi_squared": torch.rand(prompt + tokens),
                       "forksight_top1": torch.rand(prompt + tokens), "forksight_js": torch.rand(prompt + tokens),
                       "num_turns": 2})
        keys.append(f"u{i // 4}_{i % 4}_0")
        tags.append({"seq_len": prompt + tokens})
    verl_fields = ["prompts", "responses", "response_mask", "values", "advantages", "returns", "rm_scores",
                   "token_level_rewards", "num_turns"]
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
        meta = KVBatchMeta(partition_id="train", keys=keys, tags=tags)
        times = {"bare": [], "attached": []}
        for rep in range(reps + 1):
            for mode in ("bare", "attached"):
                t0 = time.perf_counter()
                tq.kv_batch_get(keys=keys, partition_id="train", select_fields=verl_fields)
                if mode == "attached":
                    read_step(tq, meta, "acc")
                if rep:
                    times[mode].append(time.perf_counter() - t0)
        tq.close()
    finally:
        ray.shutdown()
    return {"shape": f"{rows} rows x ({prompt} prompt + {tokens} response) tokens in TransferQueue", "reps": reps,
            "driver_read_ms_per_step": {"bare": _median_ms(times["bare"]), "attached": _median_ms(times["attached"])}}


def vocab_bench(rows: int, tokens: int, reps: int) -> dict:
    """Runs in .venv/verl: worker math bare vs attached at vocab 151,936; the driver's report()."""
    import torch
    from verl.utils import torch_functional as verl_F

    from forksight.hooks.integrations import verl_worker
    from forksight.hooks.integrations.verl import ForksightLogger
    from forksight.trainer.model import build_tiny

    torch.manual_seed(0)
    torch.set_num_threads(1)
    prompt = 16
    logits = torch.randn(rows * (prompt + tokens), VOCAB) * 2     # packed rows, as use_remove_padding
    labels = torch.randint(0, VOCAB, (rows * (prompt + tokens),))
    row_logits = list(logits.split(prompt + tokens))
    groups = [f"g{i // 4}" for i in range(rows)]                   # groups of 4: JS for every row
    times = {"bare": [], "attached": []}
    for rep in range(reps + 1):               # rep 0 warms up (token_stats compiles its kernel once)
        for mode in ("bare", "attached"):
            t0 = time.perf_counter()
            with torch.no_grad():
                verl_F.logprobs_from_logits(logits, labels)
                verl_F.entropy_from_logits(logits)
                if mode == "attached":
                    verl_worker.response_stats(row_logits, [prompt] * rows, [tokens] * rows, 1.0, groups, 4)
            if rep:
                times[mode].append(time.perf_counter() - t0)
    del logits, row_logits

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny(Path(tmp) / "model")
        config = {"trainer": {"forksight": {"db": str(Path(tmp) / "f.duckdb"), "token_groups": 1}},
                  "actor_rollout_ref": {"model": {"path": str(model)}, "rollout": {"n": 4}}}
        from forksight.hooks.integrations.verl_state import STATE

        STATE.trainer = object()
        logger = ForksightLogger("bench", "verl-overhead", config)
        driver = []
        for step in range(1, reps + 2):
            mask = torch.ones(rows, tokens, dtype=torch.long)
            tensors = {"prompts": torch.randint(3, 300, (rows, prompt)), "responses": torch.randint(3, 300, (rows, tokens)),
                       "response_mask": mask, "attention_mask": torch.ones(rows, prompt + tokens, dtype=torch.long),
                       "token_level_scores": torch.rand(rows, tokens), "advantages": torch.randn(rows, tokens),
                       "old_log_probs": -torch.rand(rows, tokens) * 5}
            tokens_ = {"entropy": torch.rand(rows, tokens) * 3, "logp": tensors["old_log_probs"],
                       "sum_pi_squared": torch.rand(rows, tokens) * 0.5 + 0.01,
                       "top1": torch.rand(rows, tokens), "js": torch.rand(rows, tokens)}
            non_tensor = {"uid": [f"u{i // 4}" for i in range(rows)]}
            t0 = time.perf_counter()
            logger.report(step, {"tensors": tensors, "non_tensor": non_tensor}, tokens_)
            if step > 1:                                          # step 1 loads the tokenizer
                driver.append(time.perf_counter() - t0)
        logger.finish()
        STATE.trainer = None
    return {"shape": f"{rows} rows x ({prompt} prompt + {tokens} response) tokens x vocab {VOCAB}, float32",
            "reps": reps,
            "worker_ms_per_micro_batch": {"bare": _median_ms(times["bare"]), "attached": _median_ms(times["attached"])},
            "driver_report_ms_per_step": {"bare": 0.0, "attached": _median_ms(driver)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="bare/attached CPU-loop runs each (0: skip)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out")
    parser.add_argument("--vocab-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vocab_only:                                           # the child, in .venv/verl
        result = vocab_bench(args.rows, args.tokens, args.reps)
        result["v1_transfer_queue"] = tq_read_bench(args.rows, args.tokens, args.reps)
        print(json.dumps(result))
        return
    if not VERL_PY.exists():
        print(json.dumps({"skipped": ".venv/verl is absent: `make verl-env` builds it"}))
        return
    child = subprocess.run([str(VERL_PY), __file__, "--vocab-only", "--rows", str(args.rows), "--tokens",
                            str(args.tokens), "--reps", str(args.reps)], cwd=REPO, capture_output=True,
                           text=True, timeout=1800)
    if child.returncode:
        raise RuntimeError(child.stderr[-3000:])
    vocab = json.loads(child.stdout.strip().splitlines()[-1])
    result = {"v1_transfer_queue": vocab.pop("v1_transfer_queue"), "vocab_151936": vocab}
    if args.pairs:
        result["cpu_loop"] = cpu_loop(args.pairs, args.steps)
    for part in result.values():
        for key, pair in list(part.items()):
            if isinstance(pair, dict) and pair.get("bare"):
                part[key]["ratio"] = round(pair["attached"] / pair["bare"], 3)
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
