"""Detectors for the ways a run dies besides its entropy: degenerate groups (all-correct vs
all-wrong), truncation, clip saturation, KL drift, gradient pathologies, reward–eval divergence,
reward composition. O(1) state per step like the others; each alert names its fix and a source.
"""
from __future__ import annotations

import math
from collections import deque

from forksight.monitor.alerts.config import (CompositionConfig, DegenerateConfig, DivergenceConfig, GradientConfig,
                                             KLDriftConfig)
from forksight.monitor.alerts.detector_base import Alert, Baseline, DebiasedEMA, Detector, Gate, RollingOLS, Tiers

__all__ = ["DegenerateDetector", "TruncationDetector", "ClipDetector", "KLDriftDetector", "GradientDetector",
           "DivergenceDetector", "CompositionDetector", "REFERENCES"]

# the literature each detector's diagnosis and fix come from (also in each alert's evidence)
REFERENCES = {
    "degenerate_groups": "Yu et al., DAPO (arXiv:2503.14476), dynamic sampling",
    "truncation": "Yu et al., DAPO (arXiv:2503.14476), overlong filtering and soft overlong punishment",
    "clip_saturation": "Schulman et al., PPO (arXiv:1707.06347); DAPO clip-higher (arXiv:2503.14476)",
    "kl_drift": "Stiennon et al. (arXiv:2009.01325); Gao et al., reward-model overoptimization (arXiv:2210.10760)",
    "gradient": "Pascanu et al., on the difficulty of training RNNs (arXiv:1211.5063)",
    "reward_eval_divergence": "Gao et al. (arXiv:2210.10760); Skalse et al., reward hacking (arXiv:2209.13085)",
    "reward_composition": "DeepSeek-R1 (arXiv:2501.12948), accuracy plus format rewards",
}


def first_key(keys: list[str], scalars: dict[str, float]) -> str | None:
    return next((k for k in keys if k in scalars), None)


class _Level(Detector):
    """A smoothed share (first present of `config.keys`) against a warning and a critical level."""

    what = "share"

    def __init__(self, config, cause: Detector | None = None) -> None:
        super().__init__(config)
        self.cause = cause    # the detector of this level's cause, if it has one: quiet while it holds
        self.ema, self.base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.tiers = Tiers(config.cooldown, config.persist)

    def quiet(self, value: float) -> bool:
        """A level that proves nothing on this run (see TruncationDetector)."""
        return False

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        key = first_key(c.keys, scalars)
        if key is None:
            return []
        value = self.ema.update(scalars[key])
        self.base.update(scalars[key])
        if seen < c.warmup_steps:
            return []
        h = 1.0 - c.hysteresis
        on = not self.quiet(value)
        severity = self.tiers.update(step, warn=on and value >= c.warn_frac, crit=on and value >= c.critical_frac,
                                     warn_clear=value < c.warn_frac * h, crit_clear=value < c.critical_frac * h)
        if severity is None:
            return []
        thr = c.critical_frac if severity == "critical" else c.warn_frac
        return [self._alert(step, severity, self.message(key, value, thr), self.action, value, thr, signal=key,
                            evidence={"reference": REFERENCES[self.name]})]


class TruncationDetector(_Level):
    name = "truncation"
    fix = "mask truncated completions out of the loss (DAPO overlong filtering) or raise the length cap"
    action = ("A cut-off completion is scored as a failure, so its advantage says the policy's prefix was bad: "
              "mask truncated completions out of the loss (DAPO overlong filtering) or use a soft overlong "
              "penalty, or raise max_new_tokens / max_completion_length (generation cost grows with it).")

    def quiet(self, value: float) -> bool:
        # every completion cut off from the first steps on: fixed-length generation by design, or a
        # model that never learned to stop; no completion ends, so the cap cannot tell a good
        # prefix from a bad one (a share that climbs there from lower still warns). While length
        # hacking holds, the cap is its symptom, and raising it (this alert's fix) would feed it.
        c = self.config
        if self.cause is not None and self.cause.active:      # length_hacking
            return True
        return self.base.ready and self.base.value >= c.always_frac and value >= c.always_frac

    def message(self, key: str, value: float, thr: float) -> str:
        return (f"Truncation: {100 * value:.1f}% of completions hit the length cap (`{key}`, smoothed; "
                f"threshold {100 * thr:.0f}%): their reward measures the cap, not the policy.")


