"""The train_inference_mismatch detector on series whose mismatch is known: the step scalars come from the
real producer (hooks/metrics/mismatch.py) on drawn trainer and sampler log p, a mismatch injected at a known
step; the expected alert step and every evidence number are recomputed here in float64 (median, pandas EWM,
the raw draws), and the alert row is checked where the collector stores it."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from forksight.base.records import Records, scalars_table
from forksight.hooks.metrics.mismatch import mismatch_scalars
from forksight.monitor.alerts.config import MismatchConfig
from forksight.monitor.alerts.hub import AlertConfig, AlertMonitor, evidence_of, load_alert_config
from forksight.monitor.alerts.mismatch import MismatchDetector
from forksight.monitor.collector.ingest import Ingest
from forksight.monitor.collector.store import Store
from synthetic import step_records

NAME = MismatchDetector.name
CFG = MismatchConfig()
B, T = 16, 48          # sequences per step, tokens per sequence
ONSET = 70             # the step the injected mismatch starts


# ---------------------------------------------------------------------------- series
def draw_step(rng: np.random.Generator, sigma_fork: float, sigma_nonfork: float,
              batch: int = B) -> tuple[dict, np.ndarray, np.ndarray]:
    """One step: trainer log p, a sampler whose log p differs by N(0, σ²) (σ per fork / non-fork token),
    the producer's scalars over it, and the log ratios and fork mask it saw (for independent checks)."""
    logp = -rng.gamma(1.0, 0.5, (batch, T))
    fork = rng.random((batch, T)) < 0.2
    noise = rng.normal(0.0, 1.0, (batch, T)) * np.where(fork, sigma_fork, sigma_nonfork)
    sampler = np.minimum(logp + noise, 0.0)
    scalars = mismatch_scalars(torch.from_numpy(logp), torch.from_numpy(sampler),
                               torch.ones(batch, T, dtype=torch.bool), fork=torch.from_numpy(fork))
    return scalars, logp - sampler, fork


def run(seed: int, steps: int = 130, *, quiet: float = 0.03, fork_after: float | None = None,
        all_after: float | None = None, wobble: float = 0.0, length: bool = True, batch: int = B):
    """A run's rows (and draws): σ = quiet everywhere until ONSET, then fork_after on fork tokens or
    all_after on every token; wobble: the step's σ varies by a lognormal factor (a noisy matched run)."""
    rng = np.random.default_rng(seed)
    rows, draws = [], []
    for step in range(steps):
        scale = float(rng.lognormal(0.0, wobble)) if wobble else 1.0
        sf = sn = quiet * scale
        if step >= ONSET and fork_after is not None:
            sf = fork_after
        if step >= ONSET and all_after is not None:
            sf = sn = all_after
        scalars, lr, fork = draw_step(rng, sf, sn, batch)
        if length:
            scalars["length/mean"] = float(T)
        rows.append(scalars)
        draws.append((lr, fork))
    return rows, draws


def alerts_of(rows: list[dict], config: AlertConfig | None = None) -> list:
    monitor = AlertMonitor(config)
    return [a for step, row in enumerate(rows) for a in monitor.observe(step, row) if a.detector == NAME]


def ewm(values) -> np.ndarray:
    """The debiased EMA the other way: pandas' adjusted EWM is the normalised weighted average."""
    return pd.Series(values, dtype="float64").ewm(alpha=1 - CFG.smoothing, adjust=True).mean().to_numpy()


def first_held(condition: np.ndarray, persist: int = CFG.persist, start: int = CFG.warmup_steps - 1) -> int | None:
    """First step at which `condition` held for `persist` consecutive judged steps (judging starts once
    `warmup_steps` steps were seen)."""
    for i in range(start + persist - 1, len(condition)):
        if condition[i - persist + 1:i + 1].all():
            return i
    return None


def column(rows: list[dict], key: str) -> np.ndarray:
    return np.array([r[key] for r in rows], dtype=np.float64)


