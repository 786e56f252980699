"""Value probes on the readable preset (docs/algorithms.md §12): do the fork tokens (H >= 0.672), ICT's
JS tokens or the run's own selection coincide with the tokens whose choice changes the expected
reward? For strategies all/fork/ict at the sweep's chosen lr and at the preset's, each run probes
P completions at step 1 and every N steps (every position, K continuations), and the JSON reports
per run: pivotal tokens per completion, fork precision (share of forks that are pivotal) and recall
(share of pivotal tokens that are forks), each selection rule's recall against the random rule's,
Spearman rho(H, |delta|), first probe vs last, and the probe's cost; pooled over runs: precision and
recall of "H >= tau" for several tau, 0.672 among them.

    python bench/probes.py --out docs/probes.json            # seed 0 (~15 min on 2 busy cores)
    python bench/probes.py --seeds 0,1,2 --out docs/probes.json

Every run starts from the seed-0 warm-up (cached); --seeds changes the RL phase's seed only."""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

from page_io import add_page_options, commit, rendered_only, write_outputs
from readable_warm import warm_model

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RULES = ("fork", "ict", "random", "own")
TAUS = (0.1, 0.3, 0.672, 1.0, 1.5)


def _one(model: str, strategy: str, lr: float, seed: int, args, work: Path) -> tuple:
    from forksight.monitor.collector.store import Store
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import train

    name = f"{strategy}-lr{lr:g}-s{seed}"
    db = str(work / f"{name}.duckdb")
    config = load_config(preset="readable", overrides=dict(
        model=model, warmup=False, strategy=strategy, lr=lr, seed=seed, steps=args.steps, run=name, db=db,
        progress=False, probe_every=args.every, probe_samples=args.samples, probe_k=args.k,
        probe_positions="all", probe_budget=1e9))      # no skipping here: the cost is measured instead
    started = time.perf_counter()
    result = train(config)
    with Store(db) as store:
        reader = store.reader
        scalars = reader.read_scalars(result.run_id, downsample=100_000)
        steps = reader.probe_steps(result.run_id)
        import pandas as pd

        rows = pd.concat([reader.read_probes(result.run_id, s) for s in steps], ignore_index=True)
    record = {"strategy": strategy, "lr": lr, "seed": seed, "seconds": round(time.perf_counter() - started, 1)}
    record.update(_run_figures(scalars, rows, steps, args))
    print(f"{name}: {json.dumps(record)[:300]}", file=sys.stderr, flush=True)
    return record, rows.assign(run=name, seed=seed)


def _at(scalars, key: str, step: int) -> float | None:
    hit = scalars[(scalars.key == key) & (scalars.step == step)].value
    return None if hit.empty else round(float(hit.iloc[0]), 4)


def _run_figures(scalars, rows, steps: list[int], args) -> dict:
    per_step = {}
    for s in steps:
        per_step[s] = {k.removeprefix("probe/"): _at(scalars, k, s) for k in sorted(set(scalars.key))
                       if k.startswith("probe/") and _at(scalars, k, s) is not None}
        per_step[s]["fork_frac"] = _at(scalars, "fork/frac", s)
        per_step[s]["entropy_mean"] = _at(scalars, "entropy/mean", s)
        per_step[s]["reward_mean"] = _at(scalars, "reward/mean", s)
    step_time = scalars[(scalars.key == "time/step") & ~scalars.step.isin(steps)].value.median()
    probe_s = np.mean([per_step[s]["seconds"] for s in steps])
    per_completion = probe_s / args.samples
    pivots = {s: (per_step[s].get("pivotal_per_completion") or 0) * (per_step[s].get("completions") or 0)
              for s in steps}
    recall = {}
    for rule in RULES:          # each rule's recall over the run's probes, weighted by pivotal tokens
        have = [s for s in steps if per_step[s].get(f"recall/{rule}") is not None and pivots[s]]
        if have:
            recall[rule] = round(sum(per_step[s][f"recall/{rule}"] * pivots[s] for s in have) /
                                 sum(pivots[s] for s in have), 4)
    return {"probe_steps": steps, "recall": recall, "per_step": per_step, "pooled": _pooled(rows),
            "first": per_step[steps[0]], "last": per_step[steps[-1]],
            "cost": {"step_seconds_median": round(float(step_time), 4),
                     "probe_seconds_mean": round(float(probe_s), 3),
                     "seconds_per_probed_completion": round(float(per_completion), 3),
                     "share_of_step_time_every_n": round(float(probe_s / (args.every * step_time)), 3),
                     # the budget's rule: probing at most 10% of training time
                     "min_every_at_default_budget": int(math.ceil(probe_s / (0.1 * step_time)))}}


DISTINCT = "each distinct probed token once"
# what makes a probed token itself: the runs of one seed share weights, rollout and probe seed at
# step 1, so their first probes are the same tokens with the same values, which pooling must count once
IDENTITY = ("seed", "step", "sample_id", "pos", "token_id", "entropy", "v_before", "v_after")


def distinct(rows):
    """Each distinct probed token once (rows of several runs, each with its RL `seed`)."""
    return rows.drop_duplicates(subset=[c for c in IDENTITY if c in rows.columns], ignore_index=True)


