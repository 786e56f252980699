"""The detectors' settings as pydantic models, every field with its why (AlertConfig holds them all).

Its own module so the detectors can use the configs at run time without importing alerts.py,
which imports the detectors."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DetectorConfig(BaseModel):
    """Knobs every detector has."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="run this detector at all")
    warmup_steps: int = Field(10, ge=0, description="steps observed before this detector may fire (early steps are noisy)")
    smoothing: float = Field(0.9, ge=0.0, lt=1.0, description="EMA factor β of the debiased EMA ema/(1-β^n) applied to the statistic; 0 = raw values")
    cooldown: int = Field(50, ge=0, description="minimum steps between two alerts of this detector at the same severity")
    persist: int = Field(1, ge=1, description="the condition must hold this many consecutive steps before it fires (noise rarely persists)")
    hysteresis: float = Field(0.2, ge=0.0, le=1.0, description="re-arm only once the value is back past the threshold by this fraction of it")
    baseline_steps: int = Field(10, ge=1, description="the first N observed values average into the run's early baseline")


class CollapseConfig(DetectorConfig):
    """Entropy collapse: an absolute/relative floor, a drop warning, and the log-linear forecast."""

    key: str = Field("entropy/mean", description="scalar holding the mean token entropy (nats)")
    persist: int = Field(5, ge=1, description="a forecast or drop must hold this many consecutive steps (a noisy dip does not)")
    floor: float = Field(0.05, ge=0.0, description="absolute entropy floor (nats); below it = collapsed (critical)")
    drop_fraction: float = Field(0.9, gt=0.0, lt=1.0, description="also collapsed once entropy has fallen by this fraction of its baseline; the effective floor is the larger of the two")
    warn_drop_fraction: float = Field(0.75, gt=0.0, lt=1.0, description="warn once entropy has fallen by this fraction of its baseline, forecast or not")
    forecast: bool = Field(True, description="fit log(entropy) over a recent window (exponential decay) and warn before the floor is reached")
    forecast_window: int = Field(20, ge=5, description="steps in the log-linear fit")
    forecast_smoothing: float = Field(0.7, ge=0.0, lt=1.0, description="lighter EMA β for the fitted series: less lag than `smoothing`, so the fitted rate follows a fresh decay")
    forecast_horizon: int = Field(150, ge=1, description="warn when the fitted decay reaches the floor within this many steps")
    forecast_min_drop: float = Field(0.25, ge=0.0, lt=1.0, description="forecast only once the lightly smoothed entropy is this fraction below baseline (quiet on flat noisy runs)")
    forecast_min_r2: float = Field(0.75, ge=0.0, le=1.0, description="the log-linear fit must explain this share of the variance")
    accel_min_drop: float = Field(0.02, gt=0.0, lt=1.0, description="points enter the accelerating-decay fit log(log(baseline/H)) once H is this fraction below baseline")
    accel_gate_drop: float = Field(0.05, ge=0.0, lt=1.0, description="the accelerating-decay forecast may warn once the lightly smoothed entropy is this fraction below baseline")
    accel_min_points: int = Field(6, ge=3, description="points the accelerating-decay fit needs before it may forecast")
    accel_residual_ratio: float = Field(0.5, gt=0.0, le=1.0, description="the accelerating fit's unexplained variance must be at most this share of a plain exponential's on the same steps")
    accel_min_r2: float = Field(0.9, ge=0.0, le=1.0, description="the accelerating-decay fit must explain this share of the variance (a noisy dip does not)")
    reward_key: str = Field("reward/mean", description="reward scalar for the R = -a·exp(H) + b ceiling shown in the message")


