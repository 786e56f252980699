"""A sink that keeps what the bundled trainer streams as step scalars (for tests that measure a
preset's run the way the collector's detectors would)."""
from __future__ import annotations

from forksight.monitor.sinks.client import NullSink


class Scalars(NullSink):
    """Every step's scalars, as the collector would receive them."""

    def __init__(self, name: str = "run"):
        super().__init__(name)
        self.rows: dict[int, dict] = {}

    def log_scalars(self, step, values, weight=None):
        self.rows.setdefault(step, {}).update(values)
