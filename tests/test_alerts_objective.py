"""length_hacking, clip_asymmetry and kl_inert (issue 42). Real GRPOTrainer runs of the tiny model with
forksight attached, seed 1 (the thresholds were set on bench/alerts_objective.py's seed-0 runs): TRL
beta 0.04 with the reference synced into the policy every step vs a fixed reference; ε_high 0.01 vs
0.2 both sides at 4 updates per batch; the warm model paid for length vs paid for the answer alone.
Alerts are read back from the store the collector wrote (the live path). Also: `doctor` on the issue's
TRL-like log, verl's keys, and hand-worked pieces (the within-group correlation, the clip split, β)."""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import alerts_objective  # noqa: E402

from forksight.compose import cli  # noqa: E402
from forksight.compose.doctor import diagnose  # noqa: E402
from forksight.monitor.alerts.hub import AlertMonitor  # noqa: E402

pytestmark = pytest.mark.trajectory   # asserts on trained runs: `make test-kernels` runs it under each CPU kernel level

NEW = set(alerts_objective.NEW)
RUNS = ("kl-synced", "kl-fixed", "clip-upper-lr1e-3", "clip-sym-lr1e-3", "length-paid-lr1e-3", "length-unpaid-lr1e-3")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    return {name: alerts_objective.train(name, alerts_objective.TEST_SEED, tmp_path_factory.mktemp(name))
            for name in RUNS}


def fired(run: dict, detector: str) -> list[dict]:
    return [dict(a, evidence=json.loads(e) if isinstance(e, str) else e)
            for a, e in zip(run["alerts"], run["evidence"]) if a["detector"] == detector]


def series(run: dict, key: str) -> list[tuple[int, float]]:
    return [(s, r[key]) for s, r in zip(run["steps"], run["rows"]) if key in r]


def debiased_ema(values, beta: float) -> float:
    acc = 0.0
    for x in values:
        acc = beta * acc + (1 - beta) * x
    return acc / (1 - beta ** len(values))


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_each_class_fires_on_its_run_and_no_new_class_elsewhere(live, name):
    kind = alerts_objective.SETTINGS[name][0]
    got = {a["detector"] for a in live[name]["alerts"]}
    if kind in NEW:
        assert kind in got, got
    assert not (got & NEW) - {kind}, got


@pytest.mark.slow
def test_kl_inert_on_the_synced_reference(live):
    synced, fixed = live["kl-synced"], live["kl-fixed"]
    kl = [v for _, v in series(synced, "kl")]
    assert len(kl) >= 20 and all(v == 0.0 for v in kl)              # TRL logged exactly 0 at every step
    [alert, *_] = fired(synced, "kl_inert")
    assert alert["step"] >= 20 and alert["evidence"]["largest_abs_kl"] == 0.0
    entropy = [v for _, v in series(synced, "entropy/mean")]
    assert abs(entropy[-1] - np.median(entropy[:10])) > 0.05          # while the policy moved
    assert max(v for _, v in series(fixed, "kl")) > 1e-3              # a fixed reference: KL grows


@pytest.mark.slow
def test_clip_asymmetry_on_a_tight_upper_clip(live):
    upper, sym = live["clip-upper-lr1e-3"], live["clip-sym-lr1e-3"]
    [alert, *_] = fired(upper, "clip_asymmetry")
    ev = alert["evidence"]
    assert ev["side"] == "upper"
    hi = debiased_ema([v for s, v in series(upper, "clip_ratio/high_mean") if s <= alert["step"]], 0.9)
    lo = debiased_ema([v for s, v in series(upper, "clip_ratio/low_mean") if s <= alert["step"]], 0.9)
    assert math.isclose(ev["high_frac"], hi, rel_tol=1e-5) and math.isclose(ev["low_frac"], lo, rel_tol=1e-5)
    assert hi >= 4 * lo
    # no clip_saturation while the split is lopsided: one cause, one alert
    assert not [a for a in upper["alerts"] if a["detector"] == "clip_saturation" and a["step"] >= alert["step"]]
    # both bounds at 0.2: the smoothed split never reaches 4:1
    his = [v for _, v in series(sym, "clip_ratio/high_mean")]
    los = [v for _, v in series(sym, "clip_ratio/low_mean")]
    ratios = [debiased_ema(his[:n], 0.9) / max(debiased_ema(los[:n], 0.9), 1e-12) for n in range(10, len(his))]
    assert max(ratios) < 4


