"""Failure classes beyond collapse and explosion, each on a real run of the bundled trainer made
to show it (cached in tests/data/alerts_breadth_runs.json like bench/alerts_real.py's runs), every
detector replayed on every scenario: which fire where they should, and which fire elsewhere.

    .venv/bin/python bench/alerts_breadth.py            # trains what the cache lacks, prints JSON
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alerts_real import COLLAPSE_FAMILY, _columns, _rows, _train_one, ends_solved, starts_all_wrong  # noqa: E402

import alerts_real  # noqa: E402

CACHE = Path(__file__).resolve().parents[1] / "tests" / "data" / "alerts_breadth_runs.json"
alerts_real.KEYS = tuple(dict.fromkeys((*alerts_real.KEYS, "length/clip_frac", "clip/frac", "grad_norm", "kl",
                                         "clip/high_frac", "clip/low_frac", "kl/beta")))

# (name, kind, preset, overrides): each run made to show one failure class
SCENARIOS = [
    # warmed up on reversed sums (it answers briefly and stops), trained on products written
    # forwards: nothing is ever right (too hard)
    ("allwrong-warm-s0", "all_wrong", "hard", dict(seed=0, steps=60, level=4, reverse=False)),
    # three tokens for answers that need up to four with EOS: sums past 99 are cut off
    ("truncation-s0", "truncation", "healthy", dict(seed=0, steps=60, max_new_tokens=3)),
    # four optimiser steps per batch inside a ±2% trust region at the healthy lr: the clip bites
    # (at lr 2e-3 the same run blew up: entropy tripled and nothing ended, an explosion instead)
    ("clip-tight-s0", "clip", "healthy", dict(seed=0, steps=60, updates_per_batch=4, clip_low=0.02,
                                               clip_high=0.02)),
    # a tiny KL coefficient on the collapse task from a cold start: the policy walks far from its
    # reference as it collapses onto one answer (from the warm model at lr 1e-3, KL stayed under
    # 0.11: nothing to see). 70 steps: at 80 the collapsed policy is kicked out near step 76 with a
    # real gradient spike, which the gradient detector reported.
    ("kl-cold-s0", "kl_drift", "collapse", dict(seed=0, steps=70, beta=1e-3)),
]
# Not kept: an all-correct run of the bundled trainer. Warmed up to sampled pass@1 0.9 and run at
# T = 0.5 (allcorrect-warm0.9-s0, 60 steps), pass@1 swung 0.4-0.98 (smoothed ≈ 0.75): groups
# degenerate both ways, no regime; at T = 0.1 without that warm-up pass@1 was ≈ 0.4. The all-correct
# regime is checked on TRL's real run instead (tests/data/trl_logs/collapse: reward 1.0 from step ~35).
# what may fire on each scenario: its own detector, and what the failure really is besides
EXPECTED = {
    "all_correct": {"degenerate_groups"},
    "all_wrong": {"degenerate_groups", "stagnation"},
    "truncation": {"truncation"},
    "clip": {"clip_saturation"},
    "kl_drift": {"kl_drift"} | COLLAPSE_FAMILY,
}


def _train(preset: str, overrides: dict, tmp: Path):
    """The bench's presets: "hard" is the healthy preset whose warm-up learns level-1 reversed sums
    (so completions are short and end), then RL on the task the overrides name."""
    if preset != "hard":
        return _train_one(preset, overrides, tmp)
    from forksight.trainer import loop, warmup

    original = warmup.ensure_warm
    warmup.ensure_warm = lambda base, task, **kw: original(base, loop.make_task("arith", level=1, reverse=True), **kw)
    try:
        return _train_one("healthy", overrides, tmp)
    finally:
        warmup.ensure_warm = original


def load(cache: Path = CACHE, only: set[str] | None = None) -> dict:
    names = {name for name, *_ in SCENARIOS}
    stored = json.loads(cache.read_text()) if cache.exists() else {}
    stored = {k: v for k, v in stored.items() if k in names}
    for name, kind, preset, overrides in SCENARIOS:
        if name in stored or (only is not None and name not in only):
            continue
        print(f"training {name}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            steps, rows, vocab = _train(preset, overrides, Path(tmp))
        stored[name] = {"kind": kind, "preset": preset, "overrides": overrides, "vocab_size": vocab,
                        "steps": steps, "columns": _columns(rows)}
        cache.parent.mkdir(parents=True, exist_ok=True)
        latest = json.loads(cache.read_text()) if cache.exists() else {}   # another trainer may have added one
        stored = {**{k: v for k, v in latest.items() if k in names}, **stored}
        cache.write_text(json.dumps(stored, separators=(",", ":")))
    return stored


def allowed(run: dict, expected: dict) -> set[str] | None:
    """What may fire on a run: its kind's detectors, plus degenerate_groups where the log shows
    a run that starts all-wrong or ends solved (true whatever the run was made for)."""
    out = expected.get(run["kind"])
    if out is None:
        return None
    if starts_all_wrong(run["columns"]) or ends_solved(run["columns"]):
        out = out | {"degenerate_groups"}
    return out


def matrix(runs: dict, expected: dict) -> dict:
    """{run: {detector: first step (severity)}} and the false alarms (a detector outside the
    scenario's expected set), for forksight's detectors."""
    from forksight.monitor.alerts.hub import AlertMonitor

    out, false = {}, []
    for name, run in runs.items():
        monitor = AlertMonitor(vocab_size=run["vocab_size"])
        first: dict[str, str] = {}
        for step, row in zip(run["steps"], _rows(run["columns"])):
            for a in monitor.observe(step, row):
                first.setdefault(a.detector, f"{a.step} ({a.severity})")
        out[name] = {"kind": run["kind"], "first": first}
        ok = allowed(run, expected)
        if ok is not None:
            false += [f"{name}: {d}" for d in first if d not in ok]
    return {"runs": out, "false_alarms": false}


# forksight detector -> rldoctor 0.2.0's detector for the same failure class
RLDOCTOR_NAME = {"degenerate_groups": "advantage_collapse", "truncation": "length_pathology",
                 "clip_saturation": "clip_saturation", "kl_drift": "kl_drift", "gradient": "gradient_pathology",
                 "reward_eval_divergence": "reward_hacking", "reward_composition": "reward_composition",
                 "stagnation": "plateau", "entropy_collapse": "entropy_collapse",
                 "length_hacking": "length_pathology", "clip_asymmetry": "clip_saturation"}


def rldoctor_matrix(runs: dict, expected: dict) -> dict:
    """rldoctor's LiveMonitor on the same series, at its default cadence (check_every=25) and at
    every step: first step per detector, and its alerts outside the scenario's failure class."""
    from alerts import use_peers
    from alerts_real import rldoctor_alerts

    use_peers()
    out, false = {}, {25: [], 1: []}
    for name, run in runs.items():
        ok = {RLDOCTOR_NAME.get(d, d) for d in (allowed(run, expected) or set())}
        rows = _rows(run["columns"])
        out[name] = {}
        for every in (25, 1):
            first: dict[str, str] = {}
            for a in rldoctor_alerts(run["steps"], rows, every):
                first.setdefault(a["detector"], f"{a['step']} ({a['severity']})")
            out[name][f"check_every={every}"] = first
            false[every] += [f"{name}: {d}" for d in first if d not in ok] if run["kind"] in expected else []
    return {"runs": out, "false_alarms": {f"check_every={k}": v for k, v in false.items()}}


if __name__ == "__main__":
    runs = load()
    real = json.loads(alerts_real.CACHE.read_text())
    print(json.dumps({"scenarios": {"forksight": matrix(runs, EXPECTED), "rldoctor": rldoctor_matrix(runs, EXPECTED)},
                      "real_runs": {"forksight": matrix(real, alerts_real.EXPECTED),
                                    "rldoctor": rldoctor_matrix(real, alerts_real.EXPECTED)}}, indent=1))
