"""Building blocks of the detectors: the Alert record, O(1) state per statistic (debiased EMAs,
fixed windows, running sums: a step costs microseconds however long the run), gates, the base class.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Literal

import pyarrow as pa
from pydantic import Field, create_model

from forksight.base.tables import ALERTS, Column
from forksight.monitor.alerts.config import DetectorConfig

Severity = Literal["warning", "critical"]
TINY = 1e-12  # floor under log(entropy): a fully collapsed step must not give log(0)


def _alert_field(column: Column) -> tuple[Any, Any]:
    """(type, Field) of one alerts-table column on the Alert record."""
    if column.json:
        return dict[str, Any], Field(default_factory=dict, description=column.help)
    kind = (Literal[column.choices] if column.choices else
            int if pa.types.is_integer(column.arrow) else
            float if pa.types.is_floating(column.arrow) else str)
    if column.required:
        return kind, Field(description=column.help)
    return kind | None, Field(None, description=column.help)


# One alert: what fired, how bad, the numbers (value, threshold, forecast on `signal`; the rest
# as `evidence` data) and what to do. Its fields are the alerts table's columns (forksight.base.tables).
Alert = create_model(
    "Alert", __doc__="One alert: what fired, how bad, the numbers and the evidence as data, the fix.",
    **{c.name: _alert_field(c) for c in ALERTS.columns if c.name not in ("run_id", "wall_time")})


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _plain(x: Any) -> Any:
    """An evidence value as JSON data: numbers rounded to 6 significant digits, non-finite as None."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return str(x)


# ---------------------------------------------------------------------------- bounded state
class DebiasedEMA:
    """EMA shown debiased as ema / (1 - β^n), so early steps are not pulled towards 0."""

    def __init__(self, beta: float) -> None:
        self.beta, self._ema, self._beta_n = beta, 0.0, 1.0
        self.value: float | None = None

    def update(self, x: float) -> float:
        self._beta_n *= self.beta
        self._ema = self.beta * self._ema + (1.0 - self.beta) * x
        self.value = self._ema / (1.0 - self._beta_n)
        return self.value


class Baseline:
    """Mean of the first `n` values a run reports: the 'early' level later values compare to."""

    def __init__(self, n: int) -> None:
        self.n, self._sum, self._count = n, 0.0, 0

    def update(self, x: float) -> None:
        if self._count < self.n:
            self._sum += x
            self._count += 1

    @property
    def ready(self) -> bool:
        return self._count >= self.n

    @property
    def value(self) -> float:
        return self._sum / max(self._count, 1)


class MedianBaseline:
    """Median of the first `n` values a run reports (at most n kept): an early level that one
    outlying early step cannot set, and the steps those values came from."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._values: list[float] = []
        self.first_step: int | None = None
        self.last_step: int | None = None
        self._median: float | None = None   # fixed once the n values are in

    def update(self, x: float, step: int) -> None:
        if len(self._values) < self.n:
            self._values.append(x)
            self.first_step = step if self.first_step is None else self.first_step
            self.last_step = step
            self._median = None

    @property
    def ready(self) -> bool:
        return len(self._values) >= self.n

    @property
    def count(self) -> int:
        return len(self._values)

    @property
    def value(self) -> float:
        if self._median is None and self._values:
            ordered, mid = sorted(self._values), len(self._values) // 2
            self._median = ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])
        return self._median if self._median is not None else 0.0


class RollingOLS:
    """Least-squares line y = a + b·x through the last `window` points, O(1) per point; the running
    sums are rebuilt every `window` points so float error from adding and removing cannot build up."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._points: deque[tuple[float, float]] = deque(maxlen=window)
        self._origin: float | None = None  # x is stored relative to the first point: small sums
        self._since_rebuild = 0
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0

    def add(self, x: float, y: float) -> None:
        if self._origin is None:
            self._origin = x
        x -= self._origin
        if len(self._points) == self.window:
            ox, oy = self._points[0]
            self._sx -= ox; self._sy -= oy; self._sxx -= ox * ox; self._sxy -= ox * oy; self._syy -= oy * oy
        self._points.append((x, y))
        self._sx += x; self._sy += y; self._sxx += x * x; self._sxy += x * y; self._syy += y * y
        self._since_rebuild += 1
        if self._since_rebuild >= self.window:
            self._rebuild()

    def _rebuild(self) -> None:
        pts = self._points
        self._sx = sum(p[0] for p in pts); self._sy = sum(p[1] for p in pts)
        self._sxx = sum(p[0] * p[0] for p in pts); self._sxy = sum(p[0] * p[1] for p in pts)
        self._syy = sum(p[1] * p[1] for p in pts)
        self._since_rebuild = 0

    @property
    def n(self) -> int:
        return len(self._points)

    @property
    def mean_x(self) -> float:
        return self._sx / len(self._points) + (self._origin or 0.0) if self._points else 0.0

    @property
    def mean_y(self) -> float:
        return self._sy / len(self._points) if self._points else 0.0

    @property
    def var_y(self) -> float:
        """Sample variance of the window's y values."""
        n = len(self._points)
        return max(self._syy - self._sy * self._sy / n, 0.0) / (n - 1) if n > 1 else 0.0

    @property
    def span(self) -> float:
        """x distance from the oldest to the newest point in the window."""
        return self._points[-1][0] - self._points[0][0] if self._points else 0.0

    def slope_se(self) -> float:
        """Standard error of the fitted slope (inf with < 3 points or constant x)."""
        n = len(self._points)
        vxx = self._sxx - self._sx * self._sx / n if n else 0.0
        if n < 3 or vxx <= 0:
            return math.inf
        vxy = self._sxy - self._sx * self._sy / n
        residual = max(self._syy - self._sy * self._sy / n - vxy * vxy / vxx, 0.0) / (n - 2)
        return math.sqrt(residual / vxx)

    def fit(self) -> tuple[float, float, float] | None:
        """(slope, fitted y at the newest x, r²), or None with < 3 points or constant x."""
        n = len(self._points)
        if n < 3:
            return None
        vxx = self._sxx - self._sx * self._sx / n
        if vxx <= 0:
            return None
        vxy = self._sxy - self._sx * self._sy / n
        vyy = self._syy - self._sy * self._sy / n
        slope = vxy / vxx
        last_x = self._points[-1][0]
        fitted_last = self._sy / n + slope * (last_x - self._sx / n)
        r2 = (vxy * vxy) / (vxx * vyy) if vyy > 0 else 1.0
        return slope, fitted_last, r2


