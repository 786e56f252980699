"""What every sink shares: the alerts/stop state, record cleaning, and flush at exit."""
from __future__ import annotations

import atexit
import logging
import math
import sys
import time
import weakref
from typing import Any, Mapping, Sequence

log = logging.getLogger("forksight.client")


def _warn_once(warned: set, what: str, message: str, *args) -> None:
    if what not in warned:
        warned.add(what)
        log.warning(message, *args)


_NONFINITE_CODE = {"nan": 0.0, "inf": 1.0, "-inf": -1.0}   # see forksight.base.limits.NONFINITE_PREFIX


def finite_scalars(step: int, values: Mapping[str, Any], weight, warned: set) -> list[dict]:
    # a NaN loss must not crash training, nor cost the step's other numbers (the collector
    # refuses a whole batch with one bad value): drop what cannot be stored, say so once
    from forksight.base.limits import MAX_KEY_CHARS, NONFINITE_PREFIX

    rows, now = [], time.time()
    weight = None if weight is None else float(weight.item() if hasattr(weight, "item") else weight)
    if weight is not None and not (math.isfinite(weight) and weight >= 0):
        _warn_once(warned, "weight", "scalar weight %s at step %s is not a finite count >= 0: ignored", weight, step)
        weight = None
    for key, value in values.items():
        key = str(key)
        value = float(value.item() if hasattr(value, "item") else value)
        if not math.isfinite(value):
            _warn_once(warned, key, "scalar %r is %s at step %s: not stored (the store keeps finite numbers only)",
                       key, value, step)
            # a finite marker in its place, so the collector's non-finite alert still fires
            marker = NONFINITE_PREFIX + key
            if not key.startswith(NONFINITE_PREFIX) and len(marker) <= MAX_KEY_CHARS:
                rows.append({"step": int(step), "key": marker, "value": _NONFINITE_CODE[str(value)],
                             "weight": weight, "wall_time": now})
            continue
        if not key or len(key) > MAX_KEY_CHARS:
            _warn_once(warned, key, "scalar key %r is empty or over %d characters: not stored", key[:80], MAX_KEY_CHARS)
            continue
        rows.append({"step": int(step), "key": key, "value": value, "weight": weight, "wall_time": now})
    return rows


def sample_rows(step: int, rows: Sequence[Mapping[str, Any]], warned: set) -> list[dict]:
    """Sample dicts -> storable rows: known fields only, numbers finite, text within the limits."""
    from forksight.base.tables import SAMPLE_FIELDS, SAMPLES

    limits = {c.name: c.max_chars for c in SAMPLES.columns if c.max_chars is not None}
    out = []
    for i, row in enumerate(rows):
        extra = set(row) - set(SAMPLE_FIELDS) - {"step"}
        if extra:
            _warn_once(warned, "sample-fields", "sample fields %s are not stored (known: %s)", sorted(extra),
                       ", ".join(SAMPLE_FIELDS))
        clean: dict[str, Any] = {"step": int(step)}
        for name in SAMPLE_FIELDS:
            value = row.get(name, i if name == "sample_id" else None)
            value = value.item() if hasattr(value, "item") else value
            if isinstance(value, float) and not math.isfinite(value):
                _warn_once(warned, f"sample-{name}", "sample %s is %s at step %s: stored as null", name, value, step)
                value = None
            if name in limits and isinstance(value, str) and len(value) > limits[name]:
                _warn_once(warned, f"sample-{name}-long", "sample %s over %d characters: truncated",
                           name, limits[name])
                value = value[:limits[name]]
            clean[name] = value
        out.append(clean)
    return out


def probe_rows(step: int, rows: Sequence[Mapping[str, Any]], warned: set) -> list[dict]:
    """Probe dicts -> storable rows (keyed_rows of the probes table)."""
    return keyed_rows("probes", step, rows, warned)


def keyed_rows(table: str, step: int, rows: Sequence[Mapping[str, Any]], warned: set) -> list[dict]:
    """Rows of a JSON per-token table (probes, reference) -> storable rows: known fields only,
    non-finite numbers as null, text within its limit (dropped with a warning past it)."""
    from forksight.base.tables import KEYED_TABLES

    spec = KEYED_TABLES[table]
    fields = [c.name for c in spec.wire_columns() if c.name != "step"]
    limits = {c.name: c.max_chars for c in spec.columns if c.max_chars is not None}
    out = []
    for row in rows:
        clean: dict[str, Any] = {"step": int(step)}
        for name in fields:
            value = row.get(name)
            value = value.item() if hasattr(value, "item") else value
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            if name in limits and isinstance(value, str) and len(value) > limits[name]:
                _warn_once(warned, f"{table}-{name}-long", "%s %s over %d characters: not stored", table, name,
                           limits[name])
                value = None
            clean[name] = value
        out.append(clean)
    return out


def histogram_item(step: int, key: str, counts, edges) -> dict:
    import numpy as np

    return {"step": int(step), "key": str(key),
            "counts": np.asarray(counts, dtype=np.float64).tolist(),
            "edges": np.asarray(edges, dtype=np.float64).tolist()}


_uncaught = {"seen": False, "hooked": False}


def _note_uncaught(prev_hook):
    def hook(*exc_info):
        _uncaught["seen"] = True
        prev_hook(*exc_info)
    return hook


def track(sink: "SinkBase") -> None:
    """Finish `sink` at exit; the first sink wraps sys.excepthook so exit can say 'crashed'."""
    if not _uncaught["hooked"]:      # at first use, not at import: importing must change nothing
        _uncaught["hooked"] = True
        sys.excepthook = _note_uncaught(sys.excepthook)
    _open_sinks.add(sink)
    # (re)registered now, after the sink's store or collector imported duckdb: atexit runs last-in
    # first, and DuckDB's own exit hook (registered at `import duckdb`) stops every query that reads
    # Python data, which is how queued rows are written: registered at import, exit lost them all
    atexit.unregister(_finish_open_sinks)
    atexit.register(_finish_open_sinks)


_open_sinks: "weakref.WeakSet[SinkBase]" = weakref.WeakSet()


def untrack(sink: "SinkBase") -> None:
    """`sink` finished: nothing left to finish at exit."""
    _open_sinks.discard(sink)


def _finish_open_sinks() -> None:
    # the training script ended without finish(): flush, and say how it ended
    for sink in list(_open_sinks):
        sink.finish(status="crashed" if _uncaught["seen"] else "finished")


class SinkBase:
    """Common state: alerts received and the stop flag."""

    run_id: str = ""

    def __init__(self, stop_on_alert: bool = False):
        self.alerts: list[dict] = []
        self.stop_on_alert = stop_on_alert
        self._stop = False
        self._warned: set = set()
        self._finished = False

    @property
    def should_stop(self) -> bool:
        """True once a critical alert arrived and stop_on_alert is set."""
        return self._stop

    def await_alerts(self, timeout: float = 10.0) -> None:
        """Wait (bounded) until everything logged so far is judged, so `should_stop` is exact: with
        stop_on_alert, a critical alert raised by step s stops the run before step s+2 starts."""
        self.flush(timeout=timeout)

    def _on_alerts(self, alerts: list[dict]) -> None:
        for alert in alerts:
            self.alerts.append(alert)
            if self.stop_on_alert and alert.get("severity") == "critical":
                self._stop = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.finish(status="crashed" if exc_type else "finished")