# ---------------------------------------------------------------------------- warning
@pytest.mark.parametrize("seed", range(4))
def test_injected_mismatch_warns_within_a_few_steps_after_and_never_before(seed):
    rows, draws = run(seed, fork_after=0.3)
    fired = alerts_of(rows)
    assert fired and all(a.step >= ONSET for a in fired), [(a.step, a.severity) for a in fired]
    first = fired[0]
    assert first.severity == "warning" and first.signal == "mismatch/kl_k3"
    assert first.step <= ONSET + CFG.persist + 2

    # the step, recomputed: the EMA of k3 above max(median × factor, median + floor) for `persist` steps
    k3 = column(rows, "mismatch/kl_k3")
    base = float(np.median(k3[:CFG.baseline_steps]))
    threshold = max(base * CFG.rise_factor, base + CFG.min_rise["mismatch/kl_k3"])
    smooth = ewm(k3)
    assert first.step == first_held(smooth > threshold)
    assert first.value == pytest.approx(smooth[first.step], rel=1e-9)
    assert first.threshold == pytest.approx(threshold, rel=1e-9)
    assert first.action and "Fix: " in first.message and "TIS" in first.action and "FP16" in first.action

    # evidence: the numbers above, and where the mismatch sits, from the raw draws of that step
    ev = first.evidence
    assert ev["baseline"] == pytest.approx(base, rel=1e-5)
    assert ev["smoothed"] == pytest.approx(smooth[first.step], rel=1e-5)
    assert ev["factor"] == pytest.approx(smooth[first.step] / base, rel=1e-5)
    assert (ev["window"], ev["baseline_from"], ev["baseline_to"]) == (CFG.baseline_steps, 0, CFG.baseline_steps - 1)
    assert ev["rise_factor"] == CFG.rise_factor and ev["smoothing"] == CFG.smoothing
    lr, fork = draws[first.step]
    k3_token = np.expm1(lr) - lr                                       # r − 1 − log r per token, float64
    assert ev["fork"] == pytest.approx(k3_token[fork].mean(), rel=1e-5)
    assert ev["nonfork"] == pytest.approx(k3_token[~fork].mean(), rel=1e-5)
    assert ev["fork_token_share"] == pytest.approx(fork.mean(), rel=1e-5)
    assert ev["fork_mass_share"] == pytest.approx(k3_token[fork].sum() / k3_token.sum(), rel=1e-5)
    assert ev["sits_on"] == "fork" and "the mismatch sits on fork tokens" in first.message
    # the whole evidence survives the JSON column
    assert json.loads(json.dumps(ev, allow_nan=False)) == ev


@pytest.mark.parametrize("quiet", [0.03, 0.1])          # k3 ≈ σ²/2: under the absolute floor, and 5× above it
@pytest.mark.parametrize("seed", range(4))
def test_matched_engines_with_a_noisy_small_kl_never_alert(seed, quiet):
    """The step's σ wobbles by a lognormal factor (k3 by ~×1.8 per step, one σ) but does not drift."""
    rows, _ = run(seed, steps=300, quiet=quiet, wobble=0.3)
    k3 = column(rows, "mismatch/kl_k3")
    assert abs(np.median(k3[150:]) / np.median(k3[:150]) - 1) < 0.25          # stationary: no drift
    assert k3.max() > 2.5 * np.median(k3)                                       # and single steps do jump
    assert alerts_of(rows) == []


def test_a_numerically_zero_baseline_does_not_turn_noise_into_a_rise():
    """Identical engines: |log r| ~ 1e-4, then 1e-3 from ONSET, a 100-fold rise of k3 that stays far
    under the absolute floor, so nothing fires; the same rise past the floor does."""
    rows, _ = run(1, quiet=1e-4, all_after=1e-3)
    k3 = column(rows, "mismatch/kl_k3")
    assert k3[ONSET:].mean() > 50 * np.median(k3[:CFG.baseline_steps])        # a large relative rise
    assert k3.max() < CFG.min_rise["mismatch/kl_k3"] / 10                     # all of it noise-sized
    assert alerts_of(rows) == []
    loud, _ = run(1, quiet=1e-4, all_after=0.1)
    assert [a.severity for a in alerts_of(loud)][:1] == ["warning"]


