"""Supervised warm-up: the target mask, both losses lowering the error, the stop on measured
pass@1, and the cache keyed by task, loss, target and seed."""
from __future__ import annotations

import json
import random

import pytest
import torch

from forksight.trainer.rollout import completion_logits, token_logp
from forksight.trainer.tasks import ArithmeticTask, Problem
from forksight.trainer.warmup import encode_targets, ensure_warm, supervised, warm_path


def test_encode_targets_marks_exactly_the_answer_and_eos(tiny):
    _, tokenizer = tiny
    problems = [Problem("12+34=", "46", "64"), Problem("5+7=", "12", "21")]
    ids, attn, target = encode_targets(tokenizer, problems)
    eos = tokenizer.eos_token_id
    for row, p in enumerate(problems):
        got = ids[row][target[row]].tolist()
        assert got == tokenizer(p.target).input_ids + [eos]
        real = ids[row][attn[row].bool()].tolist()
        assert real == tokenizer(p.prompt).input_ids + got  # left padding only
    assert attn[1, 0] == 0 and ids[1, 0] == tokenizer.pad_token_id


def _target_nll(model, tokenizer, problems) -> float:
    ids, attn, target = encode_targets(tokenizer, problems)
    with torch.no_grad():
        logp = token_logp(completion_logits(model, ids, attn, 1), ids[:, 1:], 1.0)
    return float(-logp[target[:, 1:]].mean())


@pytest.mark.parametrize("loss", ["ce", "bounded"])
def test_both_losses_lower_the_answer_nll_and_stop_on_measured_pass(tiny, loss):
    model, tokenizer = tiny
    task = ArithmeticTask(level=1)
    probe = [task.sample(random.Random(5)) for _ in range(64)]
    before = _target_nll(model, tokenizer, probe)
    info = supervised(model, tokenizer, task, target_pass=0.0, loss=loss, batch=64,
                      eval_every=6, progress=False)
    assert info["steps"] == 6 and info["reached"]  # pass@1 ≥ 0 is met at the first check
    assert _target_nll(model, tokenizer, probe) < before - 0.05
    with pytest.raises(ValueError, match="'ce' or 'bounded'"):
        supervised(model, tokenizer, task, target_pass=0.0, loss="mse")


def test_warm_models_are_cached_per_target(tmp_path, monkeypatch, tiny_model_path):
    monkeypatch.setenv("FORKSIGHT_HOME", str(tmp_path))
    task = ArithmeticTask(level=1)
    path = ensure_warm(tiny_model_path, task, target_pass=0.0, progress=False, batch=16,
                       eval_every=2)
    assert path == warm_path(tiny_model_path, task, 0.0, "ce", 0)
    info = json.loads((path / "warmup.json").read_text())
    assert info["steps"] == 2 and info["task"] == "arith1r"
    stamp = (path / "warmup.json").stat().st_mtime_ns
    again = ensure_warm(tiny_model_path, task, target_pass=0.0, progress=False)
    assert again == path and (path / "warmup.json").stat().st_mtime_ns == stamp  # not retrained
    assert warm_path(tiny_model_path, task, 0.5, "ce", 0) != path
    assert warm_path(tiny_model_path, task, 0.0, "bounded", 0) != path


def test_a_cached_warm_up_that_missed_its_target_is_done_again(tmp_path, monkeypatch, tiny_model_path, capsys):
    monkeypatch.setenv("FORKSIGHT_HOME", str(tmp_path))
    task = ArithmeticTask(level=1)
    path = ensure_warm(tiny_model_path, task, target_pass=0.0, progress=False, batch=16, eval_every=2)
    info = json.loads((path / "warmup.json").read_text())
    (path / "warmup.json").write_text(json.dumps({**info, "reached": False, "pass@1": 0.0}))  # as a busy box left it
    again = ensure_warm(tiny_model_path, task, target_pass=0.0, progress=False, batch=16, eval_every=2)
    assert again == path and json.loads((path / "warmup.json").read_text())["reached"] is True
    said = capsys.readouterr().out
    assert f"stopped at pass@1 0.0 short of 0 after {info['seconds']} s (its time ran out); warming up again" in said
    assert not path.with_name(path.name + ".tmp").exists()
