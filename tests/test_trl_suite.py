"""A representative slice of TRL's own GRPOTrainer tests (tests/test_grpo_trainer.py, same names,
configs and assertions) with forksight attached to every trainer they build, on offline stand-ins
for the hub models (tests/trl_models.py). Each test must pass as it does without forksight, and
the stored entropy must be what TRL logged: TRL logs the mean over each `logging_steps` window,
so the mean of the stored per-step values over the same window is compared (within 1e-4).

Differences from TRL's bodies: use_cpu/bf16=False (CPU only) and the zen stand-in dataset.
"""
from __future__ import annotations

import pytest
import torch

import forksight.trl
from forksight.compose.local import LocalSink

pytestmark = pytest.mark.usefixtures("one_torch_thread")

POLICY = "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"
REWARD_MODEL = "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5"
CPU = dict(use_cpu=True, bf16=False)


@pytest.fixture(scope="module")
def hub(tiny_model_path, tmp_path_factory):
    from trl_models import build_trl_hub

    return build_trl_hub(tiny_model_path, tmp_path_factory.mktemp("hub"))


@pytest.fixture()
def attached(hub, tmp_path, monkeypatch):
    """Every GRPOTrainer built in the test gets forksight.trl.attach(...) on its own DuckDB file."""
    from trl import GRPOTrainer

    monkeypatch.chdir(hub)  # the hub ids resolve to the local stand-in folders
    runs: list[dict] = []
    original = GRPOTrainer.__init__

    def init_and_attach(self, *args, **kwargs):
        original(self, *args, **kwargs)
        sink = LocalSink(str(tmp_path / f"fs{len(runs)}.duckdb"), f"trl-test-{len(runs)}")
        runs.append({"trainer": self, "sink": sink, "callback": forksight.trl.attach(self, sink=sink)})

    monkeypatch.setattr(GRPOTrainer, "__init__", init_and_attach)
    yield runs
    for run in runs:
        run["callback"].detach()
        run["sink"].finish()


def assert_entropy_is_trls(runs: list[dict]) -> None:
    """Each logged window's entropy equals the mean of forksight's per-step entropy over it."""
    assert runs, "the test built no GRPOTrainer"
    for run in runs:
        sink = run["sink"]
        sink.flush()
        scalars = sink.reader.read_scalars(sink.run_id, keys=["entropy/mean"], downsample=100000)
        stored = dict(zip(scalars.step, scalars.value))
        windows, last = 0, 0
        for entry in run["trainer"].state.log_history:
            if "entropy" in entry:
                step = entry["step"]
                ours = [stored[s] for s in range(last + 1, step + 1)]
                assert sum(ours) / len(ours) == pytest.approx(entry["entropy"], abs=1e-4), step
                windows, last = windows + 1, step
        assert windows >= 1
        assert sink.reader.token_steps(sink.run_id)  # per-token rows were stored too


def assert_params_changed(trainer, previous: dict) -> None:
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for n, param in previous.items():
        assert not torch.equal(param, trainer.model.get_parameter(n)), f"Parameter {n} has not changed."


def train_and_check(trainer, runs) -> None:
    previous = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert_params_changed(trainer, previous)
    assert_entropy_is_trls(runs)


# ---------------------------------------------------------------------------- TRL's tests


def test_train(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args, train_dataset=zen("standard_prompt_only"))
    train_and_check(trainer, attached)


def test_train_dataset_format_conversational(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args,
                          train_dataset=zen("conversational_prompt_only"))
    train_and_check(trainer, attached)


@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_train_loss_types(attached, loss_type):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    args = GRPOConfig(output_dir="out", importance_sampling_level="sequence" if loss_type == "luspo" else "token",
                      learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_completion_length=32,
                      gradient_accumulation_steps=2, loss_type=loss_type, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args, train_dataset=zen("standard_prompt_only"))
    train_and_check(trainer, attached)


def test_train_multiple_iterations(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, num_iterations=2, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args, train_dataset=zen("standard_prompt_only"))
    train_and_check(trainer, attached)


