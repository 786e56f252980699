"""forksight inside experiment trackers (wandb, trackio, mlflow, tensorboard): what every writer into
them shares — the bounded set of step scalars a tracker gets under `forksight/`, which trackers a
setting names (a named tracker that is not installed is said once, naming its package), and the
sending of alerts (the tracker's own alert where it has one: wandb.alert, trackio.alert; else a text
record: TensorBoard's text tab, an MLflow text artifact; each with what was seen and the fix) and of
token views (entropy-coloured HTML: wandb.Html, trackio.Html, an MLflow HTML artifact; TensorBoard
text with each token's H). A tracker whose call fails is reported once and never stops training.
Two writers: TRL's (hooks/integrations/trl_mirror.py: its trackers are the trainer's) and the bundled
trainer's (trainer/trackers.py: it opens its own)."""
from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any, Sequence

log = logging.getLogger("forksight.trackers")

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
    kept = sorted(keys, key=lambda k: (k not in MIRRORED, k))[:MAX_MIRRORED]
    # a key that is also the folder of others (mismatch/frac_outside_2x and .../fork) is filed as
    # <key>/all: MLflow's file store keeps a metric as a file named by its key, which cannot also be
    # a folder, and refused the whole step
    folders = {k for k in kept if any(o.startswith(k + "/") for o in kept)}
    return {PREFIX + k + ("/all" if k in folders else ""): float(scalars[k]) for k in kept}


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


class TrackerWriter:
    """Alerts and token views into `trackers`; `alerts` is the run's sink (its .alerts list). A writer
    says where its TensorBoard writer is and how a tracker's step is given (tb_writer, *_step)."""

    def __init__(self, trackers: list[str], alerts: Any, tokens_every: int = 50):
        self.trackers, self.alerts = trackers, alerts
        self.tokens_every, self.scale = tokens_every, None                     # one colour scale per run
        self.sent = 0
        self.failed: set[tuple[str, str]] = set()       # (tracker, what) that failed once

    def tb_writer(self):
        return None

    def wandb_step(self, step: int) -> dict:
        return {}

    def wandb_log_kwargs(self, step: int) -> dict:
        return {"step": step}

    def trackio_step(self, step: int) -> dict:
        return {}

    def trackio_log_kwargs(self, step: int) -> dict:
        return {"step": step}

    def send_tokens(self, step: int, last_tokens) -> None:
        """The token view of `step` (the reporter's last stored rows) when it is due."""
        if not self.tokens_every or step % self.tokens_every or not last_tokens or last_tokens[0] != step \
                or not last_tokens[1]:
            return
        from forksight.base import wiring

        html, self.scale = wiring.provided("token_view_html")(last_tokens[1], step, scale=self.scale)
        if html:
            self._each("tokens", lambda tracker: getattr(self, f"_tokens_{tracker}")(html, last_tokens[1], step))

    def _each(self, what: str, send) -> None:
        for tracker in self.trackers:
            if (tracker, what) in self.failed:
                continue
            try:
                send(tracker)
            except Exception as exc:  # noqa: BLE001 - a tracker must never break the run
                self.failed.add((tracker, what))
                log.warning("forksight: sending %s to %s failed (%r); they stay in forksight's store, training "
                            "goes on", what, tracker, exc)

    def send_alerts(self, step: int) -> None:
        """Each alert received since the last call, into every mirrored tracker."""
        new = self.alerts.alerts[self.sent:]
        self.sent += len(new)
        for alert in new:
            self._each("alerts", lambda tracker: getattr(self, f"_alert_{tracker}")(alert, step))

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
        writer = self.tb_writer()
        if writer is not None:
            writer.add_text("forksight/alerts", f"**{_title(alert)}**\n\n{_text(alert)}",
                            int(alert.get("step") or step))
            writer.flush()


    def _tokens_wandb(self, html: str, columns: dict, step: int) -> None:
        import wandb

        if wandb.run is not None:
            wandb.log({"forksight/tokens": wandb.Html(html), **self.wandb_step(step)}, **self.wandb_log_kwargs(step))

    def _tokens_trackio(self, html: str, columns: dict, step: int) -> None:
        import trackio

        trackio.log({"forksight/tokens": trackio.Html(html), **self.trackio_step(step)}, **self.trackio_log_kwargs(step))

    def _tokens_mlflow(self, html: str, columns: dict, step: int) -> None:
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.log_text(html, f"forksight/tokens/step-{step:07d}.html")

    def _tokens_tensorboard(self, html: str, columns: dict, step: int) -> None:
        writer = self.tb_writer()
        if writer is not None:           # TensorBoard's text is Markdown: each token with its H
            lines, sid = [], None
            for s, token, h in zip(columns["sample_id"], columns["token"], columns.get("entropy", [])):
                if s != sid:
                    lines.append(f"\n\n**sample {s}**: ")
                    sid = s
                lines.append(f"`{token!r}` {'–' if h is None else f'{h:.2f}'} ")
            writer.add_text("forksight/tokens", "".join(lines).strip(), step)
            writer.flush()


def _title(alert: dict) -> str:
    return f"forksight {alert.get('severity', 'warning')}: {alert.get('detector')} at step {alert.get('step')}"


def _text(alert: dict) -> str:
    fix = alert.get("action")
    return f"{alert.get('message', '')}" + (f"\nFix: {fix}" if fix and "Fix:" not in str(alert.get("message")) else "")
