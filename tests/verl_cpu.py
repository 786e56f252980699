"""Test-only: verl's real actor worker (ActorRolloutRefWorker + FSDP2 engine) in this process on CPU.

verl 0.9.1 knows CUDA, NPU and ROCm platforms and falls back to CUDA; this registers a CPU
platform (gloo, no device memory), maps the FSDP engine to the `cpu` device, opens a one-rank
gloo process group, and builds the worker the way verl's Ray worker group would (init_model).
"""
from __future__ import annotations

import contextlib
import os
import socket

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry, set_platform


class _CpuDeviceModule:
    """torch.cpu, plus the torch.cuda-style calls verl makes on its device module."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name) if hasattr(torch.cpu, name) else (lambda *args, **kwargs: None)

    def is_available(self):
        return True

    def current_device(self):
        return 0

    def device_count(self):
        return 1

    def get_device_name(self, *args):
        return "CPU"

    def mem_get_info(self, *args):
        return (1 << 34, 1 << 34)

    def memory_allocated(self, *args):
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """Enough of verl's platform interface for the FSDP engine on one CPU process."""

    device_name = property(lambda self: "cpu")
    vendor_name = property(lambda self: "cpu")
    device_module = property(lambda self: _CpuDeviceModule())

    def is_available(self):
        return True

    def is_platform_available(self, use_smi_check=False):
        return False                      # never auto-detected: only set_platform picks it

    def current_device(self):
        return "cpu"                      # verl moves modules with .to(get_device_id())

    def device_count(self):
        return 1

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CPU_VISIBLE_DEVICES"

    def ray_resource_name(self):
        return "CPU"

    def ray_resource_options(self, num_gpus):
        return {"num_cpus": 1}

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def rollout_env_vars(self):
        return {}

    def get_collective_module(self):
        return None

    @contextlib.contextmanager
    def nvtx_range(self, msg):
        yield

    def get_device_capability(self, device_index=0):
        return None, None

    def get_device_uuid(self, device_id):
        return "cpu"

    def cudart(self):
        return None

    set_device = synchronize = set_allocator_settings = empty_cache = profiler_start = profiler_stop = \
        lambda self, *args: None

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


def register_cpu_engines() -> None:
    """verl's FSDP language-model engine for the `cpu` device (its registry knows cuda/npu)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    for backend in ("fsdp", "fsdp2"):
        EngineRegistry._engines["language_model"][backend]["cpu"] = FSDPEngineWithLMHead


def for_ray_workers() -> None:
    """In verl's Ray workers (VERL_PLATFORM=cpu selects PlatformCPU): verl opens its process group
    with "cpu:gloo,<device>:<backend>", which on CPU names the cpu device twice; torch refuses
    that, so the duplicate is dropped; the CPU engines are registered before the engine is built."""
    original = torch.distributed.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if isinstance(backend, str) and "," in backend:
            backend = ",".join(dict.fromkeys(backend.split(",")))
        register_cpu_engines()
        return original(backend, *args, **kwargs)

    torch.distributed.init_process_group = init_process_group


def actor_worker(actor_rollout_ref_config):
    """verl's ActorRolloutRefWorker (role 'actor') with its model initialised, on CPU."""
    set_platform(PlatformCPU())
    register_cpu_engines()
    if not torch.distributed.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo")   # verl's own init asks for "cpu:gloo,cpu:gloo"
    from verl.workers.engine_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(actor_rollout_ref_config, role="actor")
    worker.init_model()
    return worker
