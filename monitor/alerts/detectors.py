"""The detectors behind forksight's alerts, one class per way a run goes wrong; shared state in
detector_base.py, collapse and covariance in collapse.py, configs in alert_config.py (docs/algorithms.md §7, §9).
"""
from __future__ import annotations

import math

from forksight.monitor.alerts.config import (DiversityConfig, ExplosionConfig, ForkConfig, NonFiniteConfig,
                                            StagnationConfig)
from forksight.monitor.alerts.collapse import ACTION_COLLAPSE, ACTION_COVARIANCE, CollapseDetector, CovarianceDetector
from forksight.monitor.alerts.detector_base import (Alert, Baseline, DebiasedEMA, Detector, Gate, RollingOLS, Severity,
                                                    Tiers)

__all__ = ["Alert", "Baseline", "DebiasedEMA", "Detector", "Gate", "RollingOLS", "Severity", "Tiers",
           "CollapseDetector", "CovarianceDetector", "ExplosionDetector", "DiversityDetector", "ForkDetector",
           "StagnationDetector", "NonFiniteDetector", "ACTION_COLLAPSE", "ACTION_COVARIANCE"]

# ---------------------------------------------------------------------------- actions
ACTION_EXPLOSION = ("Entropy is running away (incoherent chains): lower the learning rate, reduce or remove "
                    "the entropy bonus, lower clip-high, raise the KL penalty to the reference; prefer ICT "
                    "selection over maximising entropy.")
ACTION_DIVERSITY = ("The group's samples agree too often to teach anything: raise the sampling temperature "
                    "or clip-high, add an entropy bonus, drop zero-variance groups (DAPO dynamic sampling), "
                    "or switch to fork-token or ICT selection.")
ACTION_FORK = ("Few high-entropy fork tokens remain, so fork-token training has little to choose from: raise "
               "clip-high or the temperature, add an entropy bonus, lower the learning rate; ICT selection "
               "(--strategy ict) does not need high-entropy tokens.")
ACTION_STAGNATION = ("Reward has stopped improving below target: check the reward function and that groups "
                     "still have reward variance, raise the learning rate or the group size, use prompts at "
                     "the model's frontier; if entropy is also low, see the collapse actions.")
ACTION_NON_FINITE = ("Stop and inspect: lower the learning rate, enable gradient clipping, keep logits and "
                     "softmax in float32, and check divisions by a zero reward std (groups with equal rewards).")


