"""Benchmark of forksight.hooks.metrics.token_stats against the true log-prob floor, side by side in one run.

The floor is the fastest chunked log_softmax + gather of the sampled token's log p over chunk
sizes 8…512 rows, each measured in the same run (large chunks lose: their temporaries leave
malloc's heap). Targets (issue 27): token_stats at its default settings (H, H2, log p, top-1)
≤ 1.25× the floor, with ICT JS (groups of B) ≤ 2×, float32 and bfloat16, at [6, 256, 151936]
with 1 thread. Both paths are timed: the default (the compiled kernels of hooks/metrics/fused.py
where torch.compile works; with JS on the CPU, the C++ kernel of hooks/metrics/native.py) and the
eager fallback (fused=False); `kernels_run` names the kernels that ran. Every contender runs once per
--repeats interleaved rounds: each ratio is the median over rounds of the contender's time over
the floor's in the same round (the machine is shared; neighbours in time share its load).
Also: max |Δ| of every statistic against a float64 reference on a small slice, for both paths;
optionally (--memory) the peak extra memory per call in a fresh subprocess; optionally
(--sweep) token_stats at other chunk sizes, which is how the default chunking was chosen.
    .venv/bin/python bench/metrics.py [--shape 6 256 151936 ...] [--dtypes float32 bfloat16]
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

from forksight.hooks.metrics import fused as fused_kernels
from forksight.hooks.metrics import token_stats

CHILD_FLAG = "--memory-child"


# ---------------------------------------------------------------------------- the contenders


def floor_logp(logits, tokens, chunk_size: int):
    """What every RL trainer already pays: chunked log_softmax + gather (TRL's selective form)."""
    flat = logits.view(-1, logits.shape[-1])
    idx = tokens.reshape(-1, 1)
    out = torch.empty(flat.shape[0], dtype=torch.float32)
    for start in range(0, flat.shape[0], chunk_size):
        chunk = flat[start : start + chunk_size].float()
        out[start : start + chunk_size] = torch.log_softmax(chunk, -1).gather(-1, idx[start : start + chunk_size])[:, 0]
    return out


def stats_call(js: bool, fused, chunk_size: int | None):
    """token_stats as a caller runs it: tokens always, groups of B (one group) when js."""
    kwargs = {} if chunk_size is None else {"chunk_size": chunk_size}  # None: the default

    def call(logits, tokens):
        groups = torch.zeros(logits.shape[0], dtype=torch.long) if js else None
        return token_stats(logits, tokens=tokens, group_ids=groups, fused=fused, **kwargs)

    return call


def contenders(floor_chunks, sweep) -> dict:
    found = {f"floor_c{c}": (lambda z, y, c=c: floor_logp(z, y, c)) for c in floor_chunks}
    for js in (False, True):
        name = "token_stats_js" if js else "token_stats"
        found[name] = stats_call(js, None, None)  # the default settings
        found[f"{name}_eager"] = stats_call(js, False, None)
        for c in sweep:
            found[f"{name}_c{c}"] = stats_call(js, None, c)
            found[f"{name}_eager_c{c}"] = stats_call(js, False, c)
    return found


# ---------------------------------------------------------------------------- measurements


def make_inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.empty(shape, dtype=dtype).normal_(0.0, 3.0, generator=g)
    tokens = torch.randint(0, shape[-1], shape[:2], generator=g)
    return logits, tokens


def time_all(fns: dict, logits, tokens, repeats: int) -> dict[str, list[float]]:
    """Seconds per call, each round calling every contender in turn so machine noise hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm-up (and the compile, the first time)
        fn(logits, tokens)
    for _ in tqdm(range(repeats), desc="timing rounds", file=sys.stderr):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(logits, tokens)
            times[name].append(time.perf_counter() - start)
    return times


def peak_extra_bytes(name: str, shape, dtype: str) -> int:
    """Peak RSS growth of one call, measured in a fresh process (no allocator history)."""
    cmd = [sys.executable, __file__, CHILD_FLAG, name, *map(str, shape), dtype]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return int(result.stdout.strip().splitlines()[-1])


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def memory_child(name: str, shape, dtype: str) -> None:
    torch.set_num_threads(1)
    fn = contenders([8], [])[name]
    logits, tokens = make_inputs(shape, getattr(torch, dtype))
    fn(logits, tokens)  # load kernels, compile, lazy imports first
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset VmHWM (peak RSS) to the current RSS
    before = _status_bytes("VmRSS:")
    fn(logits, tokens)
    print(_status_bytes("VmHWM:") - before)


def max_error_vs_float64(logits, tokens, fused: bool) -> dict[str, float]:
    """max |Δ| nats of every statistic against float64 on a slice of 2 groups × 4 positions."""
    group_size = max(1, logits.shape[0] // 2)
    rows = min(logits.shape[0], 2 * group_size)
    z, y = logits[:rows, :4], tokens[:rows, :4]
    groups = torch.arange(rows) // group_size
    got = token_stats(z, tokens=y, group_ids=groups, chunk_size=3, fused=fused)
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

TARGETS = {"token_stats": 1.25, "token_stats_js": 2.0}


def measure(shape, dtype_name: str, args) -> dict:
    dtype = getattr(torch, dtype_name)
    logits, tokens = make_inputs(shape, dtype)
    fns = contenders(args.floor_chunks, args.sweep)
    runs = time_all(fns, logits, tokens, args.repeats)
    fastest = {k: min(v) for k, v in runs.items()}  # the shared machine only ever adds time
    median = {k: statistics.median(v) for k, v in runs.items()}
    # the floor: the chunk size with the lowest median; each contender's ratio is the median over
    # rounds of its time over the floor's in the same round (neighbours in time share the load)
    floor_name = min((k for k in median if k.startswith("floor_c")), key=median.get)
    ratios = {k: round(statistics.median(t / f for t, f in zip(v, runs[floor_name])), 3) for k, v in runs.items()}
    report = {
        "shape": list(shape),
        "dtype": dtype_name,
        "floor": {"chunk": int(floor_name[len("floor_c"):]), "median_ms": round(median[floor_name] * 1e3, 1),
                  "min_ms": round(fastest[floor_name] * 1e3, 1)},
        "fused_path": fused_kernels.failure() is None and shape[0] * shape[1] * shape[2] >= fused_kernels.FUSED_MIN_ELEMENTS,
        "kernels_run": fused_kernels.kernels_run(),  # the compiled kernels that ran, by name
        "ratio_to_floor": ratios,
        "ratio_of_mins": {k: round(v / fastest[floor_name], 3) for k, v in fastest.items()},
        "median_ms": {k: round(v * 1e3, 1) for k, v in median.items()},
        "targets": TARGETS,
        "targets_met": {k: ratios[k] <= t for k, t in TARGETS.items()},
        "max_abs_err_vs_float64": {
            "fused": max_error_vs_float64(logits, tokens, True),
            "eager": max_error_vs_float64(logits, tokens, False),
        },
    }
    if args.memory:
        names = ["token_stats", "token_stats_js", "token_stats_eager", "token_stats_js_eager", "floor_c8"]
        report["logits_bytes"] = logits.numel() * logits.element_size()
        report["peak_extra_bytes"] = {n: peak_extra_bytes(n, shape, dtype_name) for n in names}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=3, action="append", metavar=("B", "T", "V"),
                        help="repeat for several shapes (default: 6 256 151936)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--floor-chunks", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--sweep", type=int, nargs="*", default=[], help="token_stats chunk sizes to time too")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--memory", action="store_true", help="peak extra memory per call (subprocesses)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    results = [measure(tuple(shape), dtype, args) for shape in (args.shape or [[6, 256, 151_936]])
               for dtype in args.dtypes]
    print(json.dumps({
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "fused_failure": fused_kernels.failure(),
        "results": results,
        "load_avg_1min_at_end": os.getloadavg()[0],  # the machine is shared: context for the times
    }, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        _, _, name, b, t, v, dtype = sys.argv
        memory_child(name, (int(b), int(t), int(v)), dtype)
    else:
        main()
