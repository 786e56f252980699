"""Training–inference mismatch on the bundled trainer; prints one JSON object. Every figure is
measured side by side in this run (ratios and step differences, never an absolute time to compare
against). Preset: `collapse` (random-init tiny model, 6-token completions, no warm-up), the one
short enough for ~5 min on 2 busy cores; `readable` needs a warm-up of up to 15 min first.

1. float32 vs bfloat16 sampler, same seed, the preset as it is (it collapses): mismatch KL, the
   out-of-band fractions, where the mismatch sits (fork vs non-fork tokens), and when each run
   collapses (entropy floor, and the alerts the collector raised into the DuckDB file);
2. a mismatch injected at a known step S (Gaussian noise on the float32 sampler's logits,
   `sampler_noise`, from `sampler_noise_from_step`) at a learning rate where the run stays stable:
   the `train_inference_mismatch` detector's first alert minus S, and its alerts on the matched run;
3. the cost of capturing the sampler's log p: the same step with and without it, interleaved on
   one context with a real DuckDB sink (bench/mismatch_shape.py measures it at a real model's shape).

    python bench/mismatch.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from alerts_real import collapse_step  # noqa: E402 - the same entropy-floor rule as the alert benchmark
from forksight.monitor.collector.store import Store  # noqa: E402
from forksight.trainer.config import load_config  # noqa: E402
from forksight.trainer.loop import setup, train  # noqa: E402
from forksight.trainer.rollout import sampled_logp  # noqa: E402
from forksight.trainer.step import train_step  # noqa: E402

DETECTOR = "train_inference_mismatch"
PRESET = "collapse"


def _progress(message: str) -> None:
    """Section progress on stderr (stdout is the JSON)."""
    print(f"[bench/mismatch] {message}", file=sys.stderr, flush=True)


def detector_available() -> bool:
    """Whether the collector runs the mismatch detector (it is another part of issue 34)."""
    try:
        from forksight.monitor.alerts import mismatch

        return getattr(mismatch, "MismatchDetector").name == DETECTOR
    except (ImportError, AttributeError):
        return False


# ---------------------------------------------------------------------------------------------
# one stored run


def run(tmp: Path, name: str, **over) -> dict:
    """Train one run into its own DuckDB file; its scalars per step ({key: value}) and alerts."""
    db = str(tmp / f"{name}.duckdb")
    values = dict(db=db, run=name, out_dir=str(tmp / "runs"), progress=False, eval_every=0)
    values.update(over)
    started = time.perf_counter()
    result = train(load_config(preset=PRESET, overrides=values))
    with Store(db) as store:
        scalars = store.reader.read_scalars(result.run_id)
        alerts = store.reader.read_alerts(result.run_id)
    steps = {int(s): dict(zip(g.key, g.value)) for s, g in scalars.groupby("step")}
    return {"steps": steps, "alerts": alerts, "seconds": time.perf_counter() - started}


def first_alerts(alerts) -> dict:
    """First step of each detector's alerts (warning or critical)."""
    return {d: int(g.step.min()) for d, g in alerts.groupby("detector")}


def where(rows: dict[int, dict], key: str) -> list[float]:
    return [r[key] for _, r in sorted(rows.items()) if key in r]


def mean(xs: list[float]) -> float | None:
    return round(float(np.mean(xs)), 8) if xs else None


