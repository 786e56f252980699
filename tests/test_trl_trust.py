"""trust/* on a real TRL GRPOTrainer (tiny offline model, CPU) that reuses each generation batch four
times (num_iterations=4): forksight's trust/clip_frac, computed from TRL's own per-token log p and
old_per_token_logps, equals TRL's clip_ratio/region_mean at every logged step; TV and its splits are
in range and consistent; a run without reuse stores no trust/*; detach removes the taps."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import forksight.trl
from forksight.compose.local import LocalSink

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
G, PROMPTS, LENGTH, STEPS = 4, 2, 8, 12


def _run(model_path, tmp, name: str, **kw) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load

    model, tokenizer = load(model_path)

    def even_first_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    config = GRPOConfig(output_dir=str(tmp / name), report_to="none", use_cpu=True, bf16=False, seed=0,
                        per_device_train_batch_size=PROMPTS * G, num_generations=G, max_completion_length=LENGTH,
                        learning_rate=2e-2, lr_scheduler_type="constant", max_steps=STEPS, logging_steps=1,
                        save_strategy="no", disable_tqdm=True, **kw)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    sink = LocalSink(str(tmp / f"{name}.duckdb"), name)
    callback = forksight.trl.attach(trainer, sink=sink)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    sink.flush()
    scalars = sink.reader.read_scalars(sink.run_id, downsample=100000)
    tokens = pd.concat([sink.reader.read_tokens(sink.run_id, s) for s in sink.reader.token_steps(sink.run_id)])
    callback.detach()
    sink.finish()
    return {"trainer": trainer, "tokens": tokens, "scalars": {k: dict(zip(g.step, g.value)) for k, g in scalars.groupby("key")}}


@pytest.fixture(scope="module")
def reused(tiny_model_path, tmp_path_factory):
    return _run(tiny_model_path, tmp_path_factory.mktemp("trl_trust"), "reused", num_iterations=4)


def test_trust_clip_frac_equals_trls_region_clip_ratio_at_every_logged_step(reused):
    got, trl = reused["scalars"]["trust/clip_frac"], reused["scalars"]["clip_ratio/region_mean"]
    assert sorted(got) == sorted(trl) == list(range(1, STEPS + 1))
    for step in trl:
        assert got[step] == pytest.approx(trl[step], abs=1e-6), step
    assert max(trl.values()) > 0          # the ratio departed from 1 and the clip bound: not a 0 == 0 check


def test_tv_and_its_splits_are_consistent(reused):
    s = reused["scalars"]
    assert max(s["trust/tv_mean"].values()) > 0
    for step, tv in s["trust/tv_mean"].items():
        assert 0 <= tv <= s["trust/tv_max"][step] <= 1
        assert 0 <= s["trust/tv_outside_frac"][step] <= 1
        quartiles = [s[f"trust/tv_mean/q{q}"][step] for q in range(1, 5)]
        # the step's mean is the quartiles' mean within rounding (equal counts up to one token each)
        assert min(quartiles) - 1e-6 <= tv <= max(quartiles) + 1e-6


def test_detach_removes_the_loss_taps(reused):
    trainer = reused["trainer"]
    assert "_compute_loss" not in trainer.__dict__ and "_get_per_token_logps_and_entropies" not in trainer.__dict__


def test_a_run_without_reuse_stores_no_trust_scalars(tiny_model_path, tmp_path):
    run = _run(tiny_model_path, tmp_path, "fresh")
    assert not [k for k in run["scalars"] if k.startswith("trust/")]
    assert len(run["tokens"]) and run["tokens"].tv.isna().all() and run["tokens"].clipped.isna().all()
    assert "clip_ratio/region_mean" in run["scalars"]


def test_token_columns_are_stored_and_agree_with_the_stored_log_p(reused):
    """Each stored token's ratio, TV and clip, from the micro-batch that trained it: TV = π(y)·|1 − 1/r|
    with π(y) = exp(logp) of the same forward; TV exactly 0 and r exactly 1 on the first update of each
    generation batch (steps 1, 5, 9: TRL recomputes π_old with the same weights); the clip flag only where
    the ratio left [1 − ε_low, 1 + ε_high]."""
    tokens, trainer = reused["tokens"], reused["trainer"]
    model = tokens[~tokens.env & tokens.entropy.notna()]
    assert model.tv.notna().all() and model.clipped.notna().all()
    ratio, logp = model.ratio.to_numpy(np.float64), model.logp.to_numpy(np.float64)
    np.testing.assert_allclose(model.tv.to_numpy(np.float64), np.exp(logp) * np.abs(1 - 1 / ratio), atol=2e-5)
    first = model.step.isin(range(1, STEPS + 1, 4))
    assert (model[first].tv == 0).all() and (model[first].ratio == 1).all()
    assert model[~first].tv.max() > 0
    outside = (ratio < 1 - trainer.epsilon_low) | (ratio > 1 + trainer.epsilon_high)
    assert not (model.clipped.to_numpy(bool) & ~outside).any()
    assert model.clipped.any()