# ---------------------------------------------------------------------------- detectors
class ExplosionDetector(Detector):
    """Entropy or Rényi-2 well above the run's own early baseline, sustained and climbing or hurting
    (warning); critical once reward falls or length grows. A run that starts near log|V| and
    stays or falls raises nothing: log|V| never lowers the ceiling below baseline + min_rise."""

    name = "entropy_explosion"
    fix = "lower the learning rate, reduce the entropy bonus or raise the KL penalty"

    def __init__(self, config: ExplosionConfig, vocab_size: int | None = None) -> None:
        super().__init__(config)
        self.log_v = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
        keys = (config.entropy_key, config.renyi2_key, config.reward_key, config.length_key)
        self.ema = {k: DebiasedEMA(config.smoothing) for k in keys}
        self.base = {k: Baseline(config.baseline_steps) for k in keys}
        self.trend = {k: RollingOLS(config.trend_window) for k in keys[:2]}
        self.best_reward: float | None = None
        self.tiers = Tiers(config.cooldown, config.persist)

    def ceiling(self, base: float) -> float:
        """The level a statistic whose early baseline is `base` must pass to count as exploding."""
        c = self.config
        relative = max(base * c.rise_ratio, base + c.min_rise)
        if self.log_v is None:
            return relative
        return max(min(relative, c.logv_fraction * self.log_v), base + c.min_rise)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        for key, ema in self.ema.items():
            if key in scalars:
                ema.update(scalars[key])
                self.base[key].update(scalars[key])
                if key in self.trend:
                    self.trend[key].add(step, ema.value)
        reward = self.ema[c.reward_key].value
        if reward is not None and seen >= c.warmup_steps:
            self.best_reward = reward if self.best_reward is None else max(self.best_reward, reward)
        if seen < c.warmup_steps:
            return []
        worst = None  # (excess ratio, key, value, ceiling, baseline)
        for key in (c.entropy_key, c.renyi2_key):
            value, base = self.ema[key].value, self.base[key]
            if value is None or not base.ready:
                continue
            ceiling = self.ceiling(base.value)
            ratio = value / ceiling if ceiling > 0 else 0.0
            if worst is None or ratio > worst[0]:
                worst = (ratio, key, value, ceiling, base.value)
        if worst is None:
            return []
        ratio, key, value, ceiling, base = worst
        reasons = []
        if reward is not None and self.best_reward is not None and reward < self.best_reward - c.reward_drop:
            reasons.append(f"`{c.reward_key}` fell to {reward:.3f} from its best {self.best_reward:.3f} "
                           "(reward fell)")
        length, length_base = self.ema[c.length_key].value, self.base[c.length_key]
        if length is not None and length_base.ready and length > length_base.value * (1 + c.length_growth):
            reasons.append(f"`{c.length_key}` grew to {length:.1f} from {length_base.value:.1f}")
        fit = self.trend[key].fit()
        # a level that wandered up and sits there unhurt is drift, not an explosion
        climbing = fit is not None and fit[0] > 0 and fit[2] >= c.trend_min_r2
        above = ratio > 1.0
        clear = ratio < 1.0 - c.hysteresis
        # climbing while the reward already falls is the explosion starting: warn at a lower rise
        early = min(ceiling, max(base * c.early_rise_ratio, base + c.early_min_rise))
        early_warn = value > early and climbing and bool(reasons)
        severity = self.tiers.update(step, warn=(above and (climbing or bool(reasons))) or early_warn,
                                     crit=above and bool(reasons), warn_clear=value < early * (1.0 - c.hysteresis),
                                     crit_clear=clear)
        if severity is None:
            return []
        if severity == "warning" and not above:
            ceiling = early
        label = "entropy" if key == c.entropy_key else "Rényi-2 entropy"
        cap = f", at most {c.logv_fraction:g} of log|V| = {self.log_v:.2f}" if self.log_v is not None else ""
        evidence = (f"; {' and '.join(reasons)}." if reasons else
                    f"; still climbing {fit[0]:+.4f} nats/step (r² {fit[2]:.2f}).")
        rule = (f"baseline × {c.rise_ratio:g}, at least +{c.min_rise:g} nats{cap}" if above else
                f"the early level while reward falls: baseline × {c.early_rise_ratio:g}, at least +{c.early_min_rise:g} nats")
        msg = (f"Entropy explosion: smoothed {label} `{key}` = {value:.4f} nats stayed above {ceiling:.4f} "
               f"for {c.persist} steps, up {100 * (value / base - 1):.0f}% from the run's own baseline {base:.4f} "
               f"({rule}){evidence}")
        return [self._alert(step, severity, msg, ACTION_EXPLOSION, value, ceiling, signal=key,
                            evidence={"baseline": base, "reasons": reasons,
                                      "window": self.trend[key].n if fit else None,
                                      "slope": fit[0] if fit else None, "r2": fit[2] if fit else None})]