class ClipDetector(_Level):
    name = "clip_saturation"
    fix = "lower the learning rate or the updates per batch"
    action = ("The ratio clip is throwing the update away: lower the learning rate or the optimiser steps per "
              "rollout batch (PPO epochs), check that rollouts are not stale (async generation); if the upper "
              "bound does most of the clipping, raise clip-high (DAPO ε_high ≈ 0.28; clip_asymmetry says so).")

    def quiet(self, value: float) -> bool:      # clip_asymmetry: one side binding has its own, other fix
        return self.cause is not None and self.cause.lopsided() is not None

    def message(self, key: str, value: float, thr: float) -> str:
        hi, lo = (self.cause.high.value, self.cause.low.value) if self.cause is not None else (None, None)
        split = (f" Upper bound {100 * hi:.1f}%, lower {100 * lo:.1f}% (clip_asymmetry speaks instead once one "
                 "side binds far more)." if hi is not None and lo is not None else "")
        return (f"Clip saturation: {100 * value:.1f}% of token updates are clipped (`{key}`, smoothed; threshold "
                f"{100 * thr:.0f}%): the effective step is set by the clip, not the learning rate.{split}")


class DegenerateDetector(Detector):
    """Zero-variance groups, told apart by the pass rate: all-correct (too easy) or all-wrong (too
    hard). Between the two, groups agree because diversity is gone: lost_diversity's case."""

    name = "degenerate_groups"
    fix = "resample until groups disagree (DAPO dynamic sampling), and move the data to the model's frontier"

    def __init__(self, config: DegenerateConfig) -> None:
        super().__init__(config)
        self.frac, self.level = DebiasedEMA(config.smoothing), DebiasedEMA(config.smoothing)
        self.best: float | None = None
        self.entropy, self.entropy_base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if c.key not in scalars:
            return []
        frac = self.frac.update(scalars[c.key])
        # the larger of pass@1 and the reward: with partial credit, pass@1 can sit at 0 while
        # groups agree on a reward of 0.7 (they agree on the same partial answer, not on failing)
        present = [k for k in c.pass_keys if k in scalars]
        pass_key = max(present, key=lambda k: scalars[k]) if present else None
        if pass_key is not None:
            level = self.level.update(scalars[pass_key])
            self.best = level if self.best is None else max(self.best, level)
        if c.entropy_key in scalars:
            self.entropy.update(scalars[c.entropy_key])
            self.entropy_base.update(scalars[c.entropy_key])
        level = self.level.value
        if seen < c.warmup_steps or level is None:
            return []
        # all-wrong from the start (never better): a run whose pass rate crashed from a better level
        # is exploding or collapsing, not facing a task too hard for it
        too_hard = level <= c.too_hard_pass and self.best is not None and self.best <= c.too_hard_pass
        # all-correct with entropy still near its start: once entropy collapsed, groups agree
        # because the policy lost its exploration (entropy_collapse's case, with its fix)
        collapsed = (self.entropy_base.ready and self.entropy_base.value > 0 and self.entropy.value is not None
                     and self.entropy.value < self.entropy_base.value * (1.0 - c.collapsed_drop))
        too_easy = level >= c.saturated_pass and not collapsed
        too_hard = too_hard and not collapsed
        regime = "too_easy" if too_easy else "too_hard" if too_hard else None
        h = 1.0 - c.hysteresis
        severity = self.tiers.update(step, warn=regime is not None and frac >= c.warn_frac,
                                     crit=regime is not None and frac >= c.critical_frac,
                                     warn_clear=regime is None or frac < c.warn_frac * h,
                                     crit_clear=regime is None or frac < c.critical_frac * h)
        if severity is None:
            return []
        thr = c.critical_frac if severity == "critical" else c.warn_frac
        cost = 1.0 / max(1.0 - frac, 1e-6)
        if regime == "too_easy":
            head = (f"Degenerate groups, all-correct: {100 * frac:.0f}% of groups have equal rewards while the pass "
                    f"rate is {level:.2f}: the model has outgrown this data")
            action = ("The task is too easy: drop prompts the policy already solves (pass rate > 0.9) and refresh "
                      "the pool, or a curriculum aimed at pass rates 0.3–0.7; resample until each group has reward "
                      "variance (DAPO dynamic sampling).")
        else:
            head = (f"Degenerate groups, all-wrong: {100 * frac:.0f}% of groups have equal rewards while the pass "
                    f"rate is {level:.2f}: the model almost never succeeds")
            action = ("The task is too hard, or the verifier rejects everything: grade 20 completions by hand, "
                      "lower the difficulty or warm up first (SFT), raise the group size so rare successes appear; "
                      "resample until each group has reward variance (DAPO dynamic sampling).")
        msg = f"{head}; {cost:.1f} rollouts are paid per one that yields a gradient."
        return [self._alert(step, severity, msg, action, frac, thr, signal=c.key,
                            evidence={"regime": regime, "pass_rate": level, "pass_key": pass_key,
                                      "rollouts_per_useful": cost, "reference": REFERENCES[self.name]})]


