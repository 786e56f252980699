"""`forksight demo` trains each strategy at the lr the strategy sweep chose for it
(trainer/fair_settings.json, generated from docs/strategies.json), unless told otherwise."""
from __future__ import annotations

import json

from forksight.compose.cli import build_parser
from forksight.compose.demo import _train_argv
from forksight.trainer import fair
from forksight.trainer.config import PRESETS


def _args(*flags: str):
    return build_parser().parse_args(["demo", *flags])


def _lr(argv: list[str]) -> str | None:
    return argv[argv.index("--lr") + 1] if "--lr" in argv else None


def test_each_strategy_trains_at_its_own_fair_lr_and_preset_or_train_arg_override_it(tmp_path, monkeypatch):
    settings = tmp_path / "fair_settings.json"
    settings.write_text(json.dumps({"presets": {"readable": {"all": {"lr": 0.0005}, "ict": {"lr": 5e-05}}}}))
    monkeypatch.setattr(fair, "SETTINGS", settings)
    fair.fair_settings.cache_clear()
    try:
        url = "http://127.0.0.1:1"
        assert _lr(_train_argv("all", _args(), url)) == "0.0005"
        assert _lr(_train_argv("ict", _args(), url)) == "5e-05"
        assert _lr(_train_argv("fork", _args(), url)) is None            # not measured: the preset's lr
        assert _lr(_train_argv("ict", _args("--preset", "collapse"), url)) is None
        assert _lr(_train_argv("ict", _args("--lr", "preset"), url)) is None
        argv = _train_argv("ict", _args("--train-arg", "lr=0.001"), url)
        assert _lr(argv) == "0.001" and argv.count("--lr") == 1          # the user's flag wins, once
    finally:
        fair.fair_settings.cache_clear()


def test_the_committed_fair_settings_name_known_presets_and_positive_lrs():
    found = fair.fair_settings()
    if not found:                   # the sweep has not been run into this checkout
        assert not fair.SETTINGS.exists()
        return
    assert set(found["presets"]) <= set(PRESETS)
    for strategies in found["presets"].values():
        assert all(row["lr"] > 0 for row in strategies.values())
