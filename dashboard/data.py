"""Where pages find the Reader: `create_dash` puts it here, pages call `reader()`.

Pages never import `app` (Dash's pages pattern); this tiny module is the only shared state.
"""
from __future__ import annotations

from typing import Any

_reader: Any = None


def set_reader(reader: Any) -> None:
    """Install the monitor Reader every page reads through (called by create_dash)."""
    global _reader
    _reader = reader


def reader() -> Any:
    """The Reader installed by create_dash; a clear error if the app was built without one."""
    if _reader is None:
        raise RuntimeError(
            "dashboard has no reader: build the app with dashboard.app.create_dash(store.reader)"
        )
    return _reader
