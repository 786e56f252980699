"""forksight.trl as people really run GRPOTrainer (tiny offline models, CPU): tool calls (the
tool's output is environment text: stored, never scored), a dict of eval sets, gradient
accumulation. Every stored number is checked against what TRL itself logged."""
from __future__ import annotations

import math
import os
from pathlib import Path
from unittest.mock import patch

import pytest
from transformers import TrainerCallback

import forksight.trl
from forksight.compose.local import LocalSink

from trl114 import INNER_114, rerun_on_trl_114

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class LogProbe(TrainerCallback):
    """Every log call TRL made, in order: (step, logs)."""

    def __init__(self):
        self.calls: list[tuple[int, dict]] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.calls.append((state.global_step, dict(logs or {})))

    def train_logs(self) -> dict[int, dict]:
        return {step: logs for step, logs in self.calls if "loss" in logs}


def _scalar(scalars, key: str, step: int) -> float:
    values = scalars[(scalars.key == key) & (scalars.step == step)].value
    assert len(values) == 1, f"{key} at step {step}: {list(values)}"
    return float(values.iloc[0])


def _config(out: Path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(out), report_to="none", use_cpu=True, bf16=False, seed=0, logging_steps=1,
                save_strategy="no", disable_tqdm=True, lr_scheduler_type="constant")
    return GRPOConfig(**{**base, **kw})


# ---------------------------------------------------------------------------- tools


