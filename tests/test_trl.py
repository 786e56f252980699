"""hooks.trl on a real GRPOTrainer (tiny offline model, CPU): what forksight stores equals what
TRL computed (entropy, rewards), pass@k matches the estimator, the selection mask of
top_entropy_quantile is stored, alerts stop the run, training is bit-identical without the
callback; TRL 1.14 (logits path, installed side by side) runs the example through a collector."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

import forksight.trl
from forksight.compose.local import LocalSink

REPO = Path(__file__).resolve().parents[1]
TRL114 = REPO / ".venv" / "trl114"
G, PROMPTS, LENGTH, MAX_STEPS = 4, 2, 6, 6

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class LogProbe(TrainerCallback):
    """What TRL itself logged, step by step (the reference the stored values are checked against)."""

    def __init__(self):
        self.logs: dict[int, dict] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.setdefault(state.global_step, {}).update(logs or {})


def make_trainer(model_path, out_dir, steps: int, reward_log: list, quantile: float = 0.2):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load

    model, tokenizer = load(model_path)

    def even_first_token(completions, completion_ids, **kwargs):
        rewards = [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]
        reward_log.append(rewards)
        return rewards

    config = GRPOConfig(
        output_dir=str(out_dir), report_to="none", use_cpu=True, bf16=False, seed=0,
        per_device_train_batch_size=PROMPTS * G, num_generations=G, max_completion_length=LENGTH,
        learning_rate=5e-3, lr_scheduler_type="constant", max_steps=steps, top_entropy_quantile=quantile,
        logging_steps=1, save_strategy="no", disable_tqdm=True, per_device_eval_batch_size=PROMPTS * G,
    )
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    eval_data = Dataset.from_list([{"prompt": f"Q: {i}+{i}= A:"} for i in (3, 4)])
    return GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                       eval_dataset=eval_data, processing_class=tokenizer)


@pytest.fixture(scope="module")
def run_a(tiny_model_path, tmp_path_factory):
    """GRPO with forksight attached (JS on all groups, stop on a critical alert that a collapse
    floor above the untrained model's entropy raises once 2 steps are seen)."""
    from forksight.monitor.alerts.hub import AlertConfig, AlertHub, CollapseConfig
    from forksight.monitor.collector.store import Store

    tmp = tmp_path_factory.mktemp("trl_a")
    hub = AlertHub(AlertConfig(collapse=CollapseConfig(floor=50.0, warmup_steps=2, baseline_steps=1, persist=1)))
    sink = LocalSink(str(tmp / "a.duckdb"), "grpo-a", store=Store(str(tmp / "a.duckdb")), hub=hub,
                     config={"vocab_size": 311})
    rewards: list = []
    trainer = make_trainer(tiny_model_path, tmp / "out", MAX_STEPS, rewards)
    probe = LogProbe()
    trainer.add_callback(probe)
    callback = forksight.trl.attach(trainer, sink=sink, stop_on_alert=True, js_groups="all", sample=PROMPTS)
    trainer.train()
    n_train = len(rewards)
    trainer.evaluate()  # two eval prompts x G: eval_* scalars and eval/pass@k
    sink.flush()
    reader = sink.reader
    out = {
        "trainer": trainer, "callback": callback, "probe": probe, "rewards": rewards[:n_train],
        "eval_rewards": rewards[n_train:], "sink": sink,
        "scalars": reader.read_scalars(sink.run_id, downsample=100000),
        "samples": reader.read_samples(sink.run_id),
        "tokens": {s: reader.read_tokens(sink.run_id, s) for s in reader.token_steps(sink.run_id)},
        "alerts": reader.read_alerts(sink.run_id),
        "params": {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
        "steps": trainer.state.global_step,
    }
    yield out
    callback.detach()
    sink.finish()


def _scalar(run, key: str, step: int) -> float:
    s = run["scalars"]
    values = s[(s.key == key) & (s.step == step)].value
    assert len(values) == 1, f"{key} at step {step}: {list(values)}"
    return float(values.iloc[0])


def test_stored_entropy_mean_equals_trl_logged_entropy(run_a):
    steps = sorted(run_a["tokens"])
    assert steps == list(range(1, run_a["steps"] + 1))
    for step in steps:
        assert _scalar(run_a, "entropy/mean", step) == pytest.approx(run_a["probe"].logs[step]["entropy"], abs=1e-3)
        # the token rows of every group were kept (sample=PROMPTS): their mean is the same number
        assert run_a["tokens"][step]["entropy"].mean() == pytest.approx(run_a["probe"].logs[step]["entropy"], abs=1e-3)


def test_stored_rewards_are_the_reward_functions_outputs(run_a):
    samples = run_a["samples"]
    for step in range(1, run_a["steps"] + 1):
        rows = samples[samples.step == step].sort_values("sample_id")
        assert rows["reward"].tolist() == run_a["rewards"][step - 1]
        assert rows["group_id"].tolist() == [i // G for i in rows["sample_id"]]
        assert _scalar(run_a, "reward/mean", step) == pytest.approx(run_a["probe"].logs[step]["reward"], abs=1e-6)
        assert all(rows["prompt"].str.startswith("Q: ")) and rows["rank"].eq(0).all()


def test_pass_at_k_matches_the_estimator_on_stored_verdicts(run_a):
    samples = run_a["samples"]
    for step in range(1, run_a["steps"] + 1):
        rows = samples[samples.step == step]
        groups = [list(g["correct"]) for _, g in rows.groupby("group_id")]
        for k in range(1, G + 1):
            expected = sum(1 - math.comb(G - sum(g), k) / math.comb(G, k) for g in groups) / len(groups)
            assert _scalar(run_a, f"pass@{k}", step) == pytest.approx(expected, abs=1e-12)


def test_selection_mask_of_top_entropy_quantile_is_stored(run_a):
    for step, tokens in run_a["tokens"].items():
        threshold = _scalar(run_a, "entropy/p80", step)  # TRL keeps H >= its 80th percentile
        clear = (tokens["entropy"] - threshold).abs() > 1e-5
        assert (tokens["selected"][clear] == (tokens["entropy"][clear] >= threshold)).all()
        frac = _scalar(run_a, "selected/frac", step)
        assert 0.2 <= frac <= 0.2 + 2.0 / len(tokens)


def test_js_top1_renyi2_obey_their_bounds(run_a):
    log_v = math.log(run_a["trainer"].model.config.vocab_size)
    for tokens in run_a["tokens"].values():
        h, h2, top1, js = tokens["entropy"], tokens["renyi2"], tokens["top1"], tokens["js"]
        assert js.notna().all() and top1.notna().all()  # js_groups="all": full distributions everywhere
        assert (js >= 0).all() and (js <= math.log(2) + 1e-6).all()
        assert (h2 <= h + 1e-5).all() and (h <= log_v + 1e-5).all()
        # Σp² ≤ max p and (max p)² ≤ Σp²: TRL's fused H2 against our hidden-state top-1
        assert (top1 >= (-h2).map(math.exp) - 1e-6).all() and (top1 <= (-h2 / 2).map(math.exp) + 1e-6).all()
        assert (tokens["logp"].map(math.exp) <= top1 + 1e-6).all()


def test_every_trl_scalar_is_stored_under_its_own_name(run_a):
    for step, logs in run_a["probe"].logs.items():
        for key, value in logs.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                assert _scalar(run_a, key, step) == pytest.approx(float(value), rel=1e-9), key


def test_eval_metrics_and_eval_pass_at_k(run_a):
    verdicts = [r >= 1.0 for batch in run_a["eval_rewards"] for r in batch]
    groups = [verdicts[i:i + G] for i in range(0, len(verdicts), G)]
    assert len(groups) == 2
    step = run_a["steps"]
    for k in range(1, G + 1):
        expected = sum(1 - math.comb(G - sum(g), k) / math.comb(G, k) for g in groups) / len(groups)
        assert _scalar(run_a, f"eval/pass@{k}", step) == pytest.approx(expected, abs=1e-12)
    eval_logs = run_a["probe"].logs[step]
    assert _scalar(run_a, "eval_reward", step) == pytest.approx(eval_logs["eval_reward"], rel=1e-9)


def test_a_critical_alert_stops_training_when_asked(run_a):
    alerts = run_a["alerts"]
    critical = alerts[(alerts.severity == "critical") & (alerts.detector == "entropy_collapse")]
    assert len(critical) >= 1
    assert run_a["steps"] < MAX_STEPS and int(critical.step.min()) < run_a["steps"]


def test_detach_leaves_the_trainer_as_trl_built_it(run_a):
    trainer, callback = run_a["trainer"], run_a["callback"]
    model = trainer.model
    assert model.__dict__["forward"] is callback._forward_fused  # ours (asks for log Σp² too) while attached
    assert callback._forward_before.__func__.__code__.co_name == "_fused_forward"
    callback.detach(finish=False)
    assert model.__dict__["forward"] is callback._forward_before  # TRL's own fused forward again
    assert not model._forward_hooks and not model._forward_pre_hooks and not model.model._forward_hooks
    assert not model.get_output_embeddings()._forward_hooks
    assert "_generate_and_score_completions" not in trainer.__dict__
    assert "get_high_entropy_mask" not in trainer.__dict__
    assert callback not in trainer.callback_handler.callbacks


def test_training_is_bit_identical_without_the_callback(run_a, tiny_model_path, tmp_path):
    rewards: list = []
    trainer = make_trainer(tiny_model_path, tmp_path / "out", run_a["steps"], rewards)
    probe = LogProbe()
    trainer.add_callback(probe)
    trainer.train()
    assert rewards == run_a["rewards"]  # same completions sampled
    for step in range(1, run_a["steps"] + 1):
        for key in ("loss", "grad_norm", "entropy"):
            assert probe.logs[step][key] == run_a["probe"].logs[step][key], (step, key)
    for name, param in trainer.model.named_parameters():
        assert torch.equal(param.detach(), run_a["params"][name]), name


def test_unknown_trl_version_warns_and_keeps_scalars(tiny_model_path, tmp_path, monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "9.0.0")
    trainer = make_trainer(tiny_model_path, tmp_path / "out", 1, [])
    sink = LocalSink(str(tmp_path / "u.duckdb"), "unknown")
    with pytest.warns(UserWarning, match="TRL 9.0.0 is not a version forksight knows"):
        callback = forksight.trl.attach(trainer, sink=sink)
    assert callback.handle is None and not trainer.model._forward_hooks
    trainer.train()
    sink.flush()
    keys = set(sink.reader.scalar_keys(sink.run_id))
    assert {"entropy", "reward", "loss"} <= keys and "entropy/mean" not in keys
    assert sink.reader.token_steps(sink.run_id) == []
    sink.finish()


def test_trl_114_example_streams_through_a_real_collector(tmp_path):
    from collector_util import ServeProcess

    from forksight.monitor.collector.store import Store

    assert (TRL114 / "trl").is_dir(), f"TRL 1.14 is missing at {TRL114}: run `make setup` (it installs it there)"
    db = tmp_path / "c.duckdb"
    env = {**os.environ, "PYTHONPATH": f"{TRL114}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1"}
    with ServeProcess(db) as srv:
        proc = subprocess.run(
            [sys.executable, "examples/trl_grpo.py", "--url", srv.url, "--run", "ex114", "--steps", "2",
             "--output-dir", str(tmp_path / "out")],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    store = Store(str(db))
    try:
        reader = store.reader
        runs = reader.list_runs()
        config = runs.set_index("run_id").loc["ex114", "config"]
        assert '"trl": "1.14' in config if isinstance(config, str) else config["trl"].startswith("1.14")
        s = reader.read_scalars("ex114")
        value = lambda key, step: float(s[(s.key == key) & (s.step == step)].value.iloc[0])  # noqa: E731
        for step in (1, 2):
            assert value("entropy/mean", step) == pytest.approx(value("entropy", step), abs=1e-3)
            assert 0 < value("top1/mean", step) <= 1  # the logits path has full distributions for all rows
        assert len(reader.read_samples("ex114", 1)) == 16 and len(reader.read_tokens("ex114", 1)) > 0
    finally:
        store.close()
