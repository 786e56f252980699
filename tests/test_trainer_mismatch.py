"""The bundled trainer's sampler (a copy of the policy in sampler_dtype, as an inference engine)
and its token-level TIS correction: what is stored agrees with a float64 recomputation from the
stored token rows, the sampler follows the policy, and the TIS gradient is the hand-worked one."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from forksight.hooks.metrics.mismatch import log_ratio
from forksight.monitor.collector.store import Store
from forksight.trainer.config import load_config
from forksight.trainer.loop import train
from forksight.trainer.loss import grpo_loss, tis_weights
from forksight.trainer.rollout import completion_logits, token_logp
from forksight.trainer.sampler import Sampler


def _run(tmp_path, name: str, **over):
    """A short real run on the tiny model; every sequence's token rows are stored."""
    values = dict(db=str(tmp_path / f"{name}.duckdb"), out_dir=str(tmp_path / "runs"), run=name,
                  token_groups=2, steps=2)  # tiny-test: 2 prompts per step, so every group
    values.update(over)
    result = train(load_config(preset="tiny-test", overrides=values))
    with Store(values["db"]) as store:
        scalars = store.reader.read_scalars(result.run_id)
        tokens = {step: store.reader.read_tokens(result.run_id, step) for step in (1, 2)}
    at = {step: dict(zip(scalars[scalars.step == step].key, scalars[scalars.step == step].value))
          for step in (1, 2)}
    return at, tokens


def _k3(train_logp: np.ndarray, sampler_logp: np.ndarray) -> float:
    """mean(r - 1 - log r), r = p_train / p_sampler, in float64 from the stored float32 columns."""
    lr = train_logp.astype(np.float64) - sampler_logp.astype(np.float64)
    return float(np.mean(np.exp(lr) - 1 - lr))


def test_bfloat16_sampler_stores_its_own_logp_and_the_scalars_match_the_rows(tmp_path):
    at, tokens = _run(tmp_path, "bf16", sampler_dtype="bfloat16")
    for step in (1, 2):
        rows, s = tokens[step], at[step]
        assert len(rows) == s["tokens/count"] == s["mismatch/tokens"]  # every token has both log p
        assert rows.sampler_logp.notna().all()
        diff = (rows.logp - rows.sampler_logp).abs()
        assert diff.max() > 1e-4  # bf16 rounding is visible
        assert s["mismatch/kl_k3"] == pytest.approx(_k3(rows.logp.values, rows.sampler_logp.values),
                                                     rel=1e-5, abs=1e-12)
        assert s["mismatch/logp_diff_abs_max"] == pytest.approx(diff.max(), rel=1e-5)
        fork = rows[rows.fork.astype(bool)]
        if len(fork):
            assert s["mismatch/kl_k3/fork"] == pytest.approx(_k3(fork.logp.values, fork.sampler_logp.values),
                                                              rel=1e-5, abs=1e-12)


def test_float32_sampler_reports_a_mismatch_near_zero(tmp_path):
    at, tokens = _run(tmp_path, "fp32")  # the default sampler_dtype
    for step in (1, 2):
        rows = tokens[step]
        assert rows.sampler_logp.notna().all()
        # the same weights and dtype: only the KV-cached vs full forward's rounding differs
        assert (rows.logp - rows.sampler_logp).abs().max() < 1e-4
        assert at[step]["mismatch/kl_k3"] < 1e-9


def test_tis_marks_the_tokens_it_truncated(tmp_path):
    # logits noise makes many ratios leave [1/1.5, 1.5]; the loss's r is the one the rows store
    at, tokens = _run(tmp_path, "tis", sampler_noise=1.0, tis_cap=1.5)
    for step in (1, 2):
        rows = tokens[step]
        above = float(np.mean(rows.logp.values.astype(np.float64) - rows.sampler_logp.values > math.log(1.5)))
        assert above > 0
        assert at[step]["mismatch/frac_corrected"] == pytest.approx(above, abs=1.5 / len(rows))


