"""Benchmark of forksight.hooks.metrics.token_stats against a log-prob pass, side by side in one run.

Prints one JSON object: median times, ratios to the chunked log_softmax+gather baseline
(targets: entropy+Rényi-2 ≤ 1.5×, with JS ≤ 3×), peak extra memory per call (measured in a
fresh subprocess: the kernel's peak-RSS mark, reset before the call) against chunk_size × V × 4 bytes, and max |Δ| against a
float64 reference on a small slice.
    .venv/bin/python bench/metrics.py [--shape 6 256 151936] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from tqdm import tqdm

from forksight.hooks.metrics import token_stats

CHILD_FLAG = "--memory-child"


# ---------------------------------------------------------------------------- the contenders


def baseline_logp(logits, tokens, chunk_size: int):
    """What every RL trainer already pays: chunked log_softmax + gather (TRL's selective form)."""
    flat = logits.view(-1, logits.shape[-1])
    idx = tokens.reshape(-1, 1)
    out = torch.empty(flat.shape[0], dtype=torch.float32)
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start : start + chunk_size].float()
        out[start : start + chunk_size] = torch.log_softmax(chunk, -1).gather(-1, idx[start : start + chunk_size])[:, 0]
    return out


def whole_logp(logits, tokens, chunk_size: int):
    """log_softmax over the whole [B, T, V] at once (B·T·V extra memory)."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None])[..., 0]


def trl_entropy(logits, tokens, chunk_size: int):
    from trl.trainer.utils import entropy_from_logits

    return entropy_from_logits(logits, chunk_size=chunk_size)


def stats_h(logits, tokens, chunk_size: int):
    return token_stats(logits, tokens=tokens, chunk_size=chunk_size)


def make_stats_js(group_size: int):
    def stats_js(logits, tokens, chunk_size: int):
        groups = torch.arange(logits.shape[0]) // group_size
        return token_stats(logits, tokens=tokens, group_ids=groups, chunk_size=chunk_size)

    return stats_js


def contenders(batch: int) -> dict:
    found = {
        "baseline_chunked_logp": baseline_logp,
        "baseline_whole_logp": whole_logp,
        "token_stats": stats_h,
        f"token_stats_js_g{batch}": make_stats_js(batch),
    }
    if batch % 2 == 0 and batch > 2:
        found[f"token_stats_js_g{batch // 2}"] = make_stats_js(batch // 2)
    try:
        import trl.trainer.utils  # noqa: F401

        found["trl_entropy_from_logits"] = trl_entropy
    except ImportError:
        pass
    return found


# ---------------------------------------------------------------------------- measurements


def make_inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.empty(shape, dtype=dtype).normal_(0.0, 3.0, generator=g)
    tokens = torch.randint(0, shape[-1], shape[:2], generator=g)
    return logits, tokens


def time_all(fns: dict, chunk_of: dict, logits, tokens, repeats: int) -> dict[str, list[float]]:
    """Seconds per call, each round calling every contender in turn so machine noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for name, fn in fns.items():  # warm-up
        fn(logits, tokens, chunk_of[name])
    for _ in tqdm(range(repeats), desc="timing rounds", file=sys.stderr):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(logits, tokens, chunk_of[name])
            times[name].append(time.perf_counter() - start)
    return times


