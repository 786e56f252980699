"""forksight.hooks: forward hooks that compute per-token statistics in any PyTorch/TRL run.

`hooks.attach(model, ...)` for any HF causal LM; `hooks.trl.attach(trainer, ...)` for TRL's
GRPOTrainer (imported on first use, so `import hooks` never imports TRL).
"""
from __future__ import annotations

import importlib

from hooks.attach import AttachHandle, attach

__all__ = ["attach", "AttachHandle", "trl"]


def __getattr__(name: str):
    if name == "trl":  # lazy: TRL is an optional extra
        return importlib.import_module("hooks.trl")
    raise AttributeError(f"module 'hooks' has no attribute {name!r}")
