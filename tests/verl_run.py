"""A verl GRPO run on CPU, driven by verl's own RayPPOTrainer.fit (legacy trainer), for
tests/test_verl.py. Runs in the verl environment (.venv/verl), not under pytest.

verl's real code: hydra config (ppo_trainer.yaml), RLHFDataset + StatefulDataLoader, DataProto,
fit()'s step loop, GRPO advantages (compute_grpo_outcome_advantage via compute_advantage),
compute_data_metrics, Tracking (file backend + forksight backend), and the actor worker itself:
ActorRolloutRefWorker with its FSDP2 engine (entropy, log p and Σp² in prepare_model_outputs,
ppo_loss, the optimizer), one rank in this process on a test-only CPU platform (verl_cpu.py).
What cannot run on CPU is replaced: HF `generate` on the actor's module in place of vLLM/SGLang
(rollout + rule reward), and direct calls in place of Ray's worker-group dispatch.

Usage: python tests/verl_run.py OUT_DIR STEPS [options: --help]
Writes OUT_DIR/forksight.duckdb (or streams to --url), metrics.jsonl (verl's file logger),
logits_<step>.pt and summary.json.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import verl  # noqa: F401 - loads the `verl.plugins` entry points, forksight.verl among them

PLUGIN_LOADED = "forksight.verl" in sys.modules   # nothing below imported it: the entry point did
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.model import compute_position_id_with_mask
from verl.workers.utils.padding import no_padding_2_padding

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


# ---------------------------------------------------------------------------- data and config
def make_data(out: Path, n_prompts: int) -> Path:
    import random

    import pandas as pd

    rng = random.Random(0)
    rows = []
    for i in range(n_prompts):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"data_source": "forksight/arith", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)[::-1]},
                     "extra_info": {"index": i}})
    path = out / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def make_config(model: Path, data: Path, out: Path, n: int, args):
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    sink = f"+trainer.forksight.url={args.url}" if args.url else f"+trainer.forksight.db={out / 'forksight.duckdb'}"
    overrides = [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={data}", f"data.val_files={data}", "data.train_batch_size=4",
        "data.max_prompt_length=16", "data.max_response_length=8", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.log_prob_micro_batch}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.model.use_remove_padding={not args.padded}",
        # CPU: full precision, attention without flash-attn
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "trainer.logger=[file]" if args.without_forksight else "trainer.logger=[file,forksight]",
        f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=100",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.balance_batch=False", "trainer.use_v1=False", "trainer.device=cpu", "trainer.resume_mode=disable",
        "trainer.project_name=forksight-test", "trainer.experiment_name=verl-grpo",
        sink, f"+trainer.forksight.stop_on_alert={args.stop_on_alert}", "+trainer.forksight.token_groups=2",
    ]
    if args.bypass:      # old log p = the rollout's: verl skips _compute_old_log_prob (no entropy on the driver)
        overrides += ["algorithm.rollout_correction.bypass_mode=True"]
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


# ---------------------------------------------------------------------------- in-process stand-ins
class HFRollout:
    """generate_sequences as verl's agent loop returns it, sampled with HF generate (top_k=0,
    top_p=1: the full softmax), scored by a rule reward into rm_scores at the last token."""

    def __init__(self, model, tokenizer, prompt_len: int, response_len: int, seed: int = 0,
                 rollout_log_probs: bool = False):
        self.model, self.tokenizer = model, tokenizer
        self.rollout_log_probs = rollout_log_probs
        self.prompt_len, self.response_len = prompt_len, response_len
        self.generator_seed = seed
        self.verdicts: dict[int, dict] = {}
        self.calls = 0

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        self.calls += 1
        tok, eos = self.tokenizer, self.tokenizer.eos_token_id
        prompts = [tok.apply_chat_template(list(m), tokenize=True, add_generation_prompt=True)
                   for m in gen_batch.non_tensor_batch["raw_prompt"]]
        prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
        B, P, R = len(prompts), self.prompt_len, self.response_len
        prompt_ids = torch.full((B, P), eos, dtype=torch.long)
        prompt_mask = torch.zeros((B, P), dtype=torch.long)
        for i, ids in enumerate(prompts):
            prompt_ids[i, P - len(ids):], prompt_mask[i, P - len(ids):] = torch.tensor(ids), 1
        torch.manual_seed(self.generator_seed + self.calls)
        with torch.no_grad():
            gen = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, top_k=0,
                                      top_p=1.0, temperature=1.0, max_new_tokens=R, min_new_tokens=1,
                                      pad_token_id=eos, eos_token_id=eos, output_scores=True,
                                      return_dict_in_generate=True)
        out = gen.sequences
        # log p of each sampled token under the sampling distribution (vLLM's calculate_log_probs)
        scores = torch.stack(gen.scores, dim=1).float().log_softmax(-1)          # [B, steps, V]
        sampled_logp = scores.gather(-1, out[:, P:P + scores.shape[1], None]).squeeze(-1)
        responses = torch.full((B, R), eos, dtype=torch.long)
        response_mask = torch.zeros((B, R), dtype=torch.long)
        gen = out[:, P:]
        for i in range(B):
            row = gen[i].tolist()
            length = row.index(eos) + 1 if eos in row else len(row)   # the EOS is part of the response
            responses[i, :length], response_mask[i, :length] = torch.tensor(row[:length]), 1
        truth = [rm["ground_truth"] for rm in gen_batch.non_tensor_batch["reward_model"]]
        texts = tok.batch_decode([r[m.bool()].tolist() for r, m in zip(responses, response_mask)],
                                 skip_special_tokens=True)
        acc = [g[0] in t for t, g in zip(texts, truth)]  # lenient: the answer's first digit appears
        rm_scores = torch.zeros((B, R), dtype=torch.float32)
        rm_scores[torch.arange(B), response_mask.sum(1) - 1] = torch.tensor(acc, dtype=torch.float32)
        attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
        position_ids = compute_position_id_with_mask(attention_mask)
        self.verdicts[self.calls] = {"uid": list(gen_batch.non_tensor_batch["uid"]), "acc": acc}
        batch = {"prompts": prompt_ids, "responses": responses, "response_mask": response_mask,
                 "input_ids": torch.cat([prompt_ids, responses], dim=1), "attention_mask": attention_mask,
                 "position_ids": position_ids, "rm_scores": rm_scores}
        if self.rollout_log_probs:
            logp = torch.zeros((B, R))
            logp[:, :sampled_logp.shape[1]] = sampled_logp
            batch["rollout_log_probs"] = logp * response_mask
        non_tensor = {"acc": np.array(acc), "multi_modal_inputs": np.array([{} for _ in range(B)], dtype=object)}
        return DataProto.from_dict(tensors=batch, non_tensors=non_tensor,
                                   meta_info={"timing": {}, "reward_extra_keys": ["acc"]})


class InProcessWorkerGroup:
    """actor_rollout_wg with one rank in this process: verl's own ActorRolloutRefWorker (FSDP2
    engine, real ppo_loss and optimizer; tests/verl_cpu.py). It also saves each old-log-prob
    pass's response logits, from the same weights, for the test to recompute with token_stats."""

    def __init__(self, worker, out: Path, nan_at: int | None, temperature: float):
        self.worker, self.out, self.nan_at, self.temperature = worker, out, nan_at, temperature
        self.module = worker.actor.engine.module
        self.log_prob_calls = self.updates = 0

    def compute_log_prob(self, batch_td):
        self.log_prob_calls += 1
        with torch.no_grad():
            logits = [self.module(input_ids=ids[None], position_ids=pos[None]).logits[0].float() / self.temperature
                      for ids, pos in zip(batch_td["input_ids"].unbind(), batch_td["position_ids"].unbind())]
        torch.save({"logits": no_padding_2_padding(torch.cat(logits), batch_td), "mask": batch_td["response_mask"],
                    "responses": batch_td["responses"]}, self.out / f"logits_{self.log_prob_calls}.pt")
        return self.worker.compute_log_prob(batch_td)

    def update_actor(self, batch_td):
        self.updates += 1
        output = self.worker.update_actor(batch_td)
        if self.updates == self.nan_at:                  # a diverged loss, on request
            metrics = dict(tu.get(output, "metrics"))
            metrics.update({k: float("nan") for k in metrics if k.endswith("pg_loss")})
            tu.assign_non_tensor(output, metrics=metrics)
        return output


