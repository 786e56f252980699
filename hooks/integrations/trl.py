"""TRL's GRPOTrainer in one line: `forksight.trl.attach(trainer, db=... or url=..., run=...)`. `ForksightCallback`
streams TRL's scalars, per-token statistics of every training forward (tool output stored, never scored), TRL's
top_entropy_quantile mask, the sampler's log p of each token and the tokens TRL's own mismatch correction changed,
samples, pass@k and eval pass@k per set; version support in `SUPPORT` and the README."""
from __future__ import annotations

import inspect
import logging
import math
import warnings
from typing import Any

import torch
from transformers import TrainerCallback

from forksight.base.fork_rule import ForkRule
from forksight.base.runspec import RunSpec
from forksight.hooks.capture.attach import AttachHandle, Integration
from forksight.hooks.metrics.passk import pass_at_k_groups
from forksight.hooks.capture.sample_log import as_text
from forksight.hooks.metrics.summary import group_scalars
from forksight.hooks.integrations import trl_trust
from forksight.hooks.integrations.trl_logs import eval_key as _eval_key, eval_prefix as _eval_prefix
from forksight.hooks.integrations.trl_mirror import check as check_mirror, mirror_into
from forksight.hooks.integrations.trl_spec import run_spec
from forksight.hooks.integrations.trl_rows import GenerationRows, length_mismatches, sampler_rows, trl_corrected

log = logging.getLogger("forksight.trl")

# TRL minor version -> how per-token numbers are obtained. Anything else: scalars only.
SUPPORT = {
    "1.14": "logits",  # lm_head hook sees [B, K+1, V] logits (full-logits path)
    "1.15": "fused",   # fused LM head: no logits; entropy/log p from TRL, hidden states for JS
    "1.16": "fused",
}
_FUSED_OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs")


def trl_mode(version: str) -> str | None:
    """'logits', 'fused' or None (unknown version: scalar-only monitoring)."""
    parts = version.split(".")
    return SUPPORT.get(".".join(parts[:2])) if len(parts) >= 2 else None


