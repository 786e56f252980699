"""Real-run part of bench/alerts.py: the tiny model trained to collapse, stay healthy, learn
nothing and explode; every series through forksight, rlwatch 0.5.1 and rlprobe 0.1.0.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from forksight.monitor.alerts.hub import AlertMonitor

# Series are cached so reruns and tests never retrain. Ground truth from the logged entropy:
# collapse = first step below 10% of the first five steps' mean; explosion = first step whose
# 5-step mean is twice the first five steps' mean.
CACHE = Path(__file__).resolve().parents[1] / "tests" / "data" / "alerts_real_runs.json"
TARGET_LEAD = 20
# what the detectors and the peers read; the rest of the ~45 logged scalars stay out of the cache
KEYS = ("kl/beta", "entropy/mean", "renyi2/mean", "reward/mean", "reward/std", "length/mean", "pass@1", "pass@8",
        "groups/zero_var_frac", "fork/frac", "cov/logp_adv", "kl", "loss", "grad_norm", "clip/frac")
# (name, kind, preset, overrides). Collapse: the fixed-string reward, from a cold start (entropy
# near log|V|) or from the warm-up; collapse_fast: so fast (≈25 steps from step 0) that no
# detector with a baseline can warn 20 steps ahead, reported apart. No-signal: a fair coin for a
# reward. Explode: arithmetic at 3-4× the healthy lr (reward falls at once, entropy climbs after).
RUNS = [(f"collapse-cold-lr{lr:g}-s{seed}", "collapse", "collapse", dict(lr=lr, seed=seed, steps=120))
        for lr in (1e-3, 2e-3) for seed in (0, 1)]
RUNS += [(f"collapse-warm-lr1e-3-s{seed}", "collapse", "collapse", dict(lr=1e-3, seed=seed, steps=100, warmup=True))
         for seed in (0, 1)]
RUNS += [("collapse-cold-lr5e-3-s0", "collapse_fast", "collapse", dict(lr=5e-3, seed=0, steps=60))]
RUNS += [(f"healthy-s{seed}", "healthy", "healthy", dict(seed=seed, steps=150)) for seed in (0, 1)]
RUNS += [(f"nosignal-warm-s{seed}", "no_signal", "noise", dict(seed=seed, steps=150)) for seed in (0, 1)]
RUNS += [(f"nosignal-cold-s{seed}", "no_signal", "noise", dict(seed=seed, steps=150, warmup=False))
         for seed in (0, 1)]
RUNS += [(f"explode-lr{lr:g}-s{seed}", "explode", "healthy", dict(lr=lr, seed=seed, steps=150))
         for lr, seed in ((8e-4, 0), (8e-4, 1), (1.2e-3, 0))]
# TRL's GRPOTrainer on the untrained model (entropy near log|V| from step 0, the case that made
# the old explosion detector fire on 71 of 76 runs of TRL's own GRPO tests)
RUNS += [(f"trl-even-lr3e-4-s{seed}", "healthy", "trl-even", dict(lr=3e-4, seed=seed, steps=150)) for seed in (0, 1)]
# "declining": entropy falls ~12% in 150 steps, faster and faster (run on to 400 steps, seed 0
# reaches 0.72 nats, 87% down, just above the 10% line): neither healthy nor a collapse in range
RUNS += [(f"trl-even-lr1e-3-s{seed}", "declining", "trl-even", dict(lr=1e-3, seed=seed, steps=150)) for seed in (0, 1)]
RUNS += [(f"trl-coin-lr1e-3-s{seed}", "no_signal", "trl-coin", dict(lr=1e-3, seed=seed, steps=150)) for seed in (0, 1)]
RUNS += [(f"trl-even-lr1e-2-s{seed}", "collapse", "trl-even", dict(lr=1e-2, seed=seed, steps=150)) for seed in (0, 1)]
# detectors whose alerts are the point of a run of that kind. On a no-signal run the reward
# teaches nothing, and "reward has stopped improving: check the reward function" (stagnation) is
# the right diagnosis. The logged entropy adds to this: a run whose entropy doubles or collapses
# (ground truth below) expects those alerts whatever it was meant to do. Anything else is false.
COLLAPSE_FAMILY = {"entropy_collapse", "covariance", "lost_diversity", "fork_starvation", "stagnation"}
EXPECTED = {"collapse": COLLAPSE_FAMILY, "collapse_fast": COLLAPSE_FAMILY,
            "explode": {"entropy_explosion", "stagnation", "non_finite"}, "healthy": set(), "no_signal": {"stagnation"},
            "declining": COLLAPSE_FAMILY}


# ---------------------------------------------------------------------------- training (cached)
class CoinTask:
    """The arithmetic prompts with a fair-coin 0/1 reward: there is nothing to learn."""

    def __init__(self, inner, seed: int) -> None:
        self.inner, self.rng, self.name = inner, random.Random(f"coin-{seed}"), "noise"
        self.calls = 0

    def sample(self, rng):
        return self.inner.sample(rng)

    def verify(self, problem, completion: str) -> tuple[float, bool]:
        self.calls += 1
        win = self.rng.random() < 0.5
        return float(win), win


def _by_step(frame) -> tuple[list[int], list[dict]]:
    """A long scalars frame as steps and one {key: value} per step (5 significant digits)."""
    steps, rows = [], []
    for step, group in frame.groupby("step", sort=True):
        steps.append(int(step))
        rows.append({k: float(f"{v:.5g}") for k, v in zip(group["key"], group["value"])})
    return steps, rows


def _train_one(preset: str, overrides: dict, tmp: Path) -> tuple[list[int], list[dict], int]:
    import torch

    from forksight.monitor.collector.store import Store
    from forksight.trainer import loop
    from forksight.trainer.config import load_config

    torch.set_num_threads(1)  # a shared 2-core machine
    values = dict(db=str(tmp / "run.duckdb"), out_dir=str(tmp / "runs"), progress=False, run="bench",
                  eval_problems=4, eval_samples=2, eval_every=0, token_groups=0)
    values.update(overrides)
    from forksight.trainer import warmup

    original, original_warm = loop.make_task, warmup.ensure_warm
    coins: list[CoinTask] = []
    if preset == "noise":  # the bench's own task, so the trainer needs no test-only preset
        def coin_task(*args, **kw):
            coins.append(CoinTask(original("arith", level=kw["level"], reverse=kw["reverse"]), overrides["seed"]))
            return coins[-1]

        loop.make_task = coin_task
        # the warm-up still learns the real task (a coin would "pass" it at once)
        warmup.ensure_warm = lambda base, task, **kw: original_warm(base, getattr(task, "inner", task), **kw)
    try:
        result = loop.train(load_config(preset="healthy" if preset == "noise" else preset, overrides=values))
    finally:
        loop.make_task, warmup.ensure_warm = original, original_warm
    if preset == "noise" and not (coins and coins[0].calls):  # the trainer moved make_task: say so
        raise RuntimeError("the coin reward never ran: patch the trainer's make_task where train() calls it")
    with Store(values["db"]) as store:
        frame = store.reader.read_scalars(result.run_id, keys=list(KEYS), downsample=2**62)
    steps, rows = _by_step(frame)
    from forksight.trainer.model import build_tiny
    from transformers import AutoConfig

    return steps, rows, int(AutoConfig.from_pretrained(build_tiny()).vocab_size)


def _train_trl(preset: str, overrides: dict, tmp: Path) -> tuple[list[int], list[dict], int]:
    """TRL's GRPOTrainer on the untrained tiny model (entropy near log|V|), forksight attached;
    "trl-even" rewards an even first token id (as TRL's own tests do), "trl-coin" is a fair coin."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import forksight.trl
    from forksight.monitor.collector.store import Store
    from forksight.trainer.model import build_tiny, load

    torch.set_num_threads(1)
    coin = random.Random(f"coin-{overrides['seed']}")

    def reward(completions, completion_ids, **kwargs):
        if preset == "trl-coin":
            return [float(coin.random() < 0.5) for _ in completion_ids]
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    model, tokenizer = load(build_tiny())
    config = GRPOConfig(output_dir=str(tmp / "out"), report_to="none", use_cpu=True, bf16=False,
                        seed=overrides["seed"], per_device_train_batch_size=32, num_generations=8,
                        max_completion_length=8, learning_rate=overrides["lr"], lr_scheduler_type="constant",
                        max_steps=overrides["steps"], logging_steps=1, save_strategy="no", disable_tqdm=True)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=reward, train_dataset=data,
                          processing_class=tokenizer)
    callback = forksight.trl.attach(trainer, db=str(tmp / "run.duckdb"), run="bench")
    trainer.train()
    callback.detach()
    with Store(str(tmp / "run.duckdb")) as store:
        run_id = store.reader.list_runs().run_id.iloc[0]
        frame = store.reader.read_scalars(run_id, keys=list(KEYS), downsample=2**62)
    return *_by_step(frame), int(model.config.vocab_size)


