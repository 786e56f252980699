"""What the composition root hands the rooms below it that they may not import themselves: the
in-process collector behind `open_sink(db=...)` and the embedded default. `forksight/__init__.py`
provides it at package import (before any room loads, loading nothing yet); the sinks room asks
for it only when a run needs it. Tests or embedders may provide their own."""
from __future__ import annotations

from typing import Any, Callable

_loaders: dict[str, Callable[[], Any]] = {}


def provide(name: str, loader: Callable[[], Any]) -> None:
    """Register `loader`, called (once per use) to get the implementation named `name`."""
    _loaders[name] = loader


def provided(name: str) -> Any:
    """The implementation the composition root provided under `name`."""
    try:
        return _loaders[name]()
    except KeyError:
        raise RuntimeError(f"forksight: nothing provides {name!r}; import forksight (its package init "
                           f"wires the in-process collector) or pass url=... to a running collector") from None
