"""TrainConfig: every knob of the bundled trainer in one flat pydantic model, each field with a
description and a group (model, task, rollout, optimisation, selection, monitoring), loadable
from YAML/JSON and overridable by flags. PRESETS holds the named starting points.
No torch import here: `forksight --help` builds its flags from this module.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from forksight.base.fork_rule import DEFAULT_FORK_RULE

Strategy = Literal["all", "fork", "ict", "random", "stapo", "maxtok", "mintok", "rand1tok"]
TrustRegion = Literal["ratio", "tv", "binary-kl", "topk-kl", "kl"]   # ratio + hooks.metrics.trust.DEFAULT_DELTA's
STRATEGIES: tuple[str, ...] = ("all", "fork", "ict", "random", "stapo", "maxtok", "mintok", "rand1tok")
DISTILL_STRATEGIES = ("maxtok", "mintok", "rand1tok")


def _f(default: Any, group: str, description: str, **kw: Any) -> Any:
    return Field(default, description=description, json_schema_extra={"group": group}, **kw)


class TrainConfig(BaseModel):
    """One training run. Unknown keys are errors (a typo must not silently fall back)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # -- model ---------------------------------------------------------------------------------
    model: str | None = _f(None, "model", "Local HF causal-LM directory; default: the tiny "
                           "offline Qwen2 built by trainer.model.build_tiny().")
    device: str = _f("cpu", "model", "Torch device for the policy, reference and teacher: cpu, "
                     "cuda, cuda:1, ... (multi-rank CUDA runs use NCCL, CPU runs gloo).")
    dtype: Literal["float32", "bfloat16", "float16"] = _f(
        "float32", "model", "Weights dtype when loading the model (statistics are always float32).")
    warmup: bool = _f(True, "model", "Supervised warm-up before RL until sampled pass@1 reaches "
                      "warmup_pass (cached next to the model).")
    warmup_pass: float = _f(0.3, "model", "Sampled pass@1 at which the warm-up stops.", ge=0, le=1)
    warmup_loss: Literal["ce", "bounded"] = _f("ce", "model", "Warm-up loss: cross-entropy or the "
                                               "bounded log(2 - p) (docs/algorithms.md §8).")
    warmup_max_seconds: float = _f(180.0, "model", "Give up the warm-up after this long (the "
                                   "cached model is then whatever was reached).", gt=0)
    teacher: str | None = _f(None, "model", "Teacher model directory for maxtok/mintok/rand1tok; "
                             "default: the warm-up continued to teacher_pass (cached).")
    teacher_pass: float = _f(0.8, "model", "Sampled pass@1 the default teacher is trained to.",
                             ge=0, le=1)
    # -- task ----------------------------------------------------------------------------------
    task: Literal["arith", "steps", "countdown", "jsonl", "collapse"] = _f(
        "arith", "task", "Problem generator / verifier (trainer/tasks.py); steps = addition "
        "worked out in words and digits ('27+82: 7+2=9, 2+8=10 carry 1, answer 109').")
    level: int = _f(1, "task", "Arithmetic difficulty: 1 two-digit +, 2 three-digit +, "
                    "3 two-digit -, 4 two-digit × one-digit (steps: 1 two digits, else three).",
                    ge=1, le=4)
    graded: bool = _f(False, "task", "steps: reward the fraction of the worked solution's "
                      "characters written in place (partial credit, wants the steps right too), "
                      "not only a right answer; pass@k still counts right answers.")
    problem_pool: int = _f(0, "task", "Train on this many problems drawn once from the seed "
                           "(few-shot RLVR); 0 = a fresh problem every time.", ge=0)
    reverse: bool = _f(True, "task", "Arithmetic answers written with digits reversed (learns "
                       "much faster on a tiny model).")
    task_path: str | None = _f(None, "task", "JSONL file of {prompt, answer} lines for task=jsonl.")
    eval_problems: int = _f(32, "task", "Held-out problems for periodic evaluation.", ge=1)
    eval_samples: int = _f(8, "task", "Samples per held-out problem (n in eval/pass@k).", ge=1)
    eval_every: int = _f(25, "task", "Evaluate every this many steps (0 = only at the end).", ge=0)
    # -- rollout -------------------------------------------------------------------------------
    prompts_per_step: int = _f(8, "rollout", "Prompts per step on each rank.", ge=1)
    group_size: int = _f(8, "rollout", "G: samples per prompt (a group).", ge=2)
    temperature: float = _f(1.0, "rollout", "Sampling temperature; logits are divided by it for "
                            "the loss and the statistics too.", gt=0)
    max_new_tokens: int = _f(8, "rollout", "Longest completion.", ge=1)
    sampler_dtype: Literal["float32", "bfloat16", "float16"] = _f(
        "float32", "rollout", "Dtype of the policy copy that samples the rollouts, as an inference "
        "engine would (refreshed from the policy after every optimiser step); the loss still trains "
        "in `dtype`. Its log p of each sampled token is stored as sampler_logp (mismatch/* scalars).")
    sampler_noise: float = _f(0.0, "rollout", "Test/bench tool: std of Gaussian noise added to the "
                              "sampler copy's logits (a broken inference engine); 0 = off.", ge=0)
    sampler_noise_from_step: int = _f(0, "rollout", "Test/bench tool: the first step whose "
                                      "rollouts get sampler_noise (a mismatch that starts at a "
                                      "known step).", ge=0)
    # -- optimisation --------------------------------------------------------------------------
    steps: int = _f(100, "optimisation", "RL steps to run (total, counting resumed ones).", ge=0)
    lr: float = _f(3e-4, "optimisation", "AdamW learning rate.", gt=0)
    weight_decay: float = _f(0.0, "optimisation", "AdamW weight decay.", ge=0)
    max_grad_norm: float = _f(1.0, "optimisation", "Gradient clipping norm (0 = off).", ge=0)
    clip_low: float = _f(0.2, "optimisation", "PPO ratio clip below: 1 - clip_low.", ge=0)
    clip_high: float = _f(0.28, "optimisation", "PPO ratio clip above: 1 + clip_high "
                          "(DAPO clip-higher).", ge=0)
    updates_per_batch: int = _f(1, "optimisation", "Optimiser steps per rollout batch (>1 makes "
                                "the ratio differ from 1 and the clip bite).", ge=1)
    trust_region: TrustRegion = _f("ratio", "optimisation", "The trust region: ratio (PPO's clip, "
                                   "clip_low/clip_high) or DPPO's (Qi et al. 2026) on a direct divergence "
                                   "from the rollout policy: tv (|π(y) − π_old(y)|), binary-kl, topk-kl "
                                   "(top 20 tokens + the rest), kl (full vocabulary). A token outside it "
                                   "gets no gradient in the direction that leaves it.")
    trust_delta: float | None = _f(None, "optimisation", "The region's δ; None = DPPO's (0.15 for tv, "
                                   "0.05 for the KLs). With trust_region ratio: the TV δ that "
                                   "trust/tv_outside_frac is measured against (default 0.15).", gt=0)
    tis_cap: float | None = _f(None, "optimisation", "Token-level truncated importance sampling "
                               "(Yao et al. 2025): weight each token's loss by min(r, tis_cap), "
                               "r = p_train_old / p_sampler; None = off. Flag: --tis CAP.")
    beta: float = _f(0.0, "optimisation", "KL-to-reference coefficient (k3 estimator); 0 = no "
                     "reference model.", ge=0)
    scale_rewards: bool = _f(True, "optimisation", "Divide advantages by the group std (GRPO); "
                             "False = mean-centred only (Dr. GRPO).")
    seed: int = _f(0, "optimisation", "Seed for sampling problems, rollouts and selection.")
    # -- selection -----------------------------------------------------------------------------
    strategy: Strategy = _f("all", "selection", "Which tokens the loss trains on.")
    rho: float | None = _f(None, "selection", "Top-ρ fraction of tokens kept by fork/ict/random, relative "
                           "to the batch (ict: each response); default 0.2 (fork, random) or 0.1 (ict). "
                           "Not the absolute fork/frac reference H ≥ 0.672.", gt=0, le=1)
    normalizer: Literal["paper", "verl"] = _f("paper", "selection", "fork/random loss divisor: "
                                              "all valid tokens (paper) or the selected count (verl).")
    stapo_tau_p: float = _f(0.01, "selection", "STAPO: silence tokens with p(y) below this ...",
                            gt=0, le=1)
    stapo_entropy_q: float = _f(0.05, "selection", "... and entropy below this batch quantile "
                                "(and positive advantage).", gt=0, le=1)
    distill_tokens: int = _f(1, "selection", "maxtok/mintok/rand1tok: tokens supervised per "
                             "trajectory.", ge=1)
    # -- monitoring ----------------------------------------------------------------------------
    run: str | None = _f(None, "monitoring", "Run name; default strategy-task-seed-time.")
    project: str = _f("default", "monitoring", "Project the run is filed under.")
    db: str | None = _f(None, "monitoring", "Write to this DuckDB file in-process (single process).")
    url: str | None = _f(None, "monitoring", "Stream to a collector at this URL (forksight serve).")
    stream: bool = _f(True, "monitoring", "Stream at all; False = no sink (benchmarks).")
    stop_on_alert: bool = _f(False, "monitoring", "Stop when the collector raises a critical alert.")
    token_groups: int = _f(1, "monitoring", "Groups per step whose per-token rows are stored.", ge=0)
    report_to: str = _f("", "monitoring", "Also write the run into these trackers, comma-separated: wandb, "
                        "trackio, mlflow, tensorboard (forksight/ scalars, alerts, token views).")
    report_tokens_every: int = _f(50, "monitoring", "--report-to: a token view every this many steps (0 = none).",
                                  ge=0)
    fork_rule: str = _f(str(DEFAULT_FORK_RULE), "monitoring", "Which tokens are forks (the stored fork flag, fork/frac, "
                        "the pages' outline): abs:τ (H ≥ τ nats) or top:q (the step's top q by H).")
    out_dir: str = _f("runs", "monitoring", "Checkpoints go to out_dir/<run>/.")
    save_every: int = _f(0, "monitoring", "Checkpoint every this many steps (0 = only at the end).",
                         ge=0)
    resume: bool = _f(False, "monitoring", "Continue from out_dir/<run>/checkpoint.pt.")
    progress: bool = _f(True, "monitoring", "Show a tqdm bar with live reward and entropy.")
    # -- value probes (docs/algorithms.md §12) -----------------------------------------------
    probe_every: int = _f(0, "monitoring", "Monte-Carlo value probes every this many steps (0 = off): "
                          "V before and after tokens of the step's completions, the task's reward.", ge=0)
    probe_samples: int = _f(4, "monitoring", "Completions probed per probed step.", ge=1)
    probe_k: int = _f(16, "monitoring", "Continuations per value (its SE shrinks as 1/sqrt(k)).", ge=1)
    probe_positions: str = _f("auto", "monitoring", "auto (search for completions longer than 32 tokens, "
                              "forks for shorter), forks (every fork + as many random non-forks, at most 16 per "
                              "completion), all, search (bisection: about log2 T values per pivotal token), or "
                              "N random positions per completion.",
                              pattern=r"^(auto|forks|all|search|[1-9][0-9]*)$")
    probe_budget: float = _f(0.1, "monitoring", "Probing never takes more than this share of training "
                             "time: a probe past it is skipped (probe/skipped) and the log says so.", gt=0)
    # -- the reference set (docs/algorithms.md §15) ------------------------------------------
    reference_every: int | None = _f(None, "monitoring", "Re-score the reference set (completions of held-out "
                                     "prompts kept at step 0), teacher-forced, every this many steps: ref/* and "
                                     "the reference table (default: eval_every, else 25; 0 = off).", ge=0)
    reference_size: int = _f(32, "monitoring", "Held-out prompts in the reference set (1 completion each).", ge=1)
    reference_budget: float = _f(0.02, "monitoring", "Re-scoring never takes more than this share of training "
                                 "time: a due step past it is skipped (ref/skipped).", gt=0)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", value):
            raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {value!r}")
        return value

    @field_validator("report_to")
    @classmethod
    def _report_to(cls, value: str) -> str:
        from forksight.hooks.capture.trackers import TRACKERS

        named = [] if value.strip() in ("", "none") else [t.strip() for t in value.split(",") if t.strip()]
        unknown = [t for t in named if t not in TRACKERS]
        if unknown:
            raise ValueError(f"report_to names {unknown}: write a comma-separated list of {', '.join(TRACKERS)}")
        return ",".join(named)

    @field_validator("fork_rule")
    @classmethod
    def _fork_rule(cls, value: str) -> str:
        from forksight.base.fork_rule import ForkRule

        return str(ForkRule.parse(value))

    @field_validator("tis_cap")
    @classmethod
    def _tis_cap(cls, value: float | None) -> float | None:
        if value is not None and not value >= 1:  # also refuses NaN
            raise ValueError(f"tis_cap must be at least 1, got {value}: it caps r = p_train / p_sampler, "
                             "which is near 1 where the engines agree (Yao et al. 2025 use 2)")
        return value

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.sampler_noise_from_step and not self.sampler_noise:
            raise ValueError("sampler_noise_from_step needs sampler_noise > 0 (the std of the noise "
                             "added to the sampler's logits from that step)")
        if self.task == "jsonl" and not self.task_path:
            raise ValueError("task 'jsonl' needs task_path: a JSONL file of {prompt, answer} lines")
        if self.db and self.url:
            raise ValueError("give db (in-process DuckDB file) or url (a collector), not both")
        if self.resume and not self.run:
            raise ValueError("resume needs run: the name of the run whose checkpoint to continue")
        return self

    @property
    def effective_rho(self) -> float:
        """ρ with the per-strategy default (0.1 for ICT, 0.2 otherwise)."""
        return self.rho if self.rho is not None else (0.1 if self.strategy == "ict" else 0.2)

    @property
    def effective_trust_delta(self) -> float:
        """δ of the trust region (DPPO's default per region; TV's for the ratio clip's monitoring)."""
        from forksight.hooks.metrics.trust import DEFAULT_DELTA

        if self.trust_delta is not None:
            return self.trust_delta
        return DEFAULT_DELTA["tv" if self.trust_region == "ratio" else self.trust_region]

    @property
    def is_distill(self) -> bool:
        return self.strategy in DISTILL_STRATEGIES