class CovarianceConfig(DetectorConfig):
    """Early warning from the mechanism: Cov(log π, A) staying positive (docs/algorithms.md §7)."""

    # Cov(log π, A) is positive on nearly every step of a healthy GRPO run too (measured on the
    # bundled trainer), so it only warns together with an entropy that is already falling.
    key: str = Field("cov/logp_adv", description="scalar holding Cov(log π(y), A) over tokens")
    cooldown: int = Field(100, ge=0, description="minimum steps between two covariance warnings")
    persist: int = Field(3, ge=1, description="the covariance condition must hold this many consecutive steps")
    window: int = Field(10, ge=3, description="steps the covariance must stay positive over")
    min_positive_fraction: float = Field(0.8, gt=0.5, le=1.0, description="share of the window's steps with positive covariance")
    min_t: float = Field(3.0, ge=0.0, description="the window mean must be this many standard errors above 0")
    min_entropy_drop: float = Field(0.25, ge=0.0, lt=1.0, description="and smoothed entropy must already be this fraction below its baseline (0 = covariance alone)")
    min_recent_fall: float = Field(0.1, ge=0.0, lt=1.0, description="and smoothed entropy must have fallen this fraction over the window (still falling, not settled lower)")
    entropy_key: str = Field("entropy/mean", description="entropy scalar for the min_entropy_drop guard")


class ExplosionConfig(DetectorConfig):
    """Entropy or Rényi-2 rising past a ceiling set by the run's own baseline; worse with falling reward or growing length."""

    persist: int = Field(5, ge=1, description="the rise must hold this many consecutive steps (a noisy spike does not)")

    entropy_key: str = Field("entropy/mean", description="Shannon entropy scalar (nats)")
    renyi2_key: str = Field("renyi2/mean", description="Rényi-2 entropy scalar (nats)")
    reward_key: str = Field("reward/mean", description="reward scalar; a falling reward raises the severity")
    length_key: str = Field("length/mean", description="completion length scalar; growing length raises the severity")
    rise_ratio: float = Field(1.5, gt=1.0, description="ceiling = baseline × rise_ratio (and at least baseline + min_rise)")
    min_rise: float = Field(0.3, ge=0.0, description="smallest rise in nats that counts, so a tiny baseline cannot trip it")
    logv_fraction: float = Field(0.6, gt=0.0, le=1.0, description="lowers the ceiling to this fraction of log|V| (needs the vocabulary size), never below baseline + min_rise")
    early_rise_ratio: float = Field(1.25, gt=1.0, description="warn already at baseline × this (at least + early_min_rise) when the value is climbing and reward falls or length grows")
    early_min_rise: float = Field(0.1, ge=0.0, description="smallest rise in nats for that early warning")
    trend_window: int = Field(20, ge=5, description="steps in the fitted trend: a warning without falling reward or growing length needs the smoothed value still climbing")
    trend_min_r2: float = Field(0.5, ge=0.0, le=1.0, description="the climb's linear fit must explain this share of the variance")
    reward_drop: float = Field(0.05, ge=0.0, description="reward counts as falling once its EMA is this far below its best EMA")
    length_growth: float = Field(0.3, ge=0.0, description="length counts as growing once its EMA exceeds baseline × (1 + this)")


class DiversityConfig(DetectorConfig):
    """Lost diversity: pass@G − pass@1 shrinking, zero-variance groups rising."""

    pass1_target: float = Field(0.95, gt=0.0, le=1.0, description="only alert while smoothed pass@1 is below this (solving everything is not a loss)")
    min_baseline_gap: float = Field(0.05, ge=0.0, description="pass@G − pass@1 at baseline must be at least this, else there was no diversity to lose")
    gap_floor: float = Field(0.02, ge=0.0, description="alert when the smoothed gap pass@G − pass@1 falls below this ...")
    gap_fraction: float = Field(0.25, ge=0.0, le=1.0, description="... or below this fraction of its baseline (the larger wins)")
    max_pass1_drop: float = Field(0.5, gt=0.0, le=1.0, description="stay quiet once smoothed pass@1 has fallen by this fraction of its baseline: groups that agree because everything fails lack reward, not diversity")
    zero_var_key: str = Field("groups/zero_var_frac", description="scalar: fraction of groups whose rewards are all equal")
    zero_var_ceiling: float = Field(0.6, ge=0.0, le=1.0, description="alert when that fraction's EMA exceeds this ...")
    zero_var_rise: float = Field(0.25, ge=0.0, le=1.0, description="... and has risen this much above its baseline")


