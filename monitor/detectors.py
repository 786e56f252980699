"""The detectors behind forksight's alerts: one class per way a run goes wrong (configs: monitor/alerts.py).

A detector sees one step at a time and keeps only bounded state (debiased EMAs, fixed-size
windows, running sums), so a step costs microseconds however long the run is. Formulas:
../shared/ALGORITHMS.md §6 (collapse law, covariance), §9 (pass@k), §3 (fork tokens).
"""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # the configs live with AlertConfig in monitor/alerts.py, which imports this module
    from forksight.monitor.alerts import (CollapseConfig, CovarianceConfig, DetectorConfig, DiversityConfig,
                                ExplosionConfig, ForkConfig, NonFiniteConfig, StagnationConfig)

Severity = Literal["warning", "critical"]
_TINY = 1e-12  # floor under log(entropy): a fully collapsed step must not give log(0)


class Alert(BaseModel):
    """One alert: what fired, how bad, the numbers, and what to do about it."""

    detector: str = Field(description="detector name, e.g. 'entropy_collapse'")
    severity: Severity = Field(description="'warning' (act soon) or 'critical' (the run is being lost)")
    step: int = Field(description="training step whose statistics raised the alert")
    message: str = Field(description="what was seen, with the numbers")
    action: str = Field(description="the recommended fix")
    value: float | None = Field(None, description="the (smoothed) statistic that crossed the threshold")
    threshold: float | None = Field(None, description="the threshold it crossed")
    forecast: int | None = Field(None, description="predicted step of the crossing, for forecasts")


# ---------------------------------------------------------------------------- bounded state
class DebiasedEMA:
    """EMA shown debiased as ema / (1 - β^n), so early steps are not pulled towards 0."""

    def __init__(self, beta: float) -> None:
        self.beta, self._ema, self._beta_n = beta, 0.0, 1.0
        self.value: float | None = None

    def update(self, x: float) -> float:
        self._beta_n *= self.beta
        self._ema = self.beta * self._ema + (1.0 - self.beta) * x
        self.value = self._ema / (1.0 - self._beta_n)
        return self.value


class Baseline:
    """Mean of the first `n` values a run reports: the 'early' level later values compare to."""

    def __init__(self, n: int) -> None:
        self.n, self._sum, self._count = n, 0.0, 0

    def update(self, x: float) -> None:
        if self._count < self.n:
            self._sum += x
            self._count += 1

    @property
    def ready(self) -> bool:
        return self._count >= self.n

    @property
    def value(self) -> float:
        return self._sum / max(self._count, 1)


class RollingOLS:
    """Least-squares line y = a + b·x through the last `window` points, O(1) per point.

    Running sums are rebuilt from the window every `window` points so float error from
    adding and removing cannot accumulate over a long run.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._origin: float | None = None  # x is stored relative to the first point: small sums
        self._since_rebuild = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0

    def add(self, x: float, y: float) -> None:
        if self._origin is None:
            self._origin = x
        x -= self._origin
        if len(self._points) == self.window:
            ox, oy = self._points[0]
            self._sx -= ox; self._sy -= oy; self._sxx -= ox * ox; self._sxy -= ox * oy; self._syy -= oy * oy
        self._points.append((x, y))
        self._sx += x; self._sy += y; self._sxx += x * x; self._sxy += x * y; self._syy += y * y
        self._since_rebuild += 1
        if self._since_rebuild >= self.window:
            self._rebuild()

    def _rebuild(self) -> None:
        pts = self._points
        self._sx = sum(p[0] for p in pts); self._sy = sum(p[1] for p in pts)
        self._sxx = sum(p[0] * p[0] for p in pts); self._sxy = sum(p[0] * p[1] for p in pts)
        self._syy = sum(p[1] * p[1] for p in pts)
        self._since_rebuild = 0

    @property
    def n(self) -> int:
        return len(self._points)

    @property
    def mean_x(self) -> float:
        return self._sx / len(self._points) + (self._origin or 0.0) if self._points else 0.0

    @property
    def mean_y(self) -> float:
        return self._sy / len(self._points) if self._points else 0.0

    @property
    def var_y(self) -> float:
        """Sample variance of the window's y values."""
        n = len(self._points)
        return max(self._syy - self._sy * self._sy / n, 0.0) / (n - 1) if n > 1 else 0.0

    @property
    def span(self) -> float:
        """x distance from the oldest to the newest point in the window."""
        return self._points[-1][0] - self._points[0][0] if self._points else 0.0

    def fit(self) -> tuple[float, float, float] | None:
        """(slope, fitted y at the newest x, r²), or None with < 3 points or constant x."""
        n = len(self._points)
        if n < 3:
            return None
        vxx = self._sxx - self._sx * self._sx / n
        if vxx <= 0:
            return None
        vxy = self._sxy - self._sx * self._sy / n
        vyy = self._syy - self._sy * self._sy / n
        slope = vxy / vxx
        last_x = self._points[-1][0]
        fitted_last = self._sy / n + slope * (last_x - self._sx / n)
        r2 = (vxy * vxy) / (vxx * vyy) if vyy > 0 else 1.0
        return slope, fitted_last, r2


