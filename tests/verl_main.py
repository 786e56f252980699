"""A real `python -m verl.trainer.main_ppo` GRPO run on CPU, for tests/test_verl.py (runs in .venv/verl).

verl's own everything: hydra config (ppo_trainer.yaml, defaults except what a 2-core CPU box and
a tiny model need), main_ppo's routing (v1 trainer with TransferQueue by default, the legacy one
with --legacy), a local Ray cluster, the TaskRunner, RLHFDataset, the actor worker group (FSDP2
engine), the agent loop and reward loop workers, the checkpoint-engine weight sync, Tracking.
forksight is loaded by `import verl` through its `verl.plugins` entry point and named only in
`trainer.logger`. Test-only, registered through verl's plugin points (tests/verl_hf_rollout.py):
the CPU platform and an HF-`generate` rollout replica standing in for vLLM; the reward is
verl's `custom_reward_function` (tests/verl_reward.py).

Usage: python tests/verl_main.py OUT_DIR --url URL [--legacy] [--steps N] [--nan-prompt I] [--stop-on-alert]
       [--sampler-logits bfloat16] [--set KEY=VALUE ...]
Writes OUT_DIR/model, train.parquet, verdicts.jsonl (the reward's verdicts by prompt index),
rollouts.jsonl (what the rollout answered, when asked for log-probs) and summary.json
({"returncode", "wall_s"}); main_ppo's output goes to OUT_DIR/main_ppo.log.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def make_data(out: Path, n_prompts: int, nan_prompt: int | None) -> Path:
    import random

    import pandas as pd

    rng = random.Random(0)
    rows = []
    for i in range(n_prompts):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        truth = "nan" if i == nan_prompt else str(a + b)[::-1]
        rows.append({"data_source": "forksight/arith", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": truth},
                     "extra_info": {"index": i}})
    path = out / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def overrides(model: Path, data: Path, args) -> list[str]:
    cpu = [  # what this machine needs: one CPU "device", fp32, no flash-attn, a small Ray cluster
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",
        # verl checks for a GPU/NPU resource before placing workers: one logical "GPU" (the CPU
        # platform places them on CPU bundles); TransferQueue's controller and storage unit each
        # hold a Ray CPU, so Ray gets more logical CPUs than the 2 cores
        "ray_kwargs.ray_init.num_cpus=8", "+ray_kwargs.ray_init.num_gpus=1", "+ray_kwargs.ray_init.include_dashboard=False",
        "+ray_kwargs.ray_init.object_store_memory=300000000",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    run = [  # a tiny GRPO run
        "algorithm.adv_estimator=grpo", f"data.train_files={data}", f"data.val_files={data}",
        "data.train_batch_size=4", "data.max_prompt_length=16", "data.max_response_length=8",
        "data.dataloader_num_workers=0", "data.shuffle=False", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
        f"reward.custom_reward_function.path={TESTS / 'verl_reward.py'}",
        f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=100", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.project_name=forksight-test", f"trainer.experiment_name={args.run}",
        f"trainer.default_local_dir={args.out / 'ckpt'}",
    ]
    forksight = [f"trainer.logger=[{args.logger}]", f"+trainer.forksight.url={args.url}",
                 f"+trainer.forksight.stop_on_alert={args.stop_on_alert}", "+trainer.forksight.token_groups=4"]
    if args.legacy:
        run.append("trainer.use_v1=False")
    return cpu + run + forksight + list(args.set)


def main(args) -> dict:
    from transformers import AutoTokenizer

    from forksight.trainer.model import build_tiny

    out = args.out
    model = build_tiny(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model)
    data = make_data(out, 16, args.nan_prompt)
    ray_tmp = tempfile.mkdtemp(prefix="fs-ray-")      # short: Ray's socket paths must fit in 107 bytes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "VERL_USE_EXTERNAL_MODULES": "verl_hf_rollout", "VERL_PLATFORM": "cpu",
           "RAY_TMPDIR": ray_tmp, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
           "RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1", "FORKSIGHT_TEST_VERDICTS": str(out / "verdicts.jsonl"),
           "FORKSIGHT_TEST_ROLLOUTS": str(out / "rollouts.jsonl"), "FORKSIGHT_TEST_SAMPLER_LOGITS": args.sampler_logits}
    t0 = time.perf_counter()
    try:
        with open(out / "main_ppo.log", "w") as log:
            proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides(model, data, args)],
                                  cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    summary = {"returncode": proc.returncode, "wall_s": time.perf_counter() - t0}
    (out / "summary.json").write_text(json.dumps(summary))
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--url", required=True, help="a running `forksight serve`")
    parser.add_argument("--run", default="verl-main")
    parser.add_argument("--logger", default="console,forksight", help="trainer.logger's backends, comma-separated")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--legacy", action="store_true", help="trainer.use_v1=False")
    parser.add_argument("--nan-prompt", type=int, help="this prompt's reward is NaN (data.shuffle=False)")
    parser.add_argument("--stop-on-alert", action="store_true")
    parser.add_argument("--sampler-logits", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="the rollout rounds its logits to this dtype (tests/verl_hf_rollout.py)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one more hydra override")
    parser.add_argument("--timeout", type=int, default=400)
    print(json.dumps(main(parser.parse_args())))