def test_tis_gradient_is_the_hand_worked_formula():
    """d loss / d logp_t = -w_t · ρ_t · A / N on tokens the PPO clip leaves alone, 0 on clipped
    ones, with w_t = min(exp(old_t - sampler_t), cap) and N the valid token count."""
    gen = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 5, generator=gen, dtype=torch.float64) * 3
    old = logp + 0.3 * torch.randn(4, 5, generator=gen, dtype=torch.float64)  # ρ ≠ 1: some clip
    sampler = old + torch.randn(4, 5, generator=gen, dtype=torch.float64)      # r from 0.1× to 10×
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    valid = torch.ones(4, 5, dtype=torch.bool)
    valid[1, 3:] = False
    sampler[2, 1] = math.nan  # unknown sampler log p: weight 1, never "corrected"
    cap, clip_low, clip_high = 2.0, 0.2, 0.28
    weight, corrected = tis_weights(log_ratio(old, sampler, valid), cap)
    x = logp.clone().requires_grad_(True)
    loss, _ = grpo_loss(x, old, adv, valid, valid, clip_low=clip_low, clip_high=clip_high,
                        is_weight=weight)
    loss.backward()
    n = int(valid.sum())
    for b in range(4):
        for t in range(5):
            r = math.exp(old[b, t] - sampler[b, t]) if not math.isnan(sampler[b, t]) else 1.0
            w = min(r, cap)
            rho = math.exp(logp[b, t] - old[b, t])
            a = float(adv[b])
            clipped = (a > 0 and rho > 1 + clip_high) or (a < 0 and rho < 1 - clip_low)
            grad = 0.0 if clipped or not valid[b, t] else -w * rho * a / n
            assert float(x.grad[b, t]) == pytest.approx(grad, rel=1e-5, abs=1e-7), (b, t)
            assert bool(corrected[b, t]) == (bool(valid[b, t]) and r > cap)
    assert corrected.any() and (~corrected & valid).any()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])  # both run on the CPU with torch 2.x
def test_sampler_follows_the_policy_and_reports_its_own_logp(tiny, dtype):
    """After the policy moves, the half-precision copy samples from the moved weights (refresh),
    and its log p is the moved policy's within rounding, not the old one's."""
    model, tokenizer = tiny
    sampler = Sampler(model, dtype)
    assert sampler.separate and next(sampler.model.parameters()).dtype == getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before = {n: p.clone() for n, p in model.named_parameters()}
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    torch.manual_seed(0)
    roll = sampler.generate(tokenizer, ["12+34=", "5+7="], 3, step=1, temperature=0.8, max_new_tokens=5)

    def policy_logp() -> torch.Tensor:
        with torch.no_grad():
            logits = completion_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        return token_logp(logits, roll.completion, 0.8)[roll.mask]

    moved = policy_logp()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(before[n])
    old = policy_logp()
    ours = roll.sampler_logp[roll.mask]
    assert torch.isnan(roll.sampler_logp[~roll.mask]).all()
    assert (ours - moved).abs().max() < 0.05 < (ours - old).abs().max()


def test_sampler_noise_starts_at_its_step(tiny):
    model, tokenizer = tiny
    sampler = Sampler(model, "float32", noise=2.0, noise_from_step=3)
    assert sampler.separate  # noise needs its own copy even in the policy's dtype

    def max_gap(step: int) -> float:
        torch.manual_seed(0)
        roll = sampler.generate(tokenizer, ["12+34="], 4, step=step, temperature=1.0, max_new_tokens=4)
        with torch.no_grad():
            logits = completion_logits(model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        return float((token_logp(logits, roll.completion, 1.0) - roll.sampler_logp)[roll.mask].abs().max())

    assert max_gap(2) < 1e-4
    assert max_gap(3) > 0.5
    assert Sampler(model, "float32").model is model  # nothing differs: the policy samples itself


@pytest.mark.parametrize("override, words", [
    (dict(sampler_dtype="float64"), ["sampler_dtype", "float32", "bfloat16", "float16"]),
    (dict(tis_cap=0.5), ["tis_cap", "at least 1"]),
    (dict(tis_cap=float("nan")), ["tis_cap", "at least 1"]),
    (dict(sampler_noise=-0.1), ["sampler_noise", "greater than or equal to 0"]),
    (dict(sampler_noise_from_step=5), ["sampler_noise_from_step", "sampler_noise > 0"]),
])
def test_bad_sampler_and_tis_values_are_refused_with_the_reason(override, words):
    with pytest.raises(ValueError) as err:
        load_config(preset="tiny-test", overrides=override)
    for word in words:
        assert word in str(err.value)


def test_cli_tis_flag_sets_the_cap():
    from forksight.compose.cli import build_parser

    args = build_parser().parse_args(["train", "--tis", "2", "--sampler-dtype", "float16"])
    assert args.tis_cap == 2.0 and args.sampler_dtype == "float16"