def mismatch_summary(rows: dict[int, dict]) -> dict:
    """Mismatch level over the run, and its share on fork tokens (H ≥ 0.672) vs their token share."""
    n = len(rows)
    early, late = dict(list(sorted(rows.items()))[: max(n // 10, 1)]), dict(list(sorted(rows.items()))[-max(n // 10, 1):])
    out = {f"{k}_{part}": mean(where(r, f"mismatch/{k}")) for k in ("kl_k3", "kl_k1", "frac_outside_2x", "frac_outside_5x")
           for part, r in (("early", early), ("late", late))}
    out.update({"kl_k3_max": max(where(rows, "mismatch/kl_k3"), default=None),
                "logp_diff_abs_max": max(where(rows, "mismatch/logp_diff_abs_max"), default=None),
                "seq_ess_min": min(where(rows, "mismatch/seq_ess"), default=None)})
    mass = {"fork": 0.0, "nonfork": 0.0}
    count = {"fork": 0.0, "nonfork": 0.0}
    for r in rows.values():
        for part in mass:
            tokens = r.get(f"mismatch/tokens/{part}", 0.0)
            count[part] += tokens
            mass[part] += tokens * r.get(f"mismatch/logp_diff_abs_mean/{part}", 0.0)
    total_mass, total = sum(mass.values()), sum(count.values())
    out["fork_token_share"] = round(count["fork"] / total, 4) if total else None
    out["fork_share_of_abs_log_ratio"] = round(mass["fork"] / total_mass, 4) if total_mass else None
    for part in mass:  # per-token level where it sits
        out[f"kl_k3_{part}_mean"] = mean(where(rows, f"mismatch/kl_k3/{part}"))
        out[f"logp_diff_abs_mean_{part}"] = round(mass[part] / count[part], 8) if count[part] else None
    return out


def collapse_summary(result: dict) -> dict:
    rows = result["steps"]
    steps = sorted(rows)
    entropy = np.array([rows[s]["entropy/mean"] for s in steps])
    alerts = result["alerts"]
    firsts = first_alerts(alerts)
    crit = alerts[(alerts.detector == "entropy_collapse") & (alerts.severity == "critical")]
    return {"collapse_step_entropy_floor": collapse_step(steps, entropy),
            "entropy_collapse_first_alert": firsts.get("entropy_collapse"),
            "entropy_collapse_first_critical": int(crit.step.min()) if len(crit) else None,
            "entropy_first": round(float(entropy[:5].mean()), 4), "entropy_last": round(float(entropy[-5:].mean()), 4),
            "reward_last": round(float(np.mean(where(rows, "reward/mean")[-5:])), 4),
            "first_alert_per_detector": firsts, "seconds": round(result["seconds"], 1)}


# ---------------------------------------------------------------------------------------------
# 1. float32 vs bfloat16 sampler


def dtypes(tmp: Path, steps: int, seed: int) -> dict:
    out = {}
    for dtype in ("float32", "bfloat16"):
        _progress(f"{PRESET} preset, sampler {dtype}, {steps} steps")
        result = run(tmp, f"sampler-{dtype}", sampler_dtype=dtype, steps=steps, seed=seed)
        mismatch_alerts = result["alerts"][result["alerts"].detector == DETECTOR]
        out[dtype] = {**mismatch_summary(result["steps"]), **collapse_summary(result),
                      "mismatch_alerts": len(mismatch_alerts),
                      "mismatch_first_alert": int(mismatch_alerts.step.min()) if len(mismatch_alerts) else None}
    f32, b16 = out["float32"], out["bfloat16"]
    if f32["kl_k3_late"] and b16["kl_k3_late"]:
        out["kl_k3_late_bf16_over_fp32"] = round(b16["kl_k3_late"] / f32["kl_k3_late"], 1)
    out["settings"] = {"preset": PRESET, "steps": steps, "seed": seed, "lr": load_config(preset=PRESET).lr}
    return out


# ---------------------------------------------------------------------------------------------
# 2. an injected mismatch from a known step


def injected(tmp: Path, steps: int, start: int, noises: tuple[float, ...], lr: float, seed: int,
             available: bool) -> dict:
    base = dict(steps=steps, lr=lr, seed=seed)
    _progress(f"matched float32 run at lr {lr:g}, {steps} steps")
    matched = run(tmp, "matched", **base)
    m_alerts = matched["alerts"][matched["alerts"].detector == DETECTOR]
    out: dict = {"settings": {"preset": PRESET, "lr": lr, "steps": steps, "seed": seed, "noise_from_step": start,
                              "what": "Gaussian noise of std sigma on the float32 sampler copy's logits"},
                 "detector_available": available,
                 "matched": {"false_alarms": len(m_alerts), "false_alarm_steps": sorted(int(s) for s in m_alerts.step),
                             "kl_k3_mean": mean(where(matched["steps"], "mismatch/kl_k3")),
                             "frac_outside_2x_mean": mean(where(matched["steps"], "mismatch/frac_outside_2x")),
                             "other_alerts": first_alerts(matched["alerts"]),
                             "collapse_step_entropy_floor": collapse_summary(matched)["collapse_step_entropy_floor"]}}
    for sigma in noises:
        _progress(f"sampler noise {sigma} from step {start}")
        result = run(tmp, f"noise-{sigma:g}", sampler_noise=sigma, sampler_noise_from_step=start, **base)
        rows, alerts = result["steps"], result["alerts"]
        hits = alerts[alerts.detector == DETECTOR]
        before, after = hits[hits.step < start], hits[hits.step >= start]
        crit = after[after.severity == "critical"]
        pre = {s: r for s, r in rows.items() if s < start}
        post = {s: r for s, r in rows.items() if s >= start}
        same_before = all(rows[s].get("loss") == matched["steps"][s].get("loss") for s in pre)
        out[f"sigma_{sigma:g}"] = {
            "kl_k3_before": mean(where(pre, "mismatch/kl_k3")), "kl_k3_after": mean(where(post, "mismatch/kl_k3")),
            "frac_outside_2x_after": mean(where(post, "mismatch/frac_outside_2x")),
            "first_alert_step": int(after.step.min()) if len(after) else None,
            "lag_steps": int(after.step.min()) - start if len(after) else None,
            "first_critical_lag_steps": int(crit.step.min()) - start if len(crit) else None,
            "alerts_before_start": len(before),
            "identical_to_matched_before_start": same_before,
            "message": str(after.sort_values("step").message.iloc[0])[:300] if len(after) else None,
        }
    if not available:
        out["note"] = (f"the {DETECTOR} detector is not in this checkout yet: no alert could fire; the mismatch "
                       "scalars above are what it will read")
    return out


# ---------------------------------------------------------------------------------------------
# 3. the cost of capturing the sampler's log p


def overhead(pairs: int, seed: int) -> dict:
    """Median step time with the sampler's log p captured and shipped vs not (interleaved, order
    alternating, one context, real DuckDB sink); plus its in-step share measured directly: the
    reporter's extra time and sampled_logp on logits of the rollout's shape (on busy cores the
    paired ratio's spread is wider than 1%: the in-step share is the figure that resolves it)."""
    from forksight.monitor.sinks.client import open_sink

    with tempfile.TemporaryDirectory() as tmp:
        sink = open_sink(run="bench-capture", db=str(Path(tmp) / "capture.duckdb"))
        config = load_config(preset=PRESET, overrides=dict(stream=False, progress=False, seed=seed,
                                                           sampler_dtype="bfloat16"))
        ctx, _ = setup(config, sink)
        for capture in (True, False):  # warm caches, allocator, the writer thread
            ctx.capture_sampler_logp = capture
            train_step(ctx, 0)
        on, off, report_on, report_off = [], [], [], []
        for i in range(pairs):
            for capture in ((True, False) if i % 2 == 0 else (False, True)):
                ctx.capture_sampler_logp = capture
                start = time.perf_counter()
                train_step(ctx, 1 + i)  # the same step number: the same prompts and draws
                (on if capture else off).append(time.perf_counter() - start)
                (report_on if capture else report_off).append(ctx.report_seconds)
        sink.finish()
    b, t, v = config.prompts_per_step * config.group_size, config.max_new_tokens, len(ctx.tokenizer)
    logits = tuple(torch.randn(b, v) for _ in range(t))
    completion = torch.randint(0, v, (b, t))
    mask = torch.ones(b, t, dtype=torch.bool)
    timings = []
    for _ in range(50):
        start = time.perf_counter()
        sampled_logp(logits, completion, mask, config.temperature)
        timings.append(time.perf_counter() - start)
    med_on, med_off = statistics.median(on), statistics.median(off)
    # each pair's two steps ran back to back: their ratio shares the machine's load of the moment
    pair_ratios = [a / b for a, b in zip(on, off)]
    extra = statistics.median(report_on) - statistics.median(report_off) + statistics.median(timings)
    return {"pairs": pairs, "shape": {"sequences": b, "max_new_tokens": t, "vocab": v, "sampler_dtype": "bfloat16"},
            "step_s_captured": round(med_on, 4), "step_s_plain": round(med_off, 4),
            "ratio_of_medians": round(med_on / med_off, 4),
            "ratio_paired_median": round(statistics.median(pair_ratios), 4),
            "ratio_paired_iqr": [round(q, 4) for q in np.quantile(pair_ratios, [0.25, 0.75])],
            "overhead_pct_paired": round(100 * (statistics.median(pair_ratios) - 1), 2),
            "overhead_pct_in_step": round(100 * extra / med_off, 2),
            "report_s_captured": round(statistics.median(report_on), 5),
            "report_s_plain": round(statistics.median(report_off), 5),
            "sampled_logp_s": round(statistics.median(timings), 6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewest steps (smoke run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    steps, inj_steps, start, pairs = (12, 16, 8, 3) if args.quick else (100, 60, 30, 20)
    started = time.perf_counter()
    available = detector_available()
    report: dict = {"torch_threads": torch.get_num_threads(), "preset": PRESET, "detector_available": available}
    with tempfile.TemporaryDirectory() as tmp:
        report["float32_vs_bfloat16"] = dtypes(Path(tmp), steps, args.seed)
        # lr 3e-4 (a tenth of the preset's): the run stays stable, so a rise is the injected one's
        report["injected"] = injected(Path(tmp), inj_steps, start, (0.1, 0.5), 3e-4, args.seed, available)
    _progress(f"capture overhead, {pairs} interleaved pairs")
    report["capture_overhead"] = overhead(pairs, args.seed)
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
