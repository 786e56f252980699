"""The short real GRPOTrainer the subprocess TRL tests run (trl_quiet_script.py, trl_ranks_script.py):
the tiny local model, a reward on the first completion token's parity, 64 addition prompts."""
from __future__ import annotations

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from forksight.trainer.model import load


def even_first_token(completions, completion_ids, **kwargs):
    return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


def tiny_grpo_trainer(model_dir: str, out: str, max_steps: int) -> GRPOTrainer:
    torch.set_num_threads(1)
    model, tokenizer = load(model_dir)
    config = GRPOConfig(output_dir=out, report_to="none", use_cpu=True, bf16=False, seed=0, logging_steps=1,
                        save_strategy="no", disable_tqdm=True, per_device_train_batch_size=8, num_generations=4,
                        max_completion_length=6, learning_rate=5e-3, max_steps=max_steps, top_entropy_quantile=0.2)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:"} for i in range(64)])
    return GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                       processing_class=tokenizer)