class DiversityDetector(Detector):
    """pass@G − pass@1 shrinking towards 0 while pass@1 < target, or zero-variance groups rising."""

    name = "lost_diversity"
    fix = "raise the temperature or clip-high, or drop zero-variance groups"

    def __init__(self, config: DiversityConfig) -> None:
        super().__init__(config)
        self.group_k: int | None = None
        self.gap, self.gap_base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.pass1, self.pass1_base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.zero_var, self.zero_var_base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.tiers = Tiers(config.cooldown, config.persist)

    def _largest_k(self, scalars: dict[str, float]) -> int | None:
        # G is not announced: take the largest k reported as pass@k (cached; re-read only if absent)
        if self.group_k is None or f"pass@{self.group_k}" not in scalars:
            ks = [int(k[5:]) for k in scalars if k.startswith("pass@") and k[5:].isdigit()]
            self.group_k = max(ks) if ks else None
        return self.group_k

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        k = self._largest_k(scalars)
        if "pass@1" in scalars:
            self.pass1.update(scalars["pass@1"])
            self.pass1_base.update(scalars["pass@1"])
            if k is not None and k > 1:
                gap = scalars[f"pass@{k}"] - scalars["pass@1"]
                self.gap.update(gap)
                self.gap_base.update(gap)
        if c.zero_var_key in scalars:
            self.zero_var.update(scalars[c.zero_var_key])
            self.zero_var_base.update(scalars[c.zero_var_key])
        if seen < c.warmup_steps:
            return []
        pass1 = self.pass1.value
        # groups that agree because pass@1 crashed (an exploding run's first sign) lack reward, not
        # diversity: the diversity fixes (more temperature, more entropy) would make that worse
        crashed = pass1 is not None and pass1 < self.pass1_base.value * (1.0 - c.max_pass1_drop)
        below_target = (pass1 is None or pass1 < c.pass1_target) and not crashed
        gap, gap_low, gap_thr, gap_clear = self.gap.value, False, None, True
        if gap is not None and self.gap_base.ready and self.gap_base.value >= c.min_baseline_gap:
            gap_thr = max(c.gap_floor, c.gap_fraction * self.gap_base.value)
            gap_low = below_target and gap < gap_thr
            gap_clear = gap > gap_thr * (1.0 + c.hysteresis) or not below_target
        zv, zv_high, zv_thr, zv_clear = self.zero_var.value, False, None, True
        if zv is not None and self.zero_var_base.ready:
            zv_thr = max(c.zero_var_ceiling, self.zero_var_base.value + c.zero_var_rise)
            zv_high = below_target and zv > zv_thr
            zv_clear = zv < zv_thr * (1.0 - c.hysteresis) or not below_target
        severity = self.tiers.update(step, warn=gap_low or zv_high, crit=gap_low and zv_high,
                                     warn_clear=gap_clear and zv_clear, crit_clear=gap_clear or zv_clear)
        if severity is None:
            return []
        parts = []
        if gap_low:
            parts.append(f"`pass@{k}-pass@1` (pass@{k} − pass@1) shrank to {gap:.3f} (baseline "
                         f"{self.gap_base.value:.3f}, threshold {gap_thr:.3f})")
        if zv_high:
            parts.append(f"`{c.zero_var_key}` = {zv:.3f}: {100 * zv:.0f}% of groups have zero reward variance (baseline "
                         f"{100 * self.zero_var_base.value:.0f}%, threshold {100 * zv_thr:.0f}%)")
        p1 = f"{pass1:.3f}" if pass1 is not None else "n/a"
        msg = f"Lost diversity: {' and '.join(parts)} while pass@1 is {p1} < {c.pass1_target:g}."
        value, thr, key = (gap, gap_thr, f"pass@{k}-pass@1") if gap_low else (zv, zv_thr, c.zero_var_key)
        return [self._alert(step, severity, msg, ACTION_DIVERSITY, value, thr, signal=key,
                            evidence={"pass@1": pass1, "group_k": k, "gap": gap, "gap_threshold": gap_thr,
                                      "gap_baseline": self.gap_base.value if gap is not None else None,
                                      "zero_var": zv, "zero_var_threshold": zv_thr})]


class ForkDetector(Detector):
    """Under an `abs:τ` fork rule, the fraction of fork tokens falling below a floor; under a top:q rule
    (the default top:0.1: the share is q by construction), the entropy threshold that makes the top q
    falling from its baseline."""

    name = "fork_starvation"
    fix = "raise clip-high or the temperature, or switch to --strategy ict"

    def __init__(self, config: ForkConfig) -> None:
        super().__init__(config)
        self.ema, self.baseline = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if "fork/quantile" in scalars and c.threshold_key in scalars:     # a top:q rule: its H value falls
            return self._threshold(step, scalars[c.threshold_key], scalars["fork/quantile"], seen)
        key = next((k for k in c.keys if k in scalars), None)
        if key is None:
            return []
        frac = scalars[key]
        smooth = self.ema.update(frac)
        self.baseline.update(frac)
        if seen < c.warmup_steps or not self.baseline.ready:
            return []
        relative_ok = smooth <= self.baseline.value * c.max_baseline_fraction
        h = 1.0 + c.hysteresis
        severity = self.tiers.update(
            step, warn=relative_ok and smooth < c.floor, crit=relative_ok and smooth < c.critical_floor,
            warn_clear=smooth > c.floor * h, crit_clear=smooth > c.critical_floor * h)
        if severity is None:
            return []
        thr = c.critical_floor if severity == "critical" else c.floor
        msg = (f"Fork-token starvation: {100 * smooth:.2f}% of tokens are forks (`{key}`; baseline "
               f"{100 * self.baseline.value:.2f}%, floor {100 * thr:.2f}%).")
        return [self._alert(step, severity, msg, ACTION_FORK, smooth, thr, signal=key,
                            evidence={"baseline": self.baseline.value})]

    def _threshold(self, step: int, tau: float, q: float, seen: int) -> list[Alert]:
        """Under `top:q` the fork share is q by construction: the forks starve when the entropy
        that makes the step's top q falls (smoothed) to a share of its baseline."""
        c = self.config
        smooth = self.ema.update(tau)
        self.baseline.update(tau)
        if seen < c.warmup_steps or not self.baseline.ready or not self.baseline.value > 0:
            return []
        base, h = self.baseline.value, 1.0 + c.hysteresis
        warn, crit = base * c.threshold_fraction, base * c.threshold_critical_fraction
        severity = self.tiers.update(step, warn=smooth <= warn, crit=smooth <= crit,
                                     warn_clear=smooth > warn * h, crit_clear=smooth > crit * h)
        if severity is None:
            return []
        thr = crit if severity == "critical" else warn
        msg = (f"Fork-token starvation: the entropy of the step's top {100 * q:g}% of tokens (the fork rule "
               f"top:{q:g}) fell to {smooth:.3g} nats (baseline {base:.3g} nats, alert at {thr:.3g}).")
        return [self._alert(step, severity, msg, ACTION_FORK, smooth, thr, signal=c.threshold_key,
                            evidence={"baseline": base, "quantile": q})]


