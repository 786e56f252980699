"""`forksight doctor` and `forksight import` on real logs: TRL's trainer_state.json and the
TensorBoard events its SummaryWriter wrote for a collapsing (lr 1e-2) and a healthy (lr 3e-4)
GRPO run of the tiny model (tests/data/trl_logs, by bench/doctor_fixtures.py). The collapse is
judged from the logged entropy here, not by the detectors."""
from __future__ import annotations

import json
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
