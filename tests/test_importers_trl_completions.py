"""TRL's completions log, as a real GRPOTrainer(log_completions=True) writes it on the tiny local
model (CPU): <output_dir>/completions/completions_NNNNN.parquet. forksight reads it as samples
(prompt, completion, reward = the reward function's value, a group = a prompt's G completions) and
`forksight import` stores them with pass@k per step, checked against a hand count of the rewards
TRL handed back to the reward function. The same run also reports to a W&B offline run (HF's
WandbCallback), read back with the W&B reader and compared with its trainer_state.json."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from forksight.monitor.importers import SourceError, read_source

G, PROMPTS, LENGTH, STEPS = 4, 2, 4, 3


@pytest.fixture(scope="module")
def trl_out(tiny_model_path, tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load

    out = tmp_path_factory.mktemp("trl_completions") / "out"
    model, tokenizer = load(tiny_model_path)
    calls: list[tuple[list[str], list[str], list[float]]] = []

    def even_first_token(prompts, completions, completion_ids, **kwargs):
        rewards = [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]
        calls.append((list(prompts), list(completions), rewards))
        return rewards

    wandb_dir = out.parent / "wb"
    wandb_dir.mkdir()
    env = pytest.MonkeyPatch()        # TRL also reports to a W&B offline run: its real keys, read back
    env.setenv("WANDB_MODE", "offline")
    env.setenv("WANDB_DIR", str(wandb_dir))
    env.setenv("WANDB_SILENT", "true")
    env.setenv("WANDB_PROJECT", "forksight-test")
    config = GRPOConfig(
        output_dir=str(out), report_to=["wandb"], run_name="trl-wandb", use_cpu=True, bf16=False, seed=0, log_completions=True,
        per_device_train_batch_size=PROMPTS * G, num_generations=G, max_completion_length=LENGTH,
        learning_rate=5e-3, max_steps=STEPS, logging_steps=1, save_strategy="steps", save_steps=STEPS,
        disable_tqdm=True)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(32)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    try:
        trainer.train()
        import wandb

        wandb.finish()
    finally:
        env.undo()
    return out, calls


def test_the_files_trl_wrote_are_read_as_samples(trl_out):
    out, calls = trl_out
    files = sorted((out / "completions").glob("completions_*.parquet"))
    assert [f.name for f in files] == [f"completions_{s:05d}.parquet" for s in range(1, STEPS + 1)]
    run = read_source(out / "completions")
    assert run.kind == "trl-completions" and run.config["reward_functions"] == ["even_first_token"]
    assert len(run.samples) == STEPS * PROMPTS * G
    for step, (prompts, completions, rewards) in enumerate(calls, 1):   # one generation batch per step
        got = [s for s in run.samples if s["step"] == step]
        assert [s["prompt"] for s in got] == prompts and [s["completion"] for s in got] == completions
        assert [s["reward"] for s in got] == rewards
        assert [s["correct"] for s in got] == [r > 0 for r in rewards]
        # a group is one prompt's G completions, as TRL's RepeatSampler lays them out
        assert [s["group_id"] for s in got] == [i // G for i in range(PROMPTS * G)]
        assert all(len({p for p, g in zip(prompts, range(len(prompts))) if g // G == k}) == 1 for k in range(PROMPTS))
    frame = pd.read_parquet(files[0])
    assert list(frame.columns[:3]) == ["step", "prompt", "completion"] and "advantage" in frame.columns


def test_import_stores_samples_and_pass_at_k(trl_out, tmp_path, capsys):
    from forksight.compose import cli
    from forksight.monitor.collector.store import Store

    out, calls = trl_out
    db = tmp_path / "c.duckdb"
    assert cli.main(["import", str(out), "--db", str(db), "--run", "trl-c"]) == 0   # the output dir
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["format"] == "trl" and summary["samples"] == STEPS * PROMPTS * G
    store = Store(str(db))
    try:
        samples = store.reader.read_samples("trl-c")
        scalars = store.reader.read_scalars("trl-c", downsample=100_000)
    finally:
        store.close()
    assert len(samples) == STEPS * PROMPTS * G and samples["completion"].tolist()[:G] == calls[0][1][:G]
    for step, (_, _, rewards) in enumerate(calls, 1):
        groups = [rewards[i:i + G] for i in range(0, len(rewards), G)]
        solved = sum(any(r > 0 for r in g) for g in groups) / len(groups)      # pass@G by hand
        mean_correct = sum(sum(r > 0 for r in g) / G for g in groups) / len(groups)
        at = scalars[scalars.step == step].set_index("key")["value"]
        assert at[f"pass@{G}"] == pytest.approx(solved) and at["pass@1"] == pytest.approx(mean_correct)
        # trainer_state.json's own reward (from the checkpoint) is kept, not overwritten by the samples'
        assert at["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))


def test_a_parquet_without_trl_columns_says_what_was_expected(tmp_path):
    folder = tmp_path / "completions"
    folder.mkdir()
    pd.DataFrame({"x": [1.0]}).to_parquet(folder / "completions_00001.parquet")
    with pytest.raises(SourceError, match="expected TRL's completions directory"):
        read_source(folder)
    (folder / "completions_00001.parquet").write_bytes(b"not parquet")
    with pytest.raises(SourceError, match="not a readable parquet"):
        read_source(folder)


def test_conversational_rows_and_two_reward_functions(tmp_path):
    """A conversational dataset's rows, built as GRPOTrainer.log builds its table (TRL's own
    strip_images_from_messages, the same column order, pandas' to_parquet; a real run on the tiny
    model's plain-text prompts is above): messages become
    "role: content" text, the reward is the sum of the functions that applied (NaN skipped)."""
    from trl.trainer.utils import strip_images_from_messages

    prompts = [[{"role": "user", "content": "2+2?"}]] * 2 + [[{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "Name a pet."}]] * 2
    completions = [[{"role": "assistant", "content": c}] for c in ("4", "5", "cat", "dog")]
    table = {"step": [7] * 4, "prompt": [strip_images_from_messages(m) for m in prompts],
             "completion": [strip_images_from_messages(m) for m in completions],
             "accuracy": [1.0, 0.0, float("nan"), float("nan")], "format": [0.5, 0.0, 0.0, 1.0],
             "advantage": [0.7, -0.7, -0.7, 0.7]}
    (tmp_path / "completions").mkdir()
    pd.DataFrame(table).to_parquet(tmp_path / "completions" / "completions_00007.parquet")
    run = read_source(tmp_path)
    assert run.config["reward_functions"] == ["accuracy", "format"]
    assert [s["prompt"] for s in run.samples] == ["user: 2+2?"] * 2 + ["system: Be brief.\nuser: Name a pet."] * 2
    assert [s["completion"] for s in run.samples] == ["assistant: 4", "assistant: 5", "assistant: cat",
                                                      "assistant: dog"]
    assert [s["reward"] for s in run.samples] == [1.5, 0.0, 0.0, 1.0]
    assert [s["group_id"] for s in run.samples] == [0, 0, 1, 1] and {s["step"] for s in run.samples} == {7}


def test_the_same_run_reported_to_wandb_offline_reads_as_its_trainer_state(trl_out):
    pytest.importorskip("wandb.sdk.internal.datastore", reason="needs wandb < 0.30 (the dev extra)")
    out, _ = trl_out
    from_wandb = read_source(out.parent / "wb" / "wandb")
    from_state = read_source(out)
    assert from_wandb.kind == "wandb" and from_wandb.name == "trl-wandb"
    assert from_wandb.renamed["train/reward"] == "reward/mean" and "train/entropy" in from_wandb.renamed
    # HF's WandbCallback logs train/global_step beside W&B's _step: the trainer's step is the run's
    # (TRL's profiling timings are logged at global step 0 too, before the first step ends)
    assert [s for s, r in zip(from_wandb.steps, from_wandb.rows) if "reward/mean" in r] == list(range(1, STEPS + 1))
    state_rows = [r for r in from_state.rows if "entropy/mean" in r]
    wandb_rows = [r for r in from_wandb.rows if "entropy/mean" in r]
    assert len(wandb_rows) == len(state_rows) == STEPS
    for a, b in zip(wandb_rows, state_rows):
        assert a["entropy/mean"] == pytest.approx(b["entropy/mean"]) and a["reward/mean"] == b["reward/mean"]