def test_the_detector_works_on_the_mean_log_p_difference_alone():
    """TRL logs only |log p_old − log p_sampler| (mean, max), which the importers map to
    mismatch/logp_diff_abs_*: that key carries the warning, with no split and no critical."""
    full, _ = run(2, all_after=0.3)
    keys = ("mismatch/logp_diff_abs_mean", "mismatch/logp_diff_abs_max")
    rows = [{k: r[k] for k in keys} for r in full]
    fired = alerts_of(rows)
    assert fired and fired[0].signal == "mismatch/logp_diff_abs_mean" and fired[0].step >= ONSET
    assert {a.severity for a in fired} == {"warning"}
    diff = column(rows, "mismatch/logp_diff_abs_mean")
    base = float(np.median(diff[:CFG.baseline_steps]))
    threshold = max(base * CFG.rise_factor, base + CFG.min_rise["mismatch/logp_diff_abs_mean"])
    assert fired[0].step == first_held(ewm(diff) > threshold)
    assert "fork" not in fired[0].evidence and "sits on" not in fired[0].message


# ---------------------------------------------------------------------------- critical
def test_collapsing_sequence_ess_is_critical_after_the_warning():
    """Every token's log ratio spreads from σ 0.03 to 0.5 at ONSET: over 48 tokens the sequence weights
    exp(Σ log r) of a 64-sequence step degenerate (a few sequences carry them). No length is logged, so the
    ESS alone is the cause."""
    rows, _ = run(3, all_after=0.5, length=False, batch=64)
    fired = alerts_of(rows)
    crit = [a for a in fired if a.severity == "critical"]
    assert crit and fired[0].severity == "warning" and fired[0].step < crit[0].step
    ess = ewm(column(rows, "mismatch/seq_ess"))
    first = crit[0]
    assert first.step == first_held(ess < CFG.min_seq_ess) and first.step > ONSET
    assert first.signal == "mismatch/seq_ess" and first.value == pytest.approx(ess[first.step], rel=1e-9)
    assert first.threshold == CFG.min_seq_ess and first.evidence["causes"] == ["seq_ess"]
    assert first.evidence["seq_ess"] == pytest.approx(ess[first.step], rel=1e-5)
    assert "t_kl" not in first.evidence and "token-level" in first.action


def test_t_times_kl_past_log_cap_is_critical_without_an_ess():
    """verl logs k3 (rollout_corr/k3_kl) and the response length but no ESS: 100 tokens × a KL rising
    from 0.002 to 0.05 nats takes T × KL from 0.2 past log 3 ≈ 1.10 (the typical sequence weight under 1/3)."""
    rng = np.random.default_rng(4)
    rows = [{"mismatch/kl_k3": (0.002 if s < ONSET else 0.05) * float(rng.lognormal(0, 0.1)),
             "length/mean": 100.0 + float(rng.normal(0, 3))} for s in range(120)]
    crit = [a for a in alerts_of(rows) if a.severity == "critical"]
    assert crit
    first = crit[0]
    kl, length = ewm(column(rows, "mismatch/kl_k3")), ewm(column(rows, "length/mean"))
    t_kl = kl * length
    assert first.step == first_held(t_kl > math.log(CFG.seq_cap)) and first.step > ONSET
    ev = first.evidence
    assert first.signal == "mismatch/kl_k3" and ev["causes"] == ["t_kl"]
    assert first.value == pytest.approx(kl[first.step], rel=1e-9)
    assert first.threshold == pytest.approx(math.log(CFG.seq_cap) / length[first.step], rel=1e-9)
    assert ev["t_kl"] == pytest.approx(t_kl[first.step], rel=1e-5)
    assert ev["typical_seq_weight"] == pytest.approx(math.exp(-t_kl[first.step]), rel=1e-5)
    assert ev["log_cap"] == pytest.approx(math.log(3.0), rel=1e-5) and "C = 3" in first.message
    # before ONSET T × KL ≈ 0.2: nothing critical there
    assert t_kl[:ONSET].max() < math.log(CFG.seq_cap)