class ForkConfig(DetectorConfig):
    """Fork-token starvation: too few tokens with H ≥ 0.672; under a top:q fork rule, its threshold falling."""

    keys: list[str] = Field(["fork/frac"], description="scalar(s) holding the fraction of tokens with H ≥ 0.672; the first present is used")
    floor: float = Field(0.05, ge=0.0, le=1.0, description="warn below this fraction of fork tokens")
    critical_floor: float = Field(0.01, ge=0.0, le=1.0, description="critical below this fraction")
    max_baseline_fraction: float = Field(0.5, gt=0.0, le=1.0, description="and only once the fraction is at most this share of its baseline (1 = floor alone)")
    # under a quantile fork rule (top:q) the share is q by construction: the rule's entropy value is watched
    threshold_key: str = Field("fork/threshold", description="under a top:q fork rule: the step's fork threshold H (nats)")
    threshold_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="top:q rule: warn once the threshold is at most this share of its baseline")
    threshold_critical_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="top:q rule: critical at this share")


class StagnationConfig(DetectorConfig):
    """Reward plateau over a window while pass@1 is below target."""

    reward_key: str = Field("reward/mean", description="reward scalar whose plateau is detected")
    pass1_key: str = Field("pass@1", description="pass@1 scalar compared with the target (reward when absent)")
    cooldown: int = Field(200, ge=0, description="minimum steps between two stagnation warnings")
    window: int = Field(100, ge=10, description="steps in the reward trend fit")
    min_improvement: float = Field(0.02, description="plateau: the fitted reward gain over the window is below this")
    pass1_target: float = Field(0.9, description="only alert while smoothed pass@1 (or reward) is below this")
    confidence_z: float = Field(1.64, ge=0.0, description="plateau only when gain + z·(its standard error) is below min_improvement (0 = the point estimate alone)")


class DegenerateConfig(DetectorConfig):
    """Degenerate groups split by cause: all-correct (too easy) vs all-wrong (too hard), opposite fixes."""

    persist: int = Field(5, ge=1, description="the condition must hold this many consecutive steps")
    key: str = Field("groups/zero_var_frac", description="scalar: fraction of groups whose rewards are all equal")
    pass_keys: list[str] = Field(["pass@1", "reward/mean"], description="the pass rate that says which way the groups agree; the largest present is used (reward read as a rate in [0, 1])")
    warn_frac: float = Field(0.5, gt=0.0, le=1.0, description="warn once the smoothed fraction reaches this (2 rollouts paid per useful one)")
    critical_frac: float = Field(0.75, gt=0.0, le=1.0, description="critical from this fraction (4 rollouts per useful one)")
    saturated_pass: float = Field(0.85, gt=0.0, le=1.0, description="pass rate at or above which degenerate groups are all-correct: the task is too easy")
    too_hard_pass: float = Field(0.15, ge=0.0, lt=1.0, description="pass rate at or below which they are all-wrong: the task is too hard (between the two, lost_diversity speaks)")
    entropy_key: str = Field("entropy/mean", description="entropy scalar: groups that agree because entropy collapsed are entropy_collapse's case")
    collapsed_drop: float = Field(0.75, gt=0.0, lt=1.0, description="all-correct stays quiet once smoothed entropy is this fraction below its baseline")


class TruncationConfig(DetectorConfig):
    """Completions cut off at the length cap: their reward measures the cap, not the policy."""

    persist: int = Field(3, ge=1, description="the condition must hold this many consecutive steps")
    keys: list[str] = Field(["length/clip_frac", "completions/clipped_ratio", "response_length/clip_ratio"], description="scalar(s) holding the share of truncated completions; the first present is used")
    warn_frac: float = Field(0.05, gt=0.0, le=1.0, description="warn once the smoothed share reaches this")
    critical_frac: float = Field(0.15, gt=0.0, le=1.0, description="critical from this share")
    always_frac: float = Field(0.95, gt=0.0, le=1.0, description="quiet while this share or more is cut off and was from the start (baseline): nothing ever ends, so truncation cannot bias the reward (fixed-length generation, or a model that never learned EOS)")


