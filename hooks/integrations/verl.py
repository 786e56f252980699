"""verl's `forksight` logger backend: `trainer.logger='[console,forksight]'`.

Every metric verl logs is stored under verl's own name (the policy loss, grad norm and KL
loss also as TRL's `loss`, `grad_norm`, `kl`, which the run page plots). On
verl's v1 trainer (the default) the step's rows are read from TransferQueue before verl clears them
(hooks/integrations/verl_v1.py); on the legacy trainer the post-import patches
(hooks/integrations/verl_install.py) hand over each step's per-token tensors:
entropy and log p as `_compute_old_log_prob` returned them, Σp² when `actor.calculate_sum_pi_squared=True`
(H2 = -log Σp²), and the finished batch (responses, response_mask, token_level_scores,
advantages, `uid`, and `rollout_log_probs` when `actor_rollout_ref.rollout.calculate_log_probs=True`:
the inference engine's log p of each sampled token, stored as `sampler_logp` beside the trainer's,
with the tokens verl's own rollout correction truncated or rejected (hooks/integrations/verl_correction.py)).
StepReporter turns them into the same records a TRL run produces, so pass@k,
the tokens page and every alert work. Top-1 and JS need full distributions, which only the
workers see: hooks/integrations/verl_worker.py computes them there on the old-log-prob pass (NaN = "not
computed", stored as null, where a group was split or the logits were never built).

Settings come from `+trainer.forksight.<name>=...` (or FORKSIGHT_<NAME>): url, db, run, project,
stop_on_alert, token_groups, correct_key, correct_threshold, allow_unknown_version, worker_stats
(top-1/JS from the workers, default on), fork_rule (abs:τ or top:q, forksight.base.fork_rule), mirror and
mirror_tokens_every (forksight's keys, alerts and token views in the other trackers `trainer.logger` names:
hooks/integrations/verl_mirror.py), reference_every, reference_size and reference_budget (the reference
set, re-scored by the actor workers: hooks/integrations/verl_reference.py). With neither url nor db,
open_sink's default applies ($FORKSIGHT_URL, else an embedded collector).
"""
from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Mapping

import numpy as np

from forksight.base.fork_rule import DEFAULT_FORK_RULE, ForkRule
from forksight.hooks.integrations.verl_correction import correction_settings, corrected_tokens
from forksight.hooks.integrations.verl_mirror import mirror_into, mirror_setting
from forksight.hooks.integrations.verl_state import STATE, check_version, verl_version

log = logging.getLogger("forksight.verl")

# what the last finished backend measured: driver seconds spent in forksight's hooks, steps reported
LAST_RUN: dict[str, float] = {}

# verl's names for what the run page plots under TRL's names: stored under both
TRL_NAMES = {"actor/pg_loss": "loss", "actor/grad_norm": "grad_norm", "actor/kl_loss": "kl"}

_DEFAULTS = {"url": None, "db": None, "run": None, "project": None, "stop_on_alert": False, "token_groups": 1,
             "correct_key": "acc", "correct_threshold": 1.0, "allow_unknown_version": False, "worker_stats": True,
             "fork_rule": str(DEFAULT_FORK_RULE), "mirror": "auto", "mirror_tokens_every": 50, "reference_every": None,
             "reference_size": 32, "reference_budget": 0.02}


def _truthy(value: Any) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def settings_from(config: Mapping | None) -> dict[str, Any]:
    """`trainer.forksight` of verl's config over FORKSIGHT_* environment variables over defaults."""
    out = dict(_DEFAULTS)
    for key in out:
        if key in ("url", "db"):      # open_sink reads FORKSIGHT_URL / FORKSIGHT_DB itself (embedded fallback)
            continue
        env = os.environ.get(f"FORKSIGHT_{key.upper()}")
        if env is not None:
            out[key] = env
    section = ((config or {}).get("trainer") or {}).get("forksight") or {}
    unknown = set(section) - set(_DEFAULTS)
    if unknown:
        raise ValueError(f"forksight.verl: unknown trainer.forksight settings {sorted(unknown)}; "
                         f"known: {sorted(_DEFAULTS)}")
    out.update({k: v for k, v in section.items() if v is not None})
    out["stop_on_alert"] = _truthy(out["stop_on_alert"])
    out["allow_unknown_version"] = _truthy(out["allow_unknown_version"])
    out["worker_stats"] = _truthy(out["worker_stats"])
    out["token_groups"] = int(out["token_groups"])
    out["correct_threshold"] = float(out["correct_threshold"])
    out["fork_rule"] = str(ForkRule.parse(out["fork_rule"]))     # a bad rule: said before the run starts
    out["mirror"] = mirror_setting(out["mirror"])                  # an unknown tracker: said before it starts
    out["mirror_tokens_every"] = int(out["mirror_tokens_every"])
    if out["reference_every"] is not None:
        out["reference_every"] = int(out["reference_every"])
    out["reference_size"], out["reference_budget"] = int(out["reference_size"]), float(out["reference_budget"])
    if (out["reference_every"] or 0) < 0 or out["reference_size"] < 1 or not out["reference_budget"] > 0:
        raise ValueError("forksight.verl: reference_every must be >= 0 (0: off), reference_size >= 1 and "
                         f"reference_budget > 0; got {out['reference_every']}, {out['reference_size']}, "
                         f"{out['reference_budget']}")
    return out


