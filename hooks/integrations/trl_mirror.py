"""forksight inside the trackers a TRL run already reports to (`report_to`: wandb, trackio, mlflow,
tensorboard, ...): the step's forksight scalars under `forksight/` in the same run at the same step,
each alert as the tracker's own alert or a text record, and every `tokens_every` steps a token view
(the sending: hooks/capture/trackers.py).

The scalars ride TRL's own log: `trainer.log` is wrapped so the keys join the dict TRL hands to every
reporting callback, which therefore files them as it files TRL's (same run, same step, any tracker
transformers knows). Values are this process's (rank 0 logs)."""
from __future__ import annotations

from typing import Any, Sequence

from forksight.hooks.capture.trackers import (MAX_MIRRORED, TrackerWriter, check, log, mirrored,  # noqa: F401
                                              resolve)


def mirror_into(trainer, mirror: str | Sequence[str] | None, sink, tokens_every: int = 50) -> "TrackerMirror | None":
    """The trainer's mirror (None when no tracker is mirrored into)."""
    trackers = resolve(mirror, list(getattr(trainer.args, "report_to", None) or []))
    return TrackerMirror(trainer, trackers, sink, tokens_every) if trackers else None


class TrackerMirror(TrackerWriter):
    """Stages each step's scalars and adds them to TRL's next training log; alerts and token views as
    every writer sends them, into the trainer's own trackers (its TensorBoardCallback's writer)."""

    def __init__(self, trainer, trackers: list[str], alerts: Any, tokens_every: int = 50):
        super().__init__(trackers, alerts, tokens_every)
        self.trainer = trainer
        self.staged: dict[str, float] = {}
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

    def after_step(self, step: int, scalars: Sequence[dict | None], last_tokens) -> None:
        """A step's scalars staged for TRL's next log; its token view sent when due."""
        for part in scalars:
            self.stage(part)
        self.send_tokens(step, last_tokens)

    def detach(self) -> None:
        self.trainer.__dict__.pop("log", None)

    def tb_writer(self):
        return next((getattr(cb, "tb_writer", None) for cb in self.trainer.callback_handler.callbacks
                     if type(cb).__name__ == "TensorBoardCallback"), None)

    # transformers' callbacks log without a step of the tracker's own: the token view joins the
    # step's next W&B row (commit=False); trackio counts its own steps, the trainer's step beside it
    def wandb_log_kwargs(self, step: int) -> dict:
        return {"commit": False}

    def trackio_step(self, step: int) -> dict:
        return {"train/global_step": step}

    def trackio_log_kwargs(self, step: int) -> dict:
        return {}