class StagnationDetector(Detector):
    """Reward trend over a window gains less than `min_improvement` while pass@1 is below target."""

    name = "stagnation"
    fix = "check the reward function and that groups keep reward variance"

    def __init__(self, config: StagnationConfig) -> None:
        super().__init__(config)
        self.trend = RollingOLS(config.window)
        self.progress = DebiasedEMA(config.smoothing)
        self.gate = Gate(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        reward = scalars.get(c.reward_key)
        if reward is None:
            return []
        self.trend.add(step, reward)
        level = self.progress.update(scalars.get(c.pass1_key, reward))
        if seen < c.warmup_steps or self.trend.n < c.window:
            return []
        slope, fitted, r2 = self.trend.fit() or (0.0, reward, 0.0)
        gain = slope * self.trend.span
        # a plateau the data show: even the optimistic end of the gain's interval is short of the
        # minimum (a noisy reward's 100-step gain is uncertain by several hundredths)
        upper = gain + c.confidence_z * self.trend.slope_se() * self.trend.span
        below = level < c.pass1_target
        active = below and upper < c.min_improvement
        cleared = not below or gain > c.min_improvement + c.hysteresis * abs(c.min_improvement)
        if not self.gate.update(step, active, cleared):
            return []
        msg = (f"Stagnation: `{c.reward_key}` gained {gain:+.4f} (at most {upper:+.4f} at {c.confidence_z:g} "
               f"standard errors) over the last {self.trend.n} steps (now ≈{fitted:.3f}; plateau below "
               f"+{c.min_improvement:g}) while pass@1 is {level:.3f} < target {c.pass1_target:g}.")
        return [self._alert(step, "warning", msg, ACTION_STAGNATION, gain, c.min_improvement, signal=c.reward_key,
                            evidence={"window": self.trend.n, "span": self.trend.span, "slope": slope,
                                      "fitted": fitted, "r2": r2, "upper": upper, "level": level})]


class NonFiniteDetector(Detector):
    """Any NaN or ±inf statistic: critical, once per statistic until it is finite again."""

    name = "non_finite"
    fix = "lower the learning rate, clip gradients, keep softmax in float32"

    def __init__(self, config: NonFiniteConfig) -> None:
        super().__init__(config)
        self.reported: set[str] = set()
        self.last_fired: int | None = None

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        """Here `scalars` holds the NON-finite values of the step (the monitor splits them)."""
        c = self.config
        self.reported &= set(scalars)  # a statistic that is finite again can alert again later
        new = set(scalars) - self.reported
        cooled = self.last_fired is None or step - self.last_fired >= c.cooldown
        if not new or seen < c.warmup_steps or not cooled:
            return []
        self.reported |= new
        self.last_fired = step
        shown = ", ".join(f"{k}={scalars[k]}" for k in sorted(scalars)[:10])
        more = f" (+{len(scalars) - 10} more)" if len(scalars) > 10 else ""
        msg = f"Non-finite statistics at step {step}: {shown}{more}."
        return [self._alert(step, "critical", msg, ACTION_NON_FINITE, float(len(scalars)), 0.0,
                            signal=sorted(scalars)[0],
                            evidence={"keys": sorted(scalars)[:10], "values": [str(scalars[k]) for k in sorted(scalars)[:10]]})]
