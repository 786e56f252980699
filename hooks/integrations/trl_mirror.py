"""forksight inside the trackers a TRL run already reports to (`report_to`: wandb, trackio, mlflow,
tensorboard, ...): the step's forksight scalars under `forksight/`, in the same run at the same step,
and each alert as the tracker's own alert where it has one (wandb.alert, trackio.alert), else as a
text record (TensorBoard's text tab, an MLflow text artifact), with what was seen and the fix.

The scalars ride TRL's own log: `trainer.log` is wrapped so the keys below join the dict TRL hands to
every reporting callback, which therefore files them as it files TRL's (same run, same step, any
tracker transformers knows). A bounded set, not every key: MIRRORED, pass@k at k = 1, 2, 4, ... and
the group size, and the families in MIRRORED_PREFIXES (each a fixed set of a few keys), at most
MAX_MIRRORED. Values are this process's (rank 0 logs).
A tracker whose alert call fails is reported once and never stops training."""
from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any, Sequence

log = logging.getLogger("forksight.trl")

PREFIX = "forksight/"
MIRRORED = ("entropy/mean", "entropy/p20", "entropy/p50", "entropy/p80", "entropy/p95", "renyi2/mean",
            "js/mean", "top1/mean", "fork/frac", "selected/frac", "selected/threshold", "groups/zero_var_frac",
            "cov/logp_adv", "tokens/count")
MIRRORED_PREFIXES = ("pass@", "mismatch/", "probe/", "trust/", "ref/")
MAX_MIRRORED = 64
# trackers forksight writes alerts into, and the pip package each needs
TRACKERS = {"wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow", "tensorboard": "tensorboard"}


def mirrored(scalars: dict[str, float]) -> dict[str, float]:
    """The step scalars a tracker gets, under forksight/ (finite numbers only, at most MAX_MIRRORED)."""
    ks = [int(k[5:]) for k in scalars if k.startswith("pass@") and k[5:].isdigit()]
    passes = {f"pass@{k}" for k in ks if k & (k - 1) == 0 or k == max(ks)}   # 1, 2, 4, ... and the group's
    keys = [k for k in scalars if k in MIRRORED or k in passes or
            (k.startswith(MIRRORED_PREFIXES) and not k.startswith("pass@"))]
    keys = [k for k in keys if isinstance(scalars[k], (int, float)) and not isinstance(scalars[k], bool)
            and math.isfinite(scalars[k])]
    return {PREFIX + k: float(scalars[k]) for k in sorted(keys, key=lambda k: (k not in MIRRORED, k))[:MAX_MIRRORED]}


def check(mirror: str | Sequence[str] | None) -> list[str]:
    """The trackers a `mirror=` list names (ValueError for a name forksight does not write into)."""
    if mirror is None or mirror in ("auto", "none") or mirror is False:
        return []
    names = [mirror] if isinstance(mirror, str) else list(mirror)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"mirror: unknown tracker(s) {unknown}; choose from {sorted(TRACKERS)}, 'auto' "
                         "(every tracker the trainer reports to) or 'none'")
    return names


def resolve(mirror: str | Sequence[str] | None, report_to: Sequence[str]) -> list[str]:
    """The trackers to mirror into: `mirror` None or "auto" -> every tracker the trainer reports to;
    "none" (or an empty list) -> none; a list -> those. A named tracker that is not installed is
    said once, naming the package, and left out."""
    if mirror is None or mirror == "auto":
        names = [t for t in report_to if t != "none"]
    elif mirror == "none" or mirror is False:
        return []
    else:
        names = check(mirror)
    kept = []
    for name in names:
        package = TRACKERS.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            log.warning("forksight: mirroring into %s skipped: it is not installed (pip install %s); training "
                        "goes on", name, package)
            continue
        kept.append(name)
    return kept


def mirror_into(trainer, mirror: str | Sequence[str] | None, sink) -> "TrackerMirror | None":
    """The trainer's mirror (None when no tracker is mirrored into)."""
    trackers = resolve(mirror, list(getattr(trainer.args, "report_to", None) or []))
    return TrackerMirror(trainer, trackers, sink) if trackers else None


class TrackerMirror:
    """Stages each step's scalars, adds them to TRL's next training log, and sends new alerts."""

    def __init__(self, trainer, trackers: list[str], alerts: Any):
        self.trainer, self.trackers, self.alerts = trainer, trackers, alerts   # alerts: the sink (.alerts)
        self.staged: dict[str, float] = {}
        self.sent = 0
        self.failed: set[str] = set()
        inner = trainer.log

        def log_with_forksight(logs: dict, *args, **kwargs):
            if self.staged and not any(k.endswith("_runtime") and k.startswith("eval") for k in logs):
                logs = {**logs, **self.staged}
                self.staged = {}
            return inner(logs, *args, **kwargs)

        trainer.log = log_with_forksight       # an instance attribute: detach deletes it

    def stage(self, scalars: dict[str, float] | None) -> None:
        if scalars:
            self.staged.update(mirrored(scalars))

    def send_alerts(self, step: int) -> None:
        """Each alert received since the last call, into every mirrored tracker."""
        new = self.alerts.alerts[self.sent:]
        self.sent += len(new)
        for alert in new:
            for tracker in self.trackers:
                if tracker in self.failed:
                    continue
                try:
                    getattr(self, f"_alert_{tracker}")(alert, step)
                except Exception as exc:  # noqa: BLE001 - a tracker must never break the run
                    self.failed.add(tracker)
                    log.warning("forksight: sending alerts to %s failed (%r); alerts stay in forksight's store, "
                                "training goes on", tracker, exc)

    def detach(self) -> None:
        self.trainer.__dict__.pop("log", None)

    # -- one function per tracker --------------------------------------------------------------
    def _alert_wandb(self, alert: dict, step: int) -> None:
        import wandb

        if wandb.run is not None:
            level = wandb.AlertLevel.ERROR if alert.get("severity") == "critical" else wandb.AlertLevel.WARN
            wandb.alert(title=_title(alert), text=_text(alert), level=level, wait_duration=0)

    def _alert_trackio(self, alert: dict, step: int) -> None:
        import trackio

        level = trackio.AlertLevel.ERROR if alert.get("severity") == "critical" else trackio.AlertLevel.WARN
        trackio.alert(title=_title(alert), text=_text(alert), level=level)

    def _alert_mlflow(self, alert: dict, step: int) -> None:
        import mlflow

        if mlflow.active_run() is not None:
            name = f"forksight/alerts/step-{int(alert.get('step') or step):07d}-{alert.get('detector')}.md"
            mlflow.log_text(f"# {_title(alert)}\n\n{_text(alert)}\n", name)

    def _alert_tensorboard(self, alert: dict, step: int) -> None:
        writer = next((getattr(cb, "tb_writer", None) for cb in self.trainer.callback_handler.callbacks
                       if type(cb).__name__ == "TensorBoardCallback"), None)
        if writer is not None:
            writer.add_text("forksight/alerts", f"**{_title(alert)}**\n\n{_text(alert)}",
                            int(alert.get("step") or step))
            writer.flush()


def _title(alert: dict) -> str:
    return f"forksight {alert.get('severity', 'warning')}: {alert.get('detector')} at step {alert.get('step')}"


def _text(alert: dict) -> str:
    fix = alert.get("action")
    return f"{alert.get('message', '')}" + (f"\nFix: {fix}" if fix and "Fix:" not in str(alert.get("message")) else "")
