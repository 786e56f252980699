"""Training–inference mismatch (docs/algorithms.md §11): the sampler's and the trainer's log p of the sampled
tokens drifting apart from the run's own early level (warning), or sequence-level importance weights
degenerating (critical). Reads whatever `mismatch/*` step scalars a run has (the hooks', or TRL's and verl's
mapped by the importers); a run without sampler log-probs has none and raises nothing."""
from __future__ import annotations

import math
from typing import Any

from forksight.monitor.alerts.config import MismatchConfig
from forksight.monitor.alerts.detector_base import Alert, DebiasedEMA, Detector, MedianBaseline, Tiers

__all__ = ["MismatchDetector", "REFERENCE", "ACTION_RISE", "ACTION_DEGENERATE"]

TOKENS_KEY, CORRECTED_KEY = "mismatch/tokens", "mismatch/frac_corrected"

REFERENCE = ("Yao et al. 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy RL Training' (TIS); "
             "Liu, Li et al. 2025, 'When Speed Kills Stability' (MIS, sequence vs token level); Qi et al. 2025, "
             "'Defeating the Training-Inference Mismatch via FP16' (arXiv:2510.26788); Thinking Machines 2025, "
             "'Defeating Nondeterminism in LLM Inference'")
ACTION_RISE = ("The engine that samples and the trainer now disagree well beyond where they started, so the update "
               "is silently off-policy. Correct it per token: truncated importance sampling (TIS, weight min(r, C)) "
               "or masked IS (MIS, tokens outside [1/C, C] dropped) (Yao et al. 2025): verl "
               "`algorithm.rollout_correction.rollout_is=token` with `rollout_is_threshold`, TRL "
               "`vllm_importance_sampling_correction=True` with `vllm_importance_sampling_mode=token_truncate` or "
               "`token_mask`. Remove it at the source: sample and train in FP16 instead of BF16, or keep the LM head "
               "and logits in FP32 (Qi et al. 2025, 'Defeating the Training-Inference Mismatch via FP16'); use "
               "batch-invariant kernels in the engine (Thinking Machines 2025, 'Defeating Nondeterminism in LLM "
               "Inference'). Check that the engine received the latest weights: a stale sync looks the same.")
ACTION_DEGENERATE = ("Sequence-level importance weights cannot carry this mismatch: a sequence-level correction "
                     "(TRL's default `vllm_importance_sampling_mode=sequence_mask`, verl's default "
                     "`rollout_is=sequence`) now masks, clips or over-weights most of the batch. Switch to token-level "
                     "TIS/MIS (Yao et al. 2025; verl `rollout_is=token`, TRL `token_truncate` / `token_mask`) or a "
                     "length-normalised sequence ratio (verl `rollout_rs=seq_mean_k1`), shorten completions, and "
                     "remove the mismatch at its source: FP16 or an FP32 LM head (Qi et al. 2025), batch-invariant "
                     "kernels (Thinking Machines 2025).")


def _first(keys: list[str], scalars: dict[str, float]) -> str | None:
    return next((k for k in keys if k in scalars), None)


