"""forksight.verl: a verl GRPO run (verl's own RayPPOTrainer.fit and actor worker with its FSDP2
engine, on CPU: tests/verl_run.py, tests/verl_cpu.py) with the plugin loaded through its
`verl.plugins` entry point streams what a TRL run streams.

verl pins its own transformers, so it lives in .venv/verl (`make test` builds it); these tests
run it in a subprocess and check its outputs here against values computed another way.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import duckdb
import pytest
import torch

from forksight.hooks.metrics import token_stats
from forksight.hooks.integrations.verl import settings_from
from forksight.hooks.integrations.verl_install import SUPPORT, check_version, supported

REPO = Path(__file__).resolve().parents[1]
VERL_PY = REPO / ".venv" / "verl" / "bin" / "python"
needs_verl = pytest.mark.skipif(not VERL_PY.exists(), reason=".venv/verl is absent: `make verl-env` builds it")


def run_verl(out: Path, *args: str, env: dict | None = None, timeout: int = 240) -> dict:
    proc = subprocess.run([str(VERL_PY), str(REPO / "tests" / "verl_run.py"), str(out), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "FORKSIGHT_HOME": str(out / "home"), **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "summary.json").read_text())


def query(db: Path, sql: str, *params):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def pass_at_k_by_hand(groups: dict[str, list[bool]], k: int) -> float:
    """Chen et al.'s estimator from the binomials, averaged over the uid groups."""
    values = []
    for verdicts in groups.values():
        n, c = len(verdicts), sum(verdicts)
        values.append(1.0 - math.comb(n - c, k) / math.comb(n, k))
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("verl")
    summary = run_verl(out, "3")
    return out, summary


# ---------------------------------------------------------------------------- the run
@needs_verl
def test_plugin_loads_through_the_entry_point_and_reports_every_step(grpo_run):
    out, summary = grpo_run
    assert "forksight.verl" in summary["entry_points"]
    assert summary["forksight_loaded"]                       # by `import verl`, nothing else
    assert summary["steps_run"] == 3 and summary["steps_reported"] == 3
    db = out / "forksight.duckdb"
    assert query(db, "SELECT run_id, status, strategy FROM runs") == [("verl-grpo", "finished", "verl-grpo")]
    print(f"verl CPU loop: {summary['wall_s']:.2f} s for 3 steps, forksight's driver hooks "
          f"{summary['overhead_s'] * 1000 / 3:.1f} ms per step")


@needs_verl
def test_tracking_backend_stores_every_metric_verl_logged(grpo_run):
    out, _ = grpo_run
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]  # verl's file logger
    stored = {(step, key): value for step, key, value in
              query(out / "forksight.duckdb", "SELECT step, key, value FROM scalars")}
    assert [line["step"] for line in lines] == [1, 2, 3]
    checked = 0
    for line in lines:
        for key, value in line["data"].items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                assert stored[(line["step"], key)] == pytest.approx(float(value), rel=1e-9, abs=1e-12), key
                checked += 1
    assert checked > 40 * 3                                  # actor/*, critic/*, timing_s/*, perf/*, ...
    for line in lines:                                       # the run page's TRL-named signals
        assert stored[(line["step"], "loss")] == pytest.approx(line["data"]["actor/pg_loss"])
        assert stored[(line["step"], "grad_norm")] == pytest.approx(line["data"]["actor/grad_norm"])


def group_ids_of(uids: list[str]) -> list[int]:
    first_seen = {uid: k for k, uid in enumerate(dict.fromkeys(uids))}
    return [first_seen[u] for u in uids]


