"""Alerts that warn before a run is lost: `AlertMonitor` runs every detector on one run's steps;
`AlertHub` keeps one per run and sends what fires to the `alerts` rows it returns, the
`forksight.alerts` logger and an optional webhook that never blocks ingest."""
from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from forksight.monitor.alerts.detectors import (
    Alert,
    CollapseDetector,
    CovarianceDetector,
    Detector,
    DiversityDetector,
    ExplosionDetector,
    ForkDetector,
    NonFiniteDetector,
    StagnationDetector,
)
from forksight.monitor.alerts.breadth import (ClipDetector, CompositionDetector, DegenerateDetector,
                                              DivergenceDetector, GradientDetector, KLDriftDetector,
                                              TruncationDetector)
from forksight.monitor.alerts.mismatch import MismatchDetector
from forksight.monitor.alerts.objective import ClipAsymmetryDetector, KLInertDetector, LengthHackingDetector
from forksight.base.limits import NONFINITE_PREFIX
from forksight.monitor.alerts.config import (  # noqa: F401 - the configs' public home stays forksight.monitor.alerts.hub
    AlertConfig, CollapseConfig, CovarianceConfig, DetectorConfig, DiversityConfig, ExplosionConfig, ForkConfig,
    NonFiniteConfig, StagnationConfig,
)
from forksight.base.errors import validation_message
from forksight.base.tables import ALERTS

__all__ = ["Alert", "AlertConfig", "AlertMonitor", "AlertHub", "load_alert_config", "ALERT_COLUMNS", "alert_row",
           "evidence_of"]

logger = logging.getLogger("forksight.alerts")

# read by AlertHub() when not given explicitly: the collector builds its hub with no arguments,
# so these reach `forksight serve`, the embedded collector and Docker without new flags
_FROM_CODE = {0.0: math.nan, 1.0: math.inf, -1.0: -math.inf}
ENV_CONFIG = "FORKSIGHT_ALERTS_CONFIG"    # path of a YAML/JSON alert config
ENV_WEBHOOK = "FORKSIGHT_WEBHOOK_URL"     # Slack-compatible webhook URL

ALERT_COLUMNS = ALERTS.names   # columns of the `alerts` table, in order (forksight.base.tables)


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
        problems = validation_message(exc.errors(), root="config", model=AlertConfig)
        raise ValueError(f"invalid alert config: {problems} (sections: {', '.join(AlertConfig.model_fields)})") from None


class AlertMonitor:
    """All detectors for one run; feed it each step's scalars in step order."""

    def __init__(self, config: AlertConfig | None = None, vocab_size: int | None = None) -> None:
        self.config = config or AlertConfig()
        c = self.config
        # the cause runs before the detectors that stay quiet on its symptoms (one alert per cause)
        length = LengthHackingDetector(c.length_hacking) if c.length_hacking.enabled else None
        split = ClipAsymmetryDetector(c.clip_asymmetry) if c.clip_asymmetry.enabled else None
        built: list[tuple[Any, Detector]] = [
            (c.non_finite, NonFiniteDetector(c.non_finite)),
            (c.collapse, CollapseDetector(c.collapse)),
            (c.covariance, CovarianceDetector(c.covariance)),
            (c.explosion, ExplosionDetector(c.explosion, vocab_size)),
            (c.diversity, DiversityDetector(c.diversity)),
            (c.fork, ForkDetector(c.fork)),
            (c.stagnation, StagnationDetector(c.stagnation)),
            (c.degenerate, DegenerateDetector(c.degenerate)),
            (c.length_hacking, length),
            (c.clip_asymmetry, split),
            (c.kl_inert, KLInertDetector(c.kl_inert)),
            (c.truncation, TruncationDetector(c.truncation, cause=length)),
            (c.clip, ClipDetector(c.clip, cause=split)),
            (c.kl_drift, KLDriftDetector(c.kl_drift)),
            (c.gradient, GradientDetector(c.gradient)),
            (c.divergence, DivergenceDetector(c.divergence)),
            (c.composition, CompositionDetector(c.composition, cause=length)),
            (c.mismatch, MismatchDetector(c.mismatch)),
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
            if key.startswith(NONFINITE_PREFIX):  # a sink's marker for a value it could not store
                bad[key[len(NONFINITE_PREFIX):]] = _FROM_CODE.get(value, math.nan)
                continue
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
        """config / webhook_url default to $FORKSIGHT_ALERTS_CONFIG / $FORKSIGHT_WEBHOOK_URL when set."""
        if config is None and os.environ.get(ENV_CONFIG):
            config = load_alert_config(os.environ[ENV_CONFIG])
        if webhook_url is None:
            webhook_url = os.environ.get(ENV_WEBHOOK) or None
        self.config = config or AlertConfig()
        self._monitors: dict[str, AlertMonitor] = {}
        self._lock = threading.Lock()  # ingest may call from several request threads
        self.webhook = None
        if webhook_url:
            from forksight.monitor.alerts.webhook import WebhookSink

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

    def close(self) -> None:
        """Flush the webhook queue (bounded wait) and stop its thread."""
        if self.webhook is not None:
            self.webhook.close()


def alert_row(run_id: str, alert: Alert, wall_time: float) -> dict:
    """An Alert as a row of the `alerts` table (wall_time: seconds since the epoch); its evidence
    as the JSON text the column stores."""
    row = {"run_id": run_id, "wall_time": wall_time, **alert.model_dump()}
    row["evidence"] = json.dumps(row["evidence"], allow_nan=False) if row["evidence"] else None
    return row


def evidence_of(row: Any) -> dict[str, Any]:
    """The evidence of a stored alert row (a dict, or the column's JSON text, or nothing) as a dict."""
    value = row.get("evidence") if hasattr(row, "get") else None
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        try:
            found = json.loads(value)
        except json.JSONDecodeError:
            return {}
        return found if isinstance(found, dict) else {}
    return {}
