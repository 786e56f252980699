"""`python trl_quiet_script.py MODEL_DIR OUT_DIR [DB]` (test_trl_quiet.py): a short real GRPOTrainer
run, with forksight attached on DB when given; what it prints is what the test compares."""
from __future__ import annotations

import sys
from pathlib import Path

import forksight.trl
from trl_tiny_run import tiny_grpo_trainer


def main(model_dir: str, out: str, db: str | None = None) -> None:
    trainer = tiny_grpo_trainer(model_dir, out, max_steps=4)
    if db:
        forksight.trl.attach(trainer, db=str(Path(db).resolve()), run="quiet")
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:])
