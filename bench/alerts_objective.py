"""length_hacking, clip_asymmetry and kl_inert on real TRL runs of the tiny model, forksight attached
(the live path: TRL's own metric names, forksight's step scalars and the samples' length-reward
correlation, alerts judged by the collector as the run goes), and every cached real run of the other
benches replayed for false alarms. The thresholds in forksight.monitor.alerts.config were set on the
seed-0 runs here; tests/test_alerts_objective.py checks fresh seed-1 runs of the same settings.

    .venv/bin/python bench/alerts_objective.py        # trains what the cache lacks, prints JSON
"""
from __future__ import annotations

import contextlib
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "tests" / "data" / "alerts_objective_runs.json"
NEW = ("length_hacking", "clip_asymmetry", "kl_inert")
KEYS = ("kl", "entropy", "entropy/mean", "logp/mean", "reward", "reward/mean", "length/mean", "completions/mean_length",
        "completions/clipped_ratio", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
        "rewards/accuracy/mean", "rewards/length_bonus/mean", "rewards/even_first/mean", "groups/length_reward_corr",
        "groups/zero_var_frac", "pass@1", "pass@4", "grad_norm", "frac_reward_zero_std", "reward_std")

# name -> (kind, settings). kl: TRL beta 0.04 with the reference synced into the policy every step
# (mixup 1.0) against a fixed reference; clip: 4 updates per batch with ε_high 0.01 against 0.2 both
# sides; length: the warm model (it answers in ~3 tokens and stops) paid 0.5·len/16 on top of exact-
# answer accuracy, against accuracy alone
SETTINGS = {
    "kl-synced": ("kl_inert", dict(steps=30, beta=0.04, sync_ref_model=True, ref_model_sync_steps=1,
                                   ref_model_mixup_alpha=1.0)),
    "kl-fixed": ("healthy", dict(steps=30, beta=0.04)),
    "clip-upper-lr1e-3": ("clip_asymmetry", dict(steps=60, num_iterations=4, learning_rate=1e-3, epsilon=0.2,
                                                 epsilon_high=0.01)),
    "clip-upper-lr3e-4": ("clip_asymmetry", dict(steps=60, num_iterations=4, learning_rate=3e-4, epsilon=0.2,
                                                 epsilon_high=0.01)),
    "clip-sym-lr1e-3": ("healthy", dict(steps=60, num_iterations=4, learning_rate=1e-3, epsilon=0.2)),
    "clip-sym-lr3e-4": ("healthy", dict(steps=60, num_iterations=4, learning_rate=3e-4, epsilon=0.2)),
    "length-paid-lr2e-3": ("length_hacking", dict(steps=60, learning_rate=2e-3, paid=True)),
    "length-paid-lr1e-3": ("length_hacking", dict(steps=80, learning_rate=1e-3, paid=True)),
    "length-paid-lr6e-4": ("length_hacking", dict(steps=80, learning_rate=6e-4, paid=True)),
    "length-unpaid-lr1e-3": ("healthy", dict(steps=80, learning_rate=1e-3, paid=False)),
}
CALIBRATION_SEED, TEST_SEED = 0, 1


def warm_model() -> tuple[str, object]:
    """The tiny model warmed up on two-digit reversed sums (cached): short answers that end."""
    from forksight.trainer.model import build_tiny
    from forksight.trainer.tasks import make_task
    from forksight.trainer.warmup import ensure_warm

    task = make_task("arith", level=1, reverse=True)
    return str(ensure_warm(build_tiny(), task, target_pass=0.3, progress=False)), task


