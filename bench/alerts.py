"""Alert benchmark: lead time, false alarms, rlwatch and rlprobe side by side, cost per step (JSON).

    python bench/alerts.py [--db RUNS.duckdb --run ID ...] [--quick] [--no-real | --retrain]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from forksight.monitor.alerts.hub import AlertMonitor
from forksight.base.records import Records, scalars_table
from forksight.monitor.collector.store import Store

# Synthetic runs (collapsing: flat, then H0·exp(-(t - onset)/tau) with multiplicative noise;
# healthy: entropy settles 20% lower, reward climbs) go through a real DuckDB file and back
# through the store's Reader, so every detector sees the same stored series. Their ground truth:
# the first step where the debiased EMA (β = 0.9) of entropy is below 10% of the first 10 steps'
# mean. rlwatch's own EntropyCollapseDetector (default: entropy < 1.0 for 50 steps -> critical,
# 25 -> warning) runs on the same series. Real runs: bench/alerts_real.py (cached in tests/data).
# The peers are pinned and live in their own folder, never in the project venv:
#     .venv/bin/pip install --target .venv/bench-peers --no-deps rlwatch==0.5.1 rlprobe==0.1.0 rldoctor==0.2.0
TARGET_LEAD = 20
PEERS = {"rlwatch": "0.5.1", "rlprobe": "0.1.0", "rldoctor": "0.2.0"}
PEERS_DIR = Path(__file__).resolve().parents[1] / ".venv" / "bench-peers"


def use_peers() -> dict:
    """Put the pinned peers on sys.path (for this process only) and check their versions."""
    from importlib.metadata import version

    if str(PEERS_DIR) not in sys.path:
        sys.path.insert(0, str(PEERS_DIR))
    found = {name: version(name) for name in PEERS}
    wrong = {n: v for n, v in found.items() if v != PEERS[n]}
    if wrong:
        raise SystemExit(f"bench peers {wrong} differ from the pinned {PEERS}: reinstall into {PEERS_DIR}")
    return found


# ---------------------------------------------------------------------------- synthetic runs
def collapsing(tau: float, noise: float, h0: float, onset: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    steps = int(onset + 6 * tau + 60)
    rows = []
    for t in range(steps):
        h = h0 * math.exp(-max(0, t - onset) / tau)
        frac_left = h / h0
        p1 = 0.3 + 0.3 * (1 - frac_left)
        rows.append({"entropy/mean": h * (1 + rng.normal(0, noise)), "renyi2/mean": 0.7 * h,
                     "reward/mean": 0.8 - 0.5 * math.exp(h - h0) + rng.normal(0, 0.02),
                     "cov/logp_adv": (0.01 if t >= onset else 0.0) + rng.normal(0, 0.01),
                     "pass@1": p1, "pass@8": min(1.0, p1 + 0.3 * frac_left),
                     "fork/frac": 0.2 * frac_left, "groups/zero_var_frac": 0.1 + 0.85 * (1 - frac_left),
                     "length/mean": 40 + rng.normal(0, 2)})
    return rows


def healthy(noise: float, h0: float, seed: int, steps: int = 600) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for t in range(steps):
        h = h0 * (0.8 + 0.2 * math.exp(-t / 150))
        p1 = 0.2 + 0.6 * t / steps + rng.normal(0, 0.02)
        rows.append({"entropy/mean": h * (1 + rng.normal(0, noise)), "renyi2/mean": 0.7 * h,
                     "reward/mean": p1, "cov/logp_adv": rng.normal(0, 0.01), "pass@1": p1,
                     "pass@8": min(1.0, p1 + 0.3), "fork/frac": 0.2 * h / h0,
                     "groups/zero_var_frac": 0.1 + rng.normal(0, 0.02), "length/mean": 40 + rng.normal(0, 2)})
    return rows


# ---------------------------------------------------------------------------- detectors on a series
def ground_truth(entropy: np.ndarray) -> int | None:
    smooth = pd.Series(entropy).ewm(alpha=0.1, adjust=True).mean().to_numpy()  # = debiased EMA
    below = np.flatnonzero(smooth < 0.1 * entropy[:10].mean())
    return int(below[0]) if below.size else None


def ours(steps: list[int], rows: list[dict]) -> dict:
    monitor = AlertMonitor()
    alerts = [a for step, row in zip(steps, rows) for a in monitor.observe(step, row)]
    collapse = [a for a in alerts if a.detector == "entropy_collapse"]
    first = collapse[0] if collapse else None
    return {"first_collapse_step": first.step if first else None,
            "first_collapse_forecast": first.forecast if first else None,
            "critical_step": next((a.step for a in collapse if a.severity == "critical"), None),
            "covariance_step": next((a.step for a in alerts if a.detector == "covariance"), None),
            "detectors": sorted({a.detector for a in alerts})}


def rlwatch_rule(steps: list[int], entropy: list[float]) -> dict:
    from rlwatch.config import EntropyCollapseConfig
    from rlwatch.detectors import EntropyCollapseDetector

    detector = EntropyCollapseDetector(EntropyCollapseConfig())
    found = {}
    for step, h in zip(steps, entropy):
        alert = detector.check(step, h)
        if alert is not None:
            found.setdefault(alert.severity, step)
    return {"rlwatch_warning_step": found.get("warning"), "rlwatch_step": found.get("critical")}


def stored_series(reader, run_id: str) -> tuple[list[int], list[dict]]:
    frame = reader.read_scalars(run_id, downsample=2**62)
    steps, rows = [], []
    for step, group in frame.groupby("step", sort=True):
        steps.append(int(step))
        rows.append(dict(zip(group["key"], group["value"].astype(float))))
    return steps, rows


def evaluate(reader, run_id: str) -> dict:
    steps, rows = stored_series(reader, run_id)
    entropy = [r["entropy/mean"] for r in rows]
    truth_index = ground_truth(np.asarray(entropy))
    out = {"run": run_id, "steps": len(steps), "initial_entropy": float(np.mean(entropy[:10])),
           "ground_truth_step": steps[truth_index] if truth_index is not None else None}
    out.update(ours(steps, rows))
    out.update(rlwatch_rule(steps, entropy))
    truth = out["ground_truth_step"]
    for name, key in (("lead", "first_collapse_step"), ("rlwatch_lead", "rlwatch_step")):
        out[name] = truth - out[key] if truth is not None and out[key] is not None else None
    return out


# ---------------------------------------------------------------------------- cost
def cost_per_step(steps: int = 10_000) -> dict:
    """Seconds per observed step on one long run: ours (all detectors) vs rlwatch's entropy rule.

    CPU time of this process (not wall time): the machine may be shared; best of 3 rounds."""
    from rlwatch.config import EntropyCollapseConfig
    from rlwatch.detectors import EntropyCollapseDetector

    rows = collapsing(tau=steps / 5, noise=0.05, h0=1.5, onset=100, seed=0)[:steps]
    extra = {f"pass@{k}": 0.5 for k in range(2, 8)} | {"loss": 0.1, "kl": 0.01, "grad_norm": 1.0, "lr": 1e-6}
    rows = [r | extra for r in rows]
    best_ours = best_rl = math.inf
    for _ in range(3):
        monitor = AlertMonitor()
        t0 = time.process_time()
        for step, row in enumerate(rows):
            monitor.observe(step, row)
        best_ours = min(best_ours, (time.process_time() - t0) / len(rows))
        detector = EntropyCollapseDetector(EntropyCollapseConfig())
        t0 = time.process_time()
        for step, row in enumerate(rows):
            detector.check(step, row["entropy/mean"])
        best_rl = min(best_rl, (time.process_time() - t0) / len(rows))
    return {"steps": len(rows), "scalars_per_step": len(rows[0]), "ours_ms_per_step": round(best_ours * 1e3, 4),
            "rlwatch_entropy_rule_ms_per_step": round(best_rl * 1e3, 4),
            "ours_over_rlwatch": round(best_ours / best_rl, 2), "target_ms": 1.0,
            "meets_target": best_ours * 1e3 < 1.0}


# ---------------------------------------------------------------------------- main
def _subset(results: list[dict], above: bool) -> dict:
    chosen = [r for r in results if (r["initial_entropy"] >= 1.0) == above]
    ours_leads = [r["lead"] for r in chosen if r["lead"] is not None]
    rl_leads = [r["rlwatch_lead"] for r in chosen if r["rlwatch_lead"] is not None]
    return {"runs": len(chosen),
            "ours_lead_median": statistics.median(ours_leads) if ours_leads else None,
            "ours_lead_min": min(ours_leads, default=None),
            "rlwatch_lead_median": statistics.median(rl_leads) if rl_leads else None,
            "rlwatch_lead_min": min(rl_leads, default=None),
            "rlwatch_late_or_missed": sum(r["rlwatch_lead"] is None or r["rlwatch_lead"] < 0 for r in chosen),
            "rlwatch_fired_before_onset": sum(r["rlwatch_step"] is not None and r["rlwatch_step"] < r["onset"]
                                              for r in chosen if r.get("onset") is not None)}


def summary(results: list[dict], healthy_results: list[dict]) -> dict:
    leads = [r["lead"] for r in results if r["lead"] is not None]
    missed = sum(r["lead"] is None for r in results)
    rl_leads = [r["rlwatch_lead"] for r in results if r["rlwatch_lead"] is not None]
    fc_err = [abs(r["first_collapse_forecast"] - r["ground_truth_step"]) for r in results
              if r["first_collapse_forecast"] is not None]
    return {
        "collapsing_runs": len(results),
        "lead_steps": {"min": min(leads, default=None), "median": statistics.median(leads) if leads else None,
                       "max": max(leads, default=None)},
        "runs_with_lead_at_least_20": sum(lead >= TARGET_LEAD for lead in leads),
        "runs_missed": missed,
        "first_warning_was_forecast": sum(r["first_collapse_forecast"] is not None for r in results),
        "forecast_abs_error_at_first_warning_median": statistics.median(fc_err) if fc_err else None,
        "covariance_warning_before_ground_truth": sum(
            r["covariance_step"] is not None and r["covariance_step"] < r["ground_truth_step"] for r in results),
        "rlwatch_lead_steps": {"min": min(rl_leads, default=None),
                               "median": statistics.median(rl_leads) if rl_leads else None,
                               "max": max(rl_leads, default=None)},
        "rlwatch_missed": sum(r["rlwatch_lead"] is None for r in results),
        # rlwatch's absolute 1.0-nat threshold: on runs that start below it, it "detects" at
        # warm-up + 50 steps whatever happens, so compare both on runs starting above 1 nat
        "runs_starting_above_1_nat": _subset(results, above=True),
        "runs_starting_below_1_nat": _subset(results, above=False),
        "healthy_runs": len(healthy_results),
        "healthy_false_alarms_any_detector": sum(bool(r["detectors"]) for r in healthy_results),
        "healthy_false_alarms_collapse": sum(r["first_collapse_step"] is not None for r in healthy_results),
        "healthy_false_alarms_rlwatch": sum(r["rlwatch_step"] is not None for r in healthy_results),
        "targets": {"lead_at_least_20_on_every_run": bool(leads) and missed == 0 and min(leads) >= TARGET_LEAD,
                    "zero_false_alarms": all(not r["detectors"] for r in healthy_results)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", help="also evaluate stored runs of this DuckDB file (e.g. a collapse run)")
    parser.add_argument("--run", action="append", default=[], help="run id in --db (repeatable)")
    parser.add_argument("--quick", action="store_true", help="a smaller grid")
    parser.add_argument("--per-run", action="store_true", help="include every run's figures")
    parser.add_argument("--no-real", action="store_true", help="skip the real-run part")
    parser.add_argument("--retrain", action="store_true", help="retrain the real runs instead of reading the cache")
    args = parser.parse_args(argv)
    peers = use_peers()

    taus = (12, 40, 150) if args.quick else (12, 20, 40, 80, 150)
    noises = (0.05, 0.15) if args.quick else (0.02, 0.05, 0.1, 0.15)
    h0s = (0.6, 1.5, 3.0)
    grid = [(tau, noise, h0, 20 + 30 * (i % 2), i) for i, (tau, noise, h0) in
            enumerate((t, n, h) for t in taus for n in noises for h in h0s)]
    healthy_grid = [(noise, h0, seed) for noise in noises for h0 in h0s for seed in range(2 if args.quick else 3)]

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "bench.duckdb"))
        names: list[tuple[str, str]] = []
        series = [(f"collapse-tau{tau}-n{noise}-h{h0}-on{onset}", collapsing(tau, noise, h0, onset, seed))
                  for tau, noise, h0, onset, seed in grid]
        series += [(f"healthy-n{noise}-h{h0}-s{seed}", healthy(noise, h0, seed)) for noise, h0, seed in healthy_grid]
        for name, rows in tqdm(series, desc="store runs", file=sys.stderr):
            run_id = store.create_run(name)
            table = scalars_table([{"step": s, "key": k, "value": v} for s, row in enumerate(rows)
                                   for k, v in row.items()])
            store.write(run_id, Records(scalars=table))
            names.append((run_id, name))
        store.flush()
        results, healthy_results = [], []
        for run_id, name in tqdm(names, desc="detect", file=sys.stderr):
            result = evaluate(store.reader, run_id)
            if name.startswith("healthy"):
                healthy_results.append(result)
            else:
                result["onset"] = int(name.rsplit("-on", 1)[1])
                results.append(result)
        store.close()

    report = {"peers": peers, "synthetic": summary(results, healthy_results), "cost": cost_per_step()}
    if not args.no_real:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from alerts_real import real_part

        report["real"] = real_part(retrain=args.retrain)
    if args.per_run:
        report["runs"] = results + healthy_results
    if args.db:
        stored = Store(args.db)
        try:
            report["stored_runs"] = [evaluate(stored.reader, run) for run in args.run]
        finally:
            stored.close()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
