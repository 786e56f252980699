"""A W&B offline run written by the real wandb (WANDB_MODE=offline, wandb.init(dir=tmp), wandb.log
over steps, finish()), read back from its run-*.wandb file with wandb's own reader: values as
logged, names as forksight's keys, and `forksight doctor` / `forksight import` on the directory."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("wandb.sdk.internal.datastore",
                    reason="needs wandb < 0.30, whose Python package ships the .wandb reader (the dev extra)")

from forksight.monitor.importers import SourceError, read_source  # noqa: E402

STEPS = 40


def series(step: int) -> dict[str, float]:
    # entropy falls while reward stays flat: the collapse doctor must name
    return {"train/reward": 0.2, "train/entropy": 2.0 * math.exp(-step / 8), "train/kl": 0.001 * step,
            "train/completions/clipped_ratio": 0.0, "custom/thing": float(step)}


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wb")
    code = ("import math, wandb\n"
            f"run = wandb.init(dir={str(tmp)!r}, project='p', name='flat-collapse', config={{'lr': 1e-5}})\n"
            "for step in range(%d):\n"
            "    wandb.log({'train/reward': 0.2, 'train/entropy': 2.0 * math.exp(-step / 8),\n"
            "               'train/kl': 0.001 * step, 'train/completions/clipped_ratio': 0.0,\n"
            "               'custom/thing': float(step), 'train/grad_norm': float('nan') if step == 5 else 1.0},\n"
            "              step=step)\n"
            "run.finish()\n") % STEPS
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HOME": str(tmp),
           "WANDB_DISABLE_GIT": "true"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = list((tmp / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))
    return runs[0]


def test_history_read_from_the_wandb_file(wandb_dir):
    run = read_source(wandb_dir)
    assert run.kind == "wandb" and run.name == "flat-collapse" and run.config["lr"] == 1e-5
    assert run.steps == list(range(STEPS))
    for step, row in zip(run.steps, run.rows):
        expected = series(step)
        assert row["entropy/mean"] == expected["train/entropy"]          # JSON on disk: exact float64
        assert row["reward/mean"] == 0.2 and row["kl"] == expected["train/kl"]
        assert row["length/clip_frac"] == 0.0 and row["custom/thing"] == step
        assert not any(k.startswith("_") for k in row)                  # _step, _runtime, _timestamp
    assert math.isnan(run.rows[5]["grad_norm"]) and run.rows[6]["grad_norm"] == 1.0
    # the parent wandb/ directory and the .wandb file itself name the same run
    assert read_source(wandb_dir.parent).steps == read_source(next(wandb_dir.glob("*.wandb"))).steps == run.steps


def test_doctor_and_import_on_the_run_directory(wandb_dir, tmp_path, capsys):
    from forksight.compose import cli

    assert cli.main(["doctor", str(wandb_dir), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "wandb" and report["steps"] == STEPS
    detectors = {f["detector"] for f in report["findings"]}
    assert "entropy_collapse" in detectors and "non_finite" in detectors, detectors
    assert cli.main(["import", str(wandb_dir), "--db", str(tmp_path / "w.duckdb")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["format"] == "wandb" and summary["steps"] == STEPS and summary["alerts"] >= 2


def test_a_damaged_wandb_file_says_what_was_expected(tmp_path):
    (tmp_path / "run-x.wandb").write_bytes(b"not a log at all")
    with pytest.raises(SourceError, match="expected a W&B offline run directory"):
        read_source(tmp_path)