class KLDriftDetector(Detector):
    """KL to the reference past `extreme`, or past `high` and accelerating; critical when the
    reward bought with it has stalled. A run whose KL has been exactly 0 has no KL term: quiet."""

    name = "kl_drift"
    fix = "raise the KL coefficient or lower the learning rate, and keep the last checkpoint under budget"

    def __init__(self, config: KLDriftConfig) -> None:
        super().__init__(config)
        self.ema = DebiasedEMA(config.smoothing)
        self.recent, self.before = RollingOLS(config.window), RollingOLS(config.window)
        self.moving: deque[tuple[int, float]] = deque(maxlen=config.window)
        self.reward = RollingOLS(config.window)
        self.nonzero = False
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        key = first_key(c.keys, scalars)
        if c.reward_key in scalars:
            self.reward.add(step, scalars[c.reward_key])
        if key is None:
            return []
        self.nonzero |= scalars[key] != 0.0
        kl = self.ema.update(scalars[key])
        if len(self.moving) == c.window:          # the point leaving the recent window enters the previous one
            self.before.add(*self.moving[0])
        self.moving.append((step, kl))
        self.recent.add(step, kl)
        if seen < c.warmup_steps or not self.nonzero:
            return []
        now, then = self.recent.fit(), self.before.fit() if self.before.n >= c.window // 2 else None
        slope = now[0] if now else 0.0
        accelerating = slope > 0 and then is not None and slope > c.acceleration * max(then[0], 0.0)
        gain = self.reward.fit()[0] * self.reward.span if self.reward.fit() else None
        stalled = gain is not None and gain < c.min_reward_gain
        warn = kl >= c.extreme or (kl >= c.high and accelerating)
        h = 1.0 - c.hysteresis
        severity = self.tiers.update(step, warn=warn, crit=kl >= c.extreme and stalled,
                                     warn_clear=kl < c.high * h, crit_clear=kl < c.extreme * h or not stalled)
        if severity is None:
            return []
        thr = c.extreme if kl >= c.extreme else c.high
        why = (f"while `{c.reward_key}` gained {gain:+.3f} over the last {self.reward.n} steps (stalled)"
               if severity == "critical" else
               f"rising {slope:+.4f}/step{' and accelerating' if accelerating else ''}")
        msg = f"KL drift: smoothed KL to the reference `{key}` = {kl:.3f} nats, {why}."
        action = ("The policy is walking away from its reference: raise the KL coefficient (or use an adaptive "
                  "controller with a KL budget), lower the learning rate, evaluate general capability, and keep "
                  "the last checkpoint under the budget.")
        return [self._alert(step, severity, msg, action, kl, thr, signal=key,
                            evidence={"window": self.recent.n, "slope": slope,
                                      "previous_slope": then[0] if then else None, "accelerating": accelerating,
                                      "reward_gain": gain, "reference": REFERENCES[self.name]})]


