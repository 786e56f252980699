"""`torchrun --nproc_per_node=2 trl_ranks_script.py MODEL_DIR URL RUN OUT_DIR` (test_trl_ranks.py): a real
GRPOTrainer with forksight.trl on every rank streaming to one collector run; rank 0 writes what TRL
logged (its entropy is the mean over both ranks' tokens) to OUT_DIR/trl_logs.json."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from transformers import TrainerCallback

import forksight.trl
from trl_tiny_run import tiny_grpo_trainer


class LogProbe(TrainerCallback):
    def __init__(self):
        self.logs: dict[int, dict] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.setdefault(state.global_step, {}).update(logs or {})


def main(model_dir: str, url: str, run: str, out: str) -> None:
    trainer = tiny_grpo_trainer(model_dir, out, max_steps=3)
    probe = LogProbe()
    trainer.add_callback(probe)
    callback = forksight.trl.attach(trainer, url=url, run=run, sample=2)
    trainer.train()
    callback.detach()
    if trainer.accelerator.is_main_process:
        Path(out, "trl_logs.json").write_text(json.dumps(probe.logs))


if __name__ == "__main__":
    main(*sys.argv[1:5])