def peak_extra_bytes(name: str, shape, dtype: str, chunk_size: int, threads: int) -> int:
    """Peak RSS growth of one call, measured in a fresh process (no allocator history)."""
    cmd = [sys.executable, __file__, CHILD_FLAG, name, *map(str, shape), dtype, str(chunk_size), str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(result.stdout.strip().splitlines()[-1])


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def memory_child(name: str, shape, dtype: str, chunk_size: int, threads: int) -> None:
    torch.set_num_threads(threads)
    fns = contenders(shape[0])
    logits, tokens = make_inputs(shape, getattr(torch, dtype))
    small_l, small_t = logits[:1, :2].contiguous(), tokens[:1, :2].contiguous()
    fns[name](small_l, small_t, chunk_size)  # load kernels and lazy imports first
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset VmHWM (peak RSS) to the current RSS
    before = _status_bytes("VmRSS:")
    fns[name](logits, tokens, chunk_size)
    print(_status_bytes("VmHWM:") - before)


def max_error_vs_float64(logits, tokens, group_size: int) -> dict[str, float]:
    """max |Δ| nats of every statistic against float64 on a slice of 2 groups × 4 positions."""
    rows = min(logits.shape[0], 2 * group_size)
    z, y = logits[:rows, :4], tokens[:rows, :4]
    groups = torch.arange(rows) // group_size
    got = token_stats(z, tokens=y, group_ids=groups, chunk_size=3)
    logq = torch.log_softmax(z.double(), -1)
    p = logq.exp()
    ref = {
        "entropy": -(p * logq).sum(-1),
        "renyi2": -(p * p).sum(-1).log(),
        "top1": p.amax(-1),
        "logp": logq.gather(-1, y[..., None])[..., 0],
    }
    js = torch.zeros(z.shape[:2], dtype=torch.float64)
    for i in range(rows):
        mean = p[groups == groups[i]].mean(0)
        mix = 0.5 * (p[i] + mean)
        js[i] = 0.5 * (p[i] * (logq[i] - mix.log())).sum(-1) + 0.5 * (mean * (mean.log() - mix.log())).sum(-1)
    ref["js"] = js
    return {k: float((getattr(got, k).double() - v).abs().max()) for k, v in ref.items()}


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, default=[6, 256, 151_936], metavar=("B", "T", "V"))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--chunk-size", type=int, default=1024, help="token_stats' chunk_size (memory budget rows)")
    parser.add_argument("--baseline-chunk", type=int, default=128, help="rows per chunk of the baselines")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-call memory subprocesses")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    shape, dtype = tuple(args.shape), getattr(torch, args.dtype)
    logits, tokens = make_inputs(shape, dtype)
    fns = contenders(shape[0])
    # the baselines get their own (faster) chunk; token_stats caps its blocks internally
    chunk_of = {n: (args.chunk_size if n.startswith("token_stats") else args.baseline_chunk) for n in fns}
    runs = time_all(fns, chunk_of, logits, tokens, args.repeats)
    times = {k: statistics.median(v) for k, v in runs.items()}
    fastest = {k: min(v) for k, v in runs.items()}  # the shared machine only ever adds time
    base, base_min = times["baseline_chunked_logp"], fastest["baseline_chunked_logp"]
    report = {
        "shape": list(shape),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg_1min_at_end": None,
        "repeats": args.repeats,
        "chunk_size": args.chunk_size,
        "baseline_chunk": args.baseline_chunk,
        "median_ms": {k: round(v * 1e3, 1) for k, v in times.items()},
        "ratio_to_chunked_logp": {k: round(v / base, 3) for k, v in times.items()},
        "min_ms": {k: round(v * 1e3, 1) for k, v in fastest.items()},
        "ratio_of_mins": {k: round(v / base_min, 3) for k, v in fastest.items()},
        "targets": {"token_stats": 1.5, "token_stats_js": 3.0},
        "max_abs_err_vs_float64": max_error_vs_float64(logits, tokens, shape[0] // 2 or 1),
    }
    if not args.no_memory:
        bound = args.chunk_size * shape[-1] * 4
        report["chunk_bound_bytes"] = bound
        report["logits_bytes"] = logits.numel() * logits.element_size()
        report["peak_extra_bytes"] = {}
        names = [n for n in fns if n.startswith("token_stats") or n == "baseline_chunked_logp"]
        for name in tqdm(names, desc="memory", file=sys.stderr):
            report["peak_extra_bytes"][name] = peak_extra_bytes(name, shape, args.dtype, chunk_of[name], args.threads)
        report["peak_within_chunk_bound"] = all(v <= bound for v in report["peak_extra_bytes"].values())
    report["load_avg_1min_at_end"] = os.getloadavg()[0]  # the machine is shared: context for the times
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        _, _, name, b, t, v, dtype, chunk, threads = sys.argv
        memory_child(name, (int(b), int(t), int(v)), dtype, int(chunk), int(threads))
    else:
        main()
