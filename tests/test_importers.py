"""Runs logged elsewhere, read from files the tools themselves wrote: TensorBoard's SummaryWriter,
verl's Tracking "file" backend (in .venv/verl), TRL's trainer_state.json (tests/data/trl_logs, by
bench/doctor_fixtures.py), pandas' CSV and JSONL of step dicts. Values come back as written, names
as forksight's keys; a source that is none of these says what was expected."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from forksight.monitor.importers import SourceError, canonical, read_source

REPO = Path(__file__).resolve().parents[1]
TRL_LOGS = REPO / "tests" / "data" / "trl_logs"
VERL_PY = REPO / ".venv" / "verl" / "bin" / "python"


def series(step: int) -> dict[str, float]:
    return {"reward": 0.1 + 0.01 * step, "entropy": 2.0 * math.exp(-step / 20), "kl": 0.001 * step,
            "completions/clipped_ratio": 0.25, "rewards/format_reward/mean": 0.5, "custom/thing": float(step)}


def test_canonical_names_for_trl_verl_and_openrlhf():
    assert canonical("reward") == canonical("critic/score/mean") == canonical("train/reward") == "reward/mean"
    assert canonical("frac_reward_zero_std") == "groups/zero_var_frac"
    assert canonical("actor/entropy") == canonical("entropy") == "entropy/mean"
    assert canonical("clip_ratio/region_mean") == canonical("actor/pg_clipfrac") == "clip/frac"
    assert canonical("completions/clipped_ratio") == canonical("response_length/clip_ratio") == "length/clip_frac"
    assert canonical("val-core/gsm8k/reward/mean@4") == canonical("eval_reward") == "eval/reward"
    assert canonical("train/rewards/format_reward/mean") == "rewards/format_reward/mean"
    assert canonical("my/own") == "my/own" and canonical("eval_loss") == "eval/loss"


def test_mismatch_names_map_only_where_the_meaning_is_forksights():
    assert canonical("rollout_corr/kl") == "mismatch/kl_k1"                     # verl: mean(log p_sampler − log p_train)
    assert canonical("rollout_corr/k3_kl") == canonical("mismatch_kl/all/mean") == "mismatch/kl_k3"   # verl, prime-rl
    assert canonical("train/sampling/sampling_logp_difference/mean") == "mismatch/logp_diff_abs_mean"  # TRL in TB
    assert canonical("sampling/sampling_logp_difference/max") == "mismatch/logp_diff_abs_max"
    # ratios after the run's own truncation/masking, sequence-level PPL, probability (not log p) differences
    for own in ("sampling/importance_sampling_ratio/mean", "rollout_corr/rollout_is_max", "rollout_corr/log_ppl_diff",
                "training/rollout_probs_diff_max", "rollout_corr/rollout_rs_masked_fraction"):
        assert canonical(own) == own


def test_tensorboard_directory_written_by_summarywriter(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path / "run"))
    for step in range(30):
        for key, value in series(step).items():
            writer.add_scalar(f"train/{key}", value, step)
    writer.add_scalar("train/grad_norm", float("nan"), 7)
    writer.close()
    run = read_source(tmp_path)           # the parent: the one events directory is found
    assert run.kind == "tensorboard" and run.steps == list(range(30)) and run.name == "run"
    for step, row in zip(run.steps, run.rows):
        expected = series(step)
        assert row["reward/mean"] == pytest.approx(expected["reward"], rel=1e-6)       # float32 on disk
        assert row["entropy/mean"] == pytest.approx(expected["entropy"], rel=1e-6)
        assert row["length/clip_frac"] == pytest.approx(0.25) and row["custom/thing"] == pytest.approx(step)
        assert row["rewards/format_reward/mean"] == pytest.approx(0.5)
    assert math.isnan(run.rows[7]["grad_norm"])                 # kept for the non-finite detector
    assert run.renamed["train/reward"] == "reward/mean"


def test_two_tensorboard_runs_in_one_directory_ask_which(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for name in ("a", "b"):
        with SummaryWriter(str(tmp_path / name)) as w:
            w.add_scalar("reward", 1.0, 0)
    with pytest.raises(SourceError, match="2 TensorBoard runs"):
        read_source(tmp_path)
    assert read_source(tmp_path / "b").rows == [{"reward/mean": 1.0}]


@pytest.mark.skipif(not VERL_PY.exists(), reason=".venv/verl is absent: `make verl-env` builds it")
def test_verl_file_logger_jsonl(tmp_path):
    path = tmp_path / "verl.jsonl"
    code = ("import os\nfrom verl.utils.tracking import Tracking\n"
            "t = Tracking(project_name='p', experiment_name='e', default_backend='file')\n"
            "for s in range(1, 21):\n"
            "    t.log({'critic/score/mean': 0.1 * s, 'actor/entropy': 1.0 / s, 'actor/pg_clipfrac': 0.01,\n"
            "           'response_length/clip_ratio': 0.0, 'val-core/gsm8k/reward/mean@1': 0.3}, step=s)\n"
            "t.logger['file'].finish()\n")
    proc = subprocess.run([str(VERL_PY), "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={"VERL_FILE_LOGGER_PATH": str(path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = read_source(path)
    assert run.kind == "verl" and run.steps == list(range(1, 21))
    assert [r["reward/mean"] for r in run.rows] == pytest.approx([0.1 * s for s in range(1, 21)])
    assert run.rows[3]["entropy/mean"] == pytest.approx(0.25) and run.rows[0]["eval/reward"] == 0.3
    assert run.rows[0]["clip/frac"] == 0.01


def test_csv_and_jsonl_of_step_dicts_written_by_pandas(tmp_path):
    frame = pd.DataFrame([{"step": s, "reward": 0.5, "policy_loss": -s / 10, "response_length": 100 + s}
                          for s in range(0, 50, 5)])
    frame.to_csv(tmp_path / "run.csv", index=False)
    frame.to_json(tmp_path / "run.jsonl", orient="records", lines=True)
    for name in ("run.csv", "run.jsonl"):
        run = read_source(tmp_path / name)
        assert run.steps == list(range(0, 50, 5))
        assert [r["loss"] for r in run.rows] == pytest.approx([-s / 10 for s in run.steps])
        assert run.rows[2]["length/mean"] == 110 and run.rows[0]["reward/mean"] == 0.5


def test_trl_trainer_state_and_checkpoint_directory(tmp_path):
    state = TRL_LOGS / "collapse" / "trainer_state.json"
    history = json.loads(state.read_text())["log_history"]
    run = read_source(state)
    logged = [h for h in history if "train_runtime" not in h]
    assert run.kind == "trl" and run.steps == sorted({h["step"] for h in logged})
    first = next(h for h in logged if h["step"] == run.steps[0])
    assert run.rows[0]["entropy/mean"] == first["entropy"] and run.rows[0]["reward/mean"] == first["reward"]
    # the output directory of a run: the latest checkpoint's state is read
    for n in (10, 60):
        (tmp_path / f"checkpoint-{n}").mkdir()
        (tmp_path / f"checkpoint-{n}" / "trainer_state.json").write_text(json.dumps(
            {"log_history": [h for h in history if h.get("step", 0) <= n]}))
    assert read_source(tmp_path).steps == run.steps


@pytest.mark.parametrize("make, expected", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: p, "holds no trainer_state.json"),
    (lambda p: (p / "state.json").write_text('{"global_step": 3}') and p / "state.json", "no log_history"),
    (lambda p: (p / "x.csv").write_text("a,b\n1,2\n") and p / "x.csv", "no step column"),
    (lambda p: (p / "x.jsonl").write_text("not json\n") and p / "x.jsonl", "line 1 is not JSON"),
    (lambda p: (p / "run-abc.wandb").write_bytes(b"\x00") and p, "is not a W&B run log.*expected a W&B offline"),
    (lambda p: (p / "x.bin").write_bytes(b"\x00") and p / "x.bin", "unknown kind of file"),
])
def test_unreadable_sources_say_what_was_expected(tmp_path, make, expected):
    with pytest.raises(SourceError, match=expected):
        read_source(make(tmp_path))


def test_importers_import_no_torch():
    code = "import sys, forksight.monitor.importers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
