"""forksight: token-level training diagnostics and a live dashboard for RLVR (GRPO, DAPO).

The public API is what this module names; everything under `forksight.monitor`,
`forksight.hooks`, `forksight.trainer` and `forksight.dashboard` is internal.

    forksight.attach(model, ...)           forward hooks on any PyTorch / HF causal LM
    forksight.trl.attach(trainer, ...)     TRL's GRPOTrainer, one line
    forksight.verl                         verl: a `verl.plugins` entry point (trainer.logger=[console,forksight])
    forksight.open_sink(run, url=, db=)    stream your own numbers (NullSink: the same, doing nothing)
    forksight.RunSpec(name=, project=, ...)  one run's name and fields, frozen and validated (`run=` of the above)
    forksight.serve(db, host=, port=)      a collector + dashboard running in this process
    forksight.token_stats(...), forksight.pass_at_k(n, c, k)   the per-token math
    forksight.mismatch_scalars(logp, sampler_logp, mask)      training–inference mismatch of sampled tokens
    forksight.show(run, db=|url=), forksight.show_tokens(run, step), forksight.load(run)   a run in a notebook

Names load on first use, so `import forksight` imports neither torch nor Dash.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it (loaded lazily)
_PUBLIC = {
    "attach": "forksight.hooks.capture.attach",
    "AttachHandle": "forksight.hooks.capture.attach",
    "open_sink": "forksight.monitor.sinks.client",
    "LocalSink": "forksight.compose.local",
    "NullSink": "forksight.monitor.sinks.client",
    "RunSpec": "forksight.base.runspec",
    "serve": "forksight.compose.app",
    "Collector": "forksight.compose.app",
    "token_stats": "forksight.hooks.metrics",
    "TokenStats": "forksight.hooks.metrics",
    "pass_at_k": "forksight.hooks.metrics",
    "pass_at_k_groups": "forksight.hooks.metrics",
    "mismatch_scalars": "forksight.hooks.metrics",
    "show": "forksight.compose.notebook",
    "show_tokens": "forksight.compose.notebook",
    "load": "forksight.compose.notebook",
}
_SUBMODULES = ("trl", "verl")

__all__ = [*_PUBLIC, *_SUBMODULES, "__version__"]


# The composition root wires the in-process collector into the sinks room, which never imports
# it: `open_sink(db=...)` and the embedded default ask `forksight.base.wiring` for these. Runs
# before any room loads (every `forksight.*` import runs this file first) and loads nothing yet.
def _local_sink():
    from forksight.compose.local import LocalSink

    return LocalSink


def _embedded_collector():
    from forksight.compose.app import start_embedded

    return start_embedded


def _token_view():
    from forksight.dashboard.report_html import token_view_html

    return token_view_html


def _wire() -> None:
    from forksight.base import wiring

    wiring.provide("local_sink", _local_sink)
    wiring.provide("embedded_collector", _embedded_collector)
    wiring.provide("token_view_html", _token_view)    # the trackers' token views (integrations never import pages)


_wire()

if TYPE_CHECKING:
    from forksight.base.runspec import RunSpec
    from forksight.hooks.capture.attach import AttachHandle, attach
    from forksight.hooks.metrics import TokenStats, pass_at_k, pass_at_k_groups, token_stats
    from forksight.compose.local import LocalSink
    from forksight.monitor.sinks.client import NullSink, open_sink
    from forksight.compose.app import Collector, serve
    from forksight.compose.notebook import load, show, show_tokens


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:   # forksight.trl / forksight.verl import TRL / verl, optional extras
        return importlib.import_module(f"forksight.{name}")
    raise AttributeError(f"module 'forksight' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
