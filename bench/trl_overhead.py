"""TRL GRPOTrainer step time with forksight's callback vs without, measured side by side in ONE
run: the monitoring mode rotates every step (off / default / JS on all groups), so machine load
hits every mode alike. Reported: ratio = median step time of a mode / median with it off (process
CPU time and wall time), and the callback's own main-thread CPU per step, timed directly inside
its hooks and events (robust where step-time differences drown in a shared machine's noise).

Shapes: "realistic" = Qwen2 with vocabulary 151,936, hidden 896 and one layer (Qwen2.5-0.5B's
head and width, a shallow body); "tiny" = the offline test model. GRPOConfig defaults (8 rows,
num_generations 8) except a short completion length, so CPU steps stay in seconds.
The rlwatch anchor attaches to the tiny run through `on_log`; we list what it stored.

    python bench/trl_overhead.py [--realistic-steps 7 (0: skip)] [--tiny-steps 14] [--threads 1] [--out result.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

MODES = ("off", "default", "js_all")


class Rotate(TrainerCallback):
    """Sets the monitoring mode at each step's start and times whole steps (start to next start):
    wall time, and process CPU time, which other users of a shared machine barely disturb."""

    def __init__(self, monitor, warmup: int):
        self.monitor, self.warmup = monitor, warmup
        self.wall: dict[str, list[float]] = {m: [] for m in MODES}
        self.cpu: dict[str, list[float]] = {m: [] for m in MODES}
        self.inside: dict[str, list[float]] = {m: [] for m in MODES}  # main-thread CPU in forksight code
        self._mode, self._t0, self._c0, self._in = None, 0.0, 0.0, 0.0

    def timed(self, fn):
        """fn, with the main thread's CPU time inside it added to the current step: the callback's
        own cost, measured directly (step-time differences drown in a busy machine's noise)."""
        def wrapper(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._in += time.thread_time() - t0
        return wrapper

    def _close(self) -> None:
        if self._mode is not None:
            self.wall[self._mode].append(time.perf_counter() - self._t0)
            self.cpu[self._mode].append(time.process_time() - self._c0)
            self.inside[self._mode].append(self._in)

    def on_step_begin(self, args, state, control, **kwargs):
        self._close()  # warm-up steps (compile paths, allocate buffers) have no mode
        self._mode = MODES[(state.global_step - self.warmup) % len(MODES)] if state.global_step >= self.warmup else None
        self.monitor.enabled = self._mode != "off"
        if self.monitor.handle is not None:
            self.monitor.handle.stats.js_groups = "all" if self._mode == "js_all" else None
        self._t0, self._c0, self._in = time.perf_counter(), time.process_time(), 0.0

    def on_train_end(self, args, state, control, **kwargs):
        self._close()
        self._mode = None


def realistic_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, num_hidden_layers=1, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return Qwen2ForCausalLM(config)


def run(label: str, model, tokenizer, steps: int, warmup: int, completion_length: int, workdir: str,
        rlwatch_dir: str | None):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import forksight.trl

    def even_first_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    config = GRPOConfig(output_dir=os.path.join(workdir, label), report_to="none", use_cpu=True, bf16=False,
                        max_completion_length=completion_length, max_steps=steps, logging_steps=1,
                        save_strategy="no", disable_tqdm=False, seed=0)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(8 * steps + 8)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    db = os.path.join(workdir, f"{label}.duckdb")
    placeholder = Rotate(None, warmup)
    trainer.add_callback(placeholder)  # first in the list: its step clock starts before anything else runs
    monitor = forksight.trl.attach(trainer, db=db, run=label)
    placeholder.monitor = monitor
    for name in ("on_step_end", "on_log", "_on_generation"):  # instance attributes win over the methods
        setattr(monitor, name, placeholder.timed(getattr(monitor, name)))
    capture = monitor.handle.capture
    capture.on_fused, capture.on_logits = placeholder.timed(capture.on_fused), placeholder.timed(capture.on_logits)
    if rlwatch_dir is not None:
        import rlwatch

        rlwatch.attach(framework="trl", trainer=trainer, run_id=f"{label}-rlwatch", storage={"log_dir": rlwatch_dir})
        rlwatch.get_monitor().attach_to_trainer(trainer)
    trainer.train()
    monitor.detach(finish=False)
    sink = monitor.sink
    sink.flush()
    stored = {
        "scalar_keys": sorted(sink.reader.scalar_keys(sink.run_id)),
        "token_rows": int(sum(len(sink.reader.read_tokens(sink.run_id, s)) for s in sink.reader.token_steps(sink.run_id))),
        "sample_rows": int(len(sink.reader.read_samples(sink.run_id))),
        "histogram_steps": int(sink.reader.read_histograms(sink.run_id)["step"].nunique()),
    }
    sink.finish()
    def medians(times):
        return {m: statistics.median(t) for m, t in times.items() if t}

    wall, cpu, inside = medians(placeholder.wall), medians(placeholder.cpu), medians(placeholder.inside)
    result = {
        "cpu_s_median": {m: round(v, 4) for m, v in cpu.items()},
        "wall_s_median": {m: round(v, 4) for m, v in wall.items()},
        "steps_per_mode": {m: len(t) for m, t in placeholder.wall.items()},
        # step time attached / bare: what a user sees (1.10 = the attached run is 10% slower)
        "ratio_default": {"cpu": round(cpu["default"] / cpu["off"], 3), "wall": round(wall["default"] / wall["off"], 3)},
        "ratio_js_all_groups": {"cpu": round(cpu["js_all"] / cpu["off"], 3), "wall": round(wall["js_all"] / wall["off"], 3)},
        "callback_main_thread_ms_per_step": {m: round(1000 * inside[m], 2) for m in ("default", "js_all")},
        "ratio_callback_main_thread_to_bare_step_cpu": round(inside["default"] / cpu["off"], 4),
        "overhead_default_cpu": round(cpu["default"] / cpu["off"] - 1, 4),
        "overhead_js_all_groups_cpu": round(cpu["js_all"] / cpu["off"] - 1, 4),
        "overhead_default_wall": round(wall["default"] / wall["off"] - 1, 4),
        "overhead_js_all_groups_wall": round(wall["js_all"] / wall["off"] - 1, 4),
        "rows_per_step": trainer.args.per_device_train_batch_size,
        "num_generations": trainer.num_generations,
        "max_completion_length": completion_length,
    }
    return result, stored


def fused_head_cost(model, rows: int = 136, reps: int = 4) -> dict:
    """TRL's fused LM head (forward + backward) with the outputs TRL asks for vs with log Σp² added
    (what forksight asks for), interleaved, at the model's shape: the kernel-level cost of H2."""
    from trl.kernels import ChunkedLogProbFunction

    weight = model.get_output_embeddings().weight
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, weight.shape[1], generator=gen, requires_grad=True)
    targets = torch.randint(0, weight.shape[0], (rows,), generator=gen)
    variants = {"trl": ("log_probs", "entropy"), "forksight": ("log_probs", "entropy", "log_sum_sq_probs")}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(reps + 1):
        for name, outputs in variants.items():
            c0 = time.process_time()
            logp, entropy, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0, outputs)
            (logp.sum() + entropy.sum()).backward()
            if rep:  # the first round is warm-up
                cpu[name].append(time.process_time() - c0)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    return {"rows": rows, "cpu_s_median": {k: round(v, 4) for k, v in med.items()},
            "overhead_log_sum_sq_probs": round(med["forksight"] / med["trl"] - 1, 4)}


