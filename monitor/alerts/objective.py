"""Detectors for an objective that does not do what the user believes: a reward that pays for length
(length_hacking), a ratio clip that binds on one side (clip_asymmetry), a KL term pinned at zero
(kl_inert). O(1) state per step like the others; each alert names its fix and a source
(docs/algorithms.md §13)."""
from __future__ import annotations

from forksight.monitor.alerts.config import ClipAsymmetryConfig, KLInertConfig, LengthHackingConfig
from forksight.monitor.alerts.detector_base import (Alert, DebiasedEMA, Detector, Gate, MedianBaseline, RollingOLS,
                                                    Tiers)

__all__ = ["LengthHackingDetector", "ClipAsymmetryDetector", "KLInertDetector", "REFERENCES"]

REFERENCES = {
    "length_hacking": ("Singhal et al., A Long Way to Go: length correlations in RLHF (arXiv:2310.03716); "
                       "DAPO (arXiv:2503.14476), overlong reward shaping"),
    "clip_asymmetry": "Yu et al., DAPO (arXiv:2503.14476), Clip-Higher (ε_low 0.2, ε_high 0.28)",
    "kl_inert": ("Ouyang et al., InstructGPT (arXiv:2203.02155), KL to a frozen reference; TRL GRPOConfig "
                 "sync_ref_model (TR-DPO, arXiv:2404.09656)"),
}


def _first(keys: list[str], scalars: dict[str, float]) -> str | None:
    return next((k for k in keys if k in scalars), None)


class _Tracked:
    """A signal's debiased EMA and the median of its first values: now vs the run's early level."""

    def __init__(self, smoothing: float, baseline_steps: int) -> None:
        self.ema, self.base = DebiasedEMA(smoothing), MedianBaseline(baseline_steps)

    def update(self, value: float, step: int) -> None:
        self.ema.update(value)
        self.base.update(value, step)

    @property
    def ready(self) -> bool:
        return self.base.ready and self.ema.value is not None

    @property
    def gain(self) -> float:
        return (self.ema.value or 0.0) - self.base.value


