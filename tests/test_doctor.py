"""`forksight doctor` and `forksight import` on real logs: TRL's trainer_state.json and the
TensorBoard events its SummaryWriter wrote for a collapsing (lr 1e-2) and a healthy (lr 3e-4)
GRPO run of the tiny model (tests/data/trl_logs, by bench/doctor_fixtures.py). The collapse is
judged from the logged entropy here, not by the detectors."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from forksight.compose import cli
from forksight.compose.doctor import diagnose

LOGS = Path(__file__).resolve().parent / "data" / "trl_logs"
SOURCES = [LOGS / run / kind for run in ("collapse", "healthy") for kind in ("trainer_state.json", "tb")]


def entropy_fell(source: Path) -> float:
    """How far the logged entropy fell: 1 - (last 5 steps' mean) / (first 5 steps' mean)."""
    history = json.loads((source.parent / "trainer_state.json").read_text())["log_history"]
    h = np.array([e["entropy"] for e in history if "entropy" in e], dtype=np.float64)
    return 1.0 - h[-5:].mean() / h[:5].mean()


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_verdict_on_real_trl_logs(source):
    result = diagnose(str(source))
    fired = {a["detector"] for a in result.alerts}
    if source.parent.name == "collapse":
        assert entropy_fell(source) > 0.5
        assert result.verdict in ("warning", "critical") and "entropy_collapse" in fired
        first = min(a["step"] for a in result.alerts if a["detector"] == "entropy_collapse")
        assert first < 40
    else:
        assert abs(entropy_fell(source)) < 0.05
        assert result.verdict == "healthy" and not result.alerts
    assert "entropy_collapse" in result.checked and "reward_eval_divergence" in result.not_checked


def test_both_sources_of_one_run_agree():
    for run in ("collapse", "healthy"):
        a, b = (diagnose(str(LOGS / run / kind)) for kind in ("trainer_state.json", "tb"))
        assert a.steps == b.steps
        assert [(x["detector"], x["severity"], x["step"]) for x in a.alerts] == \
            [(x["detector"], x["severity"], x["step"]) for x in b.alerts]


def test_fail_on_gates_ci_and_formats(tmp_path, capsys):
    collapse, healthy = str(LOGS / "collapse" / "trainer_state.json"), str(LOGS / "healthy" / "tb")
    assert cli.main(["doctor", collapse, "--fail-on", "warning"]) == 1
    verdict = diagnose(collapse).verdict
    assert cli.main(["doctor", collapse, "--fail-on", "critical"]) == (1 if verdict == "critical" else 0)
    assert cli.main(["doctor", healthy, "--fail-on", "warning"]) == 0
    capsys.readouterr()
    assert cli.main(["doctor", collapse, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == verdict and report["findings"][0]["evidence"]
    assert cli.main(["doctor", collapse, "--format", "markdown"]) == 0
    assert "| entropy_collapse |" in capsys.readouterr().out.replace("warning | ", "").replace("critical | ", "")
    assert cli.main(["doctor", collapse, "--format", "html", "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "plotly" in page and 'id="verdict"' in page and "threshold:entropy_collapse" in page
    assert cli.main(["doctor", str(tmp_path / "nothing")]) == 2
    assert "expected a forksight DuckDB file" in capsys.readouterr().err


def test_html_escapes_run_text(tmp_path):
    (tmp_path / "<i>x.jsonl").write_text("".join(
        json.dumps({"step": s, "entropy": 2.0 * 0.9 ** s, "reward": 0.1}) + "\n" for s in range(80)))
    assert cli.main(["doctor", str(tmp_path / "<i>x.jsonl"), "--format", "html", "-o",
                     str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<i>x" not in page and "&lt;i&gt;x" in page


def test_import_brings_the_run_into_the_store_with_its_alerts(tmp_path, capsys):
    from forksight.monitor.collector.store import Store

    db = str(tmp_path / "i.duckdb")
    assert cli.main(["import", str(LOGS / "collapse" / "tb"), "--db", db, "--run", "trl-collapse"]) == 0
    summary = json.loads(capsys.readouterr().out)
    direct = diagnose(str(LOGS / "collapse" / "tb"))
    with Store(db) as store:
        assert store.reader.list_runs()["run_id"].tolist() == ["trl-collapse"]
        frame = store.reader.read_scalars("trl-collapse", keys=["entropy/mean"], downsample=10_000)
        alerts = store.reader.read_alerts("trl-collapse")
    assert frame["step"].tolist() == direct.steps
    assert frame["value"].tolist() == pytest.approx([r["entropy/mean"] for r in direct.rows])
    assert summary["alerts"] == len(alerts) == len(direct.alerts)
    assert set(alerts["signal"]) >= {"entropy/mean"}
    # and doctor reads the store back with the same verdict
    assert diagnose(db, "trl-collapse").verdict == direct.verdict


def test_a_constant_reward_component_in_a_real_trl_run():
    """TRL with two reward functions (bench/doctor_fixtures.py "composition"): the even-token reward
    moves, the strict correct-sum check is 0 on every step the log shows; only that is reported."""
    source = LOGS / "composition" / "trainer_state.json"
    history = json.loads(source.read_text())["log_history"]
    strict = [e["rewards/correct_sum/mean"] for e in history if "rewards/correct_sum/mean" in e]
    even = [e["rewards/even_token/mean"] for e in history if "rewards/even_token/mean" in e]
    assert max(strict) == 0.0 and np.std(even) > 0.05
    for kind in ("trainer_state.json", "tb"):
        result = diagnose(str(LOGS / "composition" / kind))
        assert {a["detector"] for a in result.alerts} == {"reward_composition"}
        [alert] = result.alerts
        assert alert["signal"] == "rewards/even_token/mean"
        assert alert["evidence"]["dead"] == ["rewards/correct_sum/mean"]


def test_import_keeps_a_non_finite_value_as_the_marker_the_detector_reads(tmp_path, capsys):
    from forksight.monitor.collector.store import Store

    rows = [{"step": s, "reward": 0.5, "grad_norm": "nan" if s == 12 else 1.0} for s in range(20)]
    (tmp_path / "log.csv").write_text("step,reward,grad_norm\n" + "".join(
        f"{r['step']},{r['reward']},{r['grad_norm']}\n" for r in rows))
    db = str(tmp_path / "i.duckdb")
    assert cli.main(["import", str(tmp_path / "log.csv"), "--db", db]) == 0
    capsys.readouterr()
    with Store(db) as store:
        [run] = store.reader.list_runs()["run_id"].tolist()
        alerts = store.reader.read_alerts(run)
        marker = store.reader.read_scalars(run, keys=["nonfinite/grad_norm"])
    assert marker["step"].tolist() == [12] and marker["value"].tolist() == [0.0]      # 0 = NaN
    assert alerts["detector"].tolist() == ["non_finite"] and alerts["step"].tolist() == [12]
    assert alerts["signal"].tolist() == ["grad_norm"]


def test_a_gamed_verifier_in_a_real_trl_run_is_divergence_first():
    """TRL where training prompts pay for an even first token and held-out prompts (evaluated every
    5 steps) for an odd one (bench/doctor_fixtures.py "divergence"): the logged training reward
    climbs while eval_reward falls. Divergence is reported first and critical; what follows (the
    policy collapsing onto even tokens, groups all-correct) is what the log shows too."""
    history = json.loads((LOGS / "divergence" / "trainer_state.json").read_text())["log_history"]
    held = [e["eval_reward"] for e in history if "eval_reward" in e]
    assert held[0] > 0.3 and held[-1] < 0.05
    for kind in ("trainer_state.json", "tb"):
        result = diagnose(str(LOGS / "divergence" / kind))
        first = min(result.alerts, key=lambda a: a["step"])
        assert (first["detector"], first["severity"], first["signal"]) == \
            ("reward_eval_divergence", "critical", "eval/reward")
        assert first["evidence"]["reward_gain"] > 0 > first["evidence"]["eval_gain"]
        assert {a["detector"] for a in result.alerts} <= {"reward_eval_divergence", "entropy_collapse",
                                                           "lost_diversity", "degenerate_groups"}


def test_recurring_gradient_spikes_in_a_real_trl_run():
    """TRL whose reward function returns 50 for one sample every 8th call, rewards unscaled
    (bench/doctor_fixtures.py "spikes"): the logged grad_norm jumps ~15x every 8 steps; the
    gradient detector reports the spikes it counted, at their steps, and nothing else fires."""
    history = json.loads((LOGS / "spikes" / "trainer_state.json").read_text())["log_history"]
    norms = {e["step"]: e["grad_norm"] for e in history if "grad_norm" in e}
    median = float(np.median(list(norms.values())))
    big = sorted(s for s, g in norms.items() if g > 5 * median)
    for kind in ("trainer_state.json", "tb"):
        result = diagnose(str(LOGS / "spikes" / kind))
        [alert] = result.alerts
        assert alert["detector"] == "gradient" and alert["evidence"]["kind"] == "spikes"
        assert set(alert["evidence"]["spikes"]) <= set(big) and alert["step"] == alert["evidence"]["spikes"][-1]


# ---------------------------------------------------------------------------- peers' mismatch scalars
VERL_PY = Path(__file__).resolve().parents[1] / ".venv" / "verl" / "bin" / "python"
MISMATCH_STEPS, DRIFT = 24, 12          # the detector's baseline is the median of a key's first 10 values


def mismatch_batches() -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per step: trainer and sampler log p of the sampled tokens [B, T] (float32) and the completion mask;
    the sampler drifts ten times more from index DRIFT on (logged step DRIFT + 1)."""
    rng = np.random.default_rng(7)
    out = []
    for step in range(MISMATCH_STEPS):
        lengths = rng.integers(3, 9, size=6)
        mask = np.arange(8)[None, :] < lengths[:, None]
        sampler = -rng.gamma(1.0, 1.0, size=(6, 8))
        drift = rng.normal(0.0, 0.05 if step < DRIFT else 0.5, size=(6, 8))
        trainer = np.minimum(sampler + drift, 0.0)
        out.append((trainer.astype(np.float32), sampler.astype(np.float32), mask))
    return out


