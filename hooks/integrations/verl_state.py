"""What the verl integration's pieces share: the verl versions forksight knows and the driver's
run state. A module of its own so the logger backend and the installer never import each other."""
from __future__ import annotations

import importlib.metadata
import threading
from typing import Any

# verl minor version -> the trainers forksight reads per-token numbers from (which one a run uses
# is seen at run time: whichever trainer's fit() starts). Anything else: the `forksight` backend
# refuses to start unless allow_unknown_version (then scalars only).
SUPPORT = {"0.9": ("v1", "legacy")}


def verl_version() -> str | None:
    """The installed verl's version, without importing verl."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return None


def supported(version: str | None) -> bool:
    """True for a verl version forksight knows (its minor is in SUPPORT)."""
    return bool(version) and ".".join(version.split(".")[:2]) in SUPPORT


def check_version(version: str | None = None) -> str:
    """Return verl's version, or raise RuntimeError saying which versions forksight knows."""
    version = version or verl_version()
    if version is None:
        raise RuntimeError("forksight.verl: verl is not installed; `pip install 'forksight[verl]'`")
    if not supported(version):
        known = ", ".join(f"{minor}.x" for minor in SUPPORT)
        raise RuntimeError(
            f"forksight.verl: verl {version} is not a version forksight knows ({known}); its trainer "
            "internals may differ. Install a known verl, or set +trainer.forksight.allow_unknown_version=true "
            "to stream verl's logged metrics only (no per-token statistics)")
    return version


# ---------------------------------------------------------------------------- run state
class _State:
    """The driver's live objects: the trainer inside fit() and the `forksight` backend of its
    Tracking. verl's driver runs one trainer per process, so one module-level state is enough."""

    def __init__(self):
        self.trainer: Any = None
        self.trainer_kind: str | None = None   # "v1" or "legacy": the fit() that is running
        self.logger: Any = None      # hooks.verl.ForksightLogger of the current Tracking
        self.stop_requested = False
        self.lock = threading.Lock()


STATE = _State()


class StopRun(Exception):
    """Raised at the start of the step after a critical alert; fit()'s wrapper ends the run."""


def stop_checked(start_profiling):
    """verl's `_start_profiling` (called at the start of every step, legacy and v1) wrapped so a
    step does not start once the logger asked the run to stop (stop_on_alert)."""
    def _start_profiling(self, *args, **kwargs):
        logger = STATE.logger
        if STATE.stop_requested or (logger is not None and logger.should_stop()):
            STATE.stop_requested = True
            raise StopRun()
        return start_profiling(self, *args, **kwargs)
    return _start_profiling


def watched_fit(fit, kind: str):
    """A trainer's `fit` that records which trainer runs (`kind`: "legacy" or "v1", known when fit
    starts, not from a version table) and ends the forksight run as the fit ended: finished,
    stopped (a critical alert with stop_on_alert) or crashed."""
    import logging

    log = logging.getLogger("forksight.verl")

    def fit_watched(self, *args, **kwargs):
        STATE.trainer, STATE.trainer_kind, STATE.stop_requested = self, kind, False
        status = "crashed"
        try:
            result = fit(self, *args, **kwargs)
            status = "finished"
            return result
        except StopRun:
            status = "stopped"
            log.warning("forksight: stopping the verl run after step %d on a critical alert: %s",
                        self.global_steps - 1, STATE.logger.last_alert() if STATE.logger else "")
            self._shutdown_dump_executor()
            return None
        finally:
            if STATE.logger is not None:
                STATE.logger.finish(status)
            STATE.trainer = None
    return fit_watched