# Named starting points. "healthy": reward rises, entropy declines slowly. "readable" (the
# demo's): addition worked in words and digits by the tiny model warm-started to pass@1 0.3, then
# RL on four problems (few-shot RLVR) with a graded reward whose optimum is the one worked
# solution: fork tokens (H ≥ 0.672) are 5-8% of tokens at the start, on the digits the model
# computes; plain GRPO is warned of collapse at step 29-57 and falls under 20% of its start
# entropy at 74-224 (the shipped warm-ups of seeds 0-2 under four CPU kernel paths:
# docs/kernel_spread.json); on a fresh problem every step this model never collapses (its
# entropy explodes above lr 5e-4). "collapse": a random-init model and a reward whose optimum is
# one fixed string at a high learning rate: plain GRPO collapses at step 37, warned at 24 (byte
# noise for text: the model learns no language).
PRESETS: dict[str, dict[str, Any]] = {
    "healthy": dict(task="arith", level=1, lr=3e-4, temperature=1.0, steps=200,
                    prompts_per_step=8, group_size=8, warmup=True, warmup_pass=0.3),
    "collapse": dict(task="collapse", lr=3e-3, temperature=1.0, steps=100, prompts_per_step=8,
                     group_size=8, warmup=False, max_new_tokens=6, eval_every=0),
    "readable": dict(task="steps", level=1, graded=True, problem_pool=4, lr=5e-4, temperature=1.0,
                     steps=300, prompts_per_step=8, group_size=8, warmup=True, warmup_pass=0.3,
                     warmup_max_seconds=900, max_new_tokens=40, eval_every=0),
    "tiny-test": dict(task="arith", steps=2, prompts_per_step=2, group_size=4, max_new_tokens=4,
                      warmup=False, eval_problems=4, eval_samples=2, eval_every=0,
                      progress=False),
}


def load_config(path: str | None = None, preset: str | None = None,
                overrides: dict[str, Any] | None = None) -> TrainConfig:
    """preset → file (YAML or JSON) → overrides, later ones winning; errors say which key."""
    values: dict[str, Any] = {}
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}: choose one of {sorted(PRESETS)}")
        values.update(PRESETS[preset])
    if path:
        values.update(_read_file(path))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return TrainConfig(**values)
    except ValidationError as exc:
        from forksight.base.errors import validation_message

        problems = validation_message(exc.errors(), root="config", model=TrainConfig)
        raise ValueError(f"invalid training config: {problems}") from None


def _read_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"config file {file} does not exist")
    text = file.read_text()
    if file.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"config file {file} must hold a mapping of field: value")
    return data


def field_groups() -> dict[str, list[str]]:
    """Field names by group, in declaration order (the CLI's argument groups)."""
    groups: dict[str, list[str]] = {}
    for name, info in TrainConfig.model_fields.items():
        group = (info.json_schema_extra or {}).get("group", "other")
        groups.setdefault(group, []).append(name)
    return groups
