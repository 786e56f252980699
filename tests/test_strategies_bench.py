"""bench/strategies.py (issue 36's fair comparison): the bootstrap interval, the one lr rule,
the collapse step against the real detector, the docs' strategy table from a JSON fixture, held-out
problems of a pool run, and a real --quick sweep whose cell commands rerun to the same figures."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from forksight.monitor.alerts.hub import AlertMonitor
from forksight.trainer.tasks import ProblemPool, held_out, make_task

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import strategies  # noqa: E402
import strategies_figures as sf  # noqa: E402
import strategies_stats as ss  # noqa: E402
import strategies_table as st  # noqa: E402
import strategies_view as sv  # noqa: E402

pytestmark = pytest.mark.trajectory   # asserts on trained runs: `make test-kernels` runs it under each CPU kernel level


# ------------------------------------------------------------------------------ bootstrap interval
def test_identical_values_give_a_zero_width_interval():
    out = ss.bootstrap_ci([0.375, 0.375, 0.375])
    assert out == {"mean": 0.375, "lo": 0.375, "hi": 0.375, "n": 3}


def test_two_values_interval_by_hand():
    # resample means of [0, 1]: 0 w.p. 1/4, 0.5 w.p. 1/2, 1 w.p. 1/4; the 2.5% and 97.5%
    # quantiles fall inside the outer atoms (each holds 25% > 2.5%): 0 and 1
    out = ss.bootstrap_ci([0.0, 1.0])
    assert (out["mean"], out["lo"], out["hi"]) == (0.5, 0.0, 1.0)


def test_three_values_interval_by_hand():
    # [0, 0, 1]: the resample mean is 1 only if all three draws are the 1: (1/3)^3 = 3.7% > 2.5%,
    # so the 97.5% quantile is 1; it is 0 with (2/3)^3 = 29.6% > 2.5%, so the 2.5% quantile is 0
    out = ss.bootstrap_ci([0.0, 0.0, 1.0])
    assert out["mean"] == pytest.approx(1 / 3) and out["lo"] == 0.0 and out["hi"] == 1.0


def test_interval_matches_the_exact_resampling_distribution():
    # every one of the 5^5 resamples of 5 values enumerated with its weight: the exact 2.5% and
    # 97.5% quantiles of the resample mean; 10,000 resamples land within a small step of them
    values = np.array([0.1, 0.4, 0.45, 0.7, 0.95])
    idx = np.indices((5,) * 5).reshape(5, -1).T
    means = np.sort(values[idx].mean(axis=1))
    lo_exact, hi_exact = np.quantile(means, [0.025, 0.975])
    out = ss.bootstrap_ci(list(values))
    assert out["lo"] == pytest.approx(lo_exact, abs=0.02) and out["hi"] == pytest.approx(hi_exact, abs=0.02)
    assert out["lo"] < out["mean"] < out["hi"]


def test_interval_agrees_with_scipy_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    values = [0.2, 0.5, 0.55, 0.9, 0.3, 0.65]
    ref = scipy_stats.bootstrap((values,), np.mean, n_resamples=20_000, method="percentile",
                                confidence_level=0.95, random_state=1).confidence_interval
    out = ss.bootstrap_ci(values)
    assert out["lo"] == pytest.approx(ref.low, abs=0.02) and out["hi"] == pytest.approx(ref.high, abs=0.02)


def test_interval_is_seeded_and_skips_missing_values():
    assert ss.bootstrap_ci([0.1, 0.5, 0.9], seed=3) == ss.bootstrap_ci([0.1, None, 0.5, 0.9], seed=3)
    assert ss.bootstrap_ci([None]) == {"mean": None, "lo": None, "hi": None, "n": 0}


# ------------------------------------------------------------------------------ the lr rule
def _cell(lr, seed, p8, p1, **kw):
    return {"task": "t", "strategy": "s", "lr": lr, "seed": seed, "eval_pass8_end": p8, "eval_pass1_end": p1, **kw}


def test_lr_with_the_highest_mean_pass8_wins_even_if_one_seed_is_best_elsewhere():
    cells = [_cell(1e-4, 0, 0.9, 0.1), _cell(1e-4, 1, 0.1, 0.1),     # mean 0.5, best single seed
             _cell(3e-4, 0, 0.6, 0.1), _cell(3e-4, 1, 0.6, 0.1)]     # mean 0.6
    assert ss.choose_lr(cells) == 3e-4


def test_tie_on_pass8_goes_to_pass1_then_to_the_smaller_lr():
    tie = [_cell(1e-4, 0, 0.5, 0.2), _cell(3e-4, 0, 0.5, 0.3), _cell(1e-3, 0, 0.5, 0.1)]
    assert ss.choose_lr(tie) == 3e-4
    full_tie = [_cell(3e-4, 0, 0.5, 0.2), _cell(1e-4, 0, 0.5, 0.2)]
    assert ss.choose_lr(full_tie) == 1e-4


def test_summary_reports_the_chosen_lr_cells_only():
    cells = [_cell(1e-4, 0, 0.2, 0.1, collapse_step=None), _cell(1e-4, 1, 0.4, 0.1, collapse_step=50),
             _cell(3e-4, 0, 0.5, 0.3, collapse_step=40), _cell(3e-4, 1, 0.7, 0.2, collapse_step=None),
             _cell(3e-4, 2, 0.9, 0.1, collapse_step=60)]
    row = ss.summarise(cells)["t"]["s"]
    assert row["lr"] == 3e-4 and row["seeds"] == [0, 1, 2]
    assert row["figures"]["eval_pass8_end"]["mean"] == pytest.approx((0.5 + 0.7 + 0.9) / 3)
    assert row["figures"]["eval_pass8_end"]["lo"] >= 0.5 and row["figures"]["eval_pass8_end"]["hi"] <= 0.9
    collapse = row["figures"]["collapse_step"]
    assert (collapse["collapsed"], collapse["of"], collapse["mean"]) == (2, 3, 50.0)
    assert row["lr_scores"]["0.0001"]["eval_pass8_end"] == pytest.approx(0.3)
    json.dumps(row, allow_nan=False)  # no NaN or inf reaches the JSON


# ------------------------------------------------------------------------------ figures of a run
def _entropy_run(n=80, drop_at=30):
    """Entropy flat at 0.8 then falling geometrically (a collapse), reward rising."""
    rows = {}
    for step in range(1, n + 1):
        h = 0.8 if step < drop_at else 0.8 * 0.85 ** (step - drop_at + 1)
        rows[step] = {"entropy/mean": h, "reward/mean": min(1.0, step / 50), "fork/frac": h / 4}
    return rows


def test_floor_step_is_where_raw_entropy_crosses_the_detector_floor():
    rows = _entropy_run()
    entropy = [rows[s]["entropy/mean"] for s in sorted(rows)]
    # floor = max(0.05, 0.8 × (1 − 0.9)) = 0.08; 0.8·0.85^k < 0.08 first for k = 15 → step 30 + 14
    assert sf.entropy_floor(entropy) == pytest.approx(0.08)
    assert sf.floor_step(sorted(rows), entropy) == 44


def test_collapse_figures_agree_with_the_real_detector():
    rows = _entropy_run()
    monitor = AlertMonitor()
    alerts = [{"detector": a.detector, "severity": a.severity, "step": a.step, "threshold": a.threshold}
              for s in sorted(rows) for a in monitor.observe(s, rows[s])]
    crit = [a for a in alerts if a["detector"] == "entropy_collapse" and a["severity"] == "critical"]
    assert crit, "the detector should go critical on this series"
    figs = sf.figures(rows, alerts)
    assert figs["collapse_step"] == crit[0]["step"]
    assert figs["entropy_floor"] == pytest.approx(crit[0]["threshold"])  # the floor the detector used
    assert figs["collapse_step_floor"] <= figs["collapse_step"]  # raw values cross before the EMA does
    warn = [a["step"] for a in alerts if a["detector"] == "entropy_collapse" and a["severity"] == "warning"]
    assert figs["collapse_warning_step"] == (min(warn) if warn else None)


def test_train_and_eval_windows():
    rows = {s: {"reward/mean": float(s), "entropy/mean": 1.0} for s in range(1, 31)}
    rows[10].update({"eval/pass@1": 0.2, "eval/pass@8": 0.5})
    rows[20].update({"eval/pass@1": 0.4, "eval/pass@8": 0.7})
    rows[30].update({"eval/pass@1": 0.3, "eval/pass@8": 0.6})
    figs = sf.figures(rows, [])
    assert figs["reward_start"] == pytest.approx(5.5) and figs["reward_end"] == pytest.approx(25.5)
    assert figs["reward_peak"] == pytest.approx(25.5)  # best 10-step rolling mean of a rising line
    assert (figs["eval_pass8_start"], figs["eval_pass8_peak"], figs["eval_pass8_end"]) == (0.5, 0.7, 0.6)
    assert figs["eval_steps"] == [10, 20, 30] and figs["collapse_step"] is None
    assert figs["collapse_step_floor"] is None and figs["fork_frac_end"] is None


# ------------------------------------------------------------------------------ held-out of a pool
def test_held_out_problems_of_a_pool_run_are_not_its_training_problems():
    task = make_task("steps", level=1, graded=True)
    pool = ProblemPool(task, 4, seed=0)
    problems = held_out(pool, 32, 0)
    assert len(problems) == 32
    assert not {p.prompt for p in problems} & {p.prompt for p in pool.problems}
    # a plain task's held-out set is unchanged: the same seeded draws
    import random

    rng = random.Random("eval-0")
    assert [p.prompt for p in held_out(task, 5, 0)] == [task.sample(rng).prompt for _ in range(5)]


# ------------------------------------------------------------------------------ the docs' table
FIXTURE = {
    "meta": {"rule": "RULE", "interval": "INTERVAL", "date": "2026-12-04T16:00:00+00:00", "quick": False,
             "tasks": {"arith": {"preset": "healthy"}}, "commit": "abc",
             "steps": {"arith": 200}, "grid": {"seeds": [0, 1, 2], "lrs": {"arith": [0.0001, 0.0003]}}},
    "summary": {"arith": {
        "all": {"lr": 0.0003, "seeds": [0, 1, 2], "figures": {
            "eval_pass8_end": {"mean": 0.5, "lo": 0.4, "hi": 0.625}, "eval_pass1_end": {"mean": 0.25, "lo": 0.2, "hi": 0.3},
            "eval_pass8_start": {"mean": 0.45, "lo": 0.45, "hi": 0.45}, "reward_end": {"mean": 0.875, "lo": 0.8, "hi": 0.95},
            "entropy_end": {"mean": 0.12345, "lo": 0.1, "hi": 0.15}, "fork_frac_end": {"mean": 0.0712, "lo": 0.05, "hi": 0.09},
            "collapse_step": {"collapsed": 2, "of": 3, "mean": 150.5, "lo": 120.0, "hi": 181.0}}},
        "ict": {"lr": 0.0001, "seeds": [0, 1], "figures": {
            "eval_pass8_end": {"mean": 0.3, "lo": 0.1, "hi": 0.5}, "eval_pass1_end": {"mean": None, "lo": None, "hi": None},
            "eval_pass8_start": {"mean": 0.45, "lo": 0.45, "hi": 0.45}, "reward_end": {"mean": 0.1, "lo": 0.0, "hi": 0.2},
            "entropy_end": {"mean": 0.3, "lo": 0.25, "hi": 0.35}, "fork_frac_end": {"mean": 0.2, "lo": 0.1, "hi": 0.3},
            "collapse_step": {"collapsed": 0, "of": 3, "mean": None, "lo": None, "hi": None}}}}},
}


def test_table_rows_from_a_fixture():
    lines = st.table(FIXTURE, "x.json").splitlines()
    assert "| strategy | lr | held-out pass@8 (end) |" in lines[4]
    assert lines[6] == ("| all | 0.0003 | 0.50 [0.40, 0.62] | 0.25 [0.20, 0.30] | 0.45 [0.45, 0.45] | "
                        "0.88 [0.80, 0.95] | 0.12 [0.10, 0.15] | 0.071 [0.050, 0.090] | 2/3 at 150 [120, 181] |")
    assert lines[7] == ("| ict | 0.0001 | 0.30 [0.10, 0.50] | – | 0.45 [0.45, 0.45] | 0.10 [0.00, 0.20] | "
                        "0.30 [0.25, 0.35] | 0.200 [0.100, 0.300] | 0/3 |")
    assert lines[2] == "**arith** (200 steps; lrs tried: 0.0001, 0.0003)"
    assert "RULE" in lines[0] and "3 seeds" in lines[0] and "`x.json`" in lines[0]


def test_every_lr_table_holds_the_mean_over_seeds_of_each_cell():
    report = {"meta": {"grid": {"lrs": {"arith": [0.0001, 0.0003]}}},
              "cells": [{"task": "arith", "strategy": "all", "lr": 0.0001, "eval_pass8_end": 0.5},
                        {"task": "arith", "strategy": "all", "lr": 0.0001, "eval_pass8_end": 0.25},
                        {"task": "arith", "strategy": "all", "lr": 0.0003, "eval_pass8_end": None},
                        {"task": "arith", "strategy": "ict", "lr": 0.0003, "eval_pass8_end": 0.125},
                        {"task": "other", "strategy": "ict", "lr": 0.0001, "eval_pass8_end": 1.0}]}
    lines = st.by_lr(report, "arith")
    assert lines[3] == "| strategy | lr 0.0001 | lr 0.0003 |"
    assert lines[5:] == ["| all | 0.38 | – |", "| ict | – | 0.12 |"]      # (0.5 + 0.25) / 2; 0.125
    assert st.by_lr({"meta": report["meta"]}, "arith") == []


def test_the_block_is_rewritten_between_the_markers_only(tmp_path):
    readme = tmp_path / "strategies.md"
    readme.write_text(f"before\n{st.BEGIN}\nold table\n{st.END}\nafter\n")
    st.rewrite(readme, "NEW\n")
    assert readme.read_text() == f"before\n{st.BEGIN}\nNEW\n{st.END}\nafter\n"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="strategies:begin"):
        st.rewrite(readme, "NEW\n")


def test_fair_settings_are_each_strategys_chosen_lr_under_its_tasks_preset():
    out = st.fair(FIXTURE, "x.json")
    assert out["presets"] == {"healthy": {"all": {"lr": 0.0003, "task": "arith", "seeds": [0, 1, 2]},
                                          "ict": {"lr": 0.0001, "task": "arith", "seeds": [0, 1]}}}
    assert (out["source"], out["rule"], out["commit"]) == ("x.json", "RULE", "abc")


def test_the_committed_table_and_demo_settings_are_generated_from_the_committed_json():
    # nothing typed by hand: the docs page's block and trainer/fair_settings.json are what the JSON gives
    report_path = ROOT / "docs" / "strategies.json"
    if not report_path.exists():
        pytest.skip("docs/strategies.json is not in this checkout: the sweep has not been run")
    report = json.loads(report_path.read_text())
    readme = (ROOT / "docs" / "explanation" / "strategies.md").read_text()
    block = readme[readme.index(st.BEGIN) + len(st.BEGIN) + 1:readme.index(st.END)]
    assert block == st.table(report, "docs/strategies.json")
    fair = json.loads((ROOT / "trainer" / "fair_settings.json").read_text())
    assert fair == st.fair(report, "docs/strategies.json")


def test_the_strategies_page_has_the_markers():
    text = (ROOT / "docs" / "explanation" / "strategies.md").read_text()
    assert text.count(st.BEGIN) == 1 and text.count(st.END) == 1


# ------------------------------------------------------------------------------ the command
def test_bad_flags_are_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        strategies.parse(["--strategies", "all,nope"])
    assert "unknown task/strategy nope" in capsys.readouterr().err
    for bad, said in (("arith=all,nope", "unknown task/strategy nope"), ("arith", "write TASK=S1,S2")):
        with pytest.raises(SystemExit):
            strategies.parse(["--task-strategies", bad])
        assert said in capsys.readouterr().err
    args = strategies.parse(["--task-strategies", "arith=all,ict", "--strategies", "fork"])
    assert args.task_strategies == {"arith": ["all", "ict"]} and args.strategies == ["fork"]


def test_default_grid_is_each_presets_lr_times_a_ninth_a_third_one_three():
    assert strategies.default_lrs("readable") == [5.56e-05, 0.000167, 0.0005, 0.0015]
    assert strategies.default_lrs("arith") == [3.33e-05, 0.0001, 0.0003, 0.0009]


def test_a_cell_records_whether_its_warm_up_reached_the_target(tmp_path, monkeypatch):
    from forksight.trainer.config import load_config
    from forksight.trainer.warmup import warm_path

    monkeypatch.setenv("FORKSIGHT_HOME", str(tmp_path / "home"))
    base = tmp_path / "model"
    assert strategies.warmup_info("arith", 2, base) is None  # never warmed up
    cfg = load_config(preset="healthy")
    out = warm_path(base, make_task("arith", level=cfg.level, reverse=cfg.reverse), cfg.warmup_pass, "ce", 2)
    out.mkdir(parents=True)
    (out / "warmup.json").write_text(json.dumps({"pass@1": 0.0, "seconds": 184.7, "reached": False}))
    assert strategies.warmup_info("arith", 2, base) == {"warmup_reached": False, "warmup_pass1": 0.0,
                                                         "warmup_seconds": 184.7}
    assert strategies.warmup_info("arith", 1, base) is None  # another seed's warm-up is its own


def test_arith_cells_give_the_warm_up_the_time_readable_has():
    argv = strategies.command(strategies.Cell("arith", "all", 3e-4, 0), Path("w"), 200, 25, 1, False)
    assert argv[argv.index("--warmup-max-seconds") + 1] == str(int(load_readable_budget()))


def load_readable_budget() -> float:
    from forksight.trainer.config import PRESETS

    return PRESETS["readable"]["warmup_max_seconds"]


@pytest.mark.slow
def test_quick_sweep_end_to_end_resumes_and_its_commands_rerun_to_the_same_figures(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out.json"
    argv = ["--quick", "--strategies", "all,fork", "--seeds", "0,1", "--tasks", "arith", "--jobs", "2",
            "--work", str(work), "--out", str(out)]
    report = strategies.main(argv)
    assert json.loads(out.read_text()) == report
    cells = report["cells"]
    assert sorted((c["strategy"], c["seed"]) for c in cells) == [("all", 0), ("all", 1), ("fork", 0), ("fork", 1)]
    for c in cells:
        # every eval_every=2 steps, and step 0 (the base model) where the trainer evaluates it
        assert c["eval_steps"] in ([2, 4], [0, 2, 4]) and c["steps"] == 4 and c["entropy_end"] > 0
        assert c["command"].startswith("OMP_NUM_THREADS=") and f"--seed {c['seed']}" in c["command"]
    assert set(report["summary"]["arith"]) == {"all", "fork"}
    row = report["summary"]["arith"]["fork"]
    assert row["lr"] == 3e-4 and row["seeds"] == [0, 1]
    ent = row["figures"]["entropy_end"]
    fork_cells = [c["entropy_end"] for c in cells if c["strategy"] == "fork"]
    assert ent["mean"] == pytest.approx(np.mean(fork_cells)) and min(fork_cells) <= ent["lo"] <= ent["hi"] <= max(fork_cells)
    assert report["meta"]["grid"]["lrs"] == {"arith": [3e-4]} and report["meta"]["rule"] == ss.RULE

    # resumable: a second invocation reruns nothing (no log rewritten)
    logs = {p: p.stat().st_mtime_ns for p in work.glob("*.log")}
    again = strategies.main(argv)
    assert again["cells"] == cells and {p: p.stat().st_mtime_ns for p in work.glob("*.log")} == logs

    # the stored command, run alone, reproduces the cell's figures
    cell = cells[0]
    name = f"arith-{cell['strategy']}-lr{cell['lr']:g}-s{cell['seed']}"
    (work / f"{name}.duckdb").unlink()
    shutil.rmtree(work / "runs" / name)
    strategies.execute(shlex.split(cell["command"]), tmp_path / "rerun.log")
    rerun = strategies.read_cell(work / f"{name}.duckdb", name)
    assert rerun == {k: v for k, v in cell.items() if k not in ("task", "strategy", "lr", "seed", "command", "seconds")}

    # the cells in one file for the dashboard: every row of every cell's file, runs apart
    view = tmp_path / "view.duckdb"
    counts = sv.main([str(out), "--work", str(work), "--out", str(view)])
    from forksight.monitor.collector.store import Store

    expected = {name: 0 for name in sv.COPIED}
    for c in cells:
        with Store(str(work / f"{sv.cell_name(c)}.duckdb")) as one:
            for name in sv.COPIED:
                expected[name] += one.call(lambda cur: cur.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0])
    assert counts == expected and counts["runs"] == len(cells) and counts["tokens"] > 0
    with Store(str(view)) as merged:
        assert sorted(merged.reader.list_runs().name) == sorted(sv.cell_name(c) for c in cells)
        c = cells[1]
        with Store(str(work / f"{sv.cell_name(c)}.duckdb")) as one:
            rid = str(one.reader.list_runs().run_id.iloc[0])
            assert merged.reader.read_scalars(rid).equals(one.reader.read_scalars(rid))
