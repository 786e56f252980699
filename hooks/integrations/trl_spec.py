"""The forksight run a GRPOTrainer becomes: its name (the callback's `run`, else TRL's run_name), and
the trainer's settings the pages and detectors read (temperature, group size, the vocabulary size
behind the explosion detector's log |V|, ...), on this process's rank."""
from __future__ import annotations

from forksight.base.fork_rule import ForkRule
from forksight.base.runspec import RunSpec


def run_spec(trainer, version: str, run, project: str | None, stop_on_alert: bool, fork_rule=None) -> RunSpec:
    args, model = trainer.args, trainer.model
    config = {"trl": version, "num_generations": trainer.num_generations,
              "temperature": trainer.temperature, "top_entropy_quantile": trainer.top_entropy_quantile,
              "loss_type": getattr(trainer, "loss_type", None), "beta": trainer.beta,
              "learning_rate": args.learning_rate, "max_completion_length": args.max_completion_length,
              "per_device_train_batch_size": args.per_device_train_batch_size,
              "world_size": trainer.accelerator.num_processes,
              "vocab_size": getattr(model.config, "vocab_size", None),   # the explosion detector's log|V|
              "fork_rule": str(ForkRule.parse(fork_rule))}
    run = run or getattr(args, "run_name", None) or "trl-grpo"   # a RunSpec, or a name
    return RunSpec.of(run, project=project, stop_on_alert=stop_on_alert or None).filled(
        strategy="trl-grpo", model=getattr(model.config, "_name_or_path", None) or type(model).__name__,
        config=config).replace(rank=trainer.accelerator.process_index)
