"""Framework metric names → forksight's scalar keys, so the detectors read a TRL, verl or
OpenRLHF log as they read forksight's own. Keys not listed keep their name."""
from __future__ import annotations

import re

# forksight key -> the names TRL (GRPOTrainer's logged metrics), verl (metric_utils, actor
# workers), OpenRLHF and common hand-written loops use for it
ALIASES: dict[str, tuple[str, ...]] = {
    "entropy/mean": ("entropy", "actor/entropy", "policy/entropy", "policy_entropy", "train/entropy"),
    "reward/mean": ("reward", "critic/score/mean", "critic/rewards/mean", "train/reward", "rewards/mean",
                    "reward_mean", "objective/rlhf_reward", "episode_reward_mean"),
    "reward/std": ("reward_std", "critic/score/std", "rewards/std", "train/reward_std"),
    "groups/zero_var_frac": ("frac_reward_zero_std", "train/frac_reward_zero_std", "zero_var_group_frac"),
    "kl": ("kl", "actor/kl_loss", "objective/kl", "train/kl", "critic/kl"),
    "clip/frac": ("clip_ratio/region_mean", "train/clip_ratio/region_mean", "clip_ratio", "actor/pg_clipfrac",
                  "policy/clipfrac", "clipfrac"),
    # the two sides of the ratio clip (clip_asymmetry): TRL's low = ratio < 1-ε_low with A < 0, high =
    # ratio > 1+ε_high with A > 0. verl logs no split: its pg_clipfrac is both sides together and its
    # pg_clipfrac_lower is dual-clip PPO's bound (A < 0 and ratio > clip_ratio_c = 3, core_algos.
    # compute_policy_loss_vanilla), another bound than 1-ε_low: kept apart as clip/dual_frac
    "clip/low_frac": ("clip_ratio/low_mean",),
    "clip/high_frac": ("clip_ratio/high_mean",),
    "clip/dual_frac": ("actor/pg_clipfrac_lower",),
    "grad_norm": ("grad_norm", "actor/grad_norm", "train/grad_norm", "policy/grad_norm"),
    "loss": ("loss", "actor/pg_loss", "policy_loss", "train/loss", "train/policy_loss"),
    "lr": ("learning_rate", "actor/lr", "train/learning_rate"),
    "length/mean": ("completions/mean_length", "response_length/mean", "completion_length", "response_length",
                    "train/completions/mean_length"),
    "length/clip_frac": ("completions/clipped_ratio", "response_length/clip_ratio", "truncation_rate",
                         "train/completions/clipped_ratio"),
    "eval/reward": ("eval_reward", "eval/reward", "val/test_score", "eval_score", "eval/score", "eval/accuracy"),
    # Training–inference mismatch, only where the peer's number is forksight's over the same tokens
    # (token means over trained tokens, r = p_train / p_sampler). verl's rollout_corr/kl is mean(log p_sampler −
    # log p_train) = k1, its k3_kl mean(r − 1 − log r) = k3 (rollout_corr_helper.compute_offpolicy_metrics);
    # prime-rl's mismatch_kl is the same k3 per token, its /all/mean the token mean; TRL's
    # sampling_logp_difference is |log p_old − log p_sampler| over completion tokens vLLM scored.
    # Not aliased (their own names kept): TRL's importance_sampling_ratio/* and verl's rollout_is_* are the
    # ratios after the run's truncation or masking (TRL's default is sequence-level); verl's
    # training/rollout_probs_diff_* compare probabilities, not log-probabilities.
    "mismatch/kl_k1": ("rollout_corr/kl",),
    "mismatch/kl_k3": ("rollout_corr/k3_kl", "mismatch_kl/all/mean"),
    "mismatch/logp_diff_abs_mean": ("sampling/sampling_logp_difference/mean",),
    "mismatch/logp_diff_abs_max": ("sampling/sampling_logp_difference/max",),
}
_EXACT = {name.lower(): key for key, names in ALIASES.items() for name in names}
# verl's validation headline: val-core/<data source>/<reward key>/mean@N
_VERL_VAL = re.compile(r"^val-core/[^/]+/(reward|acc|score)/mean@\d+$")
# TRL's per-function rewards: rewards/<func>/mean (train/ prefixed in TensorBoard)
_COMPONENT = re.compile(r"^rewards/([^/]+)/(mean|std)$")


def canonical(name: str) -> str:
    """The forksight key for a logged metric name (the name itself when none applies)."""
    key = name.strip()
    low = key.lower()
    if low in _EXACT:
        return _EXACT[low]
    if low.startswith("train/") and len(key) > 6:         # HF Trainer's TensorBoard/W&B prefix
        return canonical(key[6:])
    if _VERL_VAL.match(low):
        return "eval/reward"
    found = _COMPONENT.match(key)
    if found:
        return f"rewards/{found.group(1)}/{found.group(2)}"
    if low.startswith("eval_"):                            # TRL evaluation metrics: eval_<name>
        return "eval/" + key[5:]
    return key