def test_train_beta_non_zero(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    args = GRPOConfig(output_dir="out", beta=0.1, learning_rate=0.1, per_device_train_batch_size=3,
                      num_generations=3, max_completion_length=8, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args, train_dataset=zen("standard_prompt_only"))
    train_and_check(trainer, attached)


def test_train_multiple_reward_funcs(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    def reward_func1(completions, **kwargs):
        return [float(len(completion)) for completion in completions]

    def reward_func2(completions, **kwargs):
        return [float(len(set(completion))) for completion in completions]

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=[reward_func1, reward_func2], args=args,
                          train_dataset=zen("standard_prompt_only"))
    train_and_check(trainer, attached)


def test_train_reward_func_conversational(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    def reward_func(completions, **kwargs):
        return [float(len(completion[0]["content"])) for completion in completions]

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=reward_func, args=args,
                          train_dataset=zen("conversational_prompt_only"))
    train_and_check(trainer, attached)


def test_train_with_entropy_filter(attached):
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", top_entropy_quantile=0.2, **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args, train_dataset=zen("standard_prompt_only"))
    train_and_check(trainer, attached)


def test_train_peft_config(attached):
    pytest.importorskip("peft", reason="TRL's PEFT tests need peft (not installed here)")
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import zen

    model = AutoModelForCausalLM.from_pretrained(POLICY, dtype="float32")
    base_param_names = [f"base_model.model.{n}" for n, _ in model.named_parameters()]
    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=8, report_to="none", **CPU)
    trainer = GRPOTrainer(model=model, reward_funcs=REWARD_MODEL, args=args, train_dataset=zen("standard_prompt_only"),
                          peft_config=LoraConfig())
    previous = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for n, param in previous.items():
        new_param = trainer.model.get_parameter(n)
        if n in base_param_names:
            torch.testing.assert_close(param, new_param, msg=f"Parameter {n} has changed.")
        elif "base_layer" not in n:
            assert not torch.equal(param, new_param), f"Parameter {n} has not changed."
    assert_entropy_is_trls(attached)


# ---------------------------------------------------------------------------- tools and environments
# TRL runs these on tiny-Qwen3MoeForCausalLM; the stand-in is the same tiny Qwen2 with Qwen3's
# chat template. Generation is scripted as in TRL (its fake_generate), in the stand-in's tokens.
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>'


def test_train_with_tools(attached):
    from unittest.mock import patch

    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import multiply_tool, scripted_generate, zen

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=3, num_generations=3,
                      max_completion_length=128, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args,
                          train_dataset=zen("conversational_prompt_only"), tools=[multiply_tool])
    previous = {n: p.clone() for n, p in trainer.model.named_parameters()}
    first = [CALL.format(name="multiply_tool", args='{"a": 3, "b": 4}'),
             CALL.format(name="multiply_tool", args='{"a": 3, "c": 4}'), "I don't know any tool<|im_end|>"]
    fake = scripted_generate(AutoTokenizer.from_pretrained(POLICY), first, "Done!<|im_end|>")
    with patch.object(trainer.model, "generate", side_effect=fake):
        trainer.train()
    assert_params_changed(trainer, previous)
    assert trainer.state.log_history[-1]["tools/call_frequency"] is not None
    assert trainer.state.log_history[-1]["tools/failure_frequency"] is not None
    assert_entropy_is_trls(attached)


def test_train_with_multiple_environments(attached, monkeypatch):
    from unittest.mock import patch

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_models import scripted_generate

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    calls = {"increment": [], "shout": []}

    class CounterEnvironment:
        def reset(self, **kwargs):
            return "Count."

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            calls["increment"].append(step)
            return step

    class EchoEnvironment:
        def reset(self, **kwargs):
            return "Echo."

        def shout(self, text: str) -> str:
            """
            Shout the given text.

            Args:
                text: Text to shout.

            Returns:
                The text in upper case.
            """
            calls["shout"].append(text)
            return text.upper()

    args = GRPOConfig(output_dir="out", learning_rate=0.1, per_device_train_batch_size=4, num_generations=2,
                      shuffle_dataset=False, report_to="none", **CPU)
    trainer = GRPOTrainer(model=POLICY, reward_funcs=REWARD_MODEL, args=args,
                          train_dataset=Dataset.from_dict({"environment": ["counter", "echo"] * 8}),
                          environment_factory={"counter": CounterEnvironment, "echo": EchoEnvironment})
    previous = {n: p.clone() for n, p in trainer.model.named_parameters()}
    first = [CALL.format(name="increment", args='{"step": 1}'), "I won't<|im_end|>",
             CALL.format(name="shout", args='{"text": "hi"}'), "Done!<|im_end|>"]
    fake = scripted_generate(AutoTokenizer.from_pretrained(POLICY), first, "Done!<|im_end|>")
    with patch.object(trainer.model, "generate", side_effect=fake):
        trainer.train()
    assert_params_changed(trainer, previous)
    assert calls["increment"] and calls["shout"]
    assert trainer.state.log_history[-1]["tools/call_frequency"] == pytest.approx(2 / 4)
    assert trainer.state.log_history[-1]["tools/failure_frequency"] == pytest.approx(0.0)
    assert_entropy_is_trls(attached)