def train(name: str, seed: int, tmp: Path, alerts_config=None) -> dict:
    """One real GRPOTrainer run with forksight attached through a LocalSink (its own AlertHub):
    {steps, rows (the stored scalars per step), alerts (rows the collector stored), vocab_size}."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import forksight.trl
    from forksight.compose.local import LocalSink
    from forksight.monitor.alerts.hub import AlertHub
    from forksight.monitor.collector.store import Store
    from forksight.trainer.model import build_tiny, load

    torch.set_num_threads(1)
    kind, settings = SETTINGS[name]
    settings = dict(settings)
    paid = settings.pop("paid", None)
    steps = settings.pop("steps")
    if paid is None:
        model_dir = str(build_tiny())
        prompts = [f"Q: {10 + i}+{20 + i}= A:" for i in range(64)]

        def even_first(completions, completion_ids, **kwargs):
            return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

        rewards = [even_first]
    else:
        model_dir, task = warm_model()
        rng = random.Random(0)
        problems = {p.prompt: p for p in (task.sample(rng) for _ in range(256))}
        prompts = list(problems)

        def accuracy(prompts, completions, **kwargs):
            return [task.verify(problems[p], c)[0] for p, c in zip(prompts, completions)]

        def length_bonus(completion_ids, **kwargs):
            return [0.5 * len(ids) / 16 for ids in completion_ids]

        rewards = [accuracy, length_bonus] if paid else [accuracy]
        settings.setdefault("max_completion_length", 16)
    model, tokenizer = load(model_dir)
    args = dict(output_dir=str(tmp / "out"), report_to="none", use_cpu=True, bf16=False, seed=seed, logging_steps=1,
                save_strategy="no", disable_tqdm=True, per_device_train_batch_size=16, num_generations=4,
                max_completion_length=8, learning_rate=5e-3, lr_scheduler_type="constant", max_steps=steps)
    args.update(settings)
    trainer = GRPOTrainer(model=model, args=GRPOConfig(**args), reward_funcs=rewards,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                          processing_class=tokenizer)
    db = str(tmp / "run.duckdb")
    sink = LocalSink(db, name, store=Store(db), hub=AlertHub(alerts_config), config={"vocab_size": model.config.vocab_size})
    callback = forksight.trl.attach(trainer, sink=sink, correct_reward="accuracy" if paid is not None else None)
    with contextlib.redirect_stdout(sys.stderr):      # TRL prints every logged dict
        trainer.train()
    sink.flush()
    frame = sink.reader.read_scalars(sink.run_id, downsample=2**62)
    alerts = sink.reader.read_alerts(sink.run_id)
    samples = sink.reader.read_samples(sink.run_id)
    callback.detach()
    sink.finish()
    rows: dict[int, dict] = {}
    for step, key, value in zip(frame["step"], frame["key"], frame["value"]):
        if key in KEYS and value == value:
            rows.setdefault(int(step), {})[key] = float(value)
    steps_list = sorted(rows)
    return {"kind": kind, "seed": seed, "steps": steps_list, "rows": [rows[s] for s in steps_list],
            "vocab_size": int(model.config.vocab_size),
            "alerts": [{k: a[k] for k in ("step", "detector", "severity")} for a in alerts.to_dict("records")],
            "samples": samples[["step", "group_id", "reward", "length"]].to_dict("records") if len(samples) else [],
            "evidence": [a["evidence"] for a in alerts.to_dict("records")]}


def load(cache: Path = CACHE, seed: int = CALIBRATION_SEED) -> dict:
    """The calibration runs, training what the cache lacks (rows as columns, as the other benches)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from alerts_real import _rows

    stored = json.loads(cache.read_text()) if cache.exists() else {}
    for name in SETTINGS:
        if name not in stored:
            print(f"training {name}", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                run = train(name, seed, Path(tmp))
            rows = run.pop("rows")
            for key in ("samples", "evidence", "alerts"):    # the tests read these from their own live runs
                run.pop(key)
            run["columns"] = {k: [r.get(k) for r in rows] for k in KEYS if any(k in r for r in rows)}
            stored[name] = run
            cache.write_text(json.dumps(stored, separators=(",", ":")))
    for run in stored.values():
        run["rows"] = _rows(run["columns"])
    return stored


def first_alerts(steps: list[int], rows: list[dict], vocab_size: int | None = None) -> dict[str, str]:
    """{detector: "step (severity)"} of each detector's first alert when the run is replayed."""
    from forksight.monitor.alerts.hub import AlertMonitor

    monitor, first = AlertMonitor(vocab_size=vocab_size), {}
    for step, row in zip(steps, rows):
        for a in monitor.observe(step, row):
            first.setdefault(a.detector, f"{a.step} ({a.severity})")
    return first


def other_runs() -> dict[str, tuple[list[int], list[dict]]]:
    """Every other cached real run (bundled trainer and TRL, bench/alerts_real.py, bench/alerts_breadth.py)
    and the TRL logs doctor's tests read: none is made to show the three classes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from alerts_real import _rows

    from forksight.compose.doctor import load as load_log

    out = {}
    for cache in ("alerts_real_runs.json", "alerts_breadth_runs.json"):
        for name, run in json.loads((ROOT / "tests" / "data" / cache).read_text()).items():
            out[name] = (run["steps"], _rows(run["columns"]))
    for log in sorted((ROOT / "tests" / "data" / "trl_logs").iterdir()):
        loaded = load_log(str(log / "trainer_state.json"))
        out[f"trl-log-{log.name}"] = (loaded.steps, loaded.rows)
    return out


def report(runs: dict) -> dict:
    """Per run made for a class: each detector's first alert, replayed over the stored scalars;
    the new classes on every other run: false alarms."""
    made = {name: {"kind": run["kind"], "first": first_alerts(run["steps"], run["rows"], run["vocab_size"])}
            for name, run in runs.items()}
    false = [f"{name}: {d}" for name, run in runs.items() for d in made[name]["first"]
             if d in NEW and d != run["kind"]]
    missed = [name for name, run in runs.items() if run["kind"] in NEW and run["kind"] not in made[name]["first"]]
    # the reward as one function (no rewards/<name>/mean logged): only the samples can say it pays length
    blind = {name: first_alerts(run["steps"], [{k: v for k, v in r.items() if not k.startswith("rewards/")}
                                               for r in run["rows"]]).get("length_hacking")
             for name, run in runs.items() if name.startswith("length-")}
    others = other_runs()
    elsewhere = {name: {d: s for d, s in first_alerts(steps, rows).items() if d in NEW}
                 for name, (steps, rows) in others.items()}
    return {"made_for_a_class": made, "missed": missed, "false_alarms_on_made_runs": false,
            "length_hacking_without_reward_components": blind,
            "other_real_runs": len(others),
            "false_alarms_on_other_runs": {n: f for n, f in elsewhere.items() if f}}


if __name__ == "__main__":
    print(json.dumps(report(load()), indent=1))
