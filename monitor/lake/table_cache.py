"""The lake's tables as a serving reader sees them: each loaded from the catalog at most once per
`ttl` seconds (a load reads the catalog row and the table's metadata file), so a page's reads
plan against one loaded table instead of loading it again per call."""
from __future__ import annotations

import threading
import time


class CachedTables:
    """Duck-typed as the catalog (load_table) for the lake's read side; ttl 0 loads every time."""

    def __init__(self, catalog, ttl: float):
        self.catalog, self.ttl = catalog, ttl
        self._lock = threading.Lock()
        self._tables: dict[tuple, tuple[float, object]] = {}

    def load_table(self, identifier):
        key = tuple(identifier) if not isinstance(identifier, str) else (identifier,)
        now = time.monotonic()
        with self._lock:
            hit = self._tables.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        table = self.catalog.load_table(identifier)
        with self._lock:
            self._tables[key] = (now, table)
        return table

    def __getattr__(self, name: str):          # everything else is the catalog's own
        return getattr(self.catalog, name)
