"""A misspelt key in a training or alert config says which valid key it is close to (difflib) and
lists the valid fields of that level, from a file, an override and the CLI alike."""
from __future__ import annotations

import subprocess
import sys

import pytest

from forksight.base.errors import unknown_field, validation_message
from forksight.monitor.alerts.config import AlertConfig, CollapseConfig
from forksight.monitor.alerts.hub import load_alert_config
from forksight.trainer.config import TrainConfig, load_config


def test_unknown_field_suggests_close_names_and_lists_all():
    assert unknown_field("strategyy", ["strategy", "steps"]) == (
        "unknown field; did you mean 'strategy'? Valid fields: strategy, steps")
    assert unknown_field("zzz", ["a", "b"]) == "unknown field Valid fields: a, b"      # nothing close
    assert unknown_field("x", []) == "unknown field"


def test_training_config_typo_names_the_key_it_meant(tmp_path):
    with pytest.raises(ValueError) as err:
        load_config(overrides={"group_sise": 4})
    text = str(err.value)
    assert "group_sise: unknown field; did you mean 'group_size'?" in text
    assert "Valid fields: " + ", ".join(TrainConfig.model_fields) in text
    path = tmp_path / "run.yaml"
    path.write_text("strategy: fork\nlearning_rate: 0.001\n")
    with pytest.raises(ValueError, match="learning_rate: unknown field"):
        load_config(str(path))


def test_alert_config_typo_at_either_level_names_the_key_it_meant(tmp_path):
    with pytest.raises(ValueError) as err:
        load_alert_config(overrides=["collapse.flor=0.1"])
    assert "collapse.flor: unknown field; did you mean 'floor'?" in str(err.value)
    assert "Valid fields: " + ", ".join(CollapseConfig.model_fields) in str(err.value)
    path = tmp_path / "alerts.yaml"
    path.write_text("colapse:\n  floor: 0.1\n")
    with pytest.raises(ValueError, match="colapse: unknown field; did you mean 'collapse'"):
        load_alert_config(path)
    # other errors keep pydantic's reason
    errors = [{"loc": ("fork", "smoothing"), "msg": "Input should be less than 1", "type": "less_than"}]
    assert validation_message(errors, root="config", model=AlertConfig) == "fork.smoothing: Input should be less than 1"


def test_serve_and_train_print_the_hint_without_a_traceback(tmp_path):
    serve = subprocess.run([sys.executable, "-m", "forksight", "serve", "--db", str(tmp_path / "x.duckdb"),
                            "--port", "9", "--alert", "collapse.drop_fracton=0.5"],
                           capture_output=True, text=True, timeout=120)
    assert serve.returncode == 2 and "did you mean 'drop_fraction'" in serve.stderr
    assert "Traceback" not in serve.stderr and not (tmp_path / "x.duckdb").exists()
    config = tmp_path / "c.json"
    config.write_text('{"temprature": 0.7}')
    train = subprocess.run([sys.executable, "-m", "forksight", "train", "--config", str(config)],
                           capture_output=True, text=True, timeout=120)
    assert train.returncode == 2 and "did you mean 'temperature'?" in train.stderr
    assert "Traceback" not in train.stderr
