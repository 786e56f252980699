"""`forksight train --report-to wandb,trackio,mlflow,tensorboard`: the bundled trainer's run in the
trackers its user watches. It opens each tracker's run itself (named as the forksight run, filed under
its project, the training config as the tracker's config) and writes at every step, at the trainer's
step: forksight's bounded set of scalars under `forksight/` (hooks/capture/trackers.py) beside the
trainer's own reward, loss, KL, length and gradient norm; every alert; every `report_tokens_every`
steps a token view. W&B and trackio honour their own environment (WANDB_MODE=offline, TRACKIO_DIR),
MLflow its tracking URI, TensorBoard writes to $TENSORBOARD_LOGGING_DIR or out_dir/<run>/tensorboard.
A tracker that fails to open or to write is said once and left out; training goes on."""
from __future__ import annotations

import os
from typing import Any

from forksight.hooks.capture.trackers import PREFIX, TrackerWriter, log, mirrored, resolve

TRAINER_KEYS = ("reward/mean", "reward/std", "loss", "kl", "length/mean", "grad_norm", "lr")


def names(report_to: str) -> list[str]:
    """The trackers a `--report-to` value names, comma-separated ('' or 'none': none)."""
    return [] if report_to.strip() in ("", "none") else [t.strip() for t in report_to.split(",") if t.strip()]


class OwnTrackers(TrackerWriter):
    """The bundled trainer's trackers, opened here and finished with the run."""

    def __init__(self, config: Any, run: str, alerts: Any):
        super().__init__(resolve(names(config.report_to), []), alerts, config.report_tokens_every)
        self.run, self.project, self._tb = run, config.project, None
        settings = config.model_dump()
        for tracker in list(self.trackers):
            try:
                getattr(self, f"_open_{tracker}")(settings, config)
            except Exception as exc:  # noqa: BLE001 - a tracker must never break the run
                self.trackers.remove(tracker)
                log.warning("forksight: %s could not be opened (%r); the run goes on without it", tracker, exc)

    def _open_wandb(self, settings: dict, config) -> None:
        import wandb

        wandb.init(project=self.project, name=self.run, config=settings, reinit="finish_previous")

    def _open_trackio(self, settings: dict, config) -> None:
        import trackio

        trackio.init(project=self.project, name=self.run, config=settings)

    def _open_mlflow(self, settings: dict, config) -> None:
        import mlflow

        mlflow.set_experiment(self.project)
        mlflow.start_run(run_name=self.run)
        mlflow.log_params({k: str(v)[:250] for k, v in settings.items() if v is not None})

    def _open_tensorboard(self, settings: dict, config) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=os.environ.get("TENSORBOARD_LOGGING_DIR")
                                 or os.path.join(config.out_dir, self.run, "tensorboard"))

    def tb_writer(self):
        return self._tb

    def step(self, step: int, scalars: dict[str, float], last_tokens) -> None:
        """One trained step: its scalars, the alerts raised since the last, its token view when due."""
        values = {**mirrored(scalars), **{PREFIX + k: float(scalars[k]) for k in TRAINER_KEYS if k in scalars}}
        if values:
            self._each("scalars", lambda tracker: getattr(self, f"_scalars_{tracker}")(values, step))
        self.send_alerts(step)
        self.send_tokens(step, last_tokens)

    def _scalars_wandb(self, values: dict, step: int) -> None:
        import wandb

        wandb.log(values, step=step)

    def _scalars_trackio(self, values: dict, step: int) -> None:
        import trackio

        trackio.log(values, step=step)

    def _scalars_mlflow(self, values: dict, step: int) -> None:
        import mlflow

        mlflow.log_metrics({k.replace("@", "_"): v for k, v in values.items()}, step=step)   # MLflow's name rules

    def _scalars_tensorboard(self, values: dict, step: int) -> None:
        for key, value in values.items():
            self._tb.add_scalar(key, value, step)

    def finish(self) -> None:
        """Close every tracker's run (alerts raised after the last step are sent first)."""
        for tracker in self.trackers:
            try:
                if tracker == "wandb":
                    import wandb

                    wandb.finish()
                elif tracker == "trackio":
                    import trackio

                    trackio.finish()
                elif tracker == "mlflow":
                    import mlflow

                    mlflow.end_run()
                elif self._tb is not None:
                    self._tb.close()
            except Exception as exc:  # noqa: BLE001 - closing must not fail the finished run
                log.warning("forksight: closing %s failed (%r)", tracker, exc)
