"""TrainConfig: every field explains itself; presets, files and flags combine in order;
bad values say what is wrong."""
from __future__ import annotations

import json

import pytest

from forksight.trainer.config import PRESETS, TrainConfig, field_groups, load_config


def test_every_field_has_a_description_and_a_group():
    groups = field_groups()
    assert set(groups) == {"model", "task", "rollout", "optimisation", "selection", "monitoring"}
    for name, info in TrainConfig.model_fields.items():
        assert info.description and len(info.description) > 10, name


def test_precedence_preset_then_file_then_flags(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("lr: 0.005\nstrategy: ict\nsteps: 7\n")
    cfg = load_config(str(cfg_file), "collapse", {"steps": 3, "seed": None})
    assert cfg.task == "collapse"          # from the preset
    assert cfg.lr == 0.005 and cfg.strategy == "ict"   # the file beats the preset
    assert cfg.steps == 3                  # the flag beats the file; None means "not given"
    assert cfg.effective_rho == 0.1        # ICT's own default ρ
    json_file = tmp_path / "run.json"
    json_file.write_text(json.dumps({"strategy": "fork", "rho": 0.3}))
    assert load_config(str(json_file)).effective_rho == 0.3


def test_errors_name_the_field_and_the_reason(tmp_path):
    with pytest.raises(ValueError, match=r"rho: Input should be less than or equal to 1"):
        load_config(overrides={"rho": 2})
    with pytest.raises(ValueError, match=r"strategy: Input should be 'all'"):
        load_config(overrides={"strategy": "everything"})
    with pytest.raises(ValueError, match=r"lerning_rate: unknown field.* Valid fields: .*\blr\b"):
        load_config(overrides={"lerning_rate": 1e-3})
    with pytest.raises(ValueError, match="task_path"):
        load_config(overrides={"task": "jsonl"})
    with pytest.raises(ValueError, match="not both"):
        load_config(overrides={"db": "a.duckdb", "url": "http://127.0.0.1:1"})
    with pytest.raises(ValueError, match="device must be cpu, cuda, cuda:N or mps, got 'gpu'"):
        load_config(overrides={"device": "gpu"})
    with pytest.raises(ValueError, match="unknown preset 'fast'"):
        load_config(preset="fast")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(str(bad))


def test_presets_are_valid_configs():
    for name in PRESETS:
        load_config(preset=name)
    assert load_config(preset="collapse").lr > 5 * load_config(preset="healthy").lr