def forksight_mismatch(trainer, sampler, mask) -> dict[str, float]:
    import torch

    from forksight.hooks.metrics.mismatch import mismatch_scalars

    return mismatch_scalars(torch.from_numpy(trainer), torch.from_numpy(sampler), torch.from_numpy(mask))


def test_doctor_reads_trls_mismatch_scalars_where_they_mean_forksights(tmp_path, capsys):
    """A trainer_state.json (saved by transformers' TrainerState) holding what GRPOTrainer logs with vLLM's
    importance sampling (trl 1.16 grpo_trainer.py, default sequence_mask with clip max 3): the log p
    difference maps onto mismatch/logp_diff_abs_*, the corrected ratios keep TRL's names."""
    from transformers import TrainerState

    history = []
    for step, (trainer, sampler, mask) in enumerate(mismatch_batches(), 1):
        sampler = sampler.copy()
        sampler[0, 0] = np.nan                                   # a token vLLM could not score
        delta = np.abs(trainer - sampler)[mask & ~np.isnan(sampler)]
        diff = np.nan_to_num((trainer - sampler) * mask, nan=0.0).sum(-1)      # per sequence
        ratio = np.exp(diff)
        ratio = np.where(ratio > 3.0, 0.0, ratio)                               # sequence_mask
        history.append({"step": step, "entropy": 1.0, "reward": 0.5,
                        "sampling/sampling_logp_difference/mean": float(delta.mean()),
                        "sampling/sampling_logp_difference/max": float(delta.max()),
                        "sampling/importance_sampling_ratio/min": float(ratio.min()),
                        "sampling/importance_sampling_ratio/mean": float(ratio.mean()),
                        "sampling/importance_sampling_ratio/max": float(ratio.max())})
    TrainerState(log_history=history, global_step=MISMATCH_STEPS).save_to_json(str(tmp_path / "trainer_state.json"))
    assert cli.main(["doctor", str(tmp_path / "trainer_state.json"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "train_inference_mismatch" in report["checked"]
    result = diagnose(str(tmp_path / "trainer_state.json"))
    fired = [a for a in result.alerts if a["detector"] == "train_inference_mismatch"]
    assert fired and min(a["step"] for a in fired) > DRIFT and fired[0]["signal"] == "mismatch/logp_diff_abs_mean"
    for row, (trainer, sampler, mask), logged in zip(result.rows, mismatch_batches(), history):
        sampler = sampler.copy()
        sampler[0, 0] = np.nan
        ours = forksight_mismatch(trainer, sampler, mask)
        lr = (trainer.astype(np.float64) - sampler)[mask & ~np.isnan(sampler)]
        assert row["mismatch/logp_diff_abs_mean"] == pytest.approx(ours["mismatch/logp_diff_abs_mean"], rel=1e-6)
        assert row["mismatch/logp_diff_abs_mean"] == pytest.approx(np.abs(lr).mean(), rel=1e-6)
        assert row["mismatch/logp_diff_abs_max"] == pytest.approx(np.abs(lr).max(), rel=1e-6)
        # after TRL's masking the ratios are not forksight's token ratios: their own names
        assert row["sampling/importance_sampling_ratio/mean"] == logged["sampling/importance_sampling_ratio/mean"]
        assert not any(k.startswith("mismatch/is_ratio") for k in row)


@pytest.mark.skipif(not VERL_PY.exists(), reason=".venv/verl is absent: `make verl-env` builds it")
def test_doctor_and_import_read_verls_rollout_corr_scalars(tmp_path, capsys):
    """verl's own rollout correction (compute_rollout_correction_and_add_to_batch, token TIS at 2) and debug
    metrics, logged by its Tracking file backend: rollout_corr/kl and k3_kl are forksight's k1 and k3 over
    the same tokens; the truncated ratios, log-PPL and probability differences keep verl's names."""
    from forksight.monitor.collector.store import Store

    batches = mismatch_batches()
    np.savez(tmp_path / "batches.npz", **{f"{name}{s}": a for s, b in enumerate(batches)
                                          for name, a in zip(("trainer", "sampler", "mask"), b)})
    code = f"""
import numpy as np, torch
from verl.protocol import DataProto
from verl.trainer.config.algorithm import RolloutCorrectionConfig
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.utils.tracking import Tracking
data = np.load("batches.npz")
tracking = Tracking(project_name="p", experiment_name="e", default_backend="file")
config = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
for s in range({MISMATCH_STEPS}):
    old, rollout = torch.from_numpy(data[f"trainer{{s}}"]), torch.from_numpy(data[f"sampler{{s}}"])
    mask = torch.from_numpy(data[f"mask{{s}}"]).float()
    batch = DataProto.from_dict(tensors={{"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask,
                                         "responses": torch.zeros_like(old, dtype=torch.long)}})
    metrics = calculate_debug_metrics(batch)
    _, corr = compute_rollout_correction_and_add_to_batch(batch, config)
    tracking.log({{**metrics, **corr, "actor/entropy": 1.0}}, step=s + 1)
tracking.logger["file"].finish()
"""
    log = tmp_path / "verl.jsonl"
    proc = subprocess.run([str(VERL_PY), "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"VERL_FILE_LOGGER_PATH": str(log), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    logged = [json.loads(line)["data"] for line in log.read_text().splitlines()]
    result = diagnose(str(log))
    assert result.kind == "verl" and result.steps == list(range(1, MISMATCH_STEPS + 1))
    assert "train_inference_mismatch" in result.checked
    for row, (trainer, sampler, mask), raw in zip(result.rows, batches, logged):
        ours = forksight_mismatch(trainer, sampler, mask)
        lr = (trainer.astype(np.float64) - sampler)[mask]
        assert row["mismatch/kl_k1"] == pytest.approx(ours["mismatch/kl_k1"], rel=1e-4, abs=1e-7)
        assert row["mismatch/kl_k1"] == pytest.approx(np.mean(-lr), rel=1e-4, abs=1e-7)
        assert row["mismatch/kl_k3"] == pytest.approx(ours["mismatch/kl_k3"], rel=1e-4, abs=1e-7)
        assert row["mismatch/kl_k3"] == pytest.approx(np.mean(np.expm1(lr) - lr), rel=1e-4, abs=1e-7)
        for own in ("rollout_corr/rollout_is_mean", "rollout_corr/log_ppl_diff", "training/rollout_probs_diff_max"):
            assert row[own] == raw[own]
    late = np.mean([r["mismatch/kl_k3"] for r in result.rows[DRIFT:]])
    assert late > 10 * np.mean([r["mismatch/kl_k3"] for r in result.rows[:DRIFT]])    # the drift shows
    fired = [a for a in result.alerts if a["detector"] == "train_inference_mismatch"]
    assert fired and min(a["step"] for a in fired) > DRIFT and fired[0]["signal"] == "mismatch/kl_k3"
    # and `forksight import` stores them under forksight's keys for the run page and the detector
    db = str(tmp_path / "v.duckdb")
    assert cli.main(["import", str(log), "--db", db, "--run", "v"]) == 0
    capsys.readouterr()
    with Store(db) as store:
        stored = store.reader.read_scalars("v", keys=["mismatch/kl_k3"], downsample=1000)
    assert stored["value"].tolist() == pytest.approx([r["mismatch/kl_k3"] for r in result.rows])


def test_doctor_writes_the_logged_run_as_one_html_file(tmp_path, capsys):
    """`doctor PATH --html FILE`: the logged run imported into a temporary store and written as
    `forksight report` writes it; its entropy chart holds the logged entropy, step for step."""
    import re

    out = tmp_path / "collapse.html"
    source = LOGS / "collapse" / "tb"
    assert cli.main(["doctor", str(source), "--html", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text()
    figures = json.loads(re.search(r"const F = (\{.*\}); Plotly", text, re.S).group(1).replace("<\\/", "</"))
    raw = [t for t in figures["entropy"]["data"] if (t.get("meta") or {}).get("key") == "entropy/mean"
           and t["meta"].get("role") == "raw"][0]
    direct = diagnose(str(source))
    assert raw["x"] == direct.steps
    assert raw["y"] == pytest.approx([r["entropy/mean"] for r in direct.rows])
    assert "Plotly.newPlot" in text and "<script src=" not in text       # plotly.js inlined, nothing fetched
    assert cli.main(["doctor", str(source), "--html", str(tmp_path / "missing" / "x.html")]) == 2
    assert "not a writable folder" in capsys.readouterr().err
