"""What one dashboard app owns: its Reader and its caches, kept on its own Flask server's config
and found by pages through the request, so two apps in one process never share data."""
from __future__ import annotations

# Pages never import `app` (Dash's pages pattern) and Dash's page registry is process-global
# (the layouts of two apps are the same functions), so state cannot be a module global or a
# closure: it is looked up on `flask.current_app` per request.

import threading
from typing import Any, Callable

import cachetools
import flask

CONFIG_KEY = "FORKSIGHT_DASH_STATE"


def nbytes(value: Any) -> int:
    """Bytes a cached value holds: DataFrames deep (their text too), containers summed."""
    import sys

    if hasattr(value, "memory_usage") and hasattr(value, "columns"):          # a DataFrame
        return int(value.memory_usage(index=True, deep=True).sum())
    if isinstance(value, dict):
        return sys.getsizeof(value) + sum(nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sys.getsizeof(value) + sum(nbytes(v) for v in value)
    return sys.getsizeof(value)


class LRU:
    """A thread-safe least-recently-used map (callbacks run on several threads): cachetools'
    LRUCache behind a lock, bounded by entries (`size`) or by the bytes its values hold
    (`max_bytes`, measured by nbytes); a value larger than max_bytes is not kept."""

    def __init__(self, size: int | None = None, *, max_bytes: int | None = None):
        if (size is None) == (max_bytes is None):
            raise ValueError("give the LRU a size (entries) or max_bytes, not both")
        self.max_bytes = max_bytes
        self._items = cachetools.LRUCache(maxsize=size) if max_bytes is None else \
            cachetools.LRUCache(maxsize=max_bytes, getsizeof=nbytes)
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            return self._items.get(key)      # a hit counts as a use

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            try:
                self._items[key] = value
            except ValueError:               # larger than the whole cache: served, not kept
                self._items.pop(key, None)

    def get_or_compute(self, key: Any, compute: Callable[[], Any]) -> Any:
        """The cached value, else compute() stored (two threads may both compute: harmless)."""
        hit = self.get(key)
        if hit is None:
            hit = compute()
            self.put(key, hit)
        return hit

    def held_bytes(self) -> int:
        """Bytes the values hold now (max_bytes caches; entries otherwise)."""
        with self._lock:
            return int(self._items.currsize)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class AppState:
    """One app's reader and caches: the run page's frames, the tokens page's step rows and
    each run's colour scale. The frame caches are bounded by bytes, not entries: one step may
    hold 400k token rows (24 such steps once kept +700 MB)."""

    def __init__(self, reader: Any, *, run_frame_bytes: int = 64 << 20, token_bytes: int = 128 << 20,
                 history_bytes: int = 32 << 20, fork_rule: Any = None):
        self.reader = reader
        # `forksight serve --fork-rule`: the tokens page outlines forks under this rule (base.fork_rule), from
        # the stored H, instead of the stored flags (None: each run's own)
        self.fork_rule = fork_rule
        self.run_frames = LRU(max_bytes=run_frame_bytes)   # (run, points, keys) -> frames already read
        self.token_rows = LRU(max_bytes=token_bytes)       # (run, step) -> (tokens, samples)
        self.token_scales = LRU(64)                        # (run, metric) -> the run's fixed TokenScale
        # (run, prompt, metric, steps) -> a finished run's position × step heatmap rows
        self.token_history = LRU(max_bytes=history_bytes)


def install(server: flask.Flask, reader: Any, fork_rule: Any = None) -> AppState:
    """Give a Dash app's Flask server its own state (called by create_dash)."""
    state = AppState(reader, fork_rule=fork_rule)
    server.config[CONFIG_KEY] = state
    return state


def current() -> AppState:
    """The state of the app serving this request; a clear error outside of one."""
    if not flask.has_app_context() or CONFIG_KEY not in flask.current_app.config:
        raise RuntimeError("no dashboard state here: build the app with "
                           "forksight.dashboard.app.create_dash(reader) and call from a request")
    return flask.current_app.config[CONFIG_KEY]


def reader() -> Any:
    """The Reader of the app serving this request."""
    return current().reader
