"""forksight.verl under a real `python -m verl.trainer.main_ppo` (tests/verl_main.py): a local Ray
cluster, verl's v1 trainer with TransferQueue (its default) and its legacy trainer, verl's dataset
pipeline, worker group (FSDP2 engine), agent loop, reward loop and weight sync; forksight loaded
through its `verl.plugins` entry point, named only in `trainer.logger`, streaming to a real
`forksight serve`. Test-only stand-ins, registered through verl's plugin points: the CPU
platform and an HF-`generate` rollout replica (tests/verl_hf_rollout.py). Each run takes about
3-4 minutes on 2 cores (most of it Ray, TransferQueue and worker start-up).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from test_verl import VERL_PY, needs_verl, pass_at_k_by_hand, query

REPO = Path(__file__).resolve().parents[1]
BATCH, N = 4, 4                           # data.train_batch_size, rollout.n (tests/verl_main.py)


def run_main(out: Path, url: str, *args: str) -> dict:
    proc = subprocess.run([str(VERL_PY), str(REPO / "tests" / "verl_main.py"), str(out), "--url", url, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "FORKSIGHT_HOME": str(out / "home")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["returncode"] == 0, (out / "main_ppo.log").read_text()[-6000:]
    return summary


def read_api(url: str, run_id: str) -> dict:
    """What the dashboard reads, through the collector's read API (the same Reader)."""
    get = lambda path, **params: httpx.get(f"{url}{path}", params=params, timeout=30).json()  # noqa: E731
    return {"runs": get("/api/runs"), "keys": get(f"/api/runs/{run_id}/scalar_keys"),
            "token_steps": get(f"/api/runs/{run_id}/token_steps"),
            "histograms": get(f"/api/runs/{run_id}/histograms", key="entropy"),
            "samples": get(f"/api/runs/{run_id}/samples", step=1)}


def main_run(tmp_path_factory, name: str, *args: str):
    from collector_util import ServeProcess

    out = tmp_path_factory.mktemp(name)
    db = out / "collector.duckdb"
    with ServeProcess(db) as collector:
        summary = run_main(out, collector.url, "--run", name, *args)
        api = read_api(collector.url, name)
    verdicts = [json.loads(line) for line in (out / "verdicts.jsonl").read_text().splitlines()]
    return {"db": db, "summary": summary, "api": api, "verdicts": verdicts}


@pytest.fixture(scope="module")
def v1_run(tmp_path_factory):
    # verl's defaults route to the v1 trainer; prompt 5 (step 2: data.shuffle=False) scores NaN
    return main_run(tmp_path_factory, "verl-v1", "--steps", "5", "--nan-prompt", "5", "--stop-on-alert")


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    return main_run(tmp_path_factory, "verl-legacy", "--steps", "2", "--legacy")


def check_entropy_as_verl_aggregates_it(db: Path, steps: list[int]) -> None:
    # loss_agg_mode token-mean (verl's default): the mean over every response token of the step;
    # token_groups=4 stores every group's tokens
    for step in steps:
        (stored,) = query(db, "SELECT value FROM scalars WHERE step = ? AND key = 'actor/entropy'", step)[0]
        (mean, count), = query(db, "SELECT avg(entropy::DOUBLE), count(*) FROM tokens WHERE step = ?", step)
        assert count > 0 and mean == pytest.approx(stored, abs=1e-4), step


def check_pass_at_k(db: Path, verdicts: list[dict], steps: list[int]) -> None:
    # the reward function's own verdicts, by dataset index; step s holds prompts BATCH*(s-1) ...
    for step in steps:
        groups: dict[int, list[bool]] = defaultdict(list)
        for v in verdicts:
            if v["index"] // BATCH + 1 == step:
                groups[v["index"]].append(v["acc"])
        assert len(groups) == BATCH and {len(g) for g in groups.values()} == {N}
        scalars = dict(query(db, "SELECT key, value FROM scalars WHERE step = ?", step))
        for k in range(1, N + 1):
            assert scalars[f"pass@{k}"] == pytest.approx(pass_at_k_by_hand(groups, k), abs=1e-9), (step, k)
        stored = query(db, "SELECT group_id, correct FROM samples WHERE step = ?", step)
        by_group: dict[int, list[bool]] = defaultdict(list)
        for group_id, correct in stored:
            by_group[group_id].append(bool(correct))
        assert sorted(sorted(g) for g in by_group.values()) == sorted(sorted(g) for g in groups.values())


@needs_verl
def test_v1_default_trainer_streams_token_level_data_and_stops_on_a_critical_alert(v1_run):
    db = v1_run["db"]
    assert query(db, "SELECT run_id, status, strategy FROM runs") == [("verl-v1", "stopped", "verl-grpo")]
    assert query(db, "SELECT step, detector, severity FROM alerts") == [(2, "non_finite", "critical")]
    steps = [s for (s,) in query(db, "SELECT DISTINCT step FROM scalars ORDER BY step")]
    assert steps == [1, 2, 3]                 # step 2's NaN is judged when step 3 arrives; step 4 never runs
    check_entropy_as_verl_aggregates_it(db, steps)
    # Rényi-2 (verl's Σp², asked for with actor.calculate_sum_pi_squared), top-1 and JS (the
    # workers' old-log-prob pass) for every token; H2 <= H
    total, with_all, above = query(db, "SELECT count(*), count(renyi2 + top1 + js + logp), "
                                       "count(*) FILTER (WHERE renyi2 > entropy + 1e-5) FROM tokens")[0]
    assert total > 0 and with_all == total and above == 0
    for step in steps:                        # fork masks: the stored flags make up the step's fork/frac
        (frac,) = query(db, "SELECT value FROM scalars WHERE step = ? AND key = 'fork/frac'", step)[0]
        assert query(db, "SELECT avg(fork::DOUBLE), count(fork) = count(*) FROM tokens WHERE step = ?",
                     step)[0] == (pytest.approx(frac, abs=1e-9), True)


@needs_verl
def test_v1_pass_at_k_equals_a_hand_count_over_the_uid_groups(v1_run):
    check_pass_at_k(v1_run["db"], v1_run["verdicts"], [1, 2, 3])


@needs_verl
def test_v1_run_reads_back_like_a_trl_run(v1_run):
    api = v1_run["api"]
    (run,) = [r for r in api["runs"] if r["run_id"] == "verl-v1"]
    assert (run["status"], run["strategy"], run["last_step"]) == ("stopped", "verl-grpo", 3)
    assert {"loss", "grad_norm", "reward/mean", "entropy/mean", "renyi2/mean", "top1/mean", "js/mean", "logp/mean",
            "fork/frac", "pass@1", "pass@4"} <= set(api["keys"])
    assert api["token_steps"] == [1, 2, 3]
    assert api["histograms"], "no entropy histogram"
    samples = api["samples"]
    assert len(samples) == BATCH * N and all("+" in s["prompt"] and s["prompt"].endswith("=") for s in samples)


@needs_verl
def test_legacy_trainer_under_main_ppo_keeps_working(legacy_run):
    db = legacy_run["db"]
    assert query(db, "SELECT run_id, status FROM runs") == [("verl-legacy", "finished")]
    check_entropy_as_verl_aggregates_it(db, [1, 2])
    check_pass_at_k(db, legacy_run["verdicts"], [1, 2])
    total, with_renyi2, with_top1 = query(db, "SELECT count(*), count(renyi2), count(top1) FROM tokens")[0]
    assert total > 0 and with_renyi2 == total and with_top1 == total
    assert not math.isnan(query(db, "SELECT value FROM scalars WHERE key = 'pass@1' AND step = 2")[0][0])
