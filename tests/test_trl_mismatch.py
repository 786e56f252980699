"""forksight.trl stores the sampler's log p of every token (TRL's `sampling_per_token_logps`) on a real
GRPOTrainer (tiny offline model, CPU). The sampler is a `rollout_func` engine: a copy of the policy,
re-synced every call, with fixed noise on its LM head, that samples and returns its own `logprobs`, as
vLLM would. Checked: the stored sampler log p is the engine's, token by token; the mismatch scalars
are a float64 recomputation from the stored rows and agree with TRL's own `sampling/*` metrics; the
tokens TRL's corrections changed (token-level truncated IS, off-policy sequence masking) are counted;
bad engine output is stored as null with one warning; a run without log-probs stores none."""
from __future__ import annotations

import copy
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import TrainerCallback

import forksight.trl
from forksight.compose.local import LocalSink

from trl114 import INNER_114, rerun_on_trl_114

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
G, PROMPTS, LENGTH, STEPS = 4, 2, 6, 3
CLIP_MIN, CLIP_MAX = 0.67, 1.5          # TRL's token_truncate bounds in the vLLM run
ENV_ROW, ENV_POS = 1, 2                 # this row's token at ENV_POS is environment text (env_mask = 0)


class NoisyEngine:
    """The inference engine: the policy's weights (synced each call, as TRL syncs vLLM) plus fixed noise
    on the LM head. Samples LENGTH - (row % 3) tokens per row (an engine stops rows early) and returns
    the log p of each under its own distribution; `calls` keeps what it sampled, before `corrupt`."""

    def __init__(self, policy, tokenizer, noise: float = 0.03, logprobs: bool = True, corrupt=None,
                 env: bool = False):
        self.policy, self.tokenizer, self.logprobs, self.corrupt, self.env = policy, tokenizer, logprobs, corrupt, env
        self.sampler = copy.deepcopy(policy).eval()
        self.noise = torch.randn(self.sampler.lm_head.weight.shape, generator=torch.Generator().manual_seed(7)) * noise
        self.gen = torch.Generator().manual_seed(11)
        self.calls: list[dict] = []

    @torch.no_grad()
    def sync_weights(self) -> None:
        self.sampler.load_state_dict(self.policy.state_dict())
        self.sampler.lm_head.weight.add_(self.noise)

    @torch.no_grad()
    def __call__(self, prompts: list, trainer) -> dict:
        self.sync_weights()
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True)
        ids, attention = enc["input_ids"], enc["attention_mask"]
        steps = []
        for _ in range(LENGTH):
            logits = self.sampler(input_ids=ids, attention_mask=attention).logits[:, -1].float()
            logp = torch.log_softmax(logits / trainer.temperature, -1)
            token = torch.multinomial(logp.exp(), 1, generator=self.gen)
            steps.append(logp.gather(-1, token)[:, 0])
            ids, attention = torch.cat([ids, token], 1), torch.cat([attention, torch.ones_like(token)], 1)
        start = enc["input_ids"].shape[1]
        out: dict = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for r in range(len(prompts)):
            n = LENGTH - r % 3
            out["prompt_ids"].append(enc["input_ids"][r][enc["attention_mask"][r].bool()].tolist())
            out["completion_ids"].append(ids[r, start:start + n].tolist())
            out["logprobs"].append([float(steps[t][r]) for t in range(n)])
        if self.env:   # one token of ENV_ROW is environment text: TRL's tool loop writes log p 0.0 there
            out["env_mask"] = [[0 if (r, t) == (ENV_ROW, ENV_POS) else 1 for t in range(len(c))]
                               for r, c in enumerate(out["completion_ids"])]
            out["logprobs"][ENV_ROW][ENV_POS] = 0.0
        self.calls.append(copy.deepcopy(out))
        if self.corrupt is not None:
            out["logprobs"] = self.corrupt(copy.deepcopy(out["logprobs"]))
        if not self.logprobs:
            out["logprobs"] = None
        return out


class LogProbe(TrainerCallback):
    """TRL's own logs per step (the independent reference)."""

    def __init__(self):
        self.logs: dict[int, dict] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.setdefault(state.global_step, {}).update(logs or {})


