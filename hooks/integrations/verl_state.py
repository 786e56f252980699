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
