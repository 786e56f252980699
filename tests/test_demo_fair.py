"""`forksight demo`'s runs: by default (--lr contrast) plain GRPO twice, at the preset's lr (a common
one, chosen by no sweep) and at the lr the strategy sweep chose for it (trainer/fair_settings.json,
generated from docs/strategies.json), the other strategies at the sweep's lr; each run's name and
label say its lr and why. --lr fair / preset and a --train-arg lr=X change that."""
from __future__ import annotations

import json

import pytest

from forksight.compose.cli import build_parser
from forksight.compose.demo import _train_argv, lr_text, plan_runs
from forksight.trainer import fair
from forksight.trainer.config import PRESETS

URL = "http://127.0.0.1:1"


def _args(*flags: str):
    return build_parser().parse_args(["demo", *flags])


def _lr(argv: list[str]) -> str | None:
    return argv[argv.index("--lr") + 1] if "--lr" in argv else None


@pytest.fixture
def settings(tmp_path, monkeypatch):
    path = tmp_path / "fair_settings.json"
    path.write_text(json.dumps({"presets": {"readable": {"all": {"lr": 5e-05}, "ict": {"lr": 5e-05}}}}))
    monkeypatch.setattr(fair, "SETTINGS", path)
    fair.fair_settings.cache_clear()
    yield
    fair.fair_settings.cache_clear()


def _plan(*flags: str, strategies=("all", "fork", "ict")):
    return [(r.strategy, r.lr, r.why) for r in plan_runs(list(strategies), _args(*flags))]


def test_by_default_plain_grpo_trains_at_the_common_lr_and_at_the_sweeps_beside_the_others(settings):
    preset = PRESETS["readable"]["lr"]
    assert _plan() == [("all", preset, "common"), ("all", 5e-05, "sweep's best"),
                       ("fork", preset, "preset's"),            # not in the sweep's file: the preset's
                       ("ict", 5e-05, "sweep's best")]
    runs = plan_runs(["all", "ict"], _args())
    assert [r.name for r in runs] == ["all-lr5e-4-common", "all-lr5e-5-sweep-best", "ict-lr5e-5-sweep-best"]
    assert [r.label for r in runs] == ["all · lr 5e-4 (common)", "all · lr 5e-5 (sweep's best)",
                                       "ict · lr 5e-5 (sweep's best)"]
    argv = _train_argv(runs[0], _args(), URL)
    assert _lr(argv) == "0.0005" and argv[argv.index("--run") + 1] == "all-lr5e-4-common"
    assert argv[argv.index("--eval-every") + 1] == "25"     # held-out pass@k on the run page


def test_fair_preset_and_a_given_lr_train_each_strategy_once(settings):
    preset = PRESETS["readable"]["lr"]
    assert _plan("--lr", "fair") == [("all", 5e-05, "sweep's best"), ("fork", preset, "preset's"),
                                     ("ict", 5e-05, "sweep's best")]
    assert _plan("--lr", "preset") == [(s, preset, "preset's") for s in ("all", "fork", "ict")]
    assert _plan("--preset", "collapse") == [(s, PRESETS["collapse"]["lr"], "preset's") for s in ("all", "fork", "ict")]
    assert _plan("--train-arg", "lr=0.001") == [(s, 0.001, "given") for s in ("all", "fork", "ict")]
    argv = _train_argv(plan_runs(["ict"], _args("--train-arg", "lr=0.001"))[0],
                       _args("--train-arg", "lr=0.001"), URL)
    assert _lr(argv) == "0.001" and argv.count("--lr") == 1          # the user's flag, once
    # the contrast is the first strategy's: --strategies fork,all trains fork twice if the sweep has it
    assert [w for s, _, w in _plan(strategies=("ict", "all"))] == ["common", "sweep's best", "sweep's best"]


@pytest.mark.parametrize("lr, text", [(5e-4, "5e-4"), (5.56e-05, "5.56e-5"), (3e-3, "3e-3"), (1.5e-3, "1.5e-3"),
                                      (1.0, "1e0")])
def test_lr_text_is_short_and_exact_to_three_digits(lr, text):
    assert lr_text(lr) == text and float(text) == pytest.approx(lr, rel=5e-3)


def test_the_committed_fair_settings_name_known_presets_and_positive_lrs():
    found = fair.fair_settings()
    if not found:                   # the sweep has not been run into this checkout
        assert not fair.SETTINGS.exists()
        return
    assert set(found["presets"]) <= set(PRESETS)
    for strategies in found["presets"].values():
        assert all(row["lr"] > 0 for row in strategies.values())