@needs_verl
def test_token_statistics_match_token_stats_on_the_same_logits(grpo_run):
    # entropy, log p, Σp² from verl's FSDP engine (driver); top-1 and JS from forksight's worker
    # hook; all against token_stats on logits of the same weights, groups from the uids
    out, summary = grpo_run
    db = out / "forksight.duckdb"
    for step in (1, 2, 3):
        saved = torch.load(out / f"logits_{step}.pt", weights_only=False)
        groups = group_ids_of(summary["verdicts"][str(step)]["uid"])
        stats = token_stats(saved["logits"], mask=saved["mask"], tokens=saved["responses"], group_ids=groups)
        scalars = dict(query(db, "SELECT key, value FROM scalars WHERE step = ?", step))
        valid = stats.mask
        for key, field in (("entropy", stats.entropy), ("renyi2", stats.renyi2), ("logp", stats.logp),
                           ("top1", stats.top1), ("js", stats.js)):
            assert scalars[f"{key}/mean"] == pytest.approx(float(field[valid].double().mean()), abs=1e-5), key
        assert scalars["actor/entropy"] == pytest.approx(scalars["entropy/mean"], abs=1e-5)  # token-mean
        rows = query(db, "SELECT sample_id, pos, token_id, entropy, renyi2, logp, top1, js FROM tokens "
                         "WHERE step = ? ORDER BY sample_id, pos", step)
        assert len(rows) == int(valid[:8].sum())                # token_groups=2: both groups of 4, every token
        for sample_id, pos, token_id, *values in rows:
            assert token_id == int(saved["responses"][sample_id, pos])
            for value, field in zip(values, (stats.entropy, stats.renyi2, stats.logp, stats.top1, stats.js)):
                assert value == pytest.approx(float(field[sample_id, pos]), abs=1e-4)
            entropy, renyi2 = values[:2]
            assert renyi2 <= entropy + 1e-5


@needs_verl
def test_pass_at_k_and_samples_follow_the_uid_groups(grpo_run):
    out, summary = grpo_run
    db = out / "forksight.duckdb"
    n = summary["n"]
    for step in (1, 2, 3):
        rollout = summary["verdicts"][str(step)]
        groups: dict[str, list[bool]] = defaultdict(list)
        for uid, ok in zip(rollout["uid"], rollout["acc"]):
            groups[uid].append(ok)
        assert {len(v) for v in groups.values()} == {n}
        scalars = dict(query(db, "SELECT key, value FROM scalars WHERE step = ?", step))
        for k in range(1, n + 1):
            assert scalars[f"pass@{k}"] == pytest.approx(pass_at_k_by_hand(groups, k), abs=1e-9)
        samples = query(db, "SELECT sample_id, group_id, correct, reward FROM samples WHERE step = ? "
                            "ORDER BY sample_id", step)
        assert [bool(c) for _, _, c, _ in samples] == rollout["acc"]
        assert [r for *_, r in samples] == [float(a) for a in rollout["acc"]]
        uid_of_group = {}
        for (sample_id, group_id, _, _), uid in zip(samples, rollout["uid"]):
            assert uid_of_group.setdefault(group_id, uid) == uid     # one group id per uid
        assert len(uid_of_group) == len(groups)


@needs_verl
def test_bypass_mode_stores_samples_and_pass_at_k_but_no_token_statistics(tmp_path):
    # rollout_correction.bypass_mode: verl never runs _compute_old_log_prob, so no entropy exists
    summary = run_verl(tmp_path, "2", "--bypass")
    db = tmp_path / "forksight.duckdb"
    assert summary["steps_run"] == 0 and summary["steps_reported"] == 2
    assert query(db, "SELECT count(*) FROM tokens") == [(0,)]
    assert query(db, "SELECT count(*) FROM scalars WHERE key LIKE 'entropy/%' OR key LIKE 'renyi2/%'") == [(0,)]
    for step in (1, 2):
        rollout = summary["verdicts"][str(step)]
        groups: dict[str, list[bool]] = defaultdict(list)
        for uid, ok in zip(rollout["uid"], rollout["acc"]):
            groups[uid].append(ok)
        scalars = dict(query(db, "SELECT key, value FROM scalars WHERE step = ?", step))
        assert scalars["pass@2"] == pytest.approx(pass_at_k_by_hand(groups, 2), abs=1e-9)
        assert query(db, "SELECT count(*) FROM samples WHERE step = ?", step) == [(16,)]


# ---------------------------------------------------------------------------- stopping, loading, versions
@needs_verl
def test_stop_on_alert_ends_the_verl_run_cleanly_streaming_to_a_collector(tmp_path):
    from collector_util import ServeProcess

    # step 2's loss is NaN: a critical alert; the collector judges a step once the next one arrives
    # micro-batches of 2 rows split every group of 4: top-1 for every token, JS for none; and the
    # engine's padded path (use_remove_padding=False; the other tests use verl's default, packed)
    db = tmp_path / "collector.duckdb"
    with ServeProcess(db) as collector:
        summary = run_verl(tmp_path, "8", "--nan-at", "2", "--stop-on-alert", "--url", collector.url,
                           "--log-prob-micro-batch", "2", "--padded")
    assert summary["steps_run"] == 3                           # step 4 never generated
    assert query(db, "SELECT status FROM runs") == [("stopped",)]
    assert query(db, "SELECT step, detector, severity FROM alerts") == [(2, "non_finite", "critical")]
    # steps 1-3 trained (step 0: the reference set's base, ref/* only)
    assert query(db, "SELECT max(step), count(DISTINCT step) FROM scalars WHERE step > 0") == [(3, 3)]
    assert query(db, "SELECT count(*) FROM scalars WHERE step = 0 AND key NOT LIKE 'ref/%'") == [(0,)]
    tokens, with_top1, with_js = query(db, "SELECT count(*), count(top1), count(js) FROM tokens")[0]
    assert tokens > 0 and with_top1 == tokens and with_js == 0
    assert query(db, "SELECT count(*) FROM scalars WHERE key = 'js/mean'") == [(0,)]