@pytest.fixture(scope="module")
def tool_run(tiny_model_path, tmp_path_factory):
    """TRL's test_train_with_tools on the tiny model: of each group of 3, one valid tool call,
    one failing call and one plain answer; a tool call is followed by the tool's result and a
    second assistant turn. top_entropy_quantile 0.5, so selection is exercised too."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from trl_models import build_chat_tiny, multiply_tool, scripted_generate

    tmp = tmp_path_factory.mktemp("trl_tools")
    path = build_chat_tiny(Path(tiny_model_path), tmp / "chat_tiny")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} times 4?"}]} for i in range(8)])

    def used_the_tool(completions, **kwargs):
        return [1.0 if any(m.get("role") == "tool" and m.get("content") == "12" for m in c) else 0.0
                for c in completions]

    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(path), processing_class=tokenizer,
                          reward_funcs=used_the_tool, train_dataset=data, tools=[multiply_tool],
                          args=_config(tmp / "out", per_device_train_batch_size=3, num_generations=3,
                                       max_completion_length=160, max_steps=3, learning_rate=0.1,
                                       top_entropy_quantile=0.5))
    probe = LogProbe()
    trainer.add_callback(probe)
    sink = LocalSink(str(tmp / "t.duckdb"), "tools")
    # generate is scripted below: a reference set sampled when training begins would take the script's first
    # answers, so this run keeps none (the reference set's own tests: tests/test_reference_trl.py)
    callback = forksight.trl.attach(trainer, sink=sink, js_groups="all", reference_every=0)
    call = '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
    wrong = '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "c": 4}}\n</tool_call><|im_end|>'
    fake = scripted_generate(tokenizer, [call, wrong, "I don't know any tool<|im_end|>"], "Done!<|im_end|>")
    with patch.object(trainer.model, "generate", side_effect=fake):
        trainer.train()
    sink.flush()
    reader = sink.reader
    yield {"logs": probe.train_logs(), "steps": trainer.state.global_step,
           "scalars": reader.read_scalars(sink.run_id, downsample=100000),
           "tokens": {s: reader.read_tokens(sink.run_id, s) for s in reader.token_steps(sink.run_id)},
           "samples": reader.read_samples(sink.run_id), "hist": reader.read_histograms(sink.run_id)}
    callback.detach()
    sink.finish()


def test_tool_output_is_not_scored_entropy_equals_trl(tool_run):
    assert tool_run["steps"] == 3
    for step, logs in tool_run["logs"].items():
        assert logs["tools/call_frequency"] > 0  # the tool loop really ran
        assert _scalar(tool_run["scalars"], "entropy/mean", step) == pytest.approx(logs["entropy"], abs=1e-6)


def test_tool_spans_are_stored_as_environment_text_with_null_statistics(tool_run):
    for step, tokens in tool_run["tokens"].items():
        text = "".join(tokens.sort_values(["sample_id", "pos"]).token)
        assert "<tool_response>" in text and "12" in text and "Done!" in text
        env = tokens[tokens.entropy.isna()]
        model = tokens[tokens.entropy.notna()]
        # marked as environment text, exactly the rows TRL's tool_mask leaves out of its entropy
        assert env.env.all() and not model.env.any()
        assert "".join(env.token).count("<tool_response>") == 2  # one per tool call of the group
        assert env[["logp", "renyi2", "js", "top1"]].isna().all().all()
        assert not env.fork.any() and not env.selected.any()
        assert model[["logp", "renyi2", "js", "top1"]].notna().all().all()
        # the whole group's model tokens are stored: their mean is TRL's number (float32 rows)
        assert model.entropy.mean() == pytest.approx(tool_run["logs"][step]["entropy"], abs=1e-5)
        # TRL keeps H >= its quantile among MODEL tokens: the stored selection is that mask
        threshold = model.entropy.quantile(0.5)
        clear = (model.entropy - threshold).abs() > 1e-5
        assert (model.selected[clear] == (model.entropy[clear] >= threshold)).all()


def test_lengths_histogram_and_token_count_count_model_tokens_only(tool_run):
    scalars, samples, hist = tool_run["scalars"], tool_run["samples"], tool_run["hist"]
    for step, logs in tool_run["logs"].items():
        rows = samples[samples.step == step]
        assert rows.length.mean() == pytest.approx(logs["completions/mean_length"], abs=1e-5)
        assert _scalar(scalars, "length/mean", step) == pytest.approx(logs["completions/mean_length"], abs=1e-5)
        n_model = int(tool_run["tokens"][step].entropy.notna().sum())
        assert _scalar(scalars, "tokens/count", step) == n_model
        assert int(hist[hist.step == step]["count"].sum()) == n_model


# ---------------------------------------------------------------------------- eval sets, accumulation


def _plain_trainer(tiny_model_path, out: Path, rewards: list, **kw):
    from datasets import Dataset
    from trl import GRPOTrainer

    from forksight.trainer.model import load

    model, tokenizer = load(tiny_model_path)

    def even_first_token(completions, completion_ids, **kwargs):
        values = [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]
        rewards.append(values)
        return values

    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    eval_sets = kw.pop("eval_dataset", None)
    args = _config(out, **{"per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 6,
                           "learning_rate": 5e-3, "per_device_eval_batch_size": 8, **kw})
    return GRPOTrainer(model=model, args=args, reward_funcs=even_first_token, train_dataset=data,
                       eval_dataset=eval_sets, processing_class=tokenizer)


def test_eval_pass_at_k_is_keyed_by_the_eval_sets_name(tiny_model_path, tmp_path):
    from datasets import Dataset

    sets = {"easy": Dataset.from_list([{"prompt": f"Q: {i}+{i}= A:"} for i in (1, 2)]),
            "hard": Dataset.from_list([{"prompt": "Q: 97+98= A:"}])}
    rewards: list = []
    trainer = _plain_trainer(tiny_model_path, tmp_path / "out", rewards, max_steps=1, eval_dataset=sets)
    probe = LogProbe()
    trainer.add_callback(probe)
    sink = LocalSink(str(tmp_path / "e.duckdb"), "evalsets")
    callback = forksight.trl.attach(trainer, sink=sink)
    trainer.train()
    n_train = len(rewards)
    trainer.evaluate()  # one evaluation per set, in dict order
    sink.flush()
    scalars = sink.reader.read_scalars(sink.run_id, downsample=100000)
    eval_rewards = rewards[n_train:]
    verdicts = {"easy": [r >= 1.0 for r in eval_rewards[0]], "hard": [r >= 1.0 for r in eval_rewards[1]]}
    assert [len(v) for v in verdicts.values()] == [8, 4]  # 2 prompts x 4, 1 prompt x 4
    for name, flat in verdicts.items():
        groups = [flat[i:i + 4] for i in range(0, len(flat), 4)]
        for k in range(1, 5):
            expected = sum(1 - math.comb(4 - sum(g), k) / math.comb(4, k) for g in groups) / len(groups)
            assert _scalar(scalars, f"eval/{name}/pass@{k}", 1) == pytest.approx(expected, abs=1e-12)
    assert not scalars.key.str.startswith("eval/pass@").any()
    # TRL's own eval metrics carry no set name: each evaluation's are filed under its set
    eval_logs = [logs for _, logs in probe.calls if any(k.startswith("eval") and k.endswith("_runtime") for k in logs)]
    for name, logs in zip(("easy", "hard"), eval_logs):
        assert _scalar(scalars, f"eval_{name}_reward", 1) == pytest.approx(logs["eval_reward"], rel=1e-9)
        assert _scalar(scalars, f"eval_{name}_loss", 1) == pytest.approx(logs[f"eval_{name}_loss"], rel=1e-9)
    callback.detach()
    sink.finish()


def test_gradient_accumulation_stores_trls_per_micro_batch_mean(tiny_model_path, tmp_path):
    trainer = _plain_trainer(tiny_model_path, tmp_path / "out", [], max_steps=3, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2)
    probe = LogProbe()
    trainer.add_callback(probe)
    sink = LocalSink(str(tmp_path / "g.duckdb"), "accum")
    callback = forksight.trl.attach(trainer, sink=sink, sample=2)  # both groups' token rows
    trainer.train()
    sink.flush()
    scalars = sink.reader.read_scalars(sink.run_id, downsample=100000)
    for step, logs in probe.train_logs().items():
        assert _scalar(scalars, "entropy/mean", step) == pytest.approx(logs["entropy"], abs=1e-6)
        tokens = sink.reader.read_tokens(sink.run_id, step)
        assert _scalar(scalars, "tokens/count", step) == len(tokens)  # every token of both micro-batches
    callback.detach()
    sink.finish()


# ---------------------------------------------------------------------------- TRL 1.14: the logits path


@pytest.mark.skipif(os.environ.get(INNER_114) == "1", reason="this is the TRL 1.14 rerun")
def test_the_same_tests_pass_on_trl_114_logits_path():
    """TRL 1.14 builds logits (the lm_head hook path, not the fused head): rerun this module on it."""
    rerun_on_trl_114(__file__, "6 passed, 1 skipped")


def test_trl_version_is_the_one_this_run_means():
    import trl

    assert trl.__version__.startswith("1.14") == (os.environ.get(INNER_114) == "1")