class ClipConfig(DetectorConfig):
    """PPO clip saturation: a large share of the update thrown away by the ratio clip."""

    persist: int = Field(5, ge=1, description="the condition must hold this many consecutive steps")
    keys: list[str] = Field(["clip/frac", "clip_ratio/region_mean", "actor/pg_clipfrac"], description="scalar(s) holding the clipped share of token updates; the first present is used")
    warn_frac: float = Field(0.2, gt=0.0, le=1.0, description="warn once the smoothed clipped share reaches this")
    critical_frac: float = Field(0.4, gt=0.0, le=1.0, description="critical from this share")


class KLDriftConfig(DetectorConfig):
    """KL to the reference running away (quiet when the run has no KL term: KL exactly 0)."""

    persist: int = Field(5, ge=1, description="the condition must hold this many consecutive steps")
    keys: list[str] = Field(["kl", "actor/kl_loss", "objective/kl"], description="scalar(s) holding KL(policy ‖ reference); the first present is used")
    high: float = Field(0.5, gt=0.0, description="KL (nats) that warns when it is also accelerating")
    extreme: float = Field(2.0, gt=0.0, description="KL that warns on its own; critical once reward has stopped improving")
    window: int = Field(20, ge=5, description="steps in each of the two fitted slopes compared for acceleration")
    acceleration: float = Field(1.5, gt=1.0, description="accelerating: the recent slope is this many times the previous window's")
    reward_key: str = Field("reward/mean", description="reward scalar: KL bought with no reward gain is critical")
    min_reward_gain: float = Field(0.02, description="reward counts as stalled when its fitted gain over the window is below this")


class GradientConfig(DetectorConfig):
    """Gradient-norm pathologies: recurring spikes, a vanishing norm, exactly-zero updates."""

    cooldown: int = Field(100, ge=0, description="minimum steps between two gradient warnings")
    key: str = Field("grad_norm", description="scalar holding the (pre-clip) gradient norm")
    window: int = Field(100, ge=10, description="steps over which spikes and zero updates are counted")
    spike_ratio: float = Field(5.0, gt=1.0, description="a spike: the norm above this multiple of its running typical level (geometric EMA)")
    spike_count: int = Field(3, ge=1, description="warn at this many spikes in the window")
    vanish_fraction: float = Field(0.05, gt=0.0, lt=1.0, description="vanishing: smoothed norm below this fraction of its baseline")
    zero_fraction: float = Field(0.4, gt=0.0, le=1.0, description="warn when this share of the window's steps had a norm of exactly 0")
    zero_var_key: str = Field("groups/zero_var_frac", description="zero-variance group fraction: when most groups are degenerate that explains zero and vanishing updates (degenerate_groups speaks)")
    explained_zero_var: float = Field(0.5, ge=0.0, le=1.0, description="the smoothed zero-variance fraction above which a zero or vanishing norm is explained")


class DivergenceConfig(DetectorConfig):
    """Training reward climbing while the held-out score does not: the verifier is being gamed."""

    warmup_steps: int = Field(0, ge=0, description="counted in evaluations, see min_evals")
    cooldown: int = Field(100, ge=0, description="minimum steps between two divergence alerts")
    eval_keys: list[str] = Field(["eval/pass@1", "eval/reward", "eval_score", "val/test_score", "eval/accuracy"], description="held-out score scalar(s); the first present is used")
    reward_key: str = Field("reward/mean", description="training reward scalar (smoothed, read at each evaluation)")
    evals: int = Field(6, ge=3, description="evaluations in the fitted window")
    min_evals: int = Field(4, ge=3, description="evaluations needed before the detector may fire")
    reward_gain: float = Field(0.05, gt=0.0, description="diverging: training reward rose by at least this over the window ...")
    eval_gain: float = Field(0.0, description="... while the held-out score gained at most this (critical when it fell by reward_gain)")


