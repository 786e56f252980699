"""Test-only verl plugin: the CPU platform and an HF-`generate` rollout, for a real `main_ppo` on CPU.

Loaded in every process of the run through verl's own plugin point (VERL_USE_EXTERNAL_MODULES=
verl_hf_rollout, tests/ on PYTHONPATH, VERL_PLATFORM=cpu); nothing in verl's files is changed.
It registers
- the CPU platform (tests/verl_cpu.py: gloo, FSDP2 on `cpu`) with verl's PlatformRegistry;
- rollout `hf`: a replica (RolloutReplicaRegistry) whose server actor answers verl's token-in /
  token-out `generate` with HF `generate` on the hybrid worker's own FSDP module (the worker and
  the rollout share one process as vLLM's hybrid engine shares a GPU, so the rollout is always on
  the current weights and a weight sync has nothing to copy), and the worker-side ServerAdapter
  (verl's rollout registry) that tells the server the weight version after each sync.
With `rollout.calculate_log_probs=True` the replica answers the log p of each sampled token under
the distribution it sampled from, as vLLM's logprobs do. FORKSIGHT_TEST_SAMPLER_LOGITS=bfloat16
rounds the logits to bfloat16 before sampling (an engine whose LM head runs in bf16, while the
trainer's FSDP forward stays float32: a real numeric mismatch); FORKSIGHT_TEST_ROLLOUTS=PATH appends
each answer (prompt ids, response ids, log p) to PATH as JSON lines, for the tests to compare.
vLLM / SGLang cannot run here; this stands in for them and nothing else.
"""
from __future__ import annotations

import json
import os

import ray
import torch
from transformers import LogitsProcessor, LogitsProcessorList
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

import verl_cpu  # registers PlatformCPU (VERL_PLATFORM=cpu selects it)

verl_cpu.for_ray_workers()

SERVER = "forksight_hf_server_{}"


class RoundLogits(LogitsProcessor):
    """Logits as an engine computing them in `dtype` would have them (sampling and log p both)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype

    def __call__(self, input_ids, scores):
        return scores.to(self.dtype).to(scores.dtype)


def _generate(worker, prompt_ids: list[int], params: dict, max_new_tokens: int, seed: int):
    """Runs inside the actor worker (Ray's __ray_call__): HF generate on the FSDP module."""
    for role in getattr(worker, "worker_dict", {}).values():       # verl's colocated WorkerDict
        if hasattr(role, "actor"):
            worker = role
    module = worker.actor.engine.module
    tokenizer_eos = module.config.eos_token_id
    torch.manual_seed(seed)
    top_k = int(params.get("top_k", -1) or -1)
    temperature = float(params.get("temperature", 1.0))
    dtype = os.environ.get("FORKSIGHT_TEST_SAMPLER_LOGITS", "float32")
    processors = LogitsProcessorList([RoundLogits(getattr(torch, dtype))] if dtype != "float32" else [])
    with torch.no_grad():
        out = module.generate(input_ids=torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                              dtype=torch.long), do_sample=temperature > 0, temperature=max(temperature, 1e-5),
                              top_k=top_k if top_k > 0 else 0, top_p=float(params.get("top_p", 1.0)),
                              max_new_tokens=max_new_tokens, min_new_tokens=1, pad_token_id=tokenizer_eos,
                              eos_token_id=tokenizer_eos, output_scores=True, return_dict_in_generate=True,
                              logits_processor=processors)
    response = out.sequences[0, len(prompt_ids):].tolist()
    if tokenizer_eos in response:
        response = response[: response.index(tokenizer_eos) + 1]     # the EOS is part of the response
    # log p of each sampled token under the sampling distribution (vLLM's logprobs=True): generate's
    # scores are the logits after every processor and warper, the ones it sampled from
    scores = torch.stack(out.scores, dim=1)[0, : len(response)].float().log_softmax(-1)
    logprobs = scores.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()
    return response, logprobs


@ray.remote(num_cpus=0)
class HFServer:
    """verl's rollout server interface (generate, sleep, wake_up, ...) over the worker's module."""

    def __init__(self, worker, response_length: int, seed: int):
        self.worker, self.response_length, self.seed = worker, response_length, seed
        self.global_steps = None
        self.requests = 0

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, image_data=None, video_data=None,
                       **kwargs) -> TokenOutput:
        self.requests += 1
        max_new = min(int(sampling_params.get("max_tokens") or self.response_length), self.response_length)
        ids, logprobs = await self.worker.__ray_call__.remote(_generate, list(prompt_ids), dict(sampling_params),
                                                              max_new, self.seed * 100_003 + self.requests)
        dump = os.environ.get("FORKSIGHT_TEST_ROLLOUTS")
        if dump and sampling_params.get("logprobs"):
            with open(dump, "a") as f:
                f.write(json.dumps({"prompt": list(prompt_ids), "response": ids, "logprobs": logprobs}) + "\n")
        return TokenOutput(token_ids=ids, log_probs=logprobs if sampling_params.get("logprobs") else None,
                           stop_reason="completed", extra_fields={"global_steps": self.global_steps})

    async def set_global_steps(self, global_steps):
        self.global_steps = global_steps

    async def _nothing(self, *args, **kwargs):
        return None

    wake_up = sleep = resume_generation = clear_kv_cache = release_kv_cache = resume_kv_cache = _nothing
    abort_all_requests = start_profile = stop_profile = _nothing


class HFReplica(RolloutReplica):
    """One HFServer per replica, on the hybrid worker the replica was given."""

    async def launch_servers(self):
        server = HFServer.options(name=SERVER.format(self.replica_rank)).remote(
            self.workers[0], self.config.response_length, int(os.environ.get("FORKSIGHT_TEST_SEED", "0")))
        self.servers = [server]
        self._server_handle, self._server_address = server, f"hf-replica-{self.replica_rank}"

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """The worker side: weights are already where generation runs; pass on the weight version."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        self.replica_rank = max(replica_rank, 0)

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: int | None = None,
                             **kwargs):
        await ray.get_actor(SERVER.format(self.replica_rank)).set_global_steps.remote(global_steps)


RolloutReplicaRegistry.register("hf", lambda: HFReplica)
rollout_base._ROLLOUT_REGISTRY[("hf", "async")] = f"{__name__}.HFServerAdapter"
