"""The demo's collapse scenario across CPU kernel paths and seeds: where the test margins come from.

    python bench/kernel_spread.py                       # 3 levels x 3 seeds, 300 steps -> docs/kernel_spread.json
    python bench/kernel_spread.py --levels avx2 --seeds 0 --steps 120 --out /tmp/x.json

Each cell is a real `forksight demo --strategies all --seed S` (plain GRPO at the preset's common lr
and at the sweep's lr, side by side, a collector computing the alerts) under `ATEN_CPU_CAPABILITY=L`
with an empty FORKSIGHT_HOME, so it starts from the shipped base model as a new machine would. The
kernel level stands in for another CPU: PyTorch's vectorised kernels round differently, so the RL
trajectory from the same weights differs. A variant `L+MKL_CBWR=V` also sets MKL's conditional
numerical reproducibility branch (another BLAS path). Per run the demo summary's figures; then the
spread over cells: min and max of each figure, and whether every cell kept the verdicts the tests
assert (common lr collapses with the warning ahead of the under-20% step, the sweep's lr healthy).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "kernel_spread.json"
LEVELS = ("default", "avx2", "avx512")
SEEDS = (0, 1, 2)
COMMON, SWEPT = "all-lr5e-4-common", "all-lr5.56e-5-sweep-best"
FIGURES = ("entropy_start", "warning_step", "critical_step", "under_20pct_step", "warning_lead",
           "fork_frac_start", "eval_pass8_first", "eval_pass8_last")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def level_env(variant: str) -> dict[str, str]:
    """`avx2` or `avx512+MKL_CBWR=COMPATIBLE` as environment variables."""
    level, _, extra = variant.partition("+")
    env = {"ATEN_CPU_CAPABILITY": level}
    if extra:
        key, _, value = extra.partition("=")
        env[key] = value
    return env


def run_cell(variant: str, seed: int, steps: int, workdir: Path) -> dict:
    """One `forksight demo --strategies all` under this kernel path and seed: its two runs' figures."""
    home = workdir / "home"
    summary = workdir / "summary.json"
    env = {**os.environ, **level_env(variant), "FORKSIGHT_HOME": str(home)}
    argv = [sys.executable, "-m", "forksight", "demo", "--strategies", "all", "--seed", str(seed),
            "--steps", str(steps), "--db", str(workdir / "demo.duckdb"), "--port", str(_free_port()),
            "--exit-when-done", "--summary", str(summary)]
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"kernel_spread: {variant} seed {seed} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    runs = {r["name"]: r for r in json.loads(summary.read_text())["runs"]}
    return {"variant": variant, "seed": seed, "seconds": round(time.perf_counter() - started, 1),
            "runs": {name: figures(run) for name, run in runs.items()}}


def figures(run: dict) -> dict:
    p8 = run["heldout"].get("pass@8", {})
    return {"entropy_start": run["entropy_start"], "warning_step": run["warning_step"],
            "critical_step": run["critical_step"], "under_20pct_step": run["under_20pct_step"],
            "warning_lead": run["warning_lead"], "fork_frac_start": run["fork_frac_start"],
            "eval_pass8_first": p8.get("first"), "eval_pass8_last": p8.get("last"),
            "verdict": run["verdict"]["state"], "steps": run["steps"]}


def holds(cell: dict) -> dict[str, bool]:
    """The verdicts tests/test_demo_readable_collapse.py asserts, for one cell."""
    common, swept = cell["runs"][COMMON], cell["runs"][SWEPT]
    return {
        "common_collapsed": common["verdict"] == "collapsed" and common["under_20pct_step"] is not None,
        "common_warned_10_ahead": common["warning_lead"] is not None and common["warning_lead"] >= 10,
        "swept_healthy": swept["warning_step"] is None and swept["under_20pct_step"] is None
                         and swept["verdict"] != "collapsed",
        "heldout_cost": (common["eval_pass8_last"] is not None
                         and common["eval_pass8_last"] < common["eval_pass8_first"] - 0.3
                         and swept["eval_pass8_last"] > common["eval_pass8_last"] + 0.3),
    }


def spread(cells: list[dict]) -> dict:
    """Per run and figure: min, max and the values (None: the event never happened)."""
    out: dict = {}
    for name in (COMMON, SWEPT):
        out[name] = {}
        for fig in FIGURES:
            values = [c["runs"][name][fig] for c in cells]
            seen = [v for v in values if v is not None]
            out[name][fig] = {"min": min(seen) if seen else None, "max": max(seen) if seen else None,
                              "never": sum(v is None for v in values)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default=",".join(LEVELS),
                        help="comma-separated kernel paths: ATEN_CPU_CAPABILITY values, each optionally "
                             "+MKL_CBWR=VALUE (default: %(default)s)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=300, help="RL steps per run (the demo's 300)")
    parser.add_argument("--out", default=str(OUT), help="JSON written here (default: docs/kernel_spread.json)")
    args = parser.parse_args(argv)
    import torch

    variants = [v for v in args.levels.split(",") if v]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    cells = []
    for i, (variant, seed) in enumerate((v, s) for v in variants for s in seeds):
        with tempfile.TemporaryDirectory(prefix="forksight-spread-") as tmp:
            cell = run_cell(variant, seed, args.steps, Path(tmp))
        cell["holds"] = holds(cell)
        cells.append(cell)
        c = cell["runs"][COMMON]
        print(f"[{i + 1}/{len(variants) * len(seeds)}] {variant} s{seed}: H0 {c['entropy_start']} warned "
              f"{c['warning_step']} critical {c['critical_step']} under-20% {c['under_20pct_step']} "
              f"({cell['seconds']} s) holds {all(cell['holds'].values())}", file=sys.stderr, flush=True)
    doc = {"meta": {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                    "native_level": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                    "steps": args.steps, "command": " ".join(["python", "bench/kernel_spread.py", *(argv or sys.argv[1:])])},
           "cells": cells, "spread": spread(cells),
           "all_hold": all(all(c["holds"].values()) for c in cells)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"all_hold": doc["all_hold"], "spread": doc["spread"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