class CompositionConfig(DetectorConfig):
    """One reward component carries all the variance the policy can follow; another is a constant."""

    warmup_steps: int = Field(30, ge=0, description="steps observed before this detector may fire")
    cooldown: int = Field(200, ge=0, description="minimum steps between two composition warnings")
    prefix: str = Field("rewards/", description="component scalars are PREFIX<name>SUFFIX (TRL: rewards/<func>/mean)")
    suffix: str = Field("/mean", description="see prefix")
    max_components: int = Field(16, ge=2, description="components tracked (bounded state)")
    dominance: float = Field(0.9, gt=0.5, le=1.0, description="warn when one component holds this share of the summed variance ...")
    dead_share: float = Field(0.02, ge=0.0, lt=0.5, description="... and another holds less than this (a constant is invisible to a policy gradient)")


class NonFiniteConfig(DetectorConfig):
    """NaN or ±inf in any statistic."""

    warmup_steps: int = Field(0, ge=0, description="NaN/inf is never normal: no warm-up")
    cooldown: int = Field(10, ge=0, description="minimum steps between two non-finite alerts")


class MismatchConfig(DetectorConfig):
    """Training–inference mismatch: the sampler's and the trainer's log p of the sampled tokens drifting apart
    (warning), or sequence-level importance weights degenerating (critical); docs/algorithms.md §11."""

    smoothing: float = Field(0.7, ge=0.0, lt=1.0, description="EMA factor β of every mismatch signal (0.7: about three steps), so a rise shows within a few steps")
    persist: int = Field(3, ge=1, description="a condition must hold this many consecutive steps that carry mismatch scalars")
    baseline_steps: int = Field(10, ge=1, description="the median of a key's first N values (steps that carry it) is the run's early baseline: one noisy early step cannot set it")
    level_keys: list[str] = Field(["mismatch/kl_k3", "mismatch/kl_k1", "mismatch/logp_diff_abs_mean"], description="mismatch level whose rise above its baseline warns; the first present is used (k3 is ≥ 0 per token; TRL logs only the mean |log p difference|)")
    band_keys: list[str] = Field(["mismatch/frac_outside_2x"], description="out-of-band fraction(s) (tokens whose ratio p_train / p_sampler leaves [1/2, 2]) whose rise warns as well")
    rise_factor: float = Field(3.0, gt=1.0, description="warn when a smoothed signal exceeds its baseline × this ...")
    min_rise: dict[str, float] = Field(
        {"mismatch/kl_k3": 1e-3, "mismatch/kl_k1": 1e-3, "mismatch/logp_diff_abs_mean": 0.03,
         "mismatch/frac_outside_2x": 5e-3},
        description="... and its baseline + this (per key, in its unit: nats, or a fraction of tokens): a numerically-zero baseline (identical engines) must not turn noise into a rise")
    fork_ratio: float = Field(2.0, gt=1.0, description="the message says the mismatch sits on fork (or non-fork) tokens when the per-token value there is this many times the other's")
    ess_key: str = Field("mismatch/seq_ess", description="normalised effective sample size of the sequence-level weights Π_t r_t, in (0, 1]")
    min_seq_ess: float = Field(0.1, gt=0.0, lt=1.0, description="critical when the smoothed ESS falls below this (with n sequences a step it cannot go below 1/n)")
    kl_keys: list[str] = Field(["mismatch/kl_k3", "mismatch/kl_k1"], description="per-token KL(sampler ‖ trainer) for the T × KL rule; the first present is used")
    length_key: str = Field("length/mean", description="mean trained tokens per completion: T in T × KL (the rule is skipped without it)")
    seq_cap: float = Field(3.0, gt=1.0, description="sequence-level clamp C: critical when smoothed T × KL > log C, i.e. the typical sequence weight exp(−T·KL) is below 1/C and most of the weight lies past the clamp (3: TRL's vllm_importance_sampling_clip_max; verl's rollout_is_threshold is 2)")

    @model_validator(mode="after")
    def _every_rise_has_a_floor(self) -> "MismatchConfig":
        missing = [k for k in (*self.level_keys, *self.band_keys) if k not in self.min_rise]
        if missing:
            raise ValueError(f"min_rise has no floor for {', '.join(missing)}: add one per key of level_keys and "
                             f"band_keys (in the key's unit), e.g. {{\"{missing[0]}\": 0.001}}")
        negative = [k for k, v in self.min_rise.items() if v < 0]
        if negative:
            raise ValueError(f"min_rise must be ≥ 0, got a negative floor for {', '.join(negative)}")
        return self