class GradientDetector(Detector):
    """Recurring spikes (norm ≫ its running geometric level), a vanishing norm, or exactly-zero
    updates; the last two stay quiet when most groups are degenerate (that is the cause)."""

    name = "gradient"
    fix = "clip gradients (max_grad_norm) and inspect the spiking steps' samples"

    def __init__(self, config: GradientConfig) -> None:
        super().__init__(config)
        self.log_level = DebiasedEMA(config.smoothing)      # geometric running level of the norm
        self.ema, self.base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.zero_var = DebiasedEMA(config.smoothing)
        self.spikes: deque[int] = deque()
        self.zeros: deque[bool] = deque(maxlen=config.window)
        self.zero_count = 0
        self.gate = Gate(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if c.zero_var_key in scalars:
            self.zero_var.update(scalars[c.zero_var_key])
        g = scalars.get(c.key)
        if g is None:
            return []
        if len(self.zeros) == c.window and self.zeros[0]:
            self.zero_count -= 1
        self.zeros.append(g == 0.0)
        self.zero_count += g == 0.0
        typical = math.exp(self.log_level.value) if self.log_level.value is not None else None
        if g > 0:
            # a spike is large against both the running level and the early level: a norm that
            # shrank to nothing after a collapse and twitches back up is not one
            if (typical is not None and self.base.ready and g > c.spike_ratio * typical
                    and g > self.base.value):
                self.spikes.append(step)
            self.log_level.update(math.log(g))
        while self.spikes and self.spikes[0] <= step - c.window:
            self.spikes.popleft()
        smooth = self.ema.update(g)
        self.base.update(g)
        if seen < c.warmup_steps:
            return []
        explained = (self.zero_var.value or 0.0) >= c.explained_zero_var
        zero_share = self.zero_count / len(self.zeros)
        spiky = len(self.spikes) >= c.spike_count
        vanishing = self.base.ready and self.base.value > 0 and smooth < c.vanish_fraction * self.base.value
        zero = zero_share >= c.zero_fraction and len(self.zeros) >= c.window // 2
        active = spiky or ((vanishing or zero) and not explained)
        if not self.gate.update(step, active, not active):
            return []
        if spiky:
            msg = (f"Gradient spikes: {len(self.spikes)} steps in the last {c.window} had `{c.key}` above "
                   f"{c.spike_ratio:g}× its running level (now {typical or 0:.3g}); each corrupts Adam's moments "
                   "for many steps.")
            value, thr, what = float(len(self.spikes)), float(c.spike_count), "spikes"
        elif zero:
            msg = (f"Zero updates: {100 * zero_share:.0f}% of the last {len(self.zeros)} steps had `{c.key}` exactly 0 "
                   "with groups that still disagree: check the advantage and the loss mask.")
            value, thr, what = zero_share, c.zero_fraction, "zero"
        else:
            msg = (f"Vanishing gradient: smoothed `{c.key}` = {smooth:.3g}, under {100 * c.vanish_fraction:.0f}% of "
                   f"its baseline {self.base.value:.3g}: the optimiser is barely moving.")
            value, thr, what = smooth, c.vanish_fraction * self.base.value, "vanishing"
        action = ("Clip gradients (max_grad_norm ≈ 1), lower the learning rate, keep logits and the loss in "
                  "float32, and read the samples of the spiking steps; a vanishing or zero norm is usually an "
                  "advantage problem (check the reward spread per group) or a schedule that decayed to 0.")
        return [self._alert(step, "warning", msg, action, value, thr, signal=c.key,
                            evidence={"kind": what, "window": c.window, "spikes": list(self.spikes)[-10:],
                                      "typical": typical, "baseline": self.base.value, "zero_share": zero_share,
                                      "reference": REFERENCES[self.name]})]


class DivergenceDetector(Detector):
    """At each evaluation: the smoothed training reward's fitted gain over the last evaluations
    against the held-out score's; reward up and held-out flat warns, held-out falling is critical."""

    name = "reward_eval_divergence"
    fix = "read high-reward samples end to end and audit the verifier"

    def __init__(self, config: DivergenceConfig) -> None:
        super().__init__(config)
        self.reward = DebiasedEMA(config.smoothing)
        self.train, self.held = RollingOLS(config.evals), RollingOLS(config.evals)
        self.tiers = Tiers(config.cooldown, 1)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if c.reward_key in scalars:
            self.reward.update(scalars[c.reward_key])
        key = first_key(c.eval_keys, scalars)
        if key is None or self.reward.value is None:
            return []
        self.train.add(step, self.reward.value)
        self.held.add(step, scalars[key])
        if self.held.n < c.min_evals:
            return []
        r_fit, e_fit = self.train.fit(), self.held.fit()
        if r_fit is None or e_fit is None:
            return []
        r_gain, e_gain = r_fit[0] * self.train.span, e_fit[0] * self.held.span
        up = r_gain >= c.reward_gain
        severity = self.tiers.update(step, warn=up and e_gain <= c.eval_gain,
                                     crit=up and e_gain <= -c.reward_gain,
                                     warn_clear=not up or e_gain > c.eval_gain,
                                     crit_clear=not up or e_gain > -c.reward_gain)
        if severity is None:
            return []
        msg = (f"Reward–eval divergence: smoothed `{c.reward_key}` gained {r_gain:+.3f} over the last {self.held.n} "
               f"evaluations while the held-out `{key}` {'fell' if e_gain < 0 else 'moved'} {e_gain:+.3f}: the "
               "policy is learning something the verifier rewards and the task does not.")
        action = ("Read 20 high-reward completions end to end; audit the verifier (does it accept known-wrong "
                  "answers? keyword stuffing?); grade with a second verifier; roll back to the checkpoint before "
                  "the gap opened.")
        return [self._alert(step, severity, msg, action, e_gain, c.eval_gain, signal=key,
                            evidence={"window": self.held.n, "span": self.held.span, "reward_gain": r_gain,
                                      "eval_gain": e_gain, "reference": REFERENCES[self.name]})]


class CompositionDetector(Detector):
    """Each reward component's variance over steps (exponentially weighted): one holding nearly all
    of it while another is constant means the constant one is invisible to the gradient."""

    name = "reward_composition"
    fix = "rescale or drop the saturated component; fix the constant one"

    def __init__(self, config: CompositionConfig, cause: Detector | None = None) -> None:
        super().__init__(config)
        self.cause = cause    # length_hacking: a length term that dominates is that cause, named there
        self.mean: dict[str, DebiasedEMA] = {}
        self.var: dict[str, DebiasedEMA] = {}
        self.gate = Gate(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        for key, value in scalars.items():
            if not (key.startswith(c.prefix) and key.endswith(c.suffix)) or len(key) <= len(c.prefix) + len(c.suffix):
                continue
            if key not in self.mean and len(self.mean) >= c.max_components:
                continue
            mean = self.mean.setdefault(key, DebiasedEMA(c.smoothing))
            var = self.var.setdefault(key, DebiasedEMA(c.smoothing))
            before = mean.value if mean.value is not None else value
            mean.update(value)
            var.update((value - before) ** 2)
        if seen < c.warmup_steps or len(self.var) < 2:
            return []
        total = sum(v.value or 0.0 for v in self.var.values())
        if total <= 0:
            return []
        shares = {k: (v.value or 0.0) / total for k, v in self.var.items()}
        top = max(shares, key=shares.get)
        dead = sorted(k for k, s in shares.items() if s < c.dead_share)
        explained = self.cause is not None and self.cause.active and top == self.cause.component
        active = shares[top] >= c.dominance and bool(dead) and not explained
        if not self.gate.update(step, active, not active):
            return []
        msg = (f"Reward composition: `{top}` carries {100 * shares[top]:.0f}% of the reward variance across steps "
               f"while {', '.join(f'`{k}`' for k in dead)} {'is' if len(dead) == 1 else 'are'} nearly constant "
               f"(mean {', '.join(f'{self.mean[k].value:.3g}' for k in dead)}): a constant reward term teaches nothing.")
        action = ("The policy follows the component it can move: check the constant one (a verifier that always "
                  "returns 0 or 1?), rescale or drop a saturated format reward, and weight the components so the "
                  "task reward carries the variance.")
        return [self._alert(step, "warning", msg, action, shares[top], c.dominance, signal=top,
                            evidence={"shares": shares, "dead": dead, "reference": REFERENCES[self.name]})]
