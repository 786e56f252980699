"""Entropy collapse (floor, drop, log-linear forecast) and its mechanism, Cov(log π, A) (docs/algorithms.md §7)."""
from __future__ import annotations

import math
from collections import deque

from forksight.monitor.alerts.config import CollapseConfig, CovarianceConfig
from forksight.monitor.alerts.detector_base import TINY, Baseline, DebiasedEMA, Detector, Gate, RollingOLS, Tiers

# ---------------------------------------------------------------------------- actions
ACTION_COLLAPSE = ("Act before exploration is gone: raise clip-high (DAPO ε_high ≈ 0.28), add or raise an "
                   "entropy bonus or the KL penalty, lower the learning rate, or train on fork tokens "
                   "(--strategy fork) or ICT tokens (--strategy ict); Clip-Cov/KL-Cov damp the covariance "
                   "that drives the fall.")
ACTION_COVARIANCE = ("Log-prob and advantage keep moving together, which drives entropy down: apply Clip-Cov "
                     "or KL-Cov, raise clip-high, lower the learning rate, or switch to fork-token or ICT selection.")


class CollapseDetector(Detector):
    """Entropy below a floor (critical), fallen far from baseline or forecast to hit the floor (warning)."""

    name = "entropy_collapse"
    fix = "raise clip-high or the entropy bonus, lower the learning rate, or train on fork/ICT tokens"

    def __init__(self, config: CollapseConfig) -> None:
        super().__init__(config)
        self.ema, self.baseline = DebiasedEMA(config.smoothing), Baseline(config.baseline_steps)
        self.trend_ema = DebiasedEMA(config.forecast_smoothing)
        self.trend = RollingOLS(config.forecast_window)                 # log(lightly smoothed H) vs step
        self.accel = RollingOLS(config.forecast_window)                 # log(log(baseline / H)) vs step
        self.fall = RollingOLS(config.forecast_window)                  # log(baseline / H), same points
        self.law = RollingOLS(max(config.forecast_window, 20))          # reward vs exp(H): R = -a·e^H + b
        self.tiers = Tiers(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        h = scalars.get(c.key)
        if h is None:
            return []
        smooth = self.ema.update(h)
        self.baseline.update(h)
        fast = self.trend_ema.update(h)
        self.trend.add(step, math.log(max(fast, TINY)))
        if c.reward_key in scalars:
            self.law.add(math.exp(h), scalars[c.reward_key])
        if not self.baseline.ready:
            return []
        base = self.baseline.value
        # log(log(base/H)) is linear in step for an accelerating (Gompertz-like) collapse, where a
        # log-linear fit still extrapolates the slow start; its window restarts when H is back at base
        if base > 0 and fast < base * (1.0 - c.accel_min_drop):
            fall = math.log(base / max(fast, TINY))
            self.accel.add(step, math.log(fall))
            self.fall.add(step, fall)
        elif self.accel.n:
            self.accel, self.fall = RollingOLS(c.forecast_window), RollingOLS(c.forecast_window)
        if seen < c.warmup_steps:
            return []
        floor = max(c.floor, base * (1.0 - c.drop_fraction))
        drop_level = base * (1.0 - c.warn_drop_fraction)
        predicted, how, fitted = self._forecast(step, smooth, base, floor) if c.forecast else (None, "", {})
        warn = smooth < drop_level or predicted is not None
        # the warning re-arms only once entropy is back near its baseline: a run that
        # settles lower has had its warning; a later real collapse still goes critical
        warn_clear = smooth >= base * (1.0 - c.forecast_min_drop * (1.0 - c.hysteresis))
        severity = self.tiers.update(step, warn=warn, crit=smooth < floor, warn_clear=warn_clear,
                                     crit_clear=smooth > floor * (1.0 + c.hysteresis))
        if severity is None:
            return []
        pct = 100.0 * (1.0 - smooth / base) if base > 0 else 0.0
        evidence = {"baseline": base, "floor": floor, "drop": pct / 100.0, "law": self._law()}
        head = f"smoothed entropy {smooth:.4f} nats, down {pct:.0f}% from its baseline {base:.4f}"
        if severity == "critical":
            msg = f"Entropy collapsed: {head}, below the floor {floor:.4f}.{self._ceiling_note()}"
            return [self._alert(step, "critical", msg, ACTION_COLLAPSE, smooth, floor, signal=c.key,
                                evidence=evidence)]
        if predicted is not None:
            msg = (f"Entropy collapse forecast: {head}; {how} reaches the floor {floor:.4f} at step "
                   f"{predicted} ({predicted - step} steps ahead).{self._ceiling_note()}")
            return [self._alert(step, "warning", msg, ACTION_COLLAPSE, smooth, floor, predicted, signal=c.key,
                                evidence={**evidence, **fitted})]
        msg = f"Entropy falling fast: {head} (warns at {100 * c.warn_drop_fraction:.0f}% down).{self._ceiling_note()}"
        return [self._alert(step, "warning", msg, ACTION_COLLAPSE, smooth, drop_level, signal=c.key,
                            evidence=evidence)]

    def _forecast(self, step: int, smooth: float, base: float, floor: float) -> tuple[int | None, str, dict]:
        """(step at which a fitted decay crosses the floor if within the horizon, how it was fitted):
        the earlier of the exponential (log H linear) and the accelerating (log log(base/H) linear) fit,
        and that fit's parameters as evidence."""
        c = self.config
        if smooth < floor:
            return None, "", {}
        # gate on the lightly smoothed level: the heavy EMA lags a fast collapse by ~10 steps
        fast = self.trend_ema.value
        found: list[tuple[float, str, dict]] = []
        fit = self.trend.fit() if self.trend.n >= max(5, c.forecast_window // 2) else None
        if fit is not None and fast <= base * (1.0 - c.forecast_min_drop):
            slope, fitted_now, r2 = fit
            if slope < 0 and r2 >= c.forecast_min_r2:
                ahead = (math.log(max(floor, TINY)) - fitted_now) / slope
                found.append((ahead, f"the exponential decay fitted to the last {self.trend.n} steps "
                                     f"({100 * -slope:.2f}%/step, r² {r2:.2f})",
                              {"fit": "exponential", "window": self.trend.n, "slope": slope, "r2": r2,
                               "fitted": math.exp(fitted_now)}))
        fit = self.accel.fit() if self.accel.n >= c.accel_min_points else None
        if fit is not None and fast <= base * (1.0 - c.accel_gate_drop) and floor < base:
            slope, fitted_now, r2 = fit
            # only where the fall accelerates: on a plain exponential log(base/H) is the straighter
            # line, and the concave log-log one would forecast the floor far too early
            plain = self.fall.fit()
            better = plain is None or 1.0 - r2 <= c.accel_residual_ratio * (1.0 - plain[2])
            if slope > 0 and r2 >= c.accel_min_r2 and better:
                ahead = (math.log(math.log(base / max(floor, TINY))) - fitted_now) / slope
                found.append((ahead, f"the accelerating decay log(log(baseline/H)) fitted to the last "
                                     f"{self.accel.n} steps (r² {r2:.2f})",
                              {"fit": "accelerating", "window": self.accel.n, "slope": slope, "r2": r2,
                               "fitted": base / math.exp(math.exp(fitted_now))}))
        found = [f for f in found if f[0] <= c.forecast_horizon]
        if not found:
            return None, "", {}
        ahead, how, fitted = min(found, key=lambda f: f[0])
        # ahead <= 0: the fitted line is already under the floor while the smoothed level
        # (which lags) is not yet: the crossing is now
        return step + max(1, int(math.ceil(ahead))), how, fitted

    def _law(self) -> dict | None:
        """Cui et al.'s R = -a·exp(H) + b fitted on recent steps, as {a, b, r2, window}; None unless it holds."""
        fit = self.law.fit() if self.law.n >= 10 else None
        if fit is None:
            return None
        slope, _, r2 = fit
        if slope >= 0 or r2 < 0.5:
            return None
        a = -slope
        b = self.law.mean_y + a * self.law.mean_x  # intercept of the line through the means
        return {"a": a, "b": b, "r2": r2, "window": self.law.n}

    def _ceiling_note(self) -> str:
        """The reward left at H = 0 is b - a under the fitted law."""
        law = self._law()
        if law is None:
            return ""
        a, b = law["a"], law["b"]
        return f" Fitted R = -{a:.3f}·exp(H) + {b:.3f} (r² {law['r2']:.2f}) caps the reward near {b - a:.3f} once entropy is gone."


class CovarianceDetector(Detector):
    """Sustained positive Cov(log π, A): the mechanism of entropy loss, seen before the loss itself."""

    name = "covariance"
    fix = "apply Clip-Cov or KL-Cov, or raise clip-high"

    def __init__(self, config: CovarianceConfig) -> None:
        super().__init__(config)
        self.values: deque[float] = deque(maxlen=config.window)
        self.positive = 0
        self.stats = RollingOLS(config.window)   # used for the window's running mean and variance
        self.entropy, self.entropy_base = DebiasedEMA(0.9), Baseline(config.baseline_steps)
        self.entropy_window: deque[float] = deque(maxlen=config.window + 1)
        self.gate = Gate(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if c.entropy_key in scalars:
            self.entropy_window.append(self.entropy.update(scalars[c.entropy_key]))
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
        # lower than at the start is not enough: a healthy run settles lower and stays there
        recent = 0.0
        if len(self.entropy_window) > 1 and self.entropy_window[0] > 0:
            recent = 1.0 - self.entropy_window[-1] / self.entropy_window[0]
        active = (frac >= c.min_positive_fraction and t >= c.min_t and drop >= c.min_entropy_drop
                  and recent >= c.min_recent_fall)
        cleared = frac < c.min_positive_fraction * (1.0 - c.hysteresis) or mean <= 0
        if not self.gate.update(step, active, cleared):
            return []
        msg = (f"Cov(log π, A) was positive on {self.positive} of the last {n} steps (mean {mean:.3g}, "
               f"{t:.1f} standard errors above 0) while `{c.entropy_key}` is {100 * drop:.0f}% below baseline and "
               f"fell {100 * recent:.0f}% over the last {len(self.entropy_window) - 1} steps: entropy will keep falling.")
        return [self._alert(step, "warning", msg, ACTION_COVARIANCE, mean, 0.0, signal=c.key,
                            evidence={"window": n, "positive": self.positive, "t": t, "entropy_drop": drop,
                                      "entropy_recent_fall": recent})]
