"""Real logs for `forksight doctor`'s tests, written by the tools themselves: TRL's GRPOTrainer on
the tiny model (as bench/alerts_real.py's trl-even runs: reward for an even first token) with
report_to="tensorboard" and a checkpoint at the end, so tests/data/trl_logs/<run>/ holds the
trainer_state.json TRL saved and the TensorBoard event file its SummaryWriter wrote. "collapse" is
lr 1e-2 (entropy falls ~85% by step 40), "healthy" lr 3e-4 (entropy flat, reward noisy near 0.5).

    .venv/bin/python bench/doctor_fixtures.py      # writes what tests/data/trl_logs lacks
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "trl_logs"
RUNS = {"collapse": dict(lr=1e-2, steps=60), "healthy": dict(lr=3e-4, steps=60),
        # two reward functions: the even-token reward the policy can move, and a strict "correct
        # sum" check the untrained model never passes (always 0): a constant term teaches nothing
        "composition": dict(lr=3e-4, steps=60, strict=True),
        # a verifier that rewards the wrong thing: training prompts pay for an even first token,
        # held-out prompts (evaluated every 5 steps) score what the task wanted, an odd one
        "divergence": dict(lr=5e-3, steps=60, gamed=True),
        # a reward function that now and then returns an extreme value (one sample in ~8 steps
        # scores 50), rewards not scaled by the group std: recurring gradient spikes
        "spikes": dict(lr=3e-4, steps=60, spiky=True)}


def train(name: str, lr: float, steps: int, out: Path, strict: bool = False, gamed: bool = False,
          spiky: bool = False) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import build_tiny, load

    torch.set_num_threads(1)

    def even_token(completions, completion_ids, **kwargs):
        return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]

    calls = [0]

    def spiky_token(completion_ids, **kwargs):
        calls[0] += 1
        out = even_token(None, completion_ids)
        if calls[0] % 8 == 0:
            out[0] = 50.0
        return out

    def gamed_token(completion_ids, split, **kwargs):
        return [float(bool(ids) and ids[0] % 2 == (0 if part == "train" else 1))
                for ids, part in zip(completion_ids, split)]

    def correct_sum(prompts, completions, **kwargs):
        out = []
        for prompt, text in zip(prompts, completions):
            a, b = prompt.split(":")[1].split("=")[0].split("+")
            out.append(1.0 if text.strip().startswith(str(int(a) + int(b))) else 0.0)
        return out

    model, tokenizer = load(build_tiny())
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(Path(tmp) / "tb")   # read by TensorBoardCallback
        config = GRPOConfig(output_dir=tmp, report_to="tensorboard",
                            use_cpu=True, bf16=False, seed=0, per_device_train_batch_size=32, num_generations=8,
                            max_completion_length=8, learning_rate=lr, lr_scheduler_type="constant",
                            max_steps=steps, logging_steps=1, save_strategy="steps", save_steps=steps,
                            save_only_model=True, disable_tqdm=True,
                            **(dict(eval_strategy="steps", eval_steps=5, per_device_eval_batch_size=16) if gamed else {}),
                            **(dict(scale_rewards="none") if spiky else {}))
        data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:", "split": "train"} for i in range(64)])
        held = Dataset.from_list([{"prompt": f"Q: {50 + i}+{30 + i}= A:", "split": "eval"} for i in range(16)])
        funcs = spiky_token if spiky else gamed_token if gamed else [even_token, correct_sum] if strict else even_token
        trainer = GRPOTrainer(model=model, args=config, reward_funcs=funcs, train_dataset=data,
                              eval_dataset=held if gamed else None, processing_class=tokenizer)
        trainer.train()
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(tmp) / f"checkpoint-{steps}" / "trainer_state.json", out / "trainer_state.json")
        shutil.copytree(Path(tmp) / "tb", out / "tb", dirs_exist_ok=True)


if __name__ == "__main__":
    for name, kw in RUNS.items():
        if not (OUT / name / "trainer_state.json").exists():
            print(f"training {name}", file=sys.stderr, flush=True)
            train(name, out=OUT / name, **kw)