@pytest.mark.slow
def test_length_hacking_on_a_length_paying_reward(live):
    paid = live["length-paid-lr1e-3"]
    [alert, *_] = fired(paid, "length_hacking")
    ev = alert["evidence"]
    assert ev["explained_by"] == "component" and ev["component"] == "rewards/length_bonus/mean"
    length = [v for s, v in series(paid, "length/mean")]
    assert length[-1] >= 2 * np.median(length[:10])
    # truncation at the cap is this cause's symptom: quiet while length hacking holds
    assert not [a for a in paid["alerts"] if a["detector"] == "truncation" and a["step"] >= alert["step"]]


@pytest.mark.slow
def test_length_hacking_from_the_samples_when_the_reward_is_one_function(live):
    """Without rewards/<name>/mean (one reward function paying answer and length), the stored samples'
    within-group correlation is what explains the rise; the unpaid run stays quiet."""
    for name, expect in (("length-paid-lr1e-3", True), ("length-unpaid-lr1e-3", False)):
        run, monitor = live[name], AlertMonitor()
        got = [a for s, r in zip(run["steps"], run["rows"])
               for a in monitor.observe(s, {k: v for k, v in r.items() if not k.startswith("rewards/")})
               if a.detector == "length_hacking"]
        assert bool(got) is expect
        if expect:
            assert got[0].evidence["explained_by"] == "samples" and got[0].evidence["length_reward_corr"] >= 0.3


@pytest.mark.slow
def test_length_reward_correlation_is_the_mean_within_group_pearson_of_the_stored_samples(live):
    run = live["length-paid-lr1e-3"]
    groups: dict[tuple, list] = defaultdict(list)
    for s in run["samples"]:
        groups[(s["step"], s["group_id"])].append((s["reward"], s["length"]))
    by_step: dict[int, list] = defaultdict(list)
    for (step, _), pairs in groups.items():
        r, n = np.asarray(pairs, dtype=np.float64).T
        if len(pairs) >= 3 and r.std() > 0 and n.std() > 0:
            by_step[step].append(np.corrcoef(r, n)[0, 1])
    stored = dict(series(run, "groups/length_reward_corr"))
    assert stored and set(stored) == set(by_step)
    for step, values in by_step.items():
        assert math.isclose(stored[step], float(np.mean(values)), rel_tol=1e-9, abs_tol=1e-12)


# ---------------------------------------------------------------------------- doctor, verl, any loop
def issue_log(path: Path) -> Path:
    """The issue's example as TRL writes it: completions ~120 tokens, from step 60 growing to ~900;
    rewards/length_bonus rising from ~0 to 0.21, rewards/accuracy flat at 0.30, reward 0.29 → 0.51."""
    rng = np.random.default_rng(0)
    history = []
    for step in range(1, 121):
        grow = min(max(step - 60, 0) / 40, 1.0)
        length = 120 + 780 * grow + rng.normal(0, 8)
        bonus = -0.01 + 0.22 * grow + rng.normal(0, 0.01)
        accuracy = 0.30 + rng.normal(0, 0.02)
        history.append({"step": step, "completions/mean_length": length, "rewards/length_bonus/mean": bonus,
                        "rewards/accuracy/mean": accuracy, "reward": bonus + accuracy,
                        "entropy": 0.6 + rng.normal(0, 0.01), "loss": 0.01})
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 120}))
    return path / "trainer_state.json"


def test_doctor_names_length_hacking_on_the_issues_trl_log(tmp_path, capsys):
    source = issue_log(tmp_path / "run")
    result = diagnose(str(source))
    [first, *_] = [a for a in result.alerts if a["detector"] == "length_hacking"]
    assert 60 < first["step"] <= 80 and first["evidence"]["component"] == "rewards/length_bonus/mean"
    assert result.verdict == "critical" and "length_hacking" in result.checked
    # one alert per cause: the composition warning came before the bonus moved (accuracy is constant,
    # which is true), and none about the length term once length hacking names it
    assert all(a["step"] < first["step"] for a in result.alerts if a["detector"] == "reward_composition")
    assert cli.main(["doctor", str(source), "--fail-on", "critical"]) == 1
    assert cli.main(["doctor", str(source), "--fail-on", "warning", "--set", "length_hacking.enabled=false",
                     "--set", "composition.enabled=false"]) == 0
    capsys.readouterr()


