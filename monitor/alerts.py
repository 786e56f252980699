"""Alerts that warn before a run is lost: per-run monitors and the hub the collector holds.

`AlertMonitor` runs every detector (monitor/detectors.py) on one run's steps; `AlertHub` keeps
one monitor per run and sends what fires to the sinks: rows for the `alerts` table (returned),
the `forksight.alerts` logger, and an optional webhook that never blocks ingest.
"""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from monitor.detectors import (
    Alert,
    CollapseConfig,
    CollapseDetector,
    CovarianceConfig,
    CovarianceDetector,
    Detector,
    DiversityConfig,
    DiversityDetector,
    ExplosionConfig,
    ExplosionDetector,
    ForkConfig,
    ForkDetector,
    NonFiniteConfig,
    NonFiniteDetector,
    StagnationConfig,
    StagnationDetector,
)

__all__ = ["Alert", "AlertConfig", "AlertMonitor", "AlertHub", "load_alert_config", "ALERT_COLUMNS"]

logger = logging.getLogger("forksight.alerts")

# columns of the `alerts` table, in order (DESIGN.md "Store" + action)
ALERT_COLUMNS = ("run_id", "step", "wall_time", "detector", "severity", "message", "value",
                 "threshold", "forecast", "action")


class AlertConfig(BaseModel):
    """Every detector's settings; the defaults are meant to be quiet on healthy runs."""

    model_config = ConfigDict(extra="forbid")
    collapse: CollapseConfig = Field(default_factory=CollapseConfig, description="entropy collapse: floor, drop from baseline, forecast of the crossing")
    covariance: CovarianceConfig = Field(default_factory=CovarianceConfig, description="early warning: sustained positive Cov(log π, A)")
    explosion: ExplosionConfig = Field(default_factory=ExplosionConfig, description="entropy / Rényi-2 rising past a ceiling")
    diversity: DiversityConfig = Field(default_factory=DiversityConfig, description="pass@G − pass@1 shrinking, zero-variance groups rising")
    fork: ForkConfig = Field(default_factory=ForkConfig, description="fraction of fork tokens (H ≥ 0.672) below a floor")
    stagnation: StagnationConfig = Field(default_factory=StagnationConfig, description="reward plateau while pass@1 is below target")
    non_finite: NonFiniteConfig = Field(default_factory=NonFiniteConfig, description="NaN or ±inf statistics")


def load_alert_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> AlertConfig:
    """Defaults ← YAML/JSON file ← `section.field=value` overrides; errors name the bad key."""
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.exists():
            raise FileNotFoundError(f"alert config file {file} does not exist")
        if file.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(file.read_text()) or {}
        else:
            data = json.loads(file.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"alert config file {file} must hold a mapping of sections, got {type(data).__name__}")
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2 or not all(parts):
            raise ValueError(f"override {item!r} must look like section.field=value, e.g. collapse.floor=0.1")
        section, field = parts
        try:
            value = json.loads(raw)  # numbers, true/false, lists; anything else stays a string
        except json.JSONDecodeError:
            value = raw
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ValueError(f"alert config section {section!r} must be a mapping")
        data[section][field] = value
    try:
        return AlertConfig(**data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid alert config: {problems} (sections: {', '.join(AlertConfig.model_fields)})") from None


class AlertMonitor:
    """All detectors for one run; feed it each step's scalars in step order."""

    def __init__(self, config: AlertConfig | None = None, vocab_size: int | None = None) -> None:
        self.config = config or AlertConfig()
        c = self.config
        built: list[tuple[Any, Detector]] = [
            (c.non_finite, NonFiniteDetector(c.non_finite)),
            (c.collapse, CollapseDetector(c.collapse)),
            (c.covariance, CovarianceDetector(c.covariance)),
            (c.explosion, ExplosionDetector(c.explosion, vocab_size)),
            (c.diversity, DiversityDetector(c.diversity)),
            (c.fork, ForkDetector(c.fork)),
            (c.stagnation, StagnationDetector(c.stagnation)),
        ]
        active = [d for cfg, d in built if cfg.enabled]
        self._non_finite = next((d for d in active if isinstance(d, NonFiniteDetector)), None)
        self._detectors = [d for d in active if not isinstance(d, NonFiniteDetector)]
        self.seen = 0
        self.last_step: int | None = None

    def observe(self, step: int, scalars: dict[str, float]) -> list[Alert]:
        """Run every detector on one step; a step at or before the last one seen is ignored
        (re-sent batches and late ranks must not double-count)."""
        if self.last_step is not None and step <= self.last_step:
            return []
        self.last_step = step
        self.seen += 1
        finite: dict[str, float] = {}
        bad: dict[str, float] = {}
        for key, raw in scalars.items():
            try:
                value = float(raw)
            except (TypeError, ValueError):
                continue  # strings, None, tensors with >1 element: not a statistic we read
            (finite if math.isfinite(value) else bad)[key] = value
        alerts: list[Alert] = []
        if self._non_finite is not None:
            alerts += self._non_finite.observe(step, bad, self.seen)
        for detector in self._detectors:
            alerts += detector.observe(step, finite, self.seen)
        return alerts


class AlertHub:
    """What the collector holds: one AlertMonitor per run, and the sinks every alert goes to."""

    def __init__(self, config: AlertConfig | None = None, webhook_url: str | None = None) -> None:
        self.config = config or AlertConfig()
        self._monitors: dict[str, AlertMonitor] = {}
        self._lock = threading.Lock()  # ingest may call from several request threads
        self.webhook = None
        if webhook_url:
            from monitor.webhook import WebhookSink

            self.webhook = WebhookSink(webhook_url)

    def on_step(self, run_id: str, step: int, scalars: dict[str, float],
                vocab_size: int | None = None) -> list[dict]:
        """Run the run's detectors on one ingested step; returns rows for the `alerts` table."""
        with self._lock:
            monitor = self._monitors.get(run_id)
            if monitor is None:
                monitor = self._monitors[run_id] = AlertMonitor(self.config, vocab_size)
            alerts = monitor.observe(step, scalars)
        now = time.time()
        rows = [alert_row(run_id, alert, now) for alert in alerts]
        for row in rows:
            level = logging.CRITICAL if row["severity"] == "critical" else logging.WARNING
            logger.log(level, "run %s step %d [%s] %s Action: %s", run_id, row["step"],
                       row["detector"], row["message"], row["action"])
            if self.webhook is not None:
                self.webhook.post(row)
        return rows

    def forget(self, run_id: str) -> None:
        """Drop a run's detector state (finished or deleted run)."""
        with self._lock:
            self._monitors.pop(run_id, None)

    def close(self) -> None:
        """Flush the webhook queue (bounded wait) and stop its thread."""
        if self.webhook is not None:
            self.webhook.close()


def alert_row(run_id: str, alert: Alert, wall_time: float) -> dict:
    """An Alert as a row of the `alerts` table (wall_time: seconds since the epoch)."""
    return {"run_id": run_id, "wall_time": wall_time, **alert.model_dump()}
