"""`torchrun --nproc_per_node=2 trl_ranks_script.py MODEL_DIR URL RUN OUT_DIR` (test_trl_ranks.py): a real
GRPOTrainer with forksight.trl on every rank streaming to one collector run; rank 0 writes what TRL
logged (its entropy is the mean over both ranks' tokens) to OUT_DIR/trl_logs.json."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

import forksight.trl
from forksight.trainer.model import load


class LogProbe(TrainerCallback):
    def __init__(self):
        self.logs: dict[int, dict] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.setdefault(state.global_step, {}).update(logs or {})


def main(model_dir: str, url: str, run: str, out: str) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load(model_dir)

    def even_first_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    config = GRPOConfig(output_dir=out, report_to="none", use_cpu=True, bf16=False, seed=0, logging_steps=1,
                        save_strategy="no", disable_tqdm=True, per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=6, learning_rate=5e-3, max_steps=3, top_entropy_quantile=0.2)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    probe = LogProbe()
    trainer.add_callback(probe)
    callback = forksight.trl.attach(trainer, url=url, run=run, sample=2)
    trainer.train()
    callback.detach()
    if trainer.accelerator.is_main_process:
        Path(out, "trl_logs.json").write_text(json.dumps(probe.logs))


if __name__ == "__main__":
    main(*sys.argv[1:5])