class ForksightCallback(TrainerCallback):
    """Streams a GRPOTrainer run to forksight; add it with `forksight.trl.attach(trainer, ...)`."""

    def __init__(self, *, sink=None, db: str | None = None, url: str | None = None, run: str | RunSpec | None = None,
                 project: str | None = None, stop_on_alert: bool = False, js_groups: int | str | None = None,
                 js_budget: float = 0.02, sample: int = 1, every: int = 1, chunk_size: int = 1024,
                 correct_threshold: float = 1.0, correct_reward: str | None = None,
                 mirror: str | list[str] | None = "auto", mirror_tokens_every: int = 50, fork_rule: str | None = None):
        self._sink_arg, self.db, self.url, self.run = sink, db, url, run
        self.project, self.stop_on_alert = project, stop_on_alert
        self.js_groups, self.js_budget, self.sample, self.every = js_groups, js_budget, sample, every
        self.chunk_size = chunk_size
        self.correct_threshold, self.correct_reward = correct_threshold, correct_reward
        self.trainer = None
        self.sink = None
        self.handle: AttachHandle | None = None
        self.mode: str | None = None
        self._rows = GenerationRows()
        self._samples: list[dict] | None = None
        self._group_scalars: dict[str, float] | None = None
        self._advantages: list[float] | None = None
        self._eval_groups: list[list[bool]] = []
        self._forward_before: Any = None
        self._forward_fused: Any = None
        self._patched_model = None
        self._stopped = False
        self._mismatched: list[tuple[int, int, int]] = []  # rows whose sampler log-probs miscount their tokens
        self._off_policy_seen = None  # the last forward record TRL's off-policy mask was applied to
        self._warned: set[str] = set()
        self._trust = None            # trl_trust.TrlTrust: trust/* when generation batches are reused
        # a bad tracker name or fork rule: said before any sink opens
        self.mirror_arg, _ = (mirror, mirror_tokens_every), check_mirror(mirror)
        self.fork_rule = ForkRule.parse(fork_rule)
        self._mirror = None           # trl_mirror.TrackerMirror: forksight/ keys and alerts in report_to's trackers

    # ------------------------------------------------------------------ setup
    def bind(self, trainer) -> "ForksightCallback":
        """Open the sink and install the hooks on `trainer` (called by `attach`)."""
        import trl

        self.trainer = trainer
        accel = trainer.accelerator
        self.mode = trl_mode(trl.__version__)
        self.sink = self._sink_arg if self._sink_arg is not None else self._open_sink(trainer, trl.__version__)
        if self.stop_on_alert:
            self.sink.stop_on_alert = True
        self._mirror = mirror_into(trainer, self.mirror_arg[0], self.sink, self.mirror_arg[1])
        if self.mode is None:
            message = (f"forksight: TRL {trl.__version__} is not a version forksight knows "
                       f"({', '.join(SUPPORT)}); monitoring TRL's logged scalars only (no per-token statistics)")
            warnings.warn(message, stacklevel=3)
            log.warning(message)
            return self
        try:
            self._install(trainer, accel)
        except ValueError:          # a bad argument: said to the caller, with nothing left open
            self.detach(status="failed")
            raise
        except Exception as exc:  # noqa: BLE001 - never break the user's run
            self.mode = None
            self._uninstall()
            log.warning("forksight: per-token hooks could not be installed on this TRL trainer (%r); "
                        "monitoring TRL's logged scalars only", exc)
        return self

    def _open_sink(self, trainer, version: str):
        from forksight.monitor.sinks.client import open_sink

        return open_sink(run_spec(trainer, version, self.run, self.project, self.stop_on_alert, self.fork_rule),
                         url=self.url, db=self.db)

    def _install(self, trainer, accel) -> None:
        if self.correct_reward and self.correct_reward not in trainer.reward_func_names:
            raise ValueError(f"correct_reward={self.correct_reward!r} is not a reward function of this trainer "
                             f"({trainer.reward_func_names}); pass one of those names or leave it None")
        model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        rows = Integration(row_index=self._rows.lookup, env_mask=self._rows.env_mask,
                           num_rows=lambda: self._rows.size or None,  # the generation batch, once one is seen
                           per_forward_means=True,  # TRL logs the mean of its per-micro-batch means
                           sampler_logp=self._rows.sampler_logp, corrected=self._rows.corrected)
        self.handle = AttachHandle(model, self.sink, tokenizer=tokenizer, owns_sink=False,
                                   group_size=trainer.num_generations, sample=self.sample, every=self.every,
                                   js_groups=self.js_groups, js_budget=self.js_budget,
                                   temperature=trainer.temperature, chunk_size=self.chunk_size, auto_step=False,
                                   integration=rows, fork_rule=self.fork_rule)
        if trainer.top_entropy_quantile < 1.0:
            original_mask = trainer.get_high_entropy_mask

            def keep_trls_mask(entropies, mask, threshold):
                # TRL's own mask (threshold gathered over ranks), right after the forward it belongs to
                out = original_mask(entropies, mask, threshold)
                if self.enabled and trainer.model.training:
                    self._on_selection(out)
                return out

            trainer.get_high_entropy_mask = keep_trls_mask  # an instance attribute: detach deletes it
        if getattr(trainer, "off_policy_mask_threshold", None) is not None and hasattr(trainer, "get_off_policy_mask"):
            original_off_policy = trainer.get_off_policy_mask

            def keep_trls_off_policy_mask(*args, **kwargs):
                # TRL's off-policy sequence mask (OPSM), computed right after the forward it belongs to
                keep = original_off_policy(*args, **kwargs)
                if self.enabled and trainer.model.training and self._rows.sampler:
                    try:
                        self._on_off_policy(keep)
                    except Exception as exc:  # noqa: BLE001
                        log.warning("forksight: could not read TRL's off-policy mask (%r)", exc)
                return keep

            trainer.get_off_policy_mask = keep_trls_off_policy_mask  # an instance attribute: detach deletes it
        self._trust = (trl_trust.TrlTrust(trainer, records=lambda: self.handle.buffer.records if self.handle else None)
                       if trl_trust.applies(trainer) else None)
        if self.mode == "fused":
            self._patch_fused_head(model, trainer)
        original = trainer._generate_and_score_completions

        def generate_and_watch(inputs):
            out = original(inputs)
            if not self.enabled:
                return out
            try:
                self._on_generation(out)
            except Exception as exc:  # noqa: BLE001
                log.warning("forksight: could not read this generation batch (%r); samples skipped", exc)
            return out

        trainer._generate_and_score_completions = generate_and_watch  # an instance attribute: detach deletes it
        if hasattr(trainer, "_generate"):
            original_generate = trainer._generate

            def generate_and_count(prompts):
                # the sampler's log-prob lists before TRL pads them: only here is a row of the wrong length visible
                generated = original_generate(prompts)
                try:
                    self._mismatched = length_mismatches(generated) if self.enabled else []
                except Exception as exc:  # noqa: BLE001 - an unexpected shape: no length check, never a crash
                    self._mismatched = []
                    log.warning("forksight: could not count the sampler's log-probs per row (%r)", exc)
                return generated

            trainer._generate = generate_and_count  # an instance attribute: detach deletes it

    def _patch_fused_head(self, model, trainer) -> None:
        """Ask TRL's fused head for log Σp² too (H2 for every token at almost no cost): the same
        `add_fused_lm_head` call TRL made, plus one output; log p and entropy are unchanged."""
        try:
            from trl.trainer.utils import add_fused_lm_head
        except ImportError:
            return
        forward = model.__dict__.get("forward")
        code = getattr(getattr(forward, "__func__", None), "__code__", None)
        if code is None or code.co_name != "_fused_forward":  # functools.wraps hides __name__
            log.info("forksight: TRL's fused head not found on the model; Rényi-2 only for sampled groups")
            return
        if "outputs" not in inspect.signature(add_fused_lm_head).parameters:
            return
        self._forward_before, self._patched_model = forward, model
        add_fused_lm_head(model, temperature=trainer.temperature,
                          cast_lm_head_to_fp32=getattr(trainer.args, "cast_lm_head_to_fp32", False),
                          outputs=_FUSED_OUTPUTS)
        self._forward_fused = model.__dict__["forward"]

    # ------------------------------------------------------------------ generation batches
    def _rewards(self, logs: dict, n: int) -> tuple[list[float], list[bool]]:
        names = list(self.trainer.reward_func_names)
        weights = [float(w) for w in self.trainer.reward_weights.tolist()]
        columns = {name: list(logs["rewards"][name])[-n:] for name in names}
        totals, correct = [], []
        for i in range(n):
            total = sum(w * columns[name][i] for name, w in zip(names, weights) if not math.isnan(columns[name][i]))
            totals.append(float(total))
            verdict_value = columns[self.correct_reward][i] if self.correct_reward else total
            correct.append(bool(verdict_value >= self.correct_threshold))
        return totals, correct

    def _on_generation(self, out: dict) -> None:
        trainer, accel = self.trainer, self.trainer.accelerator
        local = out["completion_ids"].shape[0]
        size = local * accel.num_processes
        logs = trainer._logs
        n = min(size, len(logs["completion"]))
        rewards, correct = self._rewards(logs, n)
        if not trainer.model.training:  # evaluation: only verdicts, for eval/pass@k
            G = trainer.num_generations_eval if getattr(trainer, "num_generations_eval", None) else trainer.num_generations
            self._eval_groups += [correct[i:i + G] for i in range(0, n, G)]
            return
        offset = accel.process_index * local
        sampler, corrected = self._sampler_of(out, offset)
        self._rows.index(out["prompt_ids"], out["completion_ids"], offset, size, out.get("tool_mask"),
                         sampler_logp=sampler, corrected=corrected)
        self._advantages = [float(a) for a in list(logs["advantages"])[-n:]]
        # _logs is gathered over ranks: each rank stores its own rows (with their lengths), rank 0
        # the reward scalars and pass@k of all of them
        prompts, completions = list(logs["prompt"])[-n:], list(logs["completion"])[-n:]
        self._samples = [{"sample_id": i, "prompt": as_text(prompts[i]), "completion": as_text(completions[i]),
                          "reward": rewards[i], "correct": correct[i]} for i in range(offset, min(offset + local, n))]
        lengths = out["completion_mask"].sum(1).tolist() if "completion_mask" in out and size == local == n else None
        self._group_scalars = (group_scalars([i // trainer.num_generations for i in range(n)], rewards, correct,
                                             lengths) if accel.is_main_process and n else None)

    def _sampler_of(self, out: dict, offset: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """This batch's sampler log p [B, C] and TRL's corrected tokens; a bad row is warned about and
        stored as null, and a failure here costs only the mismatch numbers, never the batch."""
        try:
            bad, self._mismatched = self._mismatched, []
            if bad and out.get("sampling_per_token_logps") is not None:
                i, got, want = bad[0]
                self._warn_once("sampler_length", f"forksight: sample {offset + i} has {got} sampler log-probs for "
                                f"its {want} completion tokens ({len(bad)} such row(s) in this batch): the rollout's "
                                "'logprobs' needs one value per completion_ids token; such rows are stored "
                                "without a sampler log p")
            return sampler_rows(out, [i for i, _, _ in bad]), trl_corrected(self.trainer, out)
        except Exception as exc:  # noqa: BLE001
            log.warning("forksight: could not read the sampler's log-probs of this batch (%r); stored as null", exc)
            return None, None

    def _on_off_policy(self, keep: torch.Tensor) -> None:
        """TRL's off-policy sequence mask [B, 1] (0 = dropped) marks the dropped sequences' tokens as corrected
        on the record of the forward it was computed from."""
        records = self.handle.buffer.records
        if not records or records[-1] is self._off_policy_seen or records[-1].mask.shape[0] != keep.shape[0]:
            return
        record = self._off_policy_seen = records[-1]
        dropped = (keep.detach().reshape(-1, 1) == 0).to(record.mask.device) & record.mask
        record.corrected = dropped if record.corrected is None else record.corrected.bool() | dropped

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=2)
            log.warning(message)

    def _on_selection(self, selected: torch.Tensor) -> None:
        """Attach TRL's selection [B, C] to the record of the forward it was computed from."""
        records = self.handle.buffer.records
        if not records or records[-1].selected is not None or records[-1].mask.shape[0] != selected.shape[0]:
            return
        record = records[-1]
        width = record.mask.shape[1]  # the record keeps the last `width` completion columns
        if width > selected.shape[1]:
            return
        record.selected = selected[:, selected.shape[1] - width:].to(record.mask.device).bool() & record.mask

    # ------------------------------------------------------------------ trainer events
    def on_log(self, args, state, control, logs=None, **kwargs):
        prefix = _eval_prefix(logs or {})
        # a training log closes TRL's logging window: trust/* of its micro-batches (every rank flushes)
        trust_values = self._trust.flush() if self._trust is not None and logs and prefix is None else {}
        if self.sink is None or not logs or not state.is_world_process_zero:
            return
        if self._mirror is not None:
            self._mirror.send_alerts(state.global_step)
        values = {_eval_key(k, prefix): float(v) for k, v in logs.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("forksight/")}
        values.update(trust_values)
        if values:
            self.sink.log_scalars(state.global_step, values)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if self.handle is not None and self.handle.enabled:
            if self._samples is not None:
                s, self._samples = self._samples, None
                G = self.trainer.num_generations
                self.handle.log_samples(step, [r["prompt"] for r in s], [r["completion"] for r in s],
                                        [r["reward"] for r in s], [r["correct"] for r in s],
                                        [r["sample_id"] // G for r in s], sample_ids=[r["sample_id"] for r in s],
                                        source="trl", scalars=False)
            group, self._group_scalars = self._group_scalars, None
            if group is not None:
                self.sink.log_scalars(step, group)
            flushed = self.handle.flush(step, advantages=self._advantages)
            if self._mirror is not None and state.is_world_process_zero:   # the trackers log on rank 0
                self._mirror.after_step(step, (group, flushed), self.handle.reporter.last_tokens)
            self._rows.next_step()
        if self.sink is not None and self.sink.stop_on_alert:
            # alerts are judged on the writer thread: without this wait a fast step could outrun the
            # alert its predecessor raised, and where the run stops would depend on machine load
            self.sink.await_alerts()
        if self.sink is not None and self.sink.should_stop and not self._stopped:
            self._stopped = True
            control.should_training_stop = True
            last = self.sink.alerts[-1] if self.sink.alerts else {}
            log.warning("forksight: stopping training at step %d on a critical alert: %s", step,
                        last.get("message", last))
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.sink is None or not self._eval_groups:
            return
        groups, self._eval_groups = self._eval_groups, []
        if state.is_world_process_zero:
            prefix = _eval_prefix(metrics or {})  # eval_<name> for each set of a dict eval_dataset
            name = "eval" if prefix == "eval" else f"eval/{prefix[len('eval_'):]}"
            self.sink.log_scalars(state.global_step,
                                  {f"{name}/pass@{k}": v for k, v in pass_at_k_groups(groups).items()})

    def on_train_end(self, args, state, control, **kwargs):
        if self.sink is not None and hasattr(self.sink, "flush"):
            self.sink.flush()
        if self._mirror is not None and state.is_world_process_zero:   # alerts raised since the last log
            self._mirror.send_alerts(state.global_step)

    # ------------------------------------------------------------------ control
    @property
    def enabled(self) -> bool:
        """Per-token monitoring on/off (scalars keep flowing); the benchmark toggles it."""
        return self.handle is not None and self.handle.enabled

    @enabled.setter
    def enabled(self, on: bool) -> None:
        if self.handle is None:
            return
        self.handle.enabled = on
        if self._patched_model is not None:
            self._patched_model.__dict__["forward"] = self._forward_fused if on else self._forward_before

    def _uninstall(self) -> None:
        """Remove the hooks, the fused-head patch and the generation tap."""
        if self._trust is not None:
            self._trust.detach()
            self._trust = None
        if self._mirror is not None:
            self._mirror.detach()
            self._mirror = None
        if self.trainer is not None:
            self.trainer.__dict__.pop("_generate_and_score_completions", None)
            self.trainer.__dict__.pop("get_high_entropy_mask", None)
            self.trainer.__dict__.pop("get_off_policy_mask", None)
            self.trainer.__dict__.pop("_generate", None)
        if self._patched_model is not None:
            self._patched_model.__dict__["forward"] = self._forward_before
            self._patched_model = None
        if self.handle is not None:
            self.handle.detach(finish=False)
            self.handle = None

    def detach(self, finish: bool | None = None, status: str = "finished") -> None:
        """Remove hooks and patches, leave the trainer as it was; finish the sink if we opened it."""
        self._uninstall()
        if self.trainer is not None and self in self.trainer.callback_handler.callbacks:
            self.trainer.remove_callback(self)
        if self.sink is not None and (self._sink_arg is None if finish is None else finish):
            self.sink.finish(status)


def attach(trainer, db: str | None = None, url: str | None = None, run: str | None = None, *,
           sink=None, stop_on_alert: bool = False, js_groups: int | str | None = None, **kwargs) -> ForksightCallback:
    """One line for an existing GRPOTrainer script: `forksight.trl.attach(trainer, db="runs.duckdb")`.
    Returns the callback (already added). stop_on_alert=True ends training on a critical alert."""
    callback = ForksightCallback(sink=sink, db=db, url=url, run=run, stop_on_alert=stop_on_alert,
                                 js_groups=js_groups, **kwargs).bind(trainer)
    trainer.add_callback(callback)
    return callback