def test_verl_keys_kl_inert_and_no_clip_split(tmp_path):
    """verl logs actor/kl_loss with actor/kl_coef; its pg_clipfrac_lower is dual-clip's bound, not the lower side."""
    from forksight.monitor.importers.aliases import canonical

    assert canonical("actor/pg_clipfrac_lower") == "clip/dual_frac" and canonical("actor/pg_clipfrac") == "clip/frac"
    lines = [{"step": s, "data": {"actor/kl_loss": 0.0, "actor/kl_coef": 0.001, "actor/entropy": 1.2 - 0.01 * s,
                                  "actor/pg_clipfrac": 0.1, "actor/pg_clipfrac_lower": 0.001,
                                  "critic/score/mean": 0.3}} for s in range(1, 41)]
    path = tmp_path / "verl.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = diagnose(str(path))
    assert [a["step"] for a in result.alerts if a["detector"] == "kl_inert"] == [20]
    assert "clip_asymmetry" in result.not_checked and "clip_asymmetry" not in {a["detector"] for a in result.alerts}
    lines = [dict(x, data={**x["data"], "actor/kl_coef": 0.0}) for x in lines]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert "kl_inert" not in {a["detector"] for a in diagnose(str(path)).alerts}   # β = 0: no KL term


def _steps(n: int, **keys) -> list[dict]:
    return [{k: f(s) for k, f in keys.items()} for s in range(1, n + 1)]


def test_kl_inert_reads_the_bundled_trainers_beta():
    """The bundled trainer logs kl = 0 when β = 0 (no KL term) and kl/beta beside it."""
    moving = dict(kl=lambda s: 0.0, **{"entropy/mean": lambda s: 1.0 - 0.01 * s})
    for beta, expect in ((0.0, False), (0.04, True)):
        monitor = AlertMonitor()
        got = [a for s, row in enumerate(_steps(40, **moving, **{"kl/beta": lambda s: beta}), 1)
               for a in monitor.observe(s, row) if a.detector == "kl_inert"]
        assert bool(got) is expect
    monitor = AlertMonitor()   # no policy movement (a frozen run): nothing to say
    assert not [a for s in range(1, 60) for a in monitor.observe(s, {"kl": 0.0, "entropy/mean": 1.0})]


def test_clip_split_of_the_bundled_loss_is_the_clip_fraction_counted_by_hand():
    import torch

    from forksight.trainer.loss import grpo_loss

    g = torch.Generator().manual_seed(0)
    logp = torch.randn(6, 9, generator=g) * 0.3 - 1.0
    old = logp + torch.randn(6, 9, generator=g) * 0.3
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    valid = torch.rand(6, 9, generator=g) > 0.2
    _, info = grpo_loss(logp, old, adv, valid, valid, clip_low=0.2, clip_high=0.1)
    ratio = np.exp(logp.double().numpy() - old.double().numpy())
    a, v = adv.double().numpy()[:, None], valid.numpy()
    high = ((ratio > 1.1) & (a > 0) & v).sum() / v.sum()
    low = ((ratio < 0.8) & (a < 0) & v).sum() / v.sum()
    assert math.isclose(info["clip/high_frac"], high, rel_tol=1e-6) and math.isclose(info["clip/low_frac"], low, rel_tol=1e-6)
    assert math.isclose(info["clip/frac"], high + low, rel_tol=1e-6) and high > 0 and low > 0


def test_length_reward_corr_by_hand():
    from forksight.hooks.metrics.summary import group_scalars, length_reward_corr

    # group 0: reward = length / 10 exactly (r = 1); group 1: reward falls with length (r = -1); group 2:
    # two samples only (skipped); group 3: equal rewards (skipped)
    ids = [0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 3]
    rewards = [0.1, 0.2, 0.4, 1.0, 0.5, 0.0, 1.0, 0.0, 0.3, 0.3, 0.3]
    lengths = [1, 2, 4, 10, 20, 30, 5, 9, 1, 2, 3]
    assert math.isclose(length_reward_corr(ids, rewards, lengths), 0.0, abs_tol=1e-12)
    assert math.isclose(length_reward_corr(ids[:3], rewards[:3], lengths[:3]), 1.0)
    assert length_reward_corr(ids[6:], rewards[6:], lengths[6:]) is None
    assert "groups/length_reward_corr" not in group_scalars(ids, rewards, [True] * 11)
    assert group_scalars(ids, rewards, [True] * 11, lengths)["groups/length_reward_corr"] == pytest.approx(0.0)


