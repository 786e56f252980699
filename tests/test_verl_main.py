"""forksight.verl under a real `python -m verl.trainer.main_ppo` (tests/verl_main.py): a local Ray
cluster, verl's v1 trainer with TransferQueue (its default) and its legacy trainer, verl's dataset
pipeline, worker group (FSDP2 engine), agent loop, reward loop and weight sync; forksight loaded
through its `verl.plugins` entry point, named only in `trainer.logger`, streaming to a real
`forksight serve`. Test-only stand-ins, registered through verl's plugin points: the CPU
platform and an HF-`generate` rollout replica (tests/verl_hf_rollout.py). Each run takes about
3-4 minutes on 2 cores (most of it Ray, TransferQueue and worker start-up).

Training–inference mismatch: with `rollout.calculate_log_probs=True` the replica answers the log p
of each token it sampled from bf16-rounded logits while verl's FSDP forward stays float32, so the
stored `sampler_logp` differs from `logp` by real numerics; the legacy run rejects tokens with verl's
rollout_rs, the v1 mismatch run truncates IS weights with verl's token TIS.
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


def run_main(out: Path, url: str, *args: str, env: dict | None = None) -> dict:
    proc = subprocess.run([str(VERL_PY), str(REPO / "tests" / "verl_main.py"), str(out), "--url", url, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**(env or os.environ), "FORKSIGHT_HOME": str(out / "home")})
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


def main_run(tmp_path_factory, name: str, *args: str, trackers: bool = False):
    from collector_util import ServeProcess
    from tracker_util import tracker_env

    out = tmp_path_factory.mktemp(name)
    db = out / "collector.duckdb"
    # W&B offline and TensorBoard (verl's adapter reads TENSORBOARD_DIR) writing under out
    env = tracker_env(out, TENSORBOARD_DIR=str(out / "tb")) if trackers else None
    with ServeProcess(db) as collector:
        summary = run_main(out, collector.url, "--run", name, *args, env=env)
        api = read_api(collector.url, name)
    verdicts = [json.loads(line) for line in (out / "verdicts.jsonl").read_text().splitlines()]
    return {"db": db, "summary": summary, "api": api, "verdicts": verdicts, "out": out}


# the rollout's logits rounded to bf16, verl asked for the engine's log p of each sampled token
SAMPLER = ("--sampler-logits", "bfloat16", "--set", "actor_rollout_ref.rollout.calculate_log_probs=True")
# the reference set: 3 completions of the first step, re-scored by the workers after every update
REFERENCE = ("--set", "+trainer.forksight.reference_every=1", "--set", "+trainer.forksight.reference_size=3",
             "--set", "+trainer.forksight.reference_budget=100")
# ratio bounds around the bf16 rounding's |log r| at the initial weights (median ~1e-4 on the tiny model)
TIGHT = "1.0002"


@pytest.fixture(scope="module")
def v1_run(tmp_path_factory):
    # verl's defaults route to the v1 trainer; prompt 5 (step 2: data.shuffle=False) scores NaN;
    # the rollout's log-probs off (verl 0.9.1's rollout.yaml turns them on)
    # verl's Tracking also logs to TensorBoard and W&B: forksight mirrors into both (a token view each step)
    return main_run(tmp_path_factory, "verl-v1", "--steps", "5", "--nan-prompt", "5", "--stop-on-alert",
                    "--set", "actor_rollout_ref.rollout.calculate_log_probs=False",
                    "--logger", "console,forksight,tensorboard,wandb", "--set", "+trainer.forksight.mirror_tokens_every=1",
                    trackers=True)


@pytest.fixture(scope="module")
def legacy_run(tmp_path_factory):
    # verl's rejection sampling on: token_k1 keeps a token while its ratio stays in [1/1.0002, 1.0002]
    return main_run(tmp_path_factory, "verl-legacy", "--steps", "2", "--legacy", *SAMPLER, *REFERENCE,
                    "--set", "algorithm.rollout_correction.rollout_rs=token_k1",
                    "--set", f'algorithm.rollout_correction.rollout_rs_threshold="{1 / float(TIGHT):.7f}_{TIGHT}"')


@pytest.fixture(scope="module")
def v1_mismatch_run(tmp_path_factory):
    # verl's token-level TIS on: IS weights above 1.0002 are truncated
    return main_run(tmp_path_factory, "verl-v1-mismatch", "--steps", "2", *SAMPLER, *REFERENCE,
                    "--set", "algorithm.rollout_correction.rollout_is=token",
                    "--set", f"algorithm.rollout_correction.rollout_is_threshold={TIGHT}")


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
    steps = [s for (s,) in query(db, "SELECT DISTINCT step FROM scalars WHERE step > 0 ORDER BY step")]
    assert steps == [1, 2, 3]                 # step 2's NaN is judged when step 3 arrives; step 4 never runs
    # step 0: the reference set's base only (kept from step 1 by default; re-scored every 25 steps)
    assert {k for (k,) in query(db, "SELECT DISTINCT key FROM scalars WHERE step = 0")} >= {"ref/fork_overlap"}
    assert query(db, "SELECT count(*) FROM scalars WHERE step = 0 AND key NOT LIKE 'ref/%'") == [(0,)]
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
def test_v1_mirrors_keys_alert_and_tokens_into_verls_tensorboard_and_wandb(v1_run):
    # read back by each tracker's own reader, against what the collector stored
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tracker_util import wandb_html, wandb_records

    db, out = v1_run["db"], v1_run["out"]
    stored = {(s, k): v for s, k, v in query(db, "SELECT step, key, value FROM scalars")}
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    tags = events.Tags()
    assert {"forksight/entropy/mean", "forksight/fork/frac", "forksight/pass@1", "forksight/pass@4"} <= set(tags["scalars"])
    assert "actor/entropy" in tags["scalars"]                                  # verl's own keys beside ours
    for key in ("entropy/mean", "fork/frac", "pass@4"):
        values = {e.step: e.value for e in events.Scalars(f"forksight/{key}")}
        assert sorted(values) == [1, 2, 3]
        assert all(v == pytest.approx(stored[(s, key)], rel=1e-5, abs=1e-6) for s, v in values.items()), key
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
             for tag in ("forksight/alerts/text_summary", "forksight/tokens/text_summary")}
    (alert_step, alert), = texts["forksight/alerts/text_summary"]
    assert alert_step == 2 and "non_finite at step 2" in alert and "critical" in alert and "Fix:" in alert
    assert [s for s, _ in texts["forksight/tokens/text_summary"]] == [1, 2, 3]
    tokens_at_1 = query(db, "SELECT count(*) FROM tokens WHERE step = 1")[0][0]
    assert 0 < texts["forksight/tokens/text_summary"][0][1].count("`") // 2 <= tokens_at_1
    rows, alerts = wandb_records(out)
    logged = {}
    for row in rows:
        if "forksight/pass@4" in row:
            logged[row["_step"]] = row["forksight/pass@4"]
    assert logged == {s: pytest.approx(stored[(s, "pass@4")], abs=1e-9) for s in (1, 2, 3)}
    assert [(t, lvl) for t, _, lvl in alerts] == [("forksight critical: non_finite at step 2", "ERROR")]
    assert len(wandb_html(out)) == 3


@needs_verl
def test_legacy_trainer_under_main_ppo_keeps_working(legacy_run):
    db = legacy_run["db"]
    assert query(db, "SELECT run_id, status FROM runs") == [("verl-legacy", "finished")]
    check_entropy_as_verl_aggregates_it(db, [1, 2])
    check_pass_at_k(db, legacy_run["verdicts"], [1, 2])
    total, with_renyi2, with_top1 = query(db, "SELECT count(*), count(renyi2), count(top1) FROM tokens")[0]
    assert total > 0 and with_renyi2 == total and with_top1 == total
    assert not math.isnan(query(db, "SELECT value FROM scalars WHERE key = 'pass@1' AND step = 2")[0][0])


def check_sampler_logp(run: dict, steps: list[int], verl_fraction: str) -> None:
    """Stored sampler log p = what the rollout answered, token by token; forksight's mismatch scalars
    = verl's own rollout_corr/* numbers on the same step; frac_corrected = verl's own fraction."""
    from transformers import AutoTokenizer

    db, out = run["db"], run["out"]
    total, known, differs = query(db, "SELECT count(*), count(sampler_logp), "
                                      "count(*) FILTER (WHERE sampler_logp <> logp) FROM tokens")[0]
    assert total > 0 and known == total and differs > 0         # bf16 logits: a real mismatch
    # each stored completion against the rollout's own answer for that prompt (rollouts.jsonl)
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    answers: dict = defaultdict(list)
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        answer = json.loads(line)
        prompt = tokenizer.decode(answer["prompt"], skip_special_tokens=True)
        answers[(prompt, tuple(answer["response"]))].append(answer["logprobs"])
    rows = query(db, "SELECT t.step, t.sample_id, s.prompt, list(t.token_id ORDER BY t.pos), "
                     "list(t.sampler_logp ORDER BY t.pos) FROM tokens t JOIN samples s USING (run_id, step, sample_id) "
                     "GROUP BY t.step, t.sample_id, s.prompt")
    assert len(rows) == len(steps) * BATCH * N
    for step, sample_id, prompt, token_ids, stored in rows:
        candidates = answers[(prompt, tuple(token_ids))]
        assert candidates, (step, sample_id, prompt, token_ids)
        assert any(stored == pytest.approx(logprobs, abs=1e-6) for logprobs in candidates), (step, sample_id)
    fractions = []
    for step in steps:
        scalars = dict(query(db, "SELECT key, value FROM scalars WHERE step = ?", step))
        assert scalars["mismatch/tokens"] == query(db, "SELECT count(*) FROM tokens WHERE step = ?", step)[0][0]
        # verl's k1: mean(log p_rollout - log p_old) over the response tokens (float32 on its side)
        assert scalars["mismatch/kl_k1"] == pytest.approx(scalars["rollout_corr/kl"], rel=1e-4, abs=1e-9)
        # the rollout's log p alone: verl's mean over sequences of -mean_t log p_rollout
        (ppl,) = query(db, "SELECT avg(-m) FROM (SELECT avg(sampler_logp::DOUBLE) AS m FROM tokens "
                           "WHERE step = ? GROUP BY sample_id)", step)[0]
        assert ppl == pytest.approx(scalars["rollout_corr/rollout_log_ppl"], rel=1e-5)
        # verl's mean |p_old - p_rollout| (its float32 exp: 1e-3 relative at this tiny a gap)
        (diff,) = query(db, "SELECT avg(abs(exp(logp::DOUBLE) - exp(sampler_logp::DOUBLE))) FROM tokens "
                            "WHERE step = ?", step)[0]
        assert diff == pytest.approx(scalars["training/rollout_probs_diff_mean"], rel=1e-2)
        fractions.append(scalars["mismatch/frac_corrected"])
        assert fractions[-1] == pytest.approx(scalars[verl_fraction], abs=1e-6), step
    # step 1 (the initial weights): a share of the tokens; after an update the logits drift off
    # zero together and their bf16 rounding grows, so a later step can have verl change them all
    assert 0 < fractions[0] < 1, fractions
    histogram = query(db, "SELECT sum(count) FROM histograms WHERE key = 'mismatch_log_ratio' AND step = ?", steps[0])
    assert histogram[0][0] == query(db, "SELECT count(*) FROM tokens WHERE step = ?", steps[0])[0][0]


@needs_verl
def test_v1_stores_the_rollout_log_probs_and_verls_truncated_tokens(v1_mismatch_run):
    assert query(v1_mismatch_run["db"], "SELECT run_id, status FROM runs") == [("verl-v1-mismatch", "finished")]
    check_sampler_logp(v1_mismatch_run, [1, 2], "rollout_corr/rollout_is_ratio_fraction_high")
    check_entropy_as_verl_aggregates_it(v1_mismatch_run["db"], [1, 2])


@needs_verl
def test_legacy_stores_the_rollout_log_probs_and_verls_rejected_tokens(legacy_run):
    # the rejected tokens stay in the token rows (legacy_run's entropy check counts them, as verl does)
    check_sampler_logp(legacy_run, [1, 2], "rollout_corr/rollout_rs_masked_fraction")


@needs_verl
def test_without_calculate_log_probs_nothing_of_the_sampler_is_stored(v1_run):
    db = v1_run["db"]
    assert query(db, "SELECT count(*) > 0, count(sampler_logp) FROM tokens")[0] == (True, 0)
    assert query(db, "SELECT count(*) FROM scalars WHERE key LIKE 'mismatch/%' OR key LIKE 'rollout_corr/%'") == [(0,)]
    assert query(db, "SELECT count(*) FROM histograms WHERE key = 'mismatch_log_ratio'") == [(0,)]
    assert not (v1_run["out"] / "rollouts.jsonl").exists()


@needs_verl
@pytest.mark.parametrize("fixture", ["legacy_run", "v1_mismatch_run"])
def test_the_reference_set_is_kept_from_the_first_step_and_rescored_by_the_workers(fixture, request):
    run = request.getfixturevalue(fixture)
    db = run["db"]
    assert [s for (s,) in query(db, "SELECT DISTINCT step FROM reference ORDER BY step")] == [0, 1, 2]
    base = query(db, "SELECT sample_id, pos, token_id, entropy, logp FROM reference WHERE step = 0 ORDER BY sample_id, pos")
    assert {s for s, *_ in base} == {0, 1, 2} and any(p < 0 for _, p, *_ in base)          # prompts kept once
    completion = [(s, p, t) for s, p, t, *_ in base if p >= 0]
    for step in (1, 2):                                      # the same text, scored by the policy after `step` updates
        rows = query(db, "SELECT sample_id, pos, token_id, entropy, renyi2, logp FROM reference WHERE step = ? "
                         "ORDER BY sample_id, pos", step)
        assert [(s, p, t) for s, p, t, *_ in rows] == completion
        assert all(0 <= h2 <= h + 1e-5 and lp <= 1e-6 for *_, h, h2, lp in rows)            # 0 <= H2 <= H, log p <= 0
    # the base is the first step's own old-log-prob pass: each completion's statistics are those the tokens
    # table holds at step 1 for the row with that text (verl may reorder rows: matched by token ids)
    by_text: dict[tuple, list] = {}
    for sid, pos, tid, h, lp in query(db, "SELECT sample_id, pos, token_id, entropy, logp FROM tokens WHERE step = 1 "
                                          "ORDER BY sample_id, pos"):
        by_text.setdefault(sid, []).append((tid, h, lp))
    stored = {tuple(t for t, *_ in rows): [(h, lp) for _, h, lp in rows] for rows in by_text.values()}
    for sid in {s for s, *_ in base}:
        mine = [(t, h, lp) for s, p, t, h, lp in base if s == sid and p >= 0]
        want = stored[tuple(t for t, *_ in mine)]
        assert [x for _, h, lp in mine for x in (h, lp)] == pytest.approx([x for pair in want for x in pair], abs=1e-6)
    at = dict(query(db, "SELECT key, value FROM scalars WHERE step = 0 AND key LIKE 'ref/%'"))
    assert at["ref/fork_overlap"] == 1.0 and at["ref/dh/mean"] == 0.0
    moved = dict(query(db, "SELECT key, value FROM scalars WHERE step = 2 AND key LIKE 'ref/%'"))
    assert moved["ref/dh/mean"] > 0 and moved["ref/tokens"] == len(completion)