def _run(model_path, tmp: Path, name: str, vllm: bool = False, **kw) -> dict:
    """A GRPO run of STEPS steps whose completions `NoisyEngine(**engine)` sampled; vllm=True takes TRL's
    vLLM path past generation (weight sync, importance-sampling correction and its `sampling/*` metrics)
    with the engine in vLLM's place: vLLM itself cannot run here, everything after it is TRL's own code."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load

    model, tokenizer = load(model_path)
    engine = NoisyEngine(model, tokenizer, **kw.pop("engine", {}))

    def even_first_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    config = GRPOConfig(output_dir=str(tmp / name), report_to="none", use_cpu=True, bf16=False, seed=0,
                        per_device_train_batch_size=PROMPTS * G, num_generations=G, max_completion_length=LENGTH,
                        learning_rate=5e-3, lr_scheduler_type="constant", max_steps=STEPS, logging_steps=1,
                        save_strategy="no", disable_tqdm=True, **kw)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # rollout_func is "experimental"
        trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                              processing_class=tokenizer, rollout_func=engine)
    if vllm:
        trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, engine, -1
    probe = LogProbe()
    trainer.add_callback(probe)
    sink = LocalSink(str(tmp / f"{name}.duckdb"), name)
    callback = forksight.trl.attach(trainer, sink=sink, sample=PROMPTS)   # every group's token rows
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    sink.flush()
    reader = sink.reader
    out = {"trainer": trainer, "callback": callback, "engine": engine, "logs": probe.logs,
           "warnings": [str(w.message) for w in caught], "steps": trainer.state.global_step,
           "scalars": reader.read_scalars(sink.run_id, downsample=100000),
           "tokens": {s: reader.read_tokens(sink.run_id, s) for s in reader.token_steps(sink.run_id)},
           "samples": reader.read_samples(sink.run_id),
           "hist": reader.read_histograms(sink.run_id, key="mismatch_log_ratio")}
    callback.detach()
    sink.finish()
    return out


@pytest.fixture(scope="module")
def tis_run(tiny_model_path, tmp_path_factory):
    """TRL's vLLM path with token-level truncated IS in [CLIP_MIN, CLIP_MAX], one environment token."""
    return _run(tiny_model_path, tmp_path_factory.mktemp("trl_tis"), "tis", vllm=True, engine={"env": True},
                vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_min=CLIP_MIN,
                vllm_importance_sampling_clip_max=CLIP_MAX)


@pytest.fixture(scope="module")
def opsm_run(tiny_model_path, tmp_path_factory):
    """No vLLM: the rollout_func's log-probs feed TRL's off-policy sequence mask (threshold 0)."""
    return _run(tiny_model_path, tmp_path_factory.mktemp("trl_opsm"), "opsm", off_policy_mask_threshold=0.0)


def _scalar(run, key: str, step: int) -> float:
    s = run["scalars"]
    values = s[(s.key == key) & (s.step == step)].value
    assert len(values) == 1, f"{key} at step {step}: {list(values)}"
    return float(values.iloc[0])


def _known(tokens):
    """Stored model tokens with both log p known, and their log ratio in float64."""
    both = tokens[tokens.logp.notna() & tokens.sampler_logp.notna() & ~tokens.env.astype(bool)]
    return both, both.logp.to_numpy(np.float64) - both.sampler_logp.to_numpy(np.float64)


# ---------------------------------------------------------------------------- capture and alignment


@pytest.mark.parametrize("name", ["tis_run", "opsm_run"])
def test_stored_sampler_logp_is_the_engines_log_p_of_each_stored_token(name, request):
    run = request.getfixturevalue(name)
    assert run["steps"] == STEPS and sorted(run["tokens"]) == list(range(1, STEPS + 1))
    for step, tokens in run["tokens"].items():
        call = run["engine"].calls[step - 1]   # one generation per optimizer step
        assert len(tokens) == sum(len(c) for c in call["completion_ids"])   # every token of every sample
        for row in tokens.itertuples():
            # the row is the token the engine sampled at that place (alignment), with the engine's log p
            assert row.token_id == call["completion_ids"][row.sample_id][row.pos]
            if row.env:   # environment text: stored in place, never scored, no sampler log p
                assert math.isnan(row.sampler_logp) and math.isnan(row.logp)
            else:
                assert row.sampler_logp == np.float32(call["logprobs"][row.sample_id][row.pos])
    if name == "tis_run":
        envs = [t[t.env.astype(bool)] for t in run["tokens"].values()]
        assert all(list(zip(e.sample_id, e.pos)) == [(ENV_ROW, ENV_POS)] for e in envs)