def test_kl_inert_config_says_what_is_missing():
    from forksight.monitor.alerts.hub import load_alert_config

    with pytest.raises(ValueError, match="min_move has no threshold for logp/sum"):
        load_alert_config(overrides=['kl_inert.move_keys=["logp/sum"]'])


def test_dashboard_draws_each_new_class_where_its_signal_is(tmp_path):
    """length_hacking on the length chart (marker at the smoothed length, threshold at growth × early
    length), kl_inert on the kl chart, clip_asymmetry (a signal no chart shows) on the entropy curve;
    the alerts view shows each one's fix line."""
    import pandas as pd

    from forksight.dashboard import alert_figures as A
    from forksight.dashboard.alerts_view import alert_rows
    from forksight.dashboard.figures import DIAGNOSTIC_KEYS

    result = diagnose(str(issue_log(tmp_path / "run")))
    [hack, *_] = [a for a in result.alerts if a["detector"] == "length_hacking"]
    ev, factor = hack["evidence"], 3.0 if hack["severity"] == "critical" else 1.5
    assert hack["signal"] == "length/mean" and hack["value"] == pytest.approx(ev["length"], rel=1e-5)
    assert hack["threshold"] == pytest.approx(factor * ev["length_baseline"], rel=1e-5)
    alerts = pd.DataFrame([hack, {"detector": "kl_inert", "severity": "warning", "step": 30, "signal": "kl",
                                  "value": 0.0, "threshold": 1e-6, "message": "KL term inert. Fix: load it apart.",
                                  "action": "a", "run_id": "r", "forecast": None},
                           {"detector": "clip_asymmetry", "severity": "warning", "step": 40, "signal": "clip/high_frac",
                            "value": 0.3, "threshold": 0.05, "message": "Clip asymmetry. Fix: raise ε_high.",
                            "action": "a", "run_id": "r", "forecast": None}]).assign(run_id="r")
    routed = A.route_alerts(alerts, {"signals": DIAGNOSTIC_KEYS})
    assert sorted(routed["signals"]["detector"]) == ["kl_inert", "length_hacking"]
    assert list(routed["rest"]["detector"]) == ["clip_asymmetry"]
    rows = pd.DataFrame({"step": result.steps, "value": [r["length/mean"] for r in result.rows],
                         "wall_time": float("nan")})
    layers = A.alert_layers(routed["signals"][routed["signals"]["signal"] == "length/mean"],
                            {"length/mean": (rows, "x", "y")}, "step")
    marker = [d for d in layers["data"] if d.get("mode") == "markers"][0]
    assert marker["x"] == [hack["step"]] and marker["y"] == [pytest.approx(hack["value"])]
    assert any(s.get("y0") == pytest.approx(hack["threshold"]) for s in layers["shapes"])
    fixes = {r["detector"]: r["fix"] for r in alert_rows(alerts)}
    assert fixes["kl_inert"] == "load it apart." and fixes["clip_asymmetry"] == "raise ε_high."
    assert fixes["length_hacking"].startswith("stop paying for length")


def test_import_stores_and_alerts_replay_reraises_them(tmp_path, capsys):
    """`forksight import` judges the run as the collector would; `alerts replay` reads the same steps back
    from the DuckDB file and raises the same alerts, with a setting changed it raises what that setting says."""
    from forksight.monitor.collector.store import Store

    source, db = issue_log(tmp_path / "run"), tmp_path / "runs.duckdb"
    assert cli.main(["import", str(source), "--db", str(db)]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    with Store(str(db)) as store:
        stored = store.reader.read_alerts(run_id)
    assert "length_hacking" in set(stored["detector"])
    assert cli.main(["alerts", "replay", "--db", str(db), "--run", run_id, "--format", "json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    key = lambda rows: sorted((r["detector"], r["severity"], int(r["step"])) for r in rows)   # noqa: E731
    assert key(replayed) == key(stored.to_dict("records"))
    assert cli.main(["alerts", "replay", "--db", str(db), "--run", run_id, "--format", "json",
                     "--set", "length_hacking.growth=20", "--set", "length_hacking.critical_growth=30"]) == 0
    assert "length_hacking" not in {r["detector"] for r in json.loads(capsys.readouterr().out)}