@needs_verl
def test_verl_use_external_modules_loads_the_plugin_too():
    code = "import sys, verl; print('forksight.verl' in sys.modules)"
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "forksight.verl"}
    loaded = subprocess.run([str(VERL_PY), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    env["VERL_USE_EXTERNAL_MODULES"] = ""
    not_loaded = subprocess.run([str(VERL_PY), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert (loaded.stdout.strip(), not_loaded.stdout.strip()) == ("True", "False"), loaded.stderr[-2000:]


@needs_verl
def test_without_the_legacy_trainer_the_backend_stores_verl_metrics_only(tmp_path):
    # what verl's v1 trainer (or a custom loop) gets: verl's own Tracking, no per-token hand-over
    db = tmp_path / "v1.duckdb"
    code = f"""
import verl
from verl.utils.tracking import Tracking
config = {{"trainer": {{"forksight": {{"db": {str(db)!r}}}}}}}
tracking = Tracking("proj", "v1-run", default_backend=["forksight"], config=config)
for step in (1, 2):
    tracking.log({{"actor/entropy": 0.5 / step, "critic/score/mean": 0.25 * step}}, step=step)
tracking.finish(exit_code=0)
"""
    proc = subprocess.run([str(VERL_PY), "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FORKSIGHT_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "storing verl's logged metrics only" in proc.stderr
    assert query(db, "SELECT run_id, status FROM runs") == [("v1-run", "finished")]
    assert sorted(query(db, "SELECT step, key, value FROM scalars")) == [
        (1, "actor/entropy", 0.5), (1, "critic/score/mean", 0.25),
        (2, "actor/entropy", 0.25), (2, "critic/score/mean", 0.5)]


@needs_verl
def test_v1_step_read_from_a_real_transfer_queue_reports_like_the_legacy_path(tmp_path):
    # verl_tq.py: a real Ray + TransferQueue; rows put as verl's v1 trainer leaves them before kv_clear
    proc = subprocess.run([str(VERL_PY), str(REPO / "tests" / "verl_tq.py"), str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "FORKSIGHT_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stderr[-4000:]
    saved = torch.load(tmp_path / "tq.pt", weights_only=False)
    fields, kept, read = saved["fields"][:6], saved["kept"][:6], saved["read"]  # the 7th row is padding: left out
    tensors, tokens = read["tensors"], read["tokens"]
    assert list(read["non_tensor"]["uid"]) == [f["uid"] for f in fields]
    assert list(read["non_tensor"]["acc"]) == [f["extra_fields"]["reward_extra_info"]["acc"] for f in fields]
    for i, f in enumerate(fields):
        p, r = len(f["prompts"]), len(f["responses"])
        assert torch.equal(tensors["responses"][i, :r], f["responses"])
        # the mask verl's rejection sampling left, and the one from before it (masks_of, all of the response)
        assert torch.equal(tensors["response_mask"][i, :r], kept[i]) and tensors["response_mask"][i].sum() < r
        assert tokens["response_mask"][i, :r].all() and tokens["response_mask"][i].sum() == r
        assert torch.equal(tensors["rollout_log_probs"][i, :r], f["rollout_log_probs"])
        assert torch.equal(tensors["prompts"][i, :p], f["prompts"]) and tensors["attention_mask"][i, :p].all()
        assert torch.equal(tokens["entropy"][i, :r], f["entropy"]) and torch.equal(tokens["logp"][i, :r],
                                                                                   f["old_log_probs"])
        for name, key in (("sum_pi_squared", "sum_pi_squared"), ("top1", "forksight_top1"), ("js", "forksight_js")):
            # workers' values are over prompt + response; response token k sits at p - 1 + k
            assert torch.equal(tokens[name][i, :r], f[key][p - 1: p - 1 + r]), name
    db = tmp_path / "forksight.duckdb"
    assert query(db, "SELECT run_id, status FROM runs") == [("v1-tq", "finished")]
    rows = query(db, "SELECT sample_id, pos, entropy, renyi2, logp, top1, js, sampler_logp FROM tokens "
                     "ORDER BY sample_id, pos")
    # token_groups=2: both groups, every response token (the rejected ones too, as verl's entropy counts them)
    assert len(rows) == sum(len(f["responses"]) for f in fields)
    for sample_id, pos, entropy, renyi2, logp, top1, js, sampler_logp in rows:
        f, p = fields[sample_id], len(fields[sample_id]["prompts"])
        assert sampler_logp == pytest.approx(float(f["rollout_log_probs"][pos]), abs=1e-6)
        assert entropy == pytest.approx(float(f["entropy"][pos]), abs=1e-6)
        assert renyi2 == pytest.approx(-math.log(float(f["sum_pi_squared"][p - 1 + pos])), abs=1e-5)
        assert logp == pytest.approx(float(f["old_log_probs"][pos]), abs=1e-6)
        assert (top1, js) == pytest.approx((float(f["forksight_top1"][p - 1 + pos]),
                                            float(f["forksight_js"][p - 1 + pos])), abs=1e-6)
    groups: dict[str, list[bool]] = defaultdict(list)
    for f in fields:
        groups[f["uid"]].append(f["extra_fields"]["reward_extra_info"]["acc"])
    scalars = dict(query(db, "SELECT key, value FROM scalars WHERE step = 1"))
    for k in (1, 2, 3):
        assert scalars[f"pass@{k}"] == pytest.approx(pass_at_k_by_hand(groups, k), abs=1e-9)
    every = torch.cat([f["entropy"] for f in fields]).double()
    assert scalars["entropy/mean"] == pytest.approx(float(every.mean()), abs=1e-6)
    # mismatch by hand in float64: k1 = mean(log p_sampler - log p_train); verl's config truncates
    # IS weights above 1.2 (token TIS) and its rejection sampling zeroed tokens: corrected = either
    train = torch.cat([f["old_log_probs"] for f in fields]).double()
    sampler = torch.cat([f["rollout_log_probs"] for f in fields]).double()
    truncated = (train - sampler).exp() > 1.2
    rejected_tokens = torch.cat(kept) == 0
    assert 0 < int(truncated.sum()) and 0 < int((truncated & ~rejected_tokens).sum())
    assert scalars["mismatch/tokens"] == len(train)
    assert scalars["mismatch/kl_k1"] == pytest.approx(float((sampler - train).mean()), abs=1e-6)
    assert scalars["mismatch/frac_corrected"] == pytest.approx(float((truncated | rejected_tokens).double().mean()),
                                                               abs=1e-9)


def test_worker_top1_and_js_in_blocks_equal_token_stats_on_whole_groups(monkeypatch):
    # the worker walks response positions in blocks; ragged rows, prompts of different lengths,
    # a complete group (JS) and an incomplete one (top-1 only, JS NaN)
    from forksight.hooks.integrations import verl_worker

    torch.manual_seed(0)
    vocab, prompt_lens, response_lens = 11, [3, 3, 3, 5, 2], [7, 4, 6, 5, 3]
    rows = [torch.randn(p + r, vocab) * 3 for p, r in zip(prompt_lens, response_lens)]
    monkeypatch.setattr(verl_worker, "_BLOCK_FLOATS", 3 * vocab * 2)     # two positions per block
    top1, js = verl_worker.response_stats(rows, prompt_lens, response_lens, 0.7, ["a", "a", "a", "b", "b"], 3)

    def responses(ids):
        out = torch.zeros(len(ids), max(response_lens[i] for i in ids), vocab)
        mask = torch.zeros(out.shape[:2], dtype=torch.bool)
        for j, i in enumerate(ids):
            out[j, : response_lens[i]] = rows[i][prompt_lens[i] - 1: prompt_lens[i] - 1 + response_lens[i]]
            mask[j, : response_lens[i]] = True
        return out, mask

    logits, mask = responses([0, 1, 2])
    whole = token_stats(logits, mask=mask, temperature=0.7, group_ids=[0, 0, 0])
    for j in range(3):
        r = response_lens[j]
        assert torch.allclose(top1[j], whole.top1[j, :r], atol=1e-6)
        assert torch.allclose(js[j], whole.js[j, :r], atol=1e-6)
    for i in (3, 4):
        logits, mask = responses([i])
        alone = token_stats(logits, mask=mask, temperature=0.7)
        assert torch.allclose(top1[i], alone.top1[0], atol=1e-6)
        assert torch.isnan(js[i]).all()


def test_unknown_verl_version_is_a_clear_error():
    assert supported("0.9.1") and not supported("0.8.3") and not supported("1.0.0")
    assert check_version("0.9.1") == "0.9.1"
    with pytest.raises(RuntimeError) as err:
        check_version("0.10.0")
    message = str(err.value)
    assert "verl 0.10.0 is not a version forksight knows" in message
    assert all(f"{minor}.x" in message for minor in SUPPORT) and "allow_unknown_version" in message


def test_settings_come_from_trainer_forksight_and_refuse_unknown_names(monkeypatch):
    monkeypatch.setenv("FORKSIGHT_TOKEN_GROUPS", "3")
    config = {"trainer": {"forksight": {"db": "x.duckdb", "stop_on_alert": "true"}}}
    settings = settings_from(config)
    assert (settings["db"], settings["stop_on_alert"], settings["token_groups"]) == ("x.duckdb", True, 3)
    with pytest.raises(ValueError, match="stop_on_alrt"):
        settings_from({"trainer": {"forksight": {"stop_on_alrt": True}}})
    from forksight.base.fork_rule import DEFAULT_FORK_RULE

    assert settings["fork_rule"] == str(DEFAULT_FORK_RULE)           # the default, recorded in the run's config
    assert settings_from({"trainer": {"forksight": {"fork_rule": "top:0.2"}}})["fork_rule"] == "top:0.2"
    with pytest.raises(ValueError, match="fork rule 'top:2'"):
        settings_from({"trainer": {"forksight": {"fork_rule": "top:2"}}})
    # mirror: every tracker trainer.logger names by default; a list from the command line or a config
    assert (settings["mirror"], settings["mirror_tokens_every"]) == ("auto", 50)
    for given in ("[wandb,tensorboard]", "wandb, tensorboard", ["wandb", "tensorboard"]):
        assert settings_from({"trainer": {"forksight": {"mirror": given}}})["mirror"] == ["wandb", "tensorboard"]
    assert settings_from({"trainer": {"forksight": {"mirror": "none"}}})["mirror"] == "none"
    with pytest.raises(ValueError, match=r"unknown tracker\(s\) \['wandbb'\]"):
        settings_from({"trainer": {"forksight": {"mirror": "[wandbb]"}}})
    # the reference set: the validation interval by default, else 25; a bad value said before the run
    from forksight.hooks.integrations.verl_reference import reference_every

    assert reference_every(settings, {"trainer": {"test_freq": 5}}) == 5
    assert reference_every(settings, {"trainer": {"test_freq": -1}}) == 25
    assert reference_every(settings_from({"trainer": {"forksight": {"reference_every": "0"}}}), {}) == 0
    with pytest.raises(ValueError, match="reference_every must be >= 0"):
        settings_from({"trainer": {"forksight": {"reference_every": -2}}})


def test_mirror_writes_only_into_trackers_verl_opened(caplog):
    from forksight.hooks.integrations.verl_mirror import mirror_into

    class Backend:                                          # the interface of verl's Tracking backends
        def __init__(self):
            self.logged = []

        def log(self, data, step):
            self.logged.append((step, data))

    class Alerts:
        alerts = [{"step": 1, "detector": "entropy_collapse", "severity": "warning", "message": "m", "action": "a"}]

    backends = {"console": Backend(), "tensorboard": Backend()}
    assert mirror_into(backends, "none", Alerts(), 1) is None
    with caplog.at_level("WARNING", logger="forksight.trackers"):
        mirror = mirror_into(backends, ["wandb", "tensorboard"], Alerts(), 1)
    assert mirror.trackers == ["tensorboard"] and "trainer.logger does not name it" in caplog.text
    mirror = mirror_into(backends, "auto", Alerts(), 1)
    assert mirror.trackers == ["tensorboard"]                  # console is verl's, not a tracker forksight knows
    mirror.step(3, {"entropy/mean": 0.5, "actor/entropy": 0.5, "reward/mean": float("nan")}, None)
    assert backends["tensorboard"].logged == [(3, {"forksight/entropy/mean": 0.5})] and not backends["console"].logged