class LengthHackingDetector(Detector):
    """Smoothed completion length ≥ `growth` × its early level and reward risen ≥ `min_reward_gain`,
    where the rise is explained by length: longer completions of a group earn more (samples), or a
    length-like reward component carries the rise, or correctness does not follow while reward tracks
    length across steps (scalars only). `active` is read by truncation and reward_composition, which
    stay quiet on the symptoms of this one cause."""

    name = "length_hacking"
    fix = "stop paying for length: drop or cap the length-like reward term, or score correctness only"

    def __init__(self, config: LengthHackingConfig) -> None:
        super().__init__(config)
        c = config
        self.length, self.reward = _Tracked(c.smoothing, c.baseline_steps), _Tracked(c.smoothing, c.baseline_steps)
        self.corr = DebiasedEMA(c.smoothing)
        self.parts: dict[str, _Tracked] = {}
        self.trend = RollingOLS(c.window)          # smoothed reward against smoothed length
        self.tiers = Tiers(c.cooldown, c.persist)
        self.active = False
        self.component: str | None = None

    def _track_parts(self, step: int, scalars: dict[str, float]) -> None:
        c = self.config
        for key, value in scalars.items():
            if key.startswith("rewards/") and key.endswith("/mean") and len(key) > len("rewards//mean"):
                if key in self.parts or len(self.parts) < 16:
                    self.parts.setdefault(key, _Tracked(c.smoothing, c.baseline_steps)).update(value, step)
            elif key in c.correct_keys:
                self.parts.setdefault(key, _Tracked(c.smoothing, c.baseline_steps)).update(value, step)

    def _kind(self, key: str, words: list[str]) -> bool:
        name = key[len("rewards/"):-len("/mean")].lower() if key.startswith("rewards/") else ""
        return any(w in name for w in words)

    def _explained(self, gain: float) -> tuple[str | None, dict]:
        """How the reward's rise is explained by length (None: it is not), and the numbers."""
        c = self.config
        ready = {k: t for k, t in self.parts.items() if t.ready}
        lengthy = {k: t.gain for k, t in ready.items() if self._kind(k, c.length_components)}
        correct = {k: t.gain for k, t in ready.items()
                   if k in c.correct_keys or self._kind(k, c.correct_components)}
        found: dict = {"length_components": lengthy, "correctness": correct}
        corr = self.corr.value
        if corr is not None:
            found["length_reward_corr"] = corr
        fit = self.trend.fit()
        if fit is not None:
            found["trend_slope"], found["trend_r2"] = fit[0], fit[2]
        self.component = max(lengthy, key=lengthy.get) if lengthy else None
        # the length term's own rise is the payment, whatever the total did (a total that fell
        # because correctness fell while length was paid is the same cause, and worse)
        if lengthy and lengthy[self.component] >= max(c.min_reward_gain, c.component_share * gain):
            return "component", found
        follows = bool(correct) and max(correct.values()) >= c.max_correct_share * gain
        if gain < c.min_reward_gain or follows:     # no rise to explain, or correctness rose with it
            return None, found
        if corr is not None:
            return ("samples" if corr >= c.min_corr else None), found
        if correct and fit is not None and fit[0] > 0 and fit[2] >= c.min_r2:
            return "correctness_flat", found
        return None, found

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        self._track_parts(step, scalars)
        if c.corr_key in scalars:
            self.corr.update(scalars[c.corr_key])
        length_key, reward_key = _first(c.length_keys, scalars), _first(c.reward_keys, scalars)
        if length_key is not None:
            self.length.update(scalars[length_key], step)
        if reward_key is not None:
            self.reward.update(scalars[reward_key], step)
        if self.length.ema.value is not None and self.reward.ema.value is not None and length_key and reward_key:
            self.trend.add(self.length.ema.value, self.reward.ema.value)
        if seen < c.warmup_steps or not (self.length.ready and self.reward.ready) or self.length.base.value <= 0:
            self.active = False
            return []
        grown = self.length.ema.value / self.length.base.value
        gain = self.reward.gain
        how, found = (None, {}) if grown < c.growth else self._explained(gain)
        self.active = how is not None
        h = 1.0 - c.hysteresis
        severity = self.tiers.update(step, warn=self.active, crit=self.active and grown >= c.critical_growth,
                                     warn_clear=grown < 1.0 + (c.growth - 1.0) * h,
                                     crit_clear=grown < c.critical_growth * h)
        if severity is None:
            return []
        why = {"component": f"`{self.component}` carries {found['length_components'].get(self.component, 0):+.3f} of it",
               "samples": f"within groups, longer completions earn more (correlation {found.get('length_reward_corr', 0):.2f})",
               "correctness_flat": (f"correctness did not follow ({', '.join(f'`{k}` {v:+.3f}' for k, v in found['correctness'].items())}) "
                                    f"while reward tracked length across steps (r² {found.get('trend_r2', 0):.2f})")}[how]
        msg = (f"Length hacking: smoothed completion length `{length_key or c.length_keys[0]}` = "
               f"{self.length.ema.value:.1f} tokens, {grown:.1f}× its early {self.length.base.value:.1f}, while the "
               f"reward rose {gain:+.3f} from {self.reward.base.value:.3f} and {why}: the policy is paid for length. "
               "Truncation at the cap that follows is this cause's symptom (truncation stays quiet meanwhile).")
        action = ("The reward pays for length, not for the task: drop or cap the length-like term (or make it a "
                  "penalty past a budget, DAPO's soft overlong punishment), check that the grader cannot credit an "
                  "answer anywhere in a long text, read 20 of the longest completions, and keep the checkpoint from "
                  "before the growth; raising the length cap would only feed it.")
        factor = c.critical_growth if severity == "critical" else c.growth
        return [self._alert(step, severity, msg, action, self.length.ema.value, factor * self.length.base.value,
                            signal=length_key or c.length_keys[0],
                            evidence={"explained_by": how, "length": self.length.ema.value,
                                      "length_baseline": self.length.base.value, "growth": grown,
                                      "reward_gain": gain, "reward_baseline": self.reward.base.value,
                                      "component": self.component if how == "component" else None, **found,
                                      "reference": REFERENCES[self.name]})]