class Gate:
    """Fires once when a condition has held for `persist` steps, then stays quiet until the
    condition clears (past the threshold by the hysteresis margin) and `cooldown` steps pass."""

    def __init__(self, cooldown: int, persist: int = 1) -> None:
        self.cooldown, self.persist = cooldown, persist
        self.armed, self.count, self.last_fired = True, 0, None

    def update(self, step: int, active: bool, cleared: bool) -> bool:
        if cleared:
            self.armed = True
        self.count = self.count + 1 if active else 0
        cooled = self.last_fired is None or step - self.last_fired >= self.cooldown
        if active and self.armed and self.count >= self.persist and cooled:
            self.disarm(step)
            return True
        return False

    def disarm(self, step: int) -> None:
        self.armed, self.last_fired = False, step


class Tiers:
    """A warning gate and a critical gate; a critical suppresses (and disarms) the warning."""

    def __init__(self, cooldown: int, persist: int = 1) -> None:
        self.warning, self.critical = Gate(cooldown, persist), Gate(cooldown, persist)

    def update(self, step: int, *, warn: bool, crit: bool, warn_clear: bool,
               crit_clear: bool) -> Severity | None:
        if self.critical.update(step, crit, crit_clear):
            self.warning.disarm(step)
            return "critical"
        return "warning" if self.warning.update(step, warn and not crit, warn_clear) else None


# ---------------------------------------------------------------------------- detectors
class Detector:
    """Base: `observe(step, scalars, seen)` → alerts; `scalars` holds finite floats only."""

    name = "detector"

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config

    fix = "see the action"  # the first thing to try, named in every message

    def _alert(self, step: int, severity: Severity, message: str, action: str, value: float | None,
               threshold: float | None, forecast: int | None = None, *, signal: str,
               evidence: dict[str, Any] | None = None) -> Alert:
        """The alert with its evidence as data (signal, value, threshold, forecast, and `evidence`:
        window, baseline, fitted parameters, the conditions that held); the message, for people,
        ends in the same numbers and the fix."""
        numbers = f"signal `{signal}` = {_num(value)}, threshold {_num(threshold)}"
        if forecast is not None:
            numbers += f", forecast step {forecast}"
        message = f"{message} [{numbers}] Fix: {self.fix}."
        clean = {k: _plain(v) for k, v in (evidence or {}).items() if v is not None}
        return Alert(detector=self.name, severity=severity, step=step, message=message, action=action,
                     value=value, threshold=threshold, forecast=forecast, signal=signal, evidence=clean)

    def observe(self, step: int, scalars: dict[str, float], seen: int) -> list[Alert]:
        raise NotImplementedError