# ---------------------------------------------------------------------------- no sampler log-probs
@pytest.mark.parametrize("collapse", [True, False])
def test_a_run_without_sampler_log_probs_raises_no_mismatch_alert(collapse):
    rng = np.random.default_rng(5)
    tables = [step_records(rng, s, 150, collapse=collapse, token_samples=0).scalars for s in range(150)]
    rows = [dict(zip(t["key"].to_pylist(), t["value"].to_pylist())) for t in tables]
    assert rows[0] and not any(k.startswith("mismatch/") for r in rows for k in r)
    monitor = AlertMonitor()
    fired = [a for s, r in enumerate(rows) for a in monitor.observe(s, r)]
    assert NAME not in {a.detector for a in fired}
    # the detector itself saw nothing: no smoothed value, no baseline
    detector = MismatchDetector(CFG)
    assert all(detector.observe(s, r, s + 1) == [] for s, r in enumerate(rows))
    assert all(e.value is None for e in detector.ema.values()) and not any(b.count for b in detector.base.values())


def test_a_rise_needs_a_floor_for_every_key_it_watches():
    with pytest.raises(ValueError, match="min_rise has no floor for rollout_corr/kl"):
        load_alert_config(overrides=['mismatch.level_keys=["rollout_corr/kl"]'])
    cfg = load_alert_config(overrides=["mismatch.rise_factor=5", "mismatch.seq_cap=2"])
    assert cfg.mismatch.rise_factor == 5 and cfg.mismatch.seq_cap == 2


# ---------------------------------------------------------------------------- through the collector
def test_the_alert_row_lands_in_the_store_with_signal_and_evidence(tmp_path):
    """A synthetic run's scalars plus the mismatch scalars, ingested into a real DuckDB file: the store's
    own hub stores the alert, its evidence as JSON, and the alerts page's filter lists the detector."""
    mismatch, _ = run(0, steps=100, fork_after=0.3, length=False)   # the synthetic run logs its own length
    rng = np.random.default_rng(6)
    with Store(str(tmp_path / "m.duckdb")) as store:
        ingest = Ingest(store)
        run_id = store.create_run("mismatch-run")
        for step, extra in enumerate(mismatch):
            base = step_records(rng, step, 100, collapse=False, token_samples=0).scalars
            table = scalars_table([{"step": step, "key": k, "value": v} for k, v in extra.items()])
            ingest.write(run_id, Records(scalars=pa.concat_tables([base, table])), batch_id=f"b{step}").result()
        store.flush()
        stored = store.reader.read_alerts(run_id)
        detectors = store.reader.alert_detectors()
    rows = stored[stored.detector == NAME].sort_values("step").to_dict("records")
    assert rows and NAME in detectors
    first = rows[0]
    k3 = column(mismatch, "mismatch/kl_k3")
    base = float(np.median(k3[:CFG.baseline_steps]))
    expected = first_held(ewm(k3) > max(base * CFG.rise_factor, base + CFG.min_rise["mismatch/kl_k3"]))
    assert (first["step"], first["severity"], first["signal"]) == (expected, "warning", "mismatch/kl_k3")
    evidence = evidence_of(first)
    assert isinstance(first["evidence"], str) and evidence["baseline"] == pytest.approx(base, rel=1e-5)
    assert evidence["fork"] == pytest.approx(mismatch[expected]["mismatch/kl_k3/fork"], rel=1e-5)
    assert evidence["sits_on"] == "fork" and first["value"] == pytest.approx(ewm(k3)[expected], rel=1e-9)



def test_step_without_a_rise_signal_does_not_rearm_the_warning():
    """A step that carries mismatch scalars but no rise signal (here only the sequence ESS, healthy) says
    nothing about whether the rise cleared: it must not re-arm the warning (all([]) counted it as cleared)."""
    cfg = MismatchConfig(warmup_steps=0, baseline_steps=3, persist=1, cooldown=2, smoothing=0.0)
    det = MismatchDetector(cfg)
    level = "mismatch/kl_k3"
    fired = []
    for step in range(40):
        if step < 3:
            scalars = {level: 0.01}                      # the baseline: 0.01, threshold max(0.03, 0.011)
        elif step % 2:
            scalars = {cfg.ess_key: 0.9}                 # no rise signal this step
        else:
            scalars = {level: 0.5, cfg.ess_key: 0.9}     # far above the threshold, and never back under it
        fired += [(step, a.severity) for a in det.observe(step, scalars, step)]
    assert fired == [(4, "warning")]                     # once: the rise never cleared