@pytest.mark.parametrize("name", ["tis_run", "opsm_run"])
def test_mismatch_scalars_are_a_float64_recomputation_from_the_stored_rows(name, request):
    run = request.getfixturevalue(name)
    for step, tokens in run["tokens"].items():
        _, lr = _known(tokens)
        r = np.exp(lr)
        expected = {"mismatch/tokens": lr.size, "mismatch/kl_k1": np.mean(-lr), "mismatch/kl_k3": np.mean(r - 1 - lr),
                    "mismatch/logp_diff_abs_mean": np.mean(np.abs(lr)), "mismatch/logp_diff_abs_max": np.abs(lr).max(),
                    "mismatch/is_ratio_min": r.min(), "mismatch/is_ratio_max": r.max(),
                    "mismatch/is_ratio_mean": r.mean(), "mismatch/frac_outside_2x": np.mean(np.abs(lr) > math.log(2))}
        for key, value in expected.items():
            assert _scalar(run, key, step) == pytest.approx(float(value), rel=1e-9, abs=1e-12), (step, key)
        # the step's histogram counts the same tokens
        hist = run["hist"]
        assert int(hist[hist.step == step]["count"].sum()) == lr.size


def test_mismatch_scalars_agree_with_trls_own_sampling_metrics(tis_run):
    """TRL compares its pre-step forward (old log p) with the sampler over the same tokens (tool_mask
    = 1): the same weights as forksight's training forward, so the numbers are the same to float32."""
    for step, tokens in tis_run["tokens"].items():
        logs = tis_run["logs"][step]
        _, lr = _known(tokens)
        ours = lambda key: _scalar(tis_run, key, step)   # noqa: E731
        assert ours("mismatch/logp_diff_abs_mean") == pytest.approx(logs["sampling/sampling_logp_difference/mean"],
                                                                    rel=1e-4)
        assert ours("mismatch/logp_diff_abs_max") == pytest.approx(logs["sampling/sampling_logp_difference/max"],
                                                                   rel=1e-4)
        # TRL logs its ratios after truncation: the raw extremes clamped to TRL's bounds
        assert min(ours("mismatch/is_ratio_max"), CLIP_MAX) == pytest.approx(
            logs["sampling/importance_sampling_ratio/max"], rel=1e-4)
        assert max(ours("mismatch/is_ratio_min"), CLIP_MIN) == pytest.approx(
            logs["sampling/importance_sampling_ratio/min"], rel=1e-4)
        assert np.clip(np.exp(lr), CLIP_MIN, CLIP_MAX).mean() == pytest.approx(
            logs["sampling/importance_sampling_ratio/mean"], rel=1e-4)


# ---------------------------------------------------------------------------- TRL's corrections


def test_frac_corrected_is_the_share_of_tokens_trls_truncated_is_clamped(tis_run):
    fractions = []
    for step, tokens in tis_run["tokens"].items():
        _, lr = _known(tokens)
        # TRL's ratio is the same to float32: a token within 1e-4 of a bound could go either way
        near = (np.abs(lr - math.log(CLIP_MAX)) < 1e-4) | (np.abs(lr - math.log(CLIP_MIN)) < 1e-4)
        assert not near.any(), f"step {step}: a ratio sits on TRL's bound; pick other bounds"
        expected = np.mean((lr > math.log(CLIP_MAX)) | (lr < math.log(CLIP_MIN)))
        fractions.append(_scalar(tis_run, "mismatch/frac_corrected", step))
        assert fractions[-1] == pytest.approx(expected, abs=1e-12)
    assert max(fractions) > 0   # the bounds did truncate something


