"""How `forksight.verl` gets into a verl run without user code: verl imports the `verl.plugins`
entry points (or VERL_USE_EXTERNAL_MODULES) on every `import verl`, in every Ray process.

Importing verl's trainer there would be slow and circular (verl/__init__ is still running), so
`install()` only adds a post-import hook: when verl imports `verl.utils.tracking` a `forksight`
logger backend is registered; when it imports the v1 trainer (`ppo/v1/trainer_base.py`, verl 0.9's
default) or the legacy one (`ray_trainer.py`), four of its functions are wrapped to hand the step's
tensors to that backend (hooks/integrations/verl_v1.py, and below); when a worker imports the FSDP
engine, its old-log-prob outputs gain top-1 and JS (hooks/integrations/verl_worker.py). Nothing happens in a
run whose `trainer.logger` does not name `forksight`.
"""
from __future__ import annotations

import importlib.abc
import logging
import sys
from typing import Any, Callable

from forksight.hooks.integrations.verl_state import (  # noqa: F401
    STATE, SUPPORT, check_version, stop_checked, supported, verl_version, watched_fit,
)

log = logging.getLogger("forksight.verl")


# ---------------------------------------------------------------------------- post-import hooks
class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs a callback right after a named module finishes executing (first import only)."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]):
        self.callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, name, path, target=None):
        callback = self.callbacks.get(name)
        if callback is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(name)
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module, _original=original, _callback=callback):
            _original(module)
            _run_callback(_callback, module)

        loader.exec_module = exec_module   # this loader object serves this one module
        return spec


def _run_callback(callback: Callable[[Any], None], module) -> None:
    if getattr(module, "_forksight_patched", False):
        return
    try:
        callback(module)
        module._forksight_patched = True
    except Exception as exc:  # noqa: BLE001 - a plugin must never break `import verl`
        log.warning("forksight: could not attach to %s (%r); this part of the run is not monitored",
                    module.__name__, exc)


_INSTALLED = False


def install() -> None:
    """Register the post-import hooks (idempotent, cheap: imports neither torch nor verl)."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    callbacks = {"verl.utils.tracking": patch_tracking, "verl.trainer.ppo.ray_trainer": patch_legacy_trainer,
                 "verl.trainer.ppo.v1.trainer_base": _patch_v1_trainer,
                 "verl.workers.engine.fsdp.transformer_impl": _patch_fsdp_engine}
    version = verl_version()
    if version is not None and not supported(version):
        log.warning("forksight: verl %s is not a version forksight knows (%s); the `forksight` logger "
                    "backend will refuse to start", version, ", ".join(SUPPORT))
        callbacks = {"verl.utils.tracking": patch_tracking}
    for name, callback in callbacks.items():
        if name in sys.modules:                      # e.g. VERL_USE_EXTERNAL_MODULES after the import
            _run_callback(callback, sys.modules[name])
    sys.meta_path.insert(0, _PostImportFinder(callbacks))


# ---------------------------------------------------------------------------- Tracking backend
def patch_tracking(module) -> None:
    """Make `forksight` a backend name verl's Tracking accepts, creates and finishes."""
    tracking = module.Tracking
    if "forksight" not in tracking.supported_backend:
        tracking.supported_backend.append("forksight")
    init, finish = tracking.__init__, tracking.finish

    def __init__(self, project_name, experiment_name, default_backend="console", config=None):
        init(self, project_name, experiment_name, default_backend, config)
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        if "forksight" in names:
            from forksight.hooks.integrations.verl import ForksightLogger

            self.logger["forksight"] = ForksightLogger(project_name, experiment_name, config, backends=self.logger)

    def finish_all(self, exit_code: int = 0):
        ours = None if getattr(self, "_finished", False) else getattr(self, "logger", {}).get("forksight")
        if ours is not None:                  # forksight's last alerts into the other trackers, still open
            ours.flush_mirror()
        finish(self, exit_code)
        if ours is not None:
            try:
                ours.finish("finished" if exit_code == 0 else "crashed")
            except Exception as exc:  # noqa: BLE001 - Tracking.__del__ calls this, even at exit
                log.warning("forksight: could not finish the run (%r)", exc)

    tracking.__init__ = __init__
    tracking.finish = finish_all


def _patch_v1_trainer(module) -> None:
    from forksight.hooks.integrations.verl_v1 import patch_v1_trainer

    patch_v1_trainer(module)


def _patch_fsdp_engine(module) -> None:
    from forksight.hooks.integrations.verl_worker import patch_fsdp_engine

    patch_fsdp_engine(module)


# ---------------------------------------------------------------------------- legacy trainer
def patch_legacy_trainer(module) -> None:
    """Wrap RayPPOTrainer (trainer.use_v1=False): the step's entropy / log p / Σp² as they leave
    `_compute_old_log_prob` (verl pops the entropy right after) with the response mask as it enters
    (before a rejection sampling zeroes tokens of it), the finished batch as it enters
    `compute_data_metrics`, the start of each step (to stop after an alert), and fit() itself."""
    trainer_cls = module.RayPPOTrainer
    old_log_prob, start_profiling, fit = (trainer_cls._compute_old_log_prob, trainer_cls._start_profiling,
                                          trainer_cls.fit)
    data_metrics = module.compute_data_metrics

    def _compute_old_log_prob(self, batch, *args, **kwargs):
        logger = STATE.logger
        if logger is None:
            return old_log_prob(self, batch, *args, **kwargs)
        seen: dict = {}
        workers = self.actor_rollout_wg
        had, call = "compute_log_prob" in vars(workers), workers.compute_log_prob

        def compute_log_prob(batch_td, *a, **k):
            # ask the workers for top-1/JS (hooks/integrations/verl_worker.py) and keep their full answer
            if logger.settings["worker_stats"]:
                from verl.utils import tensordict_utils as tu

                tu.assign_non_tensor(batch_td, forksight_stats=True,
                                     forksight_group_size=int(self.config.actor_rollout_ref.rollout.n))
            seen["batch_td"], seen["output"] = batch_td, call(batch_td, *a, **k)
            return seen["output"]

        workers.compute_log_prob = compute_log_prob
        try:
            out = old_log_prob(self, batch, *args, **kwargs)
        finally:
            if had:
                workers.compute_log_prob = call
            else:
                del workers.compute_log_prob
        logger.guard(logger.note_old_log_prob, self.global_steps, out[0] if isinstance(out, tuple) else out, seen,
                     batch.batch.get("response_mask"))
        return out

    def compute_data_metrics(batch, *args, **kwargs):
        logger, trainer = STATE.logger, STATE.trainer
        if logger is not None and trainer is not None:
            logger.guard(logger.note_batch, trainer.global_steps, batch)
        return data_metrics(batch, *args, **kwargs)

    trainer_cls._compute_old_log_prob = _compute_old_log_prob
    trainer_cls._start_profiling = stop_checked(start_profiling)
    trainer_cls.fit = watched_fit(fit, "legacy")
    module.compute_data_metrics = compute_data_metrics