def _select(config: Mapping | None, dotted: str) -> Any:
    node: Any = config or {}
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _run_config(config: Mapping | None, version: str) -> dict[str, Any]:
    """The few settings that explain a verl run on the dashboard's run page."""
    actor, rollout = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout."
    keys = {"rollout_n": rollout + "n", "temperature": rollout + "temperature",
            "adv_estimator": "algorithm.adv_estimator", "loss_agg_mode": actor + "loss_agg_mode",
            "learning_rate": actor + "optim.lr", "entropy_coeff": actor + "entropy_coeff",
            "train_batch_size": "data.train_batch_size", "max_response_length": "data.max_response_length",
            "use_kl_loss": actor + "use_kl_loss", "clip_ratio_high": actor + "clip_ratio_high"}
    out: dict[str, Any] = {"verl": version}
    out.update({name: _select(config, path) for name, path in keys.items()})
    path = _select(config, "actor_rollout_ref.model.path")
    try:                                              # the explosion detector's log|V|
        import json

        with open(os.path.join(str(path), "config.json")) as f:
            out["vocab_size"] = json.load(f).get("vocab_size")
    except (OSError, ValueError, TypeError):
        pass
    return out


class ForksightLogger:
    """One verl Tracking backend: opens the sink, stores verl's metrics, reports each step."""

    def __init__(self, project_name: str, experiment_name: str, config: Mapping | None = None,
                 backends: Mapping[str, Any] | None = None):
        from forksight.base.runspec import RunSpec
        from forksight.monitor.sinks.client import open_sink

        self.settings = settings_from(config)
        version = verl_version()
        self.per_token = True
        try:
            check_version(version)
        except RuntimeError:
            if not self.settings["allow_unknown_version"]:
                raise
            self.per_token = False
            log.warning("forksight: verl %s is unknown; streaming verl's logged metrics only", version)
        s = self.settings
        self.model_path = _select(config, "actor_rollout_ref.model.path")
        self.correction = correction_settings(config)   # verl's rollout correction, when one is on
        self.masks_before: dict | None = None          # v1: response masks before verl's rejection sampling
        spec = RunSpec.of(s["run"] or experiment_name or "verl", project=s["project"] or project_name or "default",
                          strategy=f"verl-{_select(config, 'algorithm.adv_estimator') or 'ppo'}",
                          model=str(self.model_path) if self.model_path else None,
                          config={**_run_config(config, version or "?"), "fork_rule": s["fork_rule"]},
                          stop_on_alert=s["stop_on_alert"])
        self.sink = open_sink(spec, url=s["url"], db=s["db"])
        # the other backends of verl's Tracking (name -> backend): forksight's keys and alerts go there too
        self.mirror = mirror_into(backends or {}, s["mirror"], self.sink, s["mirror_tokens_every"])
        from forksight.hooks.integrations.verl_reference import VerlReference

        self.reference = VerlReference(self.sink, s, config, decode=self._decode) if self.per_token else None
        self._reporter = None
        self._tokens: dict[str, Any] | None = None     # from _compute_old_log_prob, keyed by step
        self._batch: dict[str, Any] | None = None      # from compute_data_metrics
        self._finished = False
        self.overhead_s = 0.0                          # time spent in forksight's hooks (driver)
        self.steps_reported = 0
        if STATE.trainer is None and self.per_token:
            log.warning("forksight: neither verl's v1 trainer nor its legacy RayPPOTrainer is in fit() (a custom "
                        "loop?): storing verl's logged metrics only; per-token statistics, samples, pass@k and "
                        "stop_on_alert need one of verl's trainers")
        STATE.logger = self

    # ------------------------------------------------------------------ hand-over from the trainer
    def guard(self, fn, *args) -> None:
        """Run a hook; a failure loses that step's per-token records, never the user's run."""
        t0 = time.perf_counter()
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            log.warning("forksight: per-token records skipped (%r)", exc)
        finally:
            self.overhead_s += time.perf_counter() - t0

    def note_old_log_prob(self, step: int, old_log_prob, seen: dict | None = None, response_mask=None) -> None:
        """Keep references to the step's entropy, log p and Σp² (verl pops the entropy next),
        the workers' top-1/JS when they sent them (`seen`: the worker call's input, output), and the
        response mask before verl's rejection sampling can zero tokens of it."""
        if not self.per_token:
            return
        tensors = old_log_prob.batch
        self._tokens = {"step": step, "entropy": tensors.get("entropys"), "logp": tensors.get("old_log_probs"),
                        "sum_pi_squared": tensors.get("sum_pi_squared"), "response_mask": response_mask}
        output = (seen or {}).get("output")
        if output is not None and "forksight_top1" in output.keys():
            from forksight.hooks.integrations.verl_worker import padded

            for name in ("top1", "js"):
                self._tokens[name] = padded(output[f"forksight_{name}"], seen["batch_td"])

    def note_batch(self, step: int, batch) -> None:
        """Keep the finished batch of this step (reported when verl logs the step's metrics)."""
        if not self.per_token:
            return
        self._batch = {"step": step, "tensors": batch.batch, "non_tensor": batch.non_tensor_batch}

    def note_batch_dict(self, step: int, batch: dict, tokens: dict) -> None:
        """The v1 trainer's step as read from TransferQueue (hooks/integrations/verl_v1.py): the batch
        and the per-token tensors in one hand-over."""
        if not self.per_token:
            return
        self._batch = {"step": step, **batch}
        self._tokens = {"step": step, **tokens}

    # ------------------------------------------------------------------ Tracking interface
    def log(self, data: Mapping[str, Any], step: int) -> None:
        t0 = time.perf_counter()
        values = {}
        for key, value in data.items():
            if hasattr(value, "item") and getattr(value, "size", 1) == 1:
                value = value.item()
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                values[str(key)] = float(value)
        for verl_name, trl_name in TRL_NAMES.items():
            if verl_name in values and trl_name not in values:
                values[trl_name] = values[verl_name]
        if values:
            self.sink.log_scalars(step, values)
        reported = None
        if self._batch is not None and self._batch["step"] == step:
            batch, self._batch = self._batch, None
            tokens = self._tokens if self._tokens is not None and self._tokens["step"] == step else None
            self._tokens = None
            try:
                reported = self.report(step, batch, tokens)
                self.steps_reported += 1
            except Exception as exc:  # noqa: BLE001
                log.warning("forksight: step %d's per-token records skipped (%r)", step, exc)
            if self.reference is not None:
                self.guard(self.reference.first_step, step, batch, tokens, self._mask_of(batch, tokens))
        if self.reference is not None:                       # the step's update is done: a due re-scoring
            self.guard(self.reference.after_step, STATE.trainer, step)
        if self.settings["stop_on_alert"]:
            # alerts come back from the writer asynchronously: wait for this step's, so a critical
            # alert at step s always stops the run before step s+1 generates (ms per step)
            self.sink.await_alerts()
        if self.mirror is not None:
            last = self._reporter.last_tokens if self._reporter is not None else None
            self.guard(self.mirror.step, step, reported, last)
        self.overhead_s += time.perf_counter() - t0

    def flush_mirror(self) -> None:
        """The alerts not yet in the other trackers, sent before verl's Tracking closes them."""
        if self.mirror is not None:
            if not self._finished:
                self.sink.await_alerts()
            self.guard(self.mirror.send_alerts, self.mirror.last_step)

    def should_stop(self) -> bool:
        return self.sink.should_stop

    def last_alert(self) -> str:
        last = self.sink.alerts[-1] if self.sink.alerts else {}
        return str(last.get("message", last))

    def finish(self, status: str = "finished") -> None:
        if self._finished:
            return
        self._finished = True
        LAST_RUN.update(overhead_s=self.overhead_s, steps_reported=self.steps_reported)
        if STATE.logger is self:
            STATE.logger = None
        self.sink.finish(status=status)

    # ------------------------------------------------------------------ one step's records
    @staticmethod
    def _mask_of(batch: dict, tokens: dict | None):
        """The rows' response mask as report() uses it (before verl's rejection sampling when known)."""
        kept = batch["tensors"]["response_mask"].bool()
        before = tokens.get("response_mask") if tokens else None
        return before.bool() if before is not None and tuple(before.shape) == tuple(kept.shape) else kept

    def _decode(self, token_id: int) -> str | None:
        tokenizer = self._reporter.tokenizer if self._reporter is not None else None
        return tokenizer.decode([token_id]) if tokenizer is not None else None

    def _tokenizer(self):
        tokenizer = getattr(STATE.trainer, "tokenizer", None)
        if tokenizer is None and self.model_path and os.path.isdir(str(self.model_path)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        return tokenizer

    def _verdicts(self, non_tensor: Mapping, rewards: np.ndarray) -> list[bool]:
        key = self.settings["correct_key"]
        if key and key in non_tensor:
            return [bool(v) and not (isinstance(v, float) and math.isnan(v)) for v in np.asarray(non_tensor[key])]
        return [bool(r >= self.settings["correct_threshold"]) for r in rewards]

    def report(self, step: int, batch: dict, tokens: dict | None) -> dict[str, float]:
        """Samples, groups and (when the entropy was caught) per-token statistics of one step."""
        import torch

        from forksight.hooks.metrics import TokenStats
        from forksight.hooks.capture.report import StepReporter

        if self._reporter is None:
            self._reporter = StepReporter(self.sink, tokenizer=self._tokenizer(),
                                          token_groups=self.settings["token_groups"],
                                          fork_rule=self.settings["fork_rule"])
        tensors, non_tensor = batch["tensors"], batch["non_tensor"]
        responses = tensors["responses"]
        kept = tensors["response_mask"].bool()
        # verl's rejection sampling (rollout_rs) zeroes rejected tokens of the batch's response_mask;
        # the mask from before keeps them in the samples and token rows, as verl's actor/entropy does
        mask = self._mask_of(batch, tokens)
        uids = list(non_tensor["uid"])
        first_seen = {uid: k for k, uid in enumerate(dict.fromkeys(uids))}
        group_ids = [first_seen[u] for u in uids]
        rewards = tensors["token_level_scores"].sum(-1).float().cpu().numpy()
        samples = self._samples(tensors, mask, rewards, self._verdicts(non_tensor, rewards))
        advantages = tensors.get("advantages")
        entropy = tokens.get("entropy") if tokens else None
        if entropy is None or tuple(entropy.shape) != tuple(mask.shape):
            from forksight.hooks.metrics import group_scalars

            scalars = group_scalars(group_ids, [s["reward"] for s in samples], [s["correct"] for s in samples],
                                    mask.sum(-1).tolist())
            self.sink.log_scalars(step, scalars)
            self.sink.log_samples(step, StepReporter._sample_rows(samples, group_ids, mask, list(range(len(uids)))))
            return scalars
        not_computed = torch.full(mask.shape, float("nan"))
        sum_sq = tokens.get("sum_pi_squared")
        renyi2 = (-torch.log(sum_sq.float().clamp_min(1e-30)) if sum_sq is not None else not_computed)
        logp = tensors.get("old_log_probs", tokens.get("logp"))
        zero = torch.zeros(())
        top1, js = tokens.get("top1"), tokens.get("js")
        stats = TokenStats(entropy=torch.where(mask, entropy.float(), zero),
                           renyi2=torch.where(mask, renyi2, zero) if sum_sq is not None else not_computed,
                           top1=torch.where(mask, top1, zero) if top1 is not None else not_computed,
                           logp=torch.where(mask, logp.float(), zero) if logp is not None else None,
                           js=torch.where(mask, js, zero) if js is not None else None, mask=mask)
        sampler_logp, corrected = self._sampler(tensors, logp, mask, kept)
        return self._reporter.report(step, stats, responses, group_ids=group_ids, advantages=advantages,
                                     samples=samples, sampler_logp=sampler_logp, corrected=corrected)

    def _sampler(self, tensors, logp, mask, kept) -> tuple[Any, Any]:
        """The engine's log p (`rollout_log_probs`, NaN off the mask) and the tokens verl's rollout
        correction changed (None when it has none); a wrong shape is StepReporter's to refuse."""
        import torch

        rollout = tensors.get("rollout_log_probs")
        if rollout is None:
            return None, None
        if tuple(rollout.shape) != tuple(mask.shape):
            return rollout, None
        sampler_logp = torch.where(mask, rollout.float(), torch.full(mask.shape, float("nan")))
        if self.correction is None or logp is None:
            return sampler_logp, None
        return sampler_logp, corrected_tokens(self.correction, logp, sampler_logp, mask, kept)

    def _samples(self, tensors, mask, rewards: np.ndarray, correct: list[bool]) -> list[dict]:
        tokenizer = self._reporter.tokenizer
        prompts = tensors["prompts"]
        width = prompts.shape[1]
        prompt_mask = tensors["attention_mask"][:, :width].bool()
        prompt_ids = [row[m].tolist() for row, m in zip(prompts, prompt_mask)]
        response_ids = [row[m].tolist() for row, m in zip(tensors["responses"], mask)]
        if tokenizer is not None:
            prompt_text = tokenizer.batch_decode(prompt_ids, skip_special_tokens=True)
            completion_text = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        else:
            prompt_text = [" ".join(map(str, ids)) for ids in prompt_ids]
            completion_text = [" ".join(map(str, ids)) for ids in response_ids]
        return [{"prompt": p, "completion": c, "reward": float(r), "correct": k, "source": "verl"}
                for p, c, r, k in zip(prompt_text, completion_text, rewards, correct)]