def test_frac_corrected_is_the_share_of_tokens_in_sequences_trls_off_policy_mask_dropped(opsm_run):
    """TRL drops a sequence with a negative advantage whose mean (sampler − trainer) log p exceeds the
    threshold (0); the advantage's sign is the reward's against its group's mean."""
    fractions = []
    samples = opsm_run["samples"]
    for step, tokens in opsm_run["tokens"].items():
        known, lr = _known(tokens)
        rewards = samples[samples.step == step].set_index("sample_id").reward
        dropped = []
        for sid, rows in known.assign(lr=lr).groupby("sample_id"):
            group = rewards[[i for i in rewards.index if i // G == sid // G]]
            kl = float(np.mean(-rows.lr))
            assert abs(kl) > 1e-5, "a sequence's mean log ratio sits on the threshold"
            dropped += [rewards[sid] < group.mean() and kl > 0.0] * len(rows)
        fractions.append(_scalar(opsm_run, "mismatch/frac_corrected", step))
        assert fractions[-1] == pytest.approx(np.mean(dropped), abs=1e-12)
    assert max(fractions) > 0


def test_detach_removes_the_generation_and_off_policy_taps(opsm_run):
    trainer = opsm_run["trainer"]   # detached at the end of the run
    for name in ("_generate", "_generate_and_score_completions", "get_off_policy_mask"):
        assert name not in trainer.__dict__, name


# ---------------------------------------------------------------------------- bad input, no input


def _corrupt(logprobs: list[list[float]]) -> list[list[float]]:
    """Row 1 one value short, row 3 one too many (wider than any completion), NaN / +inf / a
    positive value / -inf in rows 4-7."""
    logprobs[1] = logprobs[1][:-1]
    logprobs[3] = logprobs[3] + [-1.0]
    logprobs[4][0], logprobs[5][1], logprobs[6][2], logprobs[7][0] = math.nan, math.inf, 0.5, -math.inf
    return logprobs


BAD_ROWS, BAD_TOKENS = {1, 3}, {(4, 0), (5, 1), (6, 2), (7, 0)}


@pytest.fixture(scope="module")
def bad_run(tiny_model_path, tmp_path_factory):
    return _run(tiny_model_path, tmp_path_factory.mktemp("trl_bad"), "bad", engine={"corrupt": _corrupt})


def test_bad_sampler_log_probs_are_stored_as_null_with_one_warning_each(bad_run):
    assert bad_run["steps"] == STEPS   # training went on
    length = [w for w in bad_run["warnings"] if "sampler log-probs for its" in w]
    values = [w for w in bad_run["warnings"] if "cannot be a log-probability" in w]
    assert len(length) == 1 and "sample 1 has 4 sampler log-probs for its 5 completion tokens" in length[0]
    assert len(values) == 1
    for step, tokens in bad_run["tokens"].items():
        call = bad_run["engine"].calls[step - 1]
        for row in tokens.itertuples():
            if row.sample_id in BAD_ROWS or (row.sample_id, row.pos) in BAD_TOKENS:
                assert math.isnan(row.sampler_logp), (step, row.sample_id, row.pos)
            else:
                assert row.sampler_logp == np.float32(call["logprobs"][row.sample_id][row.pos])
        _, lr = _known(tokens)
        assert _scalar(bad_run, "mismatch/tokens", step) == lr.size
        assert _scalar(bad_run, "mismatch/kl_k3", step) == pytest.approx(float(np.mean(np.expm1(lr) - lr)), rel=1e-9)
        assert not (bad_run["scalars"].key == "mismatch/frac_corrected").any()   # TRL corrected nothing


def test_a_run_without_sampler_log_probs_stores_null_and_no_mismatch_scalars(tiny_model_path, tmp_path):
    run = _run(tiny_model_path, tmp_path, "plain", engine={"logprobs": False})
    assert run["steps"] == STEPS and run["tokens"]
    for tokens in run["tokens"].values():
        assert tokens.logp.notna().all() and tokens.sampler_logp.isna().all()
    assert not run["scalars"].key.str.startswith("mismatch/").any()
    assert run["hist"].empty
    assert not [w for w in run["warnings"] if "sampler" in w]


# ---------------------------------------------------------------------------- TRL 1.14


@pytest.mark.skipif(os.environ.get(INNER_114) == "1", reason="this is the TRL 1.14 rerun")
def test_the_same_tests_pass_on_trl_114_logits_path():
    """TRL 1.14 builds logits (the lm_head hook path): rerun this module on it."""
    rerun_on_trl_114(__file__, "11 passed, 1 skipped")


def test_trl_version_is_the_one_this_run_means():
    import trl

    assert trl.__version__.startswith("1.14") == (os.environ.get(INNER_114) == "1")
