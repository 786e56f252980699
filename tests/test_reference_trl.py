"""The reference set on a real GRPOTrainer (tiny offline model, CPU) through `forksight.trl.attach(...,
reference_every=2)`: sampled once from the eval dataset's prompts as TRL builds them, re-scored every
2 steps with the same text; the rows equal a float64 scoring of that text by TRL's saved checkpoint;
a run resumed from that checkpoint keeps its set and base (saved beside TRL's weights)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import forksight.trl
from forksight.hooks.capture.reference import set_from_rows
from forksight.monitor.collector.store import Store
from test_reference import float64_scores

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def even_first_token(completions, completion_ids, **kwargs):
    return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


def _trainer(tiny_model_path, out: Path, steps: int):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load

    model, tokenizer = load(tiny_model_path)
    config = GRPOConfig(output_dir=str(out), report_to="none", use_cpu=True, bf16=False, seed=0,
                        per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                        learning_rate=5e-3, max_steps=steps, logging_steps=1, save_strategy="steps", save_steps=2,
                        disable_tqdm=True)
    train = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    held = Dataset.from_list([{"prompt": f"{40 + i}+{3 * i}="} for i in range(10)])
    return GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=train,
                       eval_dataset=held, processing_class=tokenizer)


@pytest.fixture(scope="module")
def trl_run(tiny_model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reference_trl")
    db = str(tmp / "trl.duckdb")
    trainer = _trainer(tiny_model_path, tmp / "out", 2)
    callback = forksight.trl.attach(trainer, db=db, run="trl-ref", reference_every=2, reference_size=6,
                                    reference_budget=100.0)
    trainer.train()
    callback.detach()
    assert callback.reference not in trainer.callback_handler.callbacks
    return {"db": db, "tmp": tmp, "tokenizer": trainer.processing_class}


def test_the_set_comes_from_the_eval_prompts_and_is_rescored_with_the_same_text(trl_run, tiny_model_path):
    from transformers import AutoModelForCausalLM

    with Store(trl_run["db"]) as store:
        reader = store.reader
        assert reader.reference_steps("trl-ref") == [0, 2]
        ref, _ = set_from_rows(reader.read_reference("trl-ref", 0).to_dict("records"))
        last = reader.read_reference("trl-ref", 2).to_dict("records")
    tok = trl_run["tokenizer"]
    assert [tok.decode(p) for p in ref.prompts] == [f"{40 + i}+{3 * i}=" for i in range(6)]
    assert len(ref) == 6 and all(1 <= len(c) <= 6 for c in ref.completions)
    checkpoint = trl_run["tmp"] / "out" / "checkpoint-2"
    saved = json.loads((checkpoint / "forksight_reference.json").read_text())
    assert (saved["prompts"], saved["completions"]) == (ref.prompts, ref.completions)
    want = float64_scores(AutoModelForCausalLM.from_pretrained(checkpoint).eval(), ref, 1.0)
    assert [(r["sample_id"], r["token_id"]) for r in last] == [(i, t) for i, c in enumerate(ref.completions) for t in c]
    for r in last:
        assert r["entropy"] == pytest.approx(want[r["sample_id"]]["entropy"][r["pos"]], abs=5e-5)
        assert r["logp"] == pytest.approx(want[r["sample_id"]]["logp"][r["pos"]], abs=5e-5)


def test_a_resumed_trl_run_keeps_its_set_and_base(trl_run, tiny_model_path):
    trainer = _trainer(tiny_model_path, trl_run["tmp"] / "out", 4)
    callback = forksight.trl.attach(trainer, db=trl_run["db"], run="trl-ref-resumed", reference_every=2,
                                    reference_size=6, reference_budget=100.0)
    trainer.train(resume_from_checkpoint=str(trl_run["tmp"] / "out" / "checkpoint-2"))
    callback.detach()
    with Store(trl_run["db"]) as store:
        reader = store.reader
        assert reader.reference_steps("trl-ref-resumed") == [4]          # no new base: the saved one
        ref, _ = set_from_rows(reader.read_reference("trl-ref", 0).to_dict("records"))
        rows = reader.read_reference("trl-ref-resumed", 4).to_dict("records")
        scalars = reader.read_scalars("trl-ref-resumed")
    assert [(r["sample_id"], r["token_id"]) for r in rows] == [(i, t) for i, c in enumerate(ref.completions) for t in c]
    assert "ref/fork_overlap" in set(scalars.key)


def test_reference_every_below_zero_is_refused_before_anything_opens(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path / "out", 1)
    with pytest.raises(ValueError, match="reference_every must be >= 0"):
        forksight.trl.attach(trainer, db=str(tmp_path / "x.duckdb"), reference_every=-1)
    assert not (tmp_path / "x.duckdb").exists()


def test_rescore_over_three_real_trl_checkpoints_equals_each_checkpoints_own_forward(tiny_model_path, tmp_path,
                                                                                      capsys):
    """A TRL run without a reference set (reference_every=0) saving checkpoint-1, -2, -3, then `forksight
    rescore --from-step 1` over its output folder: each checkpoint's rows are its own teacher-forced scores."""
    from transformers import AutoModelForCausalLM

    from forksight.compose.cli import main

    trainer = _trainer(tiny_model_path, tmp_path / "out", 3)
    trainer.args.save_steps = 1
    db = str(tmp_path / "trl.duckdb")
    callback = forksight.trl.attach(trainer, db=db, run="trl-plain", reference_every=0, sample=2)
    trainer.train()
    callback.detach()
    assert sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2",
                                                                                "checkpoint-3"]
    assert main(["rescore", "--db", db, "--run", "trl-plain", "--from-step", "1", "--size", "4",
                 "--checkpoints", str(tmp_path / "out"), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [c["step"] for c in out["checkpoints"]] == [1, 2, 3] and out["base_step"] == 0
    with Store(db) as store:
        reader = store.reader
        assert reader.reference_steps("trl-plain") == [0, 1, 2, 3]    # the base: step 1's stored statistics
        ref, _ = set_from_rows(reader.read_reference("trl-plain", 0).to_dict("records"))
        rows = {s: reader.read_reference("trl-plain", s).to_dict("records") for s in (1, 2, 3)}
    for step in (1, 2, 3):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / f"checkpoint-{step}").eval()
        want = float64_scores(model, ref, 1.0)
        scored = [r for r in rows[step] if r["pos"] >= 0]
        assert len(scored) == sum(map(len, ref.completions))
        for r in scored:
            assert r["entropy"] == pytest.approx(want[r["sample_id"]]["entropy"][r["pos"]], abs=1e-5)
            assert r["logp"] == pytest.approx(want[r["sample_id"]]["logp"][r["pos"]], abs=1e-5)