class LengthHackingConfig(DetectorConfig):
    """Completions growing far past their early length while the reward gained is paid for length."""

    smoothing: float = Field(0.8, ge=0.0, lt=1.0, description="EMA factor β of length, reward and its components (0.8: about five steps, so the alert leads the truncation it causes)")
    persist: int = Field(5, ge=1, description="the condition must hold this many consecutive steps")
    cooldown: int = Field(200, ge=0, description="minimum steps between two length-hacking alerts of one severity")
    baseline_steps: int = Field(10, ge=1, description="the median of the first N lengths and rewards is the run's early level (one odd early step cannot set it)")
    length_keys: list[str] = Field(["length/mean", "completions/mean_length", "response_length/mean"], description="mean completion length (tokens); the first present is used")
    reward_keys: list[str] = Field(["reward/mean", "reward"], description="total reward per step; the first present is used")
    corr_key: str = Field("groups/length_reward_corr", description="within-group Pearson correlation of reward and length, averaged over groups (from the step's samples)")
    growth: float = Field(1.5, gt=1.0, description="length counts as grown once its smoothed value is this multiple of its early level")
    critical_growth: float = Field(3.0, gt=1.0, description="critical from this multiple (the cost of generation has tripled for a reward that pays length)")
    min_reward_gain: float = Field(0.05, gt=0.0, description="the smoothed reward (or a length-like component of it) must have risen at least this much above its early level")
    min_corr: float = Field(0.3, gt=0.0, le=1.0, description="samples: longer completions of a group earn more, smoothed within-group correlation at least this")
    length_components: list[str] = Field(["length", "len_", "_len", "verbos", "long"], description="a reward component rewards/<name>/mean whose name contains one of these pays for length")
    component_share: float = Field(0.5, gt=0.0, le=1.0, description="a length component explains the gain when it carries this share of the reward's rise")
    correct_components: list[str] = Field(["acc", "correct", "exact", "verif", "solved"], description="a component whose name contains one of these scores correctness")
    correct_keys: list[str] = Field(["eval/pass@1", "eval/reward", "eval/accuracy"], description="held-out scores; with a correctness component, the signals that must follow the reward")
    max_correct_share: float = Field(0.25, ge=0.0, lt=1.0, description="correctness does not follow when its rise is under this share of the reward's")
    min_r2: float = Field(0.5, ge=0.0, le=1.0, description="scalars only: smoothed reward regressed on smoothed length over the window explains this share of its variance")
    window: int = Field(30, ge=5, description="steps in that regression")


class ClipAsymmetryConfig(DetectorConfig):
    """One side of the ratio clip (upper or lower) binding far more often than the other, persistently."""

    persist: int = Field(5, ge=1, description="the lopsided clip must hold this many consecutive steps")
    cooldown: int = Field(200, ge=0, description="minimum steps between two clip-asymmetry alerts")
    high_keys: list[str] = Field(["clip/high_frac", "clip_ratio/high_mean"], description="share of tokens clipped at the upper bound 1+ε_high (A > 0); the first present is used")
    low_keys: list[str] = Field(["clip/low_frac", "clip_ratio/low_mean"], description="share clipped at the lower bound 1-ε_low (A < 0); the first present is used")
    min_frac: float = Field(0.01, gt=0.0, le=1.0, description="the binding side's smoothed share must reach this: below it the clip barely acts and its split is noise")
    ratio: float = Field(4.0, gt=1.0, description="lopsided: one side's smoothed share is this many times the other's")
    entropy_key: str = Field("entropy/mean", description="entropy scalar: what an upper clip that binds does to exploration is read here")
    entropy_drop: float = Field(0.25, gt=0.0, lt=1.0, description="the message calls the upper clip the likely cause of entropy loss once smoothed entropy is this fraction below its early level")