def rlwatch_captured(log_dir: str) -> list[str]:
    """Columns rlwatch filled for the run (its metrics table is one row of scalars per step)."""
    path = next(Path(log_dir).rglob("*.db"))
    with sqlite3.connect(path) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(metrics)")]
        rows = conn.execute("SELECT * FROM metrics").fetchall()
    keep = [c for i, c in enumerate(cols) if c not in ("id", "run_id", "step", "timestamp")
            and any(r[i] is not None for r in rows)]
    return keep


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--realistic-steps", type=int, default=7, help="steps at vocab 151,936 (1 warm-up, rest rotate 3 modes; 0 = skip)")
    parser.add_argument("--tiny-steps", type=int, default=14, help="steps on the tiny model (2 warm-up, rest rotate 3 modes)")
    parser.add_argument("--realistic-length", type=int, default=8, help="max_completion_length at vocab 151,936")
    parser.add_argument("--tiny-length", type=int, default=16, help="max_completion_length on the tiny model")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: tiny models gain nothing from "
                        "more, and spinning workers inflate CPU time on a shared machine)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    import trl

    from forksight.trainer.model import build_tiny, load

    tiny_model, tokenizer = load(build_tiny())
    out: dict = {"trl": trl.__version__, "torch": torch.__version__, "device": "cpu",
                 "threads": torch.get_num_threads(), "load_avg_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as workdir:
        rl_dir = os.path.join(workdir, "rlwatch") if importlib.util.find_spec("rlwatch") else None
        out["tiny"], stored = run("tiny", tiny_model, tokenizer, args.tiny_steps, 2, args.tiny_length, workdir, rl_dir)
        # the tiny tokenizer decodes ids it lacks to "": fine for timing the 151,936-row head
        if args.realistic_steps:  # 0: the tiny model only (a quick check)
            big = realistic_model()
            out["realistic_fused_head"] = fused_head_cost(big)
            out["realistic"], _ = run("realistic", big, tokenizer, args.realistic_steps, 1,
                                      args.realistic_length, workdir, None)
        captured = rlwatch_captured(rl_dir) if rl_dir else "rlwatch not installed"
    out["rlwatch"] = {
        "captures": captured,
        "forksight_scalar_keys": len(stored["scalar_keys"]),
        "forksight_only": [
            "per-token entropy, Rényi-2, log p, top-1 and ICT JS rows "
            f"({stored['token_rows']} token rows in the tiny run)",
            f"entropy histogram of every completion token per step ({stored['histogram_steps']} steps)",
            "entropy percentiles p20/p50/p80/p95, fork/frac, selected/frac (top_entropy_quantile mask)",
            "renyi2/mean, js/mean, top1/mean, logp/mean, cov/logp_adv (Cui et al. covariance)",
            "pass@1..pass@G from the rollouts' verdicts, groups/zero_var_frac",
            f"every completion with prompt, reward, verdict and group id ({stored['sample_rows']} sample rows)",
            "all of TRL's own scalars under TRL's names (rlwatch keeps the 9 it maps)",
        ],
    }
    out["load_avg_end"] = os.getloadavg()[0]
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