class MismatchDetector(Detector):
    """A mismatch level or out-of-band fraction well above the run's own early median, smoothed and held
    (warning); the sequence weights' ESS under a bound, or T × KL past log C (critical)."""

    name = "train_inference_mismatch"
    fix = ("correct per token with truncated or masked importance sampling (TIS/MIS), or remove the mismatch at "
           "its source: FP16 or an FP32 LM head, batch-invariant kernels")

    def __init__(self, config: MismatchConfig) -> None:
        super().__init__(config)
        c = config
        self.rise_keys = list(dict.fromkeys([*c.level_keys, *c.band_keys]))
        mismatch = list(dict.fromkeys([*self.rise_keys, *c.kl_keys, c.ess_key]))
        self.mismatch_keys = mismatch          # a step carrying none of these has no sampler log-probs
        self.ema = {k: DebiasedEMA(c.smoothing) for k in dict.fromkeys([*mismatch, c.length_key])}
        self.base = {k: MedianBaseline(c.baseline_steps) for k in self.rise_keys}
        self.tiers = Tiers(c.cooldown, c.persist)

    # ------------------------------------------------------------------------ conditions
    def _rises(self, scalars: dict[str, float]) -> list[dict[str, Any]]:
        """Each rise signal present this step with a ready baseline: its smoothed value against
        max(baseline × rise_factor, baseline + min_rise)."""
        c = self.config
        level = _first(c.level_keys, scalars)
        out = []
        for key in dict.fromkeys([level, *(k for k in c.band_keys if k in scalars)]):
            if key is None or not self.base[key].ready:
                continue
            base, value = self.base[key].value, self.ema[key].value
            threshold = max(base * c.rise_factor, base + c.min_rise[key])
            out.append({"key": key, "baseline": base, "smoothed": value, "threshold": threshold,
                        "above": value > threshold})
        return out

    def _ess(self, scalars: dict[str, float]) -> dict[str, Any] | None:
        c = self.config
        if c.ess_key not in scalars:
            return None
        value = self.ema[c.ess_key].value
        return {"key": c.ess_key, "smoothed": value, "threshold": c.min_seq_ess, "low": value < c.min_seq_ess,
                "clear": value > c.min_seq_ess * (1.0 + c.hysteresis)}

    def _t_kl(self, scalars: dict[str, float]) -> dict[str, Any] | None:
        """T × KL against log C: the KL at which the typical sequence weight exp(−T·KL) leaves [1/C, C]."""
        c = self.config
        key = _first(c.kl_keys, scalars)
        length = self.ema[c.length_key].value
        if key is None or length is None or length <= 0:
            return None
        kl, log_cap = self.ema[key].value, math.log(c.seq_cap)
        limit = log_cap / length
        return {"key": key, "kl": kl, "length": length, "t_kl": length * kl, "log_cap": log_cap,
                "threshold": limit, "over": kl > limit, "clear": kl < limit * (1.0 - c.hysteresis)}

    def _split(self, key: str | None, scalars: dict[str, float]) -> dict[str, Any]:
        """The fork vs non-fork split of a token-level key at this step, and where the mismatch sits."""
        if key is None or f"{key}/fork" not in scalars or f"{key}/nonfork" not in scalars:
            return {}
        fork, nonfork = scalars[f"{key}/fork"], scalars[f"{key}/nonfork"]
        out: dict[str, Any] = {"split_key": key, "fork": fork, "nonfork": nonfork}
        if fork >= 0 and nonfork >= 0:
            ratio = self.config.fork_ratio
            out["sits_on"] = ("fork" if fork > ratio * nonfork else "nonfork" if nonfork > ratio * fork
                              else "both")
            n_fork, n_non = scalars.get(f"{TOKENS_KEY}/fork"), scalars.get(f"{TOKENS_KEY}/nonfork")
            if n_fork is not None and n_non is not None and n_fork + n_non > 0:
                out["fork_token_share"] = n_fork / (n_fork + n_non)
                mass = fork * n_fork + nonfork * n_non
                if mass > 0:   # share of the summed per-token mismatch carried by fork tokens
                    out["fork_mass_share"] = fork * n_fork / mass
        return out

    # ------------------------------------------------------------------------ observe
    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        c = self.config
        if not any(k in scalars for k in self.mismatch_keys):
            return []   # no sampler log-probs this step: nothing to judge, and no count towards persist
        for key, ema in self.ema.items():
            if key in scalars:
                ema.update(scalars[key])
                if key in self.base:
                    self.base[key].update(scalars[key], step)
        if seen < c.warmup_steps:
            return []
        rises, ess, tkl = self._rises(scalars), self._ess(scalars), self._t_kl(scalars)
        h = c.hysteresis
        degenerate = bool((ess and ess["low"]) or (tkl and tkl["over"]))
        severity = self.tiers.update(
            step, warn=any(r["above"] for r in rises), crit=degenerate,
            # a step with no rise signal says nothing about a rise clearing (all([]) would re-arm it)
            warn_clear=bool(rises) and all(r["smoothed"] < r["threshold"] * (1.0 - h) for r in rises),
            crit_clear=(ess is None or ess["clear"]) and (tkl is None or tkl["clear"]))
        if severity is None:
            return []
        common = {"signals": {r["key"]: {k: r[k] for k in ("baseline", "smoothed", "threshold")} for r in rises},
                  "smoothing": c.smoothing, "persist": c.persist, "frac_corrected": scalars.get(CORRECTED_KEY),
                  "reference": REFERENCE}
        if severity == "critical":
            return [self._critical(step, scalars, ess, tkl, common)]
        return [self._warning(step, scalars, [r for r in rises if r["above"]], common)]

    # ------------------------------------------------------------------------ messages
    def _where(self, split: dict[str, Any]) -> str:
        if not split:
            return ""
        text = (f" Per token `{split['split_key']}` is {split['fork']:.4g} on fork tokens and "
                f"{split['nonfork']:.4g} on non-fork tokens")
        if "fork_mass_share" in split:
            text += (f" ({100 * split['fork_mass_share']:.0f}% of it on the {100 * split['fork_token_share']:.0f}% "
                     "of tokens that are forks)")
        where = split.get("sits_on")
        return text + (": the mismatch sits on fork tokens." if where == "fork" else
                       ": the mismatch sits on non-fork tokens." if where == "nonfork" else ".")

    def _warning(self, step: int, scalars: dict[str, float], above: list[dict], common: dict) -> Alert:
        c = self.config
        top = max(above, key=lambda r: r["smoothed"] / r["threshold"] if r["threshold"] > 0 else math.inf)
        key, base, value = top["key"], top["baseline"], top["smoothed"]
        baseline = self.base[key]
        factor = value / base if base > 0 else None
        rise = f"{factor:.1f}× the run's early baseline" if factor is not None else "up from the run's early baseline"
        msg = (f"Training–inference mismatch rising: smoothed `{key}` = {value:.4g}, {rise} {base:.4g} (median of "
               f"its first {baseline.count} values, steps {baseline.first_step}–{baseline.last_step}; threshold "
               f"max(baseline × {c.rise_factor:g}, baseline + {c.min_rise[key]:g}) = {top['threshold']:.4g}), "
               f"held {c.persist} steps")
        for other in above:
            if other is not top:
                msg += f"; `{other['key']}` rose too, to {other['smoothed']:.4g} from {other['baseline']:.4g}"
        split = self._split(key, scalars)
        msg += "." + self._where(split)
        evidence = {"baseline": base, "smoothed": value, "factor": factor, "rise_factor": c.rise_factor,
                    "min_rise": c.min_rise[key], "window": baseline.count, "baseline_from": baseline.first_step,
                    "baseline_to": baseline.last_step, **split, **common}
        return self._alert(step, "warning", msg, ACTION_RISE, value, top["threshold"], signal=key, evidence=evidence)

    def _critical(self, step: int, scalars: dict[str, float], ess: dict | None, tkl: dict | None,
                  common: dict) -> Alert:
        c = self.config
        parts, causes = [], []
        if ess and ess["low"]:
            causes.append("seq_ess")
            parts.append(f"smoothed `{ess['key']}` = {ess['smoothed']:.3g} < {c.min_seq_ess:g}: the step's "
                         "sequence-level importance weights rest on about "
                         f"{100 * ess['smoothed']:.0f}% of its sequences")
        if tkl and tkl["over"]:
            causes.append("t_kl")
            parts.append(f"T × KL = {tkl['length']:.1f} tokens × {tkl['kl']:.4g} nats (`{tkl['key']}`) = "
                         f"{tkl['t_kl']:.3g} > log C = {tkl['log_cap']:.3g} (C = {c.seq_cap:g}): the typical "
                         f"sequence weight exp(−T·KL) = {math.exp(-tkl['t_kl']):.3g} is below 1/C = "
                         f"{1 / c.seq_cap:.3g}, so a sequence-level clamp or mask at C discards most of the correction")
        signal, value, threshold = ((ess["key"], ess["smoothed"], ess["threshold"]) if causes[0] == "seq_ess" else
                                    (tkl["key"], tkl["kl"], tkl["threshold"]))
        split_key = tkl["key"] if tkl else _first([*c.kl_keys, *c.level_keys], scalars)
        split = self._split(split_key, scalars)
        msg = "Sequence-level weights degenerate: " + "; and ".join(parts) + "." + self._where(split)
        evidence = {"causes": causes, "seq_ess": ess["smoothed"] if ess else None, "min_seq_ess": c.min_seq_ess,
                    "kl_key": tkl["key"] if tkl else None, "kl": tkl["kl"] if tkl else None,
                    "length": tkl["length"] if tkl else None, "t_kl": tkl["t_kl"] if tkl else None,
                    "cap": c.seq_cap, "log_cap": math.log(c.seq_cap),
                    "typical_seq_weight": math.exp(-tkl["t_kl"]) if tkl else None, **split, **common}
        return self._alert(step, "critical", msg, ACTION_DEGENERATE, value, threshold, signal=signal,
                           evidence=evidence)
