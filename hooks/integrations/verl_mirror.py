"""forksight inside the trackers a verl run already logs to (`trainer.logger`: wandb, trackio, mlflow,
tensorboard): at each step verl logs, the step's forksight scalars under `forksight/` go through the
same backend objects verl's Tracking made (so the same run, the same step, MLflow's key sanitising),
each alert as the tracker's own alert or a text record, and every `mirror_tokens_every` steps a token
view (the sending: hooks/capture/trackers.py). Settings: `+trainer.forksight.mirror` — `auto` (every
tracker `trainer.logger` names, the default), `none`, or a list — and `+trainer.forksight.mirror_tokens_every`.

Alerts raised by step s reach the trackers at the next step verl logs (with stop_on_alert, at step s+1,
before the run stops), and the rest when verl's Tracking finishes: forksight's mirror is flushed
before the other backends close (hooks/integrations/verl_install.py)."""
from __future__ import annotations

from typing import Any, Mapping

from forksight.hooks.capture.trackers import TRACKERS, TrackerWriter, check, log, mirrored, resolve


def mirror_setting(value: Any) -> str | list[str]:
    """`mirror` as verl's config gives it: a list, `[a,b]` or `a,b` from the command line or the
    environment, `auto` or `none` (ValueError for a tracker forksight does not write into)."""
    if isinstance(value, str):
        text = value.strip().strip("[]").strip()
        if text in ("auto", "none"):
            return text
        value = [part.strip().strip("'\"") for part in text.split(",") if part.strip()]
    names = [str(v) for v in value]
    check(names)
    return names


def mirror_into(backends: Mapping[str, Any], mirror: str | list[str], alerts: Any,
                tokens_every: int) -> "VerlMirror | None":
    """The mirror into the backends verl's Tracking opened (None when none is mirrored into). A tracker
    `mirror` names that `trainer.logger` does not is said once: verl opened no run of it to write into."""
    present = [name for name in TRACKERS if name in backends]
    if isinstance(mirror, list):
        for name in (n for n in mirror if n not in backends):
            log.warning("forksight: mirroring into %s skipped: trainer.logger does not name it (add it there, "
                        "e.g. trainer.logger=[console,forksight,%s])", name, name)
        mirror = [n for n in mirror if n in backends]
    trackers = resolve(mirror, present)
    return VerlMirror(backends, trackers, alerts, tokens_every) if trackers else None


class VerlMirror(TrackerWriter):
    """Writes through verl's own backend objects: `backends` is Tracking.logger (name -> backend)."""

    def __init__(self, backends: Mapping[str, Any], trackers: list[str], alerts: Any, tokens_every: int = 50):
        super().__init__(trackers, alerts, tokens_every)
        self.backends = backends
        self.last_step = 0

    def tb_writer(self):
        return getattr(self.backends.get("tensorboard"), "writer", None)     # verl's _TensorboardAdapter

    def step(self, step: int, scalars: dict[str, float] | None, last_tokens) -> None:
        """One logged step: its forksight scalars, the alerts raised since the last, its token view when due."""
        self.last_step = step
        values = mirrored(scalars or {})
        if values:
            self._each("scalars", lambda tracker: self.backends[tracker].log(data=values, step=step))
        self.send_alerts(step)
        self.send_tokens(step, last_tokens)