def _columns(rows: list[dict]) -> dict[str, list]:
    return {k: [r.get(k) for r in rows] for k in KEYS if any(k in r for r in rows)}


def _rows(columns: dict[str, list]) -> list[dict]:
    n = len(next(iter(columns.values())))
    return [{k: v[i] for k, v in columns.items() if v[i] is not None} for i in range(n)]


def load_series(cache: Path = CACHE, retrain: bool = False) -> dict:
    """{name: {kind, preset, overrides, vocab_size, steps, rows}}, training what the cache lacks.

    The cache stores one column per scalar (a tenth of the size of one dict per step)."""
    stored = json.loads(cache.read_text()) if cache.exists() and not retrain else {}
    from tqdm import tqdm

    missing = [r for r in RUNS if r[0] not in stored]
    for name, kind, preset, overrides in tqdm(missing, desc="train real runs", file=sys.stderr):
        with tempfile.TemporaryDirectory() as tmp:
            train = _train_trl if preset.startswith("trl") else _train_one
            steps, rows, vocab = train(preset, overrides, Path(tmp))
        stored[name] = {"kind": kind, "preset": preset, "overrides": overrides, "vocab_size": vocab,
                        "steps": steps, "columns": _columns(rows)}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(stored, separators=(",", ":")))  # after each run: a crash keeps the rest
    return {name: {**{k: v for k, v in run.items() if k != "columns"}, "rows": _rows(run["columns"])}
            for name, run in stored.items()}