class NoWeightSync:
    """checkpoint_manager: generation uses the actor's own module, so there is nothing to sync."""

    def update_weights(self, step):
        pass

    def sleep_replicas(self):
        pass


# ---------------------------------------------------------------------------- main
def main(args) -> dict:
    from transformers import AutoTokenizer
    from verl.single_controller.ray import ResourcePoolManager
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl_cpu import actor_worker

    import forksight.hooks.integrations.verl as forksight_verl
    from forksight.hooks.integrations.verl_install import STATE
    from forksight.trainer.model import build_tiny

    out = Path(args.out)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model_dir = build_tiny(out / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    data = make_data(out, n_prompts=16)
    n = 4
    config = make_config(model_dir, data, out, n, args)
    dataset = RLHFDataset(data_files=[str(data)], tokenizer=tokenizer, config=config.data)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(out / "metrics.jsonl")
    pools = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={Role.ActorRollout: "global_pool"})
    trainer = RayPPOTrainer(config=config, tokenizer=tokenizer, role_worker_mapping={Role.ActorRollout: object},
                            resource_pool_manager=pools, train_dataset=dataset, val_dataset=dataset,
                            device_name="cpu")
    workers = InProcessWorkerGroup(actor_worker(config.actor_rollout_ref), out, args.nan_at,
                                   config.actor_rollout_ref.rollout.temperature)
    trainer.actor_rollout_wg = workers
    # generate with the actor's own (FSDP) module: always on-policy, nothing to sync
    trainer.async_rollout_manager = HFRollout(workers.module, tokenizer, config.data.max_prompt_length,
                                              config.data.max_response_length, rollout_log_probs=args.bypass)
    trainer.checkpoint_manager = NoWeightSync()
    t0 = time.perf_counter()
    trainer.fit()
    wall = time.perf_counter() - t0
    summary = {"steps_run": trainer.actor_rollout_wg.log_prob_calls, "wall_s": wall,
               "verdicts": trainer.async_rollout_manager.verdicts, "n": n, "logger_live": STATE.logger is not None,
               "forksight_loaded": PLUGIN_LOADED,
               "entry_points": [ep.value for ep in importlib.metadata.entry_points(group="verl.plugins")]}
    summary.update(forksight_verl.LAST_RUN)
    (out / "summary.json").write_text(json.dumps(summary))
    return summary


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output folder")
    parser.add_argument("steps", type=int)
    parser.add_argument("--nan-at", type=int, help="report the policy loss of this update as NaN")
    parser.add_argument("--stop-on-alert", action="store_true")
    parser.add_argument("--without-forksight", action="store_true", help="trainer.logger=[file] (timing)")
    parser.add_argument("--url", help="stream to this collector instead of OUT/forksight.duckdb")
    parser.add_argument("--bypass", action="store_true", help="rollout_correction.bypass_mode=True")
    parser.add_argument("--log-prob-micro-batch", type=int, default=16, help="rows per old-log-prob micro-batch")
    parser.add_argument("--padded", action="store_true", help="use_remove_padding=False")
    result = main(parser.parse_args())
    print(json.dumps({k: v for k, v in result.items() if k != "verdicts"}))