class Gate:
    """Fires once when a condition has held for `persist` steps, then stays quiet until the
    condition clears (past the threshold by the hysteresis margin) and `cooldown` steps pass."""

    def __init__(self, cooldown: int, persist: int = 1) -> None:
        self.cooldown, self.persist = cooldown, persist
        self.armed, self.count, self.last_fired = True, 0, None

    def update(self, step: int, active: bool, cleared: bool) -> bool:
        if cleared:
            self.armed = True
        self.count = self.count + 1 if active else 0
        cooled = self.last_fired is None or step - self.last_fired >= self.cooldown
        if active and self.armed and self.count >= self.persist and cooled:
            self.disarm(step)
            return True
        return False

    def disarm(self, step: int) -> None:
        self.armed, self.last_fired = False, step


class Tiers:
    """A warning gate and a critical gate; a critical suppresses (and disarms) the warning."""

    def __init__(self, cooldown: int, persist: int = 1) -> None:
        self.warning, self.critical = Gate(cooldown, persist), Gate(cooldown, persist)

    def update(self, step: int, *, warn: bool, crit: bool, warn_clear: bool,
               crit_clear: bool) -> Severity | None:
        if self.critical.update(step, crit, crit_clear):
            self.warning.disarm(step)
            return "critical"
        return "warning" if self.warning.update(step, warn and not crit, warn_clear) else None


# ---------------------------------------------------------------------------- actions
ACTION_COLLAPSE = ("Act before exploration is gone: raise clip-high (DAPO ε_high ≈ 0.28), add or raise an "
                   "entropy bonus or the KL penalty, lower the learning rate, or train on fork tokens "
                   "(--strategy fork) or ICT tokens (--strategy ict); Clip-Cov/KL-Cov damp the covariance "
                   "that drives the fall.")
ACTION_COVARIANCE = ("Log-prob and advantage keep moving together, which drives entropy down: apply Clip-Cov "
                     "or KL-Cov, raise clip-high, lower the learning rate, or switch to fork-token or ICT selection.")
ACTION_EXPLOSION = ("Entropy is running away (incoherent chains): lower the learning rate, reduce or remove "
                    "the entropy bonus, lower clip-high, raise the KL penalty to the reference; prefer ICT "
                    "selection over maximising entropy.")
ACTION_DIVERSITY = ("The group's samples agree too often to teach anything: raise the sampling temperature "
                    "or clip-high, add an entropy bonus, drop zero-variance groups (DAPO dynamic sampling), "
                    "or switch to fork-token or ICT selection.")
ACTION_FORK = ("Few tokens remain above H = 0.672, so fork-token training has little to choose from: raise "
               "clip-high or the temperature, add an entropy bonus, lower the learning rate; ICT selection "
               "(--strategy ict) does not need high-entropy tokens.")
ACTION_STAGNATION = ("Reward has stopped improving below target: check the reward function and that groups "
                     "still have reward variance, raise the learning rate or the group size, use prompts at "
                     "the model's frontier; if entropy is also low, see the collapse actions.")
ACTION_NON_FINITE = ("Stop and inspect: lower the learning rate, enable gradient clipping, keep logits and "
                     "softmax in float32, and check divisions by a zero reward std (groups with equal rewards).")