class KLInertConfig(DetectorConfig):
    """A KL term that is there (its key logged) and pinned at zero while the policy moves: the reference is the policy."""

    keys: list[str] = Field(["kl", "actor/kl_loss", "objective/kl"], description="scalar(s) holding KL(policy ‖ reference); the first present is used")
    coef_keys: list[str] = Field(["kl/beta", "actor/kl_coef", "kl_coef", "beta"], description="the KL coefficient β where the run logs it (the bundled trainer, verl): the term is there only when β > 0; without one, a logged KL key says it is (TRL logs `kl` only when beta ≠ 0)")
    warmup_steps: int = Field(5, ge=0, description="steps observed before this detector may fire")
    floor: float = Field(1e-6, gt=0.0, description="|KL| below this (nats) counts as zero: a reference ≠ policy gives more within a few steps of any update that moves entropy, log p or reward")
    window: int = Field(20, ge=3, description="KL must stay under the floor for this many consecutive steps that log it")
    move_keys: list[str] = Field(["entropy/mean", "entropy", "logp/mean", "reward/mean", "reward"], description="signals whose movement shows the policy is changing (any one suffices)")
    min_move: dict[str, float] = Field(
        {"entropy/mean": 0.05, "entropy": 0.05, "logp/mean": 0.05, "reward/mean": 0.1, "reward": 0.1},
        description="per move key: how far its smoothed value must move from its early level (nats, or reward units) to count as the policy moving")

    @model_validator(mode="after")
    def _every_move_key_has_a_threshold(self) -> "KLInertConfig":
        missing = [k for k in self.move_keys if k not in self.min_move]
        if missing:
            raise ValueError(f"min_move has no threshold for {', '.join(missing)}: add one per key of move_keys, "
                             f"e.g. {{\"{missing[0]}\": 0.1}}")
        return self


class AlertConfig(BaseModel):
    """Every detector's settings; the defaults are meant to be quiet on healthy runs."""

    model_config = ConfigDict(extra="forbid")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig, description="entropy collapse: floor, drop from baseline, forecast of the crossing")
    covariance: CovarianceConfig = Field(default_factory=CovarianceConfig, description="early warning: sustained positive Cov(log π, A)")
    explosion: ExplosionConfig = Field(default_factory=ExplosionConfig, description="entropy / Rényi-2 rising past a ceiling")
    diversity: DiversityConfig = Field(default_factory=DiversityConfig, description="pass@G − pass@1 shrinking, zero-variance groups rising")
    fork: ForkConfig = Field(default_factory=ForkConfig, description="fraction of fork tokens (H ≥ 0.672) below a floor")
    stagnation: StagnationConfig = Field(default_factory=StagnationConfig, description="reward plateau while pass@1 is below target")
    non_finite: NonFiniteConfig = Field(default_factory=NonFiniteConfig, description="NaN or ±inf statistics")
    degenerate: DegenerateConfig = Field(default_factory=DegenerateConfig, description="degenerate groups: all-correct (too easy) vs all-wrong (too hard)")
    truncation: TruncationConfig = Field(default_factory=TruncationConfig, description="completions cut off at the length cap")
    clip: ClipConfig = Field(default_factory=ClipConfig, description="PPO clip saturation")
    kl_drift: KLDriftConfig = Field(default_factory=KLDriftConfig, description="KL to the reference running away")
    gradient: GradientConfig = Field(default_factory=GradientConfig, description="gradient-norm spikes, vanishing or zero updates")
    divergence: DivergenceConfig = Field(default_factory=DivergenceConfig, description="training reward up while the held-out score is not")
    composition: CompositionConfig = Field(default_factory=CompositionConfig, description="one reward component dominates, another is constant")
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig, description="training–inference mismatch: sampler vs trainer log p rising from baseline, sequence weights degenerate")
    length_hacking: LengthHackingConfig = Field(default_factory=LengthHackingConfig, description="completions growing while the reward gained is paid for length")
    clip_asymmetry: ClipAsymmetryConfig = Field(default_factory=ClipAsymmetryConfig, description="one side of the ratio clip binding far more than the other")
    kl_inert: KLInertConfig = Field(default_factory=KLInertConfig, description="a KL term logged at zero while the policy moves: the reference is the policy")
