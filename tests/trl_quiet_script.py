"""`python trl_quiet_script.py MODEL_DIR OUT_DIR [DB]` (test_trl_quiet.py): a short real GRPOTrainer
run, with forksight attached on DB when given; what it prints is what the test compares."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

import forksight.trl
from forksight.trainer.model import load


def main(model_dir: str, out: str, db: str | None = None) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load(model_dir)

    def even_first_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    config = GRPOConfig(output_dir=out, report_to="none", use_cpu=True, bf16=False, seed=0, logging_steps=1,
                        save_strategy="no", disable_tqdm=True, per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=6, learning_rate=5e-3, max_steps=4, top_entropy_quantile=0.2)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    if db:
        forksight.trl.attach(trainer, db=str(Path(db).resolve()), run="quiet")
    trainer.train()


if __name__ == "__main__":
    main(*sys.argv[1:])