class ClipAsymmetryDetector(Detector):
    """The upper (or lower) clip's smoothed share ≥ `ratio` × the other's and ≥ `min_frac`, for
    `persist` steps. clip_saturation stays quiet while this holds (one cause, one alert); an entropy
    fall at the same time is named here as the upper clip's effect (entropy_collapse still reports it)."""

    name = "clip_asymmetry"
    fix = "raise the upper clip (clip-higher: DAPO ε_high 0.28; TRL epsilon_high, verl clip_ratio_high)"

    def __init__(self, config: ClipAsymmetryConfig) -> None:
        super().__init__(config)
        self.high, self.low = DebiasedEMA(config.smoothing), DebiasedEMA(config.smoothing)
        self.entropy = _Tracked(config.smoothing, config.baseline_steps)
        self.gate = Gate(config.cooldown, config.persist)
        self.active = False

    def lopsided(self) -> str | None:
        """"upper" or "lower" when one side binds far more than the other now, else None."""
        c, hi, lo = self.config, self.high.value, self.low.value
        if hi is None or lo is None:
            return None
        if hi >= c.min_frac and hi >= c.ratio * lo:
            return "upper"
        if lo >= c.min_frac and lo >= c.ratio * hi:
            return "lower"
        return None

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if c.entropy_key in scalars:
            self.entropy.update(scalars[c.entropy_key], step)
        hi_key, lo_key = _first(c.high_keys, scalars), _first(c.low_keys, scalars)
        if hi_key is None or lo_key is None:
            self.active = False
            return []
        hi, lo = self.high.update(scalars[hi_key]), self.low.update(scalars[lo_key])
        side = self.lopsided() if seen >= c.warmup_steps else None
        self.active = side is not None
        if not self.gate.update(step, self.active, not self.active):
            return []
        bind, other = (hi, lo) if side == "upper" else (lo, hi)
        drop = (1.0 - self.entropy.ema.value / self.entropy.base.value
                if self.entropy.ready and self.entropy.base.value > 0 else None)
        if side == "upper":
            effect = (f" `{c.entropy_key}` is {100 * drop:.0f}% below its early level: the upper bound caps how far "
                      "a low-probability token can rise, so exploration drains (DAPO's clip-higher case; "
                      "entropy_collapse's warning has this cause)" if drop is not None and drop >= c.entropy_drop else
                      " The upper bound caps how far a low-probability token can rise; entropy is "
                      + (f"{100 * drop:+.0f}% from its early level" if drop is not None else "not logged"))
            fix_text = ("Raise the upper clip (clip-higher): DAPO's ε_high = 0.28 with ε_low = 0.2 — TRL "
                        "`epsilon_high=0.28`, verl `actor_rollout_ref.actor.clip_ratio_high=0.28`, the bundled trainer "
                        "`clip_high`; fewer updates per batch (TRL num_iterations, verl ppo_epochs) bind both sides less.")
        else:
            effect = (" The lower bound stops pushing down tokens with negative advantage: the penalty of wrong "
                      "answers is cut short")
            fix_text = ("Widen the lower clip (TRL `epsilon`, verl `clip_ratio_low`) or lower ε_high if it was raised far "
                        "past ε_low; fewer updates per batch (TRL num_iterations, verl ppo_epochs) or a lower learning "
                        "rate bind both sides less.")
        msg = (f"Clip asymmetry: the {side} clip binds on {100 * bind:.2f}% of tokens (`{hi_key if side == 'upper' else lo_key}`, "
               f"smoothed) against {100 * other:.2f}% at the other bound ({bind / max(other, 1e-12):.0f}×) for "
               f"{c.persist} steps.{effect}.")
        return [self._alert(step, "warning", msg, fix_text, bind, c.ratio * other if other > 0 else c.min_frac,
                            signal=hi_key if side == "upper" else lo_key,
                            evidence={"side": side, "high_frac": hi, "low_frac": lo, "ratio": bind / max(other, 1e-12),
                                      "total": hi + lo, "entropy_drop": drop, "reference": REFERENCES[self.name]})]


class KLInertDetector(Detector):
    """KL logged (the run has a KL term) and |KL| < `floor` on `window` consecutive steps that log it,
    while a move key has moved `min_move` from its early level: the reference is the policy itself.
    kl_drift is quiet on such a run (it never saw a non-zero KL), so this is its only alert."""

    name = "kl_inert"
    fix = "load the reference apart from the policy (not synced every step with mixup 1.0, PEFT adapter disabled for it)"

    def __init__(self, config: KLInertConfig) -> None:
        super().__init__(config)
        self.zero_run = 0
        self.largest = 0.0
        self.moves = {k: _Tracked(config.smoothing, config.baseline_steps) for k in config.move_keys}
        self.gate = Gate(config.cooldown, config.persist)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        for key, tracked in self.moves.items():
            if key in scalars:
                tracked.update(scalars[key], step)
        key, coef = _first(c.keys, scalars), _first(c.coef_keys, scalars)
        if key is None or (coef is not None and scalars[coef] <= 0):      # no KL term on this step
            self.zero_run, self.largest = 0, 0.0
            return []
        if abs(scalars[key]) < c.floor:
            self.largest = max(self.largest, abs(scalars[key])) if self.zero_run else abs(scalars[key])
            self.zero_run += 1
        else:
            self.zero_run, self.largest = 0, 0.0
        moved = {k: t.gain for k, t in self.moves.items() if t.ready and abs(t.gain) >= c.min_move[k]}
        active = seen >= c.warmup_steps and self.zero_run >= c.window and bool(moved)
        if not self.gate.update(step, active, self.zero_run == 0):
            return []
        shown = ", ".join(f"`{k}` {v:+.3g}" for k, v in moved.items())
        msg = (f"KL term inert: `{key}` has stayed under {c.floor:g} nats (largest |KL| {self.largest:.3g}) for "
               f"{self.zero_run} consecutive steps while the policy moved ({shown} from their early levels): the "
               f"reference the penalty measures against is the policy itself, so β{' = ' + format(scalars[coef], 'g') if coef else ''} "
               "does nothing.")
        action = ("The KL penalty is inert: the reference model is the policy. Causes: TRL `sync_ref_model=True` "
                  "with `ref_model_sync_steps=1` and `ref_model_mixup_alpha=1.0` (the reference is overwritten by "
                  "the policy every step); a PEFT adapter never disabled for the reference pass; a reference never "
                  "loaded apart (the same module passed twice). Load a frozen reference, sync it rarely or with "
                  "mixup < 1, or set β = 0 and drop the reference forward if no KL is wanted.")
        return [self._alert(step, "warning", msg, action, self.largest, c.floor, signal=key,
                            evidence={"window": self.zero_run, "largest_abs_kl": self.largest, "moved": moved,
                                      "beta": scalars[coef] if coef else None,
                                      "reference": REFERENCES[self.name]})]