def _pooled(rows) -> dict:
    """Over every probed token of the run (or of several): the base rate, forks, rho, tau sweep."""
    if rows.empty:
        return {}
    piv = rows.pivotal.astype(bool)
    h = rows.entropy.astype(float)
    out = {"probed_tokens": int(len(rows)), "pivotal_tokens": int(piv.sum()),
           "pivotal_frac": round(float(piv.mean()), 4),
           "delta_abs_mean": round(float(rows.delta.abs().mean()), 4)}
    known = rows.dropna(subset=["entropy"])
    if len(known) > 2 and known.delta.abs().nunique() > 1:
        out["spearman_entropy_delta"] = round(float(known.entropy.rank().corr(known.delta.abs().rank())), 4)
    for tau in TAUS:
        picked = h >= tau
        out[f"H>={tau}"] = {"share": round(float(picked.mean()), 4),
                            "precision": round(float(piv[picked].mean()), 4) if picked.any() else None,
                            "recall": round(float(picked[piv].mean()), 4) if piv.any() else None}
    return out


def _f(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown(out: dict) -> str:
    """The JSON as the tables docs/probes.md shows (generated, never typed)."""
    m = out["meta"]
    lines = [f"<!-- generated by bench/probes.py from docs/probes.json; do not edit -->",
             f"Readable preset, {m['steps']} steps, {m['samples']} completions probed at step 1 and every "
             f"{m['probe_every']} steps, every position, K = {m['k']}; pivotal: {m['pivotal']}; fork: {m['fork']}; "
             f"seeds {m['seeds']} ({m['warm_start']}).", "",
             "| strategy | lr | seed | pivotal / completion (first → last) | fork precision | fork recall | "
             "recall fork / ict / own / random | ρ(H, abs Δ) | s / probed completion | min probe_every at 10% |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in out["runs"]:
        pooled, rec = r["pooled"], r["recall"]
        fork = pooled.get("H>=0.672", {})
        lines.append(
            f"| {r['strategy']} | {r['lr']:g} ({r['lr_of']}) | {r['seed']} | "
            f"{_f(r['first'].get('pivotal_per_completion'))} → {_f(r['last'].get('pivotal_per_completion'))} | "
            f"{_f(fork.get('precision'))} | {_f(fork.get('recall'))} | "
            f"{' / '.join(_f(rec.get(k)) for k in ('fork', 'ict', 'own', 'random'))} | "
            f"{_f(pooled.get('spearman_entropy_delta'))} | {_f(r['cost']['seconds_per_probed_completion'])} | "
            f"{r['cost']['min_every_at_default_budget']} |")
    if m.get("pooled") != DISTINCT:
        first = out.get("pooled_first_probe", {})
        lines += ["", f"**Counted before issue 50's fix:** the runs of one seed share weights, rollout and probe "
                  f"seed at step 1, so their first probes are the same tokens, and these pooled figures count "
                  f"each of those up to six times (step 1: {first.get('probed_tokens')} tokens and "
                  f"{first.get('pivotal_tokens')} pivots pooled, a sixth of that distinct; the step-1 shares are "
                  "unchanged by it, the pooled ones slightly). `bench/probes.py` now counts each distinct probed "
                  "token once; rerun it for corrected pooled counts."]
    lines += ["", "Pooled over every probed token of every run: precision and recall of \"H ≥ τ\" as a "
              "detector of pivotal tokens (base rate: share of probed tokens that are pivotal = "
              f"{_f(out['pooled'].get('pivotal_frac'), 4)}).", "", "| τ | share of tokens | precision | recall |",
              "|---|---|---|---|"]
    for tau in TAUS:
        row = out["pooled"].get(f"H>={tau}", {})
        lines.append(f"| {tau} | {_f(row.get('share'), 3)} | {_f(row.get('precision'), 3)} | {_f(row.get('recall'), 3)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="comma-separated RL seeds (default 0)")
    parser.add_argument("--strategies", default="all,fork,ict")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50, help="probe at step 1 and every N steps")
    parser.add_argument("--samples", type=int, default=4, help="completions probed per probed step")
    parser.add_argument("--k", type=int, default=16)
    add_page_options(parser, "docs/probes.md")
    args = parser.parse_args()
    if rendered_only(args, markdown):
        return
    import torch

    torch.set_num_threads(1)
    from forksight.trainer.config import PRESETS

    with open(REPO / "docs" / "strategies.json") as f:
        sweep_lr = json.load(f)["summary"]["readable"]
    model = warm_model()
    runs, all_rows = [], []
    with tempfile.TemporaryDirectory(prefix="probes-") as tmp:
        for strategy in args.strategies.split(","):
            for which in ("sweep", "preset"):
                lr = sweep_lr[strategy]["lr"] if which == "sweep" else PRESETS["readable"]["lr"]
                for seed in (int(s) for s in args.seeds.split(",")):
                    record, rows = _one(model, strategy, lr, seed, args, Path(tmp))
                    runs.append({"lr_of": which, **record})
                    all_rows.append(rows)
    import pandas as pd

    everything = distinct(pd.concat(all_rows, ignore_index=True))
    out = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit(),
                    "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
                    "preset": "readable", "steps": args.steps, "probe_every": args.every, "samples": args.samples,
                    "k": args.k, "positions": "all", "seeds": args.seeds, "warm_start": "seed-0 warm-up for every run",
                    "pivotal": "|delta| >= 0.2 and |delta| > 2 SE", "fork": "H >= 0.672 (FORK_ENTROPY)",
                    "pooled": DISTINCT},
           "pooled": _pooled(everything),
           "pooled_first_probe": _pooled(everything[everything.step == 1]),
           "pooled_last_probe": _pooled(everything[everything.step == args.steps]),
           "runs": runs}
    write_outputs(out, args, markdown, echo=not args.out)       # the JSON to stdout unless --out


if __name__ == "__main__":
    main()
