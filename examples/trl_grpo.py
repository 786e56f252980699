"""A plain TRL GRPO script on the tiny offline model, with the ONE line forksight adds.

    python examples/trl_grpo.py --db runs.duckdb          # in-process store on that file
    python examples/trl_grpo.py --url http://127.0.0.1:8050  # a running `forksight serve`
    python examples/trl_grpo.py                            # the embedded default collector

The task: two-digit addition; the reward is 1 when the completion's first digit is the
answer's first digit (forksight counts that as correct for pass@k) and 0.2 for writing any
digit, so an untrained model's groups disagree and GRPO has a signal. Swap in your own model path, dataset and reward: the forksight line stays.
"""
from __future__ import annotations

import argparse
import random
import re

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

import forksight.trl
from forksight.trainer.model import build_tiny, load


def addition_dataset(n: int, seed: int = 0) -> Dataset:
    """Prompts `Q: a+b= A:` with the answer in a column the reward function receives."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": f"Q: {a}+{b}= A:", "answer": str(a + b)})
    return Dataset.from_list(rows)


def first_digit_reward(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1.0 when the first digit written is the answer's first digit, 0.2 for any digit, else 0."""
    rewards = []
    for completion, target in zip(completions, answer):
        digits = re.findall(r"\d", completion)
        rewards.append(1.0 if digits and digits[0] == target[0] else 0.2 if digits else 0.0)
    return rewards


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="local HF causal LM directory (default: the tiny model)")
    parser.add_argument("--db", default=None, help="DuckDB file for an in-process store")
    parser.add_argument("--url", default=None, help="collector URL (forksight serve)")
    parser.add_argument("--run", default="trl-grpo-example", help="run name shown in the dashboard")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--num-generations", type=int, default=4, help="completions per prompt (G)")
    parser.add_argument("--max-completion-length", type=int, default=8, help="tokens per completion")
    parser.add_argument("--top-entropy-quantile", type=float, default=1.0, help="TRL's fork-token training (0.2)")
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--seed", type=int, default=0, help="training seed")
    parser.add_argument("--output-dir", default="artifacts/trl_grpo", help="TRL's output directory")
    args = parser.parse_args(argv)

    model, tokenizer = load(args.model or build_tiny())
    config = GRPOConfig(
        output_dir=args.output_dir, report_to="none", use_cpu=True, bf16=False, seed=args.seed,
        per_device_train_batch_size=args.prompts * args.num_generations, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, learning_rate=args.lr, max_steps=args.steps,
        top_entropy_quantile=args.top_entropy_quantile, logging_steps=1, save_strategy="no", disable_tqdm=False,
    )
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=first_digit_reward,
                          train_dataset=addition_dataset(args.steps * args.prompts + 64), processing_class=tokenizer)

    forksight.trl.attach(trainer, db=args.db, url=args.url, run=args.run)  # <- the one line forksight adds

    trainer.train()


if __name__ == "__main__":
    main()