# ---------------------------------------------------------------------------- ground truth
def starts_all_wrong(columns: dict) -> bool:
    """Ground truth from the log: the first ten steps pass nothing and most groups agree."""
    p, z = columns.get("pass@1") or [], columns.get("groups/zero_var_frac") or []
    head_p, head_z = [x for x in p[:10] if x is not None], [x for x in z[:10] if x is not None]
    return bool(head_p and head_z) and max(head_p) <= 0.05 and sum(head_z) / len(head_z) >= 0.5


def ends_solved(columns: dict) -> bool:
    """Ground truth from the log: pass@1 averages 0.9 or more over the last quarter."""
    p = [x for x in (columns.get("pass@1") or []) if x is not None]
    tail = p[-max(len(p) // 4, 1):]
    return bool(tail) and sum(tail) / len(tail) >= 0.9


def collapse_step(steps: list[int], entropy: np.ndarray) -> int | None:
    below = np.flatnonzero(entropy < 0.1 * entropy[:5].mean())
    return steps[int(below[0])] if below.size else None


def explosion_step(steps: list[int], entropy: np.ndarray) -> int | None:
    rolling = np.convolve(entropy, np.ones(5) / 5, mode="valid")
    above = np.flatnonzero(rolling > 2.0 * entropy[:5].mean())
    return steps[int(above[0]) + 4] if above.size else None


# ---------------------------------------------------------------------------- the three monitors
def forksight_alerts(steps: list[int], rows: list[dict], vocab_size: int | None, config=None) -> list[dict]:
    monitor = AlertMonitor(config, vocab_size)
    return [{"detector": a.detector, "severity": a.severity, "step": a.step, "value": a.value,
             "threshold": a.threshold, "forecast": a.forecast, "message": a.message}
            for s, row in zip(steps, rows) for a in monitor.observe(s, row)]


def rlwatch_alerts(steps: list[int], rows: list[dict]) -> list[dict]:
    """rlwatch's whole DetectorSuite, default config, fed the scalars it knows."""
    from rlwatch.config import RLWatchConfig
    from rlwatch.detectors import DetectorSuite

    suite = DetectorSuite(RLWatchConfig())
    out = []
    for step, row in zip(steps, rows):
        for a in suite.check_step(step, entropy=row.get("entropy/mean"), kl_divergence=row.get("kl"),
                                  reward_mean=row.get("reward/mean"), reward_std=row.get("reward/std"),
                                  loss=row.get("loss"), grad_norm=row.get("grad_norm")):
            out.append({"detector": a.detector, "severity": a.severity, "step": a.step})
    return out


def rlprobe_alerts(steps: list[int], rows: list[dict]) -> list[dict]:
    """rlprobe's live mode (RunWatcher.tick): the doctor on the steps so far, after each step;
    a (signature, severity) counts once, at the step it is first reported."""
    from rlprobe.doctor.engine import diagnose_view
    from rlprobe.doctor.runview import RunView
    from rlprobe.schemas import RunManifest, StepRecord

    manifest = RunManifest(run_id="bench", created_at="2026-01-01T00:00:00", algorithm="grpo")
    fields = {"reward_mean": "reward/mean", "reward_std": "reward/std", "kl_mean": "kl",
              "entropy_mean": "entropy/mean", "loss": "loss", "grad_norm": "grad_norm",
              "completion_len_mean": "length/mean", "zero_variance_group_frac": "groups/zero_var_frac",
              "clip_fraction": "clip/frac"}
    records = [StepRecord(step=s, **{f: row.get(k) for f, k in fields.items()}) for s, row in zip(steps, rows)]
    seen, out = set(), []
    for i in range(30, len(records) + 1):  # RunWatcher's min_steps = 30
        for f in diagnose_view(RunView(manifest, records[:i])):
            if (f.signature_id, f.severity) not in seen:
                seen.add((f.signature_id, f.severity))
                out.append({"detector": f.signature_id.lower(), "severity": f.severity, "step": steps[i - 1],
                            "onset": f.first_step})
    return out


# forksight key -> the TRL name rldoctor 0.2.0's aliases resolve (it reads TRL, verl, OpenRLHF logs)
RLDOCTOR_KEYS = {"reward/mean": "reward", "reward/std": "reward_std", "entropy/mean": "entropy", "kl": "kl",
                 "grad_norm": "grad_norm", "loss": "loss", "groups/zero_var_frac": "frac_reward_zero_std",
                 "length/mean": "completions/mean_length", "length/clip_frac": "completions/clipped_ratio",
                 "clip/frac": "clip_ratio/region_mean", "eval/reward": "eval_reward"}


def rldoctor_alerts(steps: list[int], rows: list[dict], check_every: int = 25) -> list[dict]:
    """rldoctor 0.2.0's LiveMonitor (its defaults: min_steps 60, alert at warning), fed every step;
    a finding counts at the step it is first announced (or announced worse)."""
    import logging

    from rl_doctor.live import LiveMonitor

    logging.getLogger("rl-doctor").setLevel(logging.CRITICAL + 1)   # its own log lines: not ours to print
    monitor, out = LiveMonitor(check_every=check_every, on_finding=lambda f: None), []
    for step, row in zip(steps, rows):
        record = {RLDOCTOR_KEYS.get(k, k): v for k, v in row.items()}
        for f in monitor.log(record, step=step):
            out.append({"detector": f.detector, "severity": f.severity.name.lower(), "step": step})
    return out


# ---------------------------------------------------------------------------- per run, summary
_COLLAPSE = {"forksight": "entropy_collapse", "rlwatch": "entropy_collapse", "rlprobe": "entropy_collapse",
             "rldoctor": "entropy_collapse"}
# rlwatch, rlprobe and rldoctor watch KL for blow-ups, not entropy: with beta = 0 (no reference) KL is 0
_EXPLOSION = {"forksight": "entropy_explosion", "rlwatch": "kl_explosion", "rlprobe": "kl_blowup",
              "rldoctor": "kl_drift"}


def _judge(tool: str, alerts: list[dict], kind: str, collapse: int | None, explosion: int | None,
           columns: dict | None = None) -> dict:
    target = (_EXPLOSION if kind == "explode" else _COLLAPSE)[tool]
    truth = explosion if kind == "explode" else collapse if kind.startswith("collapse") else None
    own = [a for a in alerts if a["detector"] == target]
    warn = next((a["step"] for a in own if a["severity"] in ("warning", "warn")), None)
    crit = next((a["step"] for a in own if a["severity"] == "critical"), None)
    first = min((s for s in (warn, crit) if s is not None), default=None)
    if tool == "forksight":
        expected = EXPECTED[kind] | (COLLAPSE_FAMILY if collapse is not None else set())
        expected |= {"entropy_explosion"} if explosion is not None else set()
        # groups that agree because nothing is right from the start, or everything is at the end
        expected |= {"degenerate_groups"} if starts_all_wrong(columns) or ends_solved(columns) else set()
    else:
        expected = ({_COLLAPSE[tool]} if collapse is not None else set()) | (
            {_EXPLOSION[tool]} if explosion is not None else set())
    false = [f"{a['detector']}:{a['severity']}@{a['step']}" for a in alerts if a["detector"] not in expected]
    return {"first_warning": warn, "first_critical": crit,
            "lead": truth - first if truth is not None and first is not None else None,
            "false_alarms": len(false), "false_alarm_list": false[:6]}


def evaluate_run(name: str, run: dict, config=None) -> dict:
    steps, rows, kind = run["steps"], run["rows"], run["kind"]
    entropy = np.array([r["entropy/mean"] for r in rows])
    collapse, explosion = collapse_step(steps, entropy), explosion_step(steps, entropy)
    ours = forksight_alerts(steps, rows, run["vocab_size"], config)
    out = {"run": name, "kind": kind, "steps": len(steps),
           "entropy_first5_last5": [round(float(entropy[:5].mean()), 3), round(float(entropy[-5:].mean()), 3)],
           "log_vocab": round(float(np.log(run["vocab_size"])), 3),
           "collapse_step": collapse, "explosion_step": explosion,
           "forksight": _judge("forksight", ours, kind, collapse, explosion, _columns(rows)),
           "rlwatch": _judge("rlwatch", rlwatch_alerts(steps, rows), kind, collapse, explosion),
           "rlprobe": _judge("rlprobe", rlprobe_alerts(steps, rows), kind, collapse, explosion),
           "rldoctor": _judge("rldoctor", rldoctor_alerts(steps, rows), kind, collapse, explosion),
           "rldoctor_every_step": _judge("rldoctor", rldoctor_alerts(steps, rows, 1), kind, collapse, explosion)}
    out["forksight"]["alerts"] = [f"{a['step']} {a['detector']}/{a['severity']}" for a in ours]
    out["forksight"]["first_message"] = ours[0]["message"] if ours else None
    return out


def real_part(cache: Path = CACHE, retrain: bool = False) -> dict:
    """Every real run side by side, and the issue's targets checked on them."""
    data = load_series(cache, retrain)
    runs = [evaluate_run(name, data[name]) for name, *_ in RUNS if name in data]
    collapse = [r for r in runs if r["kind"] == "collapse" and r["collapse_step"] is not None]
    quiet = [r for r in runs if r["kind"] in ("healthy", "no_signal")]
    summary = {}
    for tool in ("forksight", "rlwatch", "rlprobe", "rldoctor", "rldoctor_every_step"):
        leads = [r[tool]["lead"] for r in collapse]
        summary[tool] = {
            "collapse_leads": leads,
            "collapse_min_lead": min((x for x in leads if x is not None), default=None),
            "collapses_missed": sum(x is None or x < 0 for x in leads),
            "false_alarms_healthy_and_no_signal": sum(r[tool]["false_alarms"] for r in quiet),
            "false_alarms_all_runs": sum(r[tool]["false_alarms"] for r in runs)}
    explode = [r for r in runs if r["kind"] == "explode"]
    for tool in ("forksight", "rlwatch", "rlprobe", "rldoctor", "rldoctor_every_step"):
        summary[tool]["explosion_leads"] = {r["run"]: r[tool]["lead"] for r in explode}
    # shown, not hidden: what fired on runs that should be quiet but is counted as expected
    summary["forksight"]["expected_alerts_on_no_signal"] = {
        r["run"]: r["forksight"]["alerts"] for r in quiet if r["kind"] == "no_signal" and r["forksight"]["alerts"]}
    ok_leads = [x for x in summary["forksight"]["collapse_leads"] if x is not None]
    summary["targets"] = {
        "every_collapse_warned_20_steps_ahead": bool(collapse) and len(ok_leads) == len(collapse)
        and min(ok_leads) >= TARGET_LEAD,
        "zero_false_alarms_on_healthy_and_no_signal": summary["forksight"]["false_alarms_healthy_and_no_signal"] == 0,
        "median_collapse_lead": statistics.median(ok_leads) if ok_leads else None}
    return {"runs": runs, "summary": summary}