# ---------------------------------------------------------------------------- detectors
class Detector:
    """Base: `observe(step, scalars, seen)` → alerts; `scalars` holds finite floats only."""

    name = "detector"

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config

    def _alert(self, step: int, severity: Severity, message: str, action: str, value: float | None,
               threshold: float | None, forecast: int | None = None) -> Alert:
        return Alert(detector=self.name, severity=severity, step=step, message=message, action=action,
                     value=value, threshold=threshold, forecast=forecast)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        raise NotImplementedError


class CollapseDetector(Detector):
    """Entropy below a floor (critical), fallen far from baseline or forecast to hit the floor (warning)."""

    name = "entropy_collapse"

    def __init__(self, config: CollapseConfig) -> None:
        super().__init__(config)
        self.ema, self.baseline = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.trend_ema = DebiasedEMA(config.forecast_smoothing)
        self.trend = RollingOLS(config.forecast_window)                 # log(lightly smoothed H) vs step
        self.law = RollingOLS(max(config.forecast_window, 20))          # reward vs exp(H): R = -a·e^H + b
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        h = scalars.get(c.key)
        if h is None:
            return []
        smooth = self.ema.update(h)
        self.baseline.update(h)
        self.trend.add(step, math.log(max(self.trend_ema.update(h), _TINY)))
        if c.reward_key in scalars:
            self.law.add(math.exp(h), scalars[c.reward_key])
        if seen < c.warmup_steps or not self.baseline.ready:
            return []
        base = self.baseline.value
        floor = max(c.floor, base * (1.0 - c.drop_fraction))
        drop_level = base * (1.0 - c.warn_drop_fraction)
        predicted = self._forecast(step, smooth, base, floor) if c.forecast else None
        warn = smooth < drop_level or predicted is not None
        # the warning re-arms only once entropy is back near its baseline: a run that
        # settles lower has had its warning; a later real collapse still goes critical
        warn_clear = smooth >= base * (1.0 - c.forecast_min_drop * (1.0 - c.hysteresis))
        severity = self.tiers.update(step, warn=warn, crit=smooth < floor, warn_clear=warn_clear,
                                     crit_clear=smooth > floor * (1.0 + c.hysteresis))
        if severity is None:
            return []
        pct = 100.0 * (1.0 - smooth / base) if base > 0 else 0.0
        head = f"smoothed entropy {smooth:.4f} nats, down {pct:.0f}% from its baseline {base:.4f}"
        if severity == "critical":
            msg = f"Entropy collapsed: {head}, below the floor {floor:.4f}.{self._ceiling_note()}"
            return [self._alert(step, "critical", msg, ACTION_COLLAPSE, smooth, floor)]
        if predicted is not None:
            rate = -self.trend.fit()[0]
            msg = (f"Entropy collapse forecast: {head}, decaying {100 * rate:.2f}%/step; the fitted "
                   f"exponential decay reaches the floor {floor:.4f} at step {predicted} "
                   f"({predicted - step} steps ahead).{self._ceiling_note()}")
            return [self._alert(step, "warning", msg, ACTION_COLLAPSE, smooth, floor, predicted)]
        msg = f"Entropy falling fast: {head} (warns at {100 * c.warn_drop_fraction:.0f}% down).{self._ceiling_note()}"
        return [self._alert(step, "warning", msg, ACTION_COLLAPSE, smooth, drop_level)]

    def _forecast(self, step: int, smooth: float, base: float, floor: float) -> int | None:
        """Step at which the log-linear fit of smoothed entropy crosses the floor, if within the horizon."""
        c = self.config
        # gate on the lightly smoothed level: the heavy EMA lags a fast collapse by ~10 steps
        fast = self.trend_ema.value
        if fast > base * (1.0 - c.forecast_min_drop) or smooth < floor:
            return None
        if self.trend.n < max(5, c.forecast_window // 2):
            return None
        fit = self.trend.fit()
        if fit is None:
            return None
        slope, fitted_now, r2 = fit
        if slope >= 0 or r2 < c.forecast_min_r2:
            return None
        ahead = (math.log(max(floor, _TINY)) - fitted_now) / slope
        if ahead > c.forecast_horizon:
            return None
        # ahead <= 0: the fitted line is already under the floor while the smoothed level
        # (which lags) is not yet: the crossing is now
        return step + max(1, int(math.ceil(ahead)))

    def _ceiling_note(self) -> str:
        """Cui et al.'s R = -a·exp(H) + b fitted on recent steps: the reward left at H = 0 is b - a."""
        fit = self.law.fit() if self.law.n >= 10 else None
        if fit is None:
            return ""
        slope, _, r2 = fit
        if slope >= 0 or r2 < 0.5:
            return ""
        a = -slope
        b = self.law.mean_y + a * self.law.mean_x  # intercept of the line through the means
        return f" Fitted R = -{a:.3f}·exp(H) + {b:.3f} (r² {r2:.2f}) caps the reward near {b - a:.3f} once entropy is gone."


class CovarianceDetector(Detector):
    """Sustained positive Cov(log π, A): the mechanism of entropy loss, seen before the loss itself."""

    name = "covariance"

    def __init__(self, config: CovarianceConfig) -> None:
        super().__init__(config)
        self.values: deque[float] = deque(maxlen=config.window)
        self.positive = 0
        self.stats = RollingOLS(config.window)   # used for the window's running mean and variance
        self.entropy, self.entropy_base = DebiasedEMA(0.9), Baseline(config.baseline_steps)
        self.gate = Gate(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if c.entropy_key in scalars:
            self.entropy.update(scalars[c.entropy_key])
            self.entropy_base.update(scalars[c.entropy_key])
        cov = scalars.get(c.key)
        if cov is None:
            return []
        if len(self.values) == c.window and self.values[0] > 0:
            self.positive -= 1
        self.values.append(cov)
        self.positive += cov > 0
        self.stats.add(step, cov)
        if seen < c.warmup_steps or len(self.values) < c.window:
            return []
        n, mean, var = self.stats.n, self.stats.mean_y, self.stats.var_y
        t = mean / math.sqrt(var / n) if var > 0 else (math.inf if mean > 0 else 0.0)
        frac = self.positive / n
        drop = 0.0
        if self.entropy_base.ready and self.entropy_base.value > 0:
            drop = 1.0 - self.entropy.value / self.entropy_base.value
        active = frac >= c.min_positive_fraction and t >= c.min_t and drop >= c.min_entropy_drop
        cleared = frac < c.min_positive_fraction * (1.0 - c.hysteresis) or mean <= 0
        if not self.gate.update(step, active, cleared):
            return []
        msg = (f"Cov(log π, A) was positive on {self.positive} of the last {n} steps (mean {mean:.3g}, "
               f"{t:.1f} standard errors above 0) while entropy is {100 * drop:.0f}% below baseline: "
               f"entropy will keep falling.")
        return [self._alert(step, "warning", msg, ACTION_COVARIANCE, mean, 0.0)]


class ExplosionDetector(Detector):
    """Smoothed entropy or Rényi-2 past a ceiling; critical with falling reward or growing length."""

    name = "entropy_explosion"

    def __init__(self, config: ExplosionConfig, vocab_size: int | None = None) -> None:
        super().__init__(config)
        self.log_v = math.log(vocab_size) if vocab_size and vocab_size > 1 else None
        keys = (config.entropy_key, config.renyi2_key, config.reward_key, config.length_key)
        self.ema = {k: DebiasedEMA(config.smoothing) for k in keys}
        self.base = {k: Baseline(config.baseline_steps) for k in keys}
        self.best_reward: float | None = None
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        for key, ema in self.ema.items():
            if key in scalars:
                ema.update(scalars[key])
                self.base[key].update(scalars[key])
        reward = self.ema[c.reward_key].value
        if reward is not None and seen >= c.warmup_steps:
            self.best_reward = reward if self.best_reward is None else max(self.best_reward, reward)
        if seen < c.warmup_steps:
            return []
        worst = None  # (excess ratio, name, value, ceiling)
        for key, label in ((c.entropy_key, "entropy"), (c.renyi2_key, "Rényi-2 entropy")):
            value, base = self.ema[key].value, self.base[key]
            if value is None or not base.ready:
                continue
            ceiling = max(base.value * c.rise_ratio, base.value + c.min_rise)
            if self.log_v is not None:
                ceiling = min(ceiling, c.logv_fraction * self.log_v)
            ratio = value / ceiling if ceiling > 0 else 0.0
            if worst is None or ratio > worst[0]:
                worst = (ratio, label, value, ceiling)
        if worst is None:
            return []
        ratio, label, value, ceiling = worst
        reasons = []
        if reward is not None and self.best_reward is not None and reward < self.best_reward - c.reward_drop:
            reasons.append(f"reward fell to {reward:.3f} from {self.best_reward:.3f}")
        length, length_base = self.ema[c.length_key].value, self.base[c.length_key]
        if length is not None and length_base.ready and length > length_base.value * (1 + c.length_growth):
            reasons.append(f"length grew to {length:.1f} from {length_base.value:.1f}")
        active = ratio > 1.0
        clear = ratio < 1.0 - c.hysteresis
        severity = self.tiers.update(step, warn=active, crit=active and bool(reasons),
                                     warn_clear=clear, crit_clear=clear)
        if severity is None:
            return []
        where = f" of log|V| = {self.log_v:.2f}" if self.log_v is not None else ""
        msg = (f"Entropy explosion: smoothed {label} {value:.4f} nats is above its ceiling {ceiling:.4f}"
               f" (baseline × {c.rise_ratio:g}, at least +{c.min_rise:g} nats"
               f"{f', at most {c.logv_fraction:g}' + where if where else ''})"
               + (f"; {' and '.join(reasons)}." if reasons else "."))
        return [self._alert(step, severity, msg, ACTION_EXPLOSION, value, ceiling)]


class DiversityDetector(Detector):
    """pass@G − pass@1 shrinking towards 0 while pass@1 < target, or zero-variance groups rising."""

    name = "lost_diversity"

    def __init__(self, config: DiversityConfig) -> None:
        super().__init__(config)
        self.group_k: int | None = None
        self.gap, self.gap_base = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.pass1 = DebiasedEMA(config.smoothing)
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
        below_target = pass1 is None or pass1 < c.pass1_target
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
            parts.append(f"pass@{k} − pass@1 shrank to {gap:.3f} (baseline {self.gap_base.value:.3f}, "
                         f"threshold {gap_thr:.3f})")
        if zv_high:
            parts.append(f"{100 * zv:.0f}% of groups have zero reward variance (baseline "
                         f"{100 * self.zero_var_base.value:.0f}%, threshold {100 * zv_thr:.0f}%)")
        p1 = f"{pass1:.3f}" if pass1 is not None else "n/a"
        msg = f"Lost diversity: {' and '.join(parts)} while pass@1 is {p1} < {c.pass1_target:g}."
        value, thr = (gap, gap_thr) if gap_low else (zv, zv_thr)
        return [self._alert(step, severity, msg, ACTION_DIVERSITY, value, thr)]


class ForkDetector(Detector):
    """Fraction of fork tokens (H ≥ 0.672) falling below a floor."""

    name = "fork_starvation"

    def __init__(self, config: ForkConfig) -> None:
        super().__init__(config)
        self.ema, self.baseline = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        frac = next((scalars[k] for k in c.keys if k in scalars), None)
        if frac is None:
            return []
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
        msg = (f"Fork-token starvation: {100 * smooth:.2f}% of tokens have H ≥ 0.672 (baseline "
               f"{100 * self.baseline.value:.2f}%, floor {100 * thr:.2f}%).")
        return [self._alert(step, severity, msg, ACTION_FORK, smooth, thr)]


class StagnationDetector(Detector):
    """Reward trend over a window gains less than `min_improvement` while pass@1 is below target."""

    name = "stagnation"

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
        slope, fitted, _ = self.trend.fit() or (0.0, reward, 0.0)
        gain = slope * self.trend.span
        below = level < c.pass1_target
        active = below and gain < c.min_improvement
        cleared = not below or gain > c.min_improvement + c.hysteresis * abs(c.min_improvement)
        if not self.gate.update(step, active, cleared):
            return []
        msg = (f"Stagnation: reward gained {gain:+.4f} over the last {self.trend.n} steps (now ≈{fitted:.3f}; "
               f"plateau below +{c.min_improvement:g}) while pass@1 is {level:.3f} < target {c.pass1_target:g}.")
        return [self._alert(step, "warning", msg, ACTION_STAGNATION, gain, c.min_improvement)]


class NonFiniteDetector(Detector):
    """Any NaN or ±inf statistic: critical, once per statistic until it is finite again."""

    name = "non_finite"

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
        return [self._alert(step, "critical", msg, ACTION_NON_FINITE, float(len(scalars)), 0.0)]
