"""The training loop: `train(config, sink=None) -> TrainResult`. Reads top to bottom: set up
(distributed, models, sink), then `step.train_step` per step, evaluation and checkpoints.
Under torchrun every rank trains on its own prompts, the gradients are all-reduced (gloo on
CPU), and every rank streams its own records.
"""
from __future__ import annotations

import copy
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from forksight.base.interfaces import Sink
from forksight.hooks import metrics
from forksight.trainer.config import TrainConfig
from forksight.trainer.model import build_tiny, load
from forksight.trainer.rollout import generate, head_is_plain
from forksight.trainer.sampler import Sampler
from forksight.trainer.step import Context, train_step
from forksight.trainer.tasks import ProblemPool, Task, held_out, make_task


@dataclass
class TrainResult:
    """What a finished (or stopped) run reports back."""

    run_id: str
    steps: int                    # last completed step (counting resumed ones)
    final: dict[str, float]       # scalars of the last step
    eval: dict[str, float] = field(default_factory=dict)  # last eval/pass@k
    stopped_early: bool = False   # sink.should_stop (a critical alert) ended the run
    checkpoint: str | None = None
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------
# setup


def _dist(device: str = "cpu") -> tuple[int, int]:
    """(rank, world size); joins the torchrun process group (gloo on CPU, NCCL on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if world > 1:
        return torch.distributed.get_rank(), world
    return 0, 1


def _barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()


def resolve_models(config: TrainConfig, task: Task, rank: int, world: int) -> tuple[str, str | None]:
    """Policy and teacher directories; rank 0 warms up (cached), the others wait and reuse."""
    from forksight.trainer.warmup import ensure_warm

    base = config.model or str(build_tiny())
    policy, teacher = base, config.teacher
    if rank == 0:
        kw = dict(loss=config.warmup_loss, seed=config.seed,
                  max_seconds=config.warmup_max_seconds, progress=config.progress)
        if config.warmup:
            policy = str(ensure_warm(base, task, target_pass=config.warmup_pass, **kw))
        if config.is_distill and teacher is None:
            # "longer-trained tiny model": the policy's warm-up continued to a higher pass@1
            teacher = str(ensure_warm(policy, task, target_pass=config.teacher_pass, **kw))
    if world > 1:
        shared = [policy, teacher]
        torch.distributed.broadcast_object_list(shared, src=0)
        policy, teacher = shared
    return policy, teacher


def open_run_sink(config: TrainConfig, run_name: str, rank: int, world: int):
    """The sink for this rank. One run for all ranks: rank 0 creates it, the others join the
    live run of the same name (the collector merges a step across ranks). With db=..., only
    rank 0 logs: a DuckDB file belongs to one process (use url for multi-rank runs)."""
    from forksight.base.runspec import RunSpec
    from forksight.monitor.sinks.client import NullSink, open_sink

    if not config.stream:
        return NullSink(run_name)
    spec = RunSpec.of(run_name, strategy=config.strategy, model=config.model or "tiny-qwen2",
                      config=config.model_dump(), project=config.project, stop_on_alert=config.stop_on_alert)
    sink = open_sink(spec.replace(resume=config.resume), url=config.url, db=config.db) if rank == 0 else None
    _barrier(world)  # the run exists before the other ranks ask to join it
    if rank != 0:
        sink = open_sink(spec.replace(rank=rank), url=config.url, db=config.db)
    return sink


def setup(config: TrainConfig, sink: Sink | None = None, *, model=None, tokenizer=None,
          teacher=None) -> tuple[Context, Any]:
    """Build the step context (and the sink unless one is given). model/tokenizer/teacher:
    use these objects instead of loading (benchmarks, notebooks)."""
    device = config.device
    if device == "cuda" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"  # one GPU per rank
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # NCCL collectives use the current device
    rank, world = _dist(device)
    dtype = getattr(torch, config.dtype)
    task = make_task(config.task, level=config.level, reverse=config.reverse, path=config.task_path,
                     graded=config.graded)
    if model is None:    # the warm-up learns the whole task, never only the RL pool
        policy_path, teacher_path = resolve_models(config, task, rank, world)
        model, tokenizer = load(policy_path, dtype=dtype)
    else:
        policy_path, teacher_path = "(given)", config.teacher
    if config.problem_pool:
        task = ProblemPool(task, config.problem_pool, config.seed)
    model.to(device)
    torch.manual_seed(config.seed)  # identical initial weights are given; this seeds the rest
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    ref = None
    if config.beta > 0:  # the reference is the policy as it starts
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    teacher = teacher if config.is_distill else None
    if config.is_distill and teacher is None:
        if teacher_path is None:
            raise ValueError(f"strategy {config.strategy!r} needs a teacher: set teacher (a model "
                             "directory) or keep the default warm-up teacher")
        teacher = load(teacher_path, dtype=dtype)[0].eval().requires_grad_(False)
    if teacher is not None:
        teacher.to(device)
    run_name = config.run or f"{config.strategy}-{task.name}-s{config.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    if world > 1:  # ranks may disagree on the clock: rank 0's name wins
        shared = [run_name]
        torch.distributed.broadcast_object_list(shared, src=0)
        run_name = shared[0]
    if sink is None:
        sink = open_run_sink(config, run_name, rank, world)
    from forksight.hooks.capture.report import StepReporter

    reporter = StepReporter(sink, tokenizer, token_groups=config.token_groups, fork_rule=config.fork_rule)
    sampler = Sampler(model, config.sampler_dtype, noise=config.sampler_noise,
                      noise_from_step=config.sampler_noise_from_step, seed=config.seed)
    from forksight.trainer.probe import make_prober

    ctx = Context(config, model, tokenizer, optimizer, task, reporter, ref, teacher, rank, world,
                  policy_path, run_name, head_is_plain(model), sampler=sampler,
                  prober=make_prober(config, sink, tokenizer))
    return ctx, sink


# ---------------------------------------------------------------------------------------------
# evaluation and checkpoints


@torch.no_grad()
def evaluate(ctx: Context, step: int | None = None) -> dict[str, float]:
    """eval/pass@k on the held-out problems with eval_samples samples each; at a probed step (value
    probes on), a few of these held-out completions are probed too (probe/eval/*)."""
    cfg = ctx.config
    problems = held_out(ctx.task, cfg.eval_problems, cfg.seed)
    torch.manual_seed(cfg.seed + 424242)
    roll = generate(ctx.model, ctx.tokenizer, [p.prompt for p in problems], cfg.eval_samples,
                    temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens)
    n = cfg.eval_samples
    verdicts = [[ctx.task.verify(p, roll.texts[i * n + j])[1] for j in range(n)]
                for i, p in enumerate(problems)]
    out = {f"eval/pass@{k}": v for k, v in metrics.pass_at_k_groups(verdicts).items()}
    if step is not None and ctx.prober is not None and ctx.prober.due(step):
        from forksight.trainer.probe import probe_eval

        probe_eval(ctx, step, roll, problems, n)
    return out


def checkpoint_path(config: TrainConfig, run_name: str) -> Path:
    return Path(config.out_dir) / run_name / "checkpoint.pt"


def save_checkpoint(ctx: Context, path: Path, step: int, run_id: str) -> None:
    """Weights, optimiser state, step and run id (rank 0 only; ranks hold identical weights)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": ctx.model.state_dict(), "optimizer": ctx.optimizer.state_dict(),
                "step": step, "run_id": run_id, "model_path": ctx.model_path,
                "config": ctx.config.model_dump(),
                "reference": ctx.reference.state() if ctx.reference is not None else None}, tmp)
    tmp.replace(path)


def load_checkpoint(ctx: Context, path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"resume: no checkpoint at {path} (was the run named differently, "
                                "or out_dir changed?)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    ctx.model.load_state_dict(state["model"])
    ctx.optimizer.load_state_dict(state["optimizer"])
    return state


# ---------------------------------------------------------------------------------------------
# the loop


def train(config: TrainConfig, sink: Sink | None = None) -> TrainResult:
    """Run (or resume) a training run; streams to `sink`, else to the sink the config names.
    Ctrl-C (SIGINT) ends it cleanly: checkpoint saved, records flushed, run marked stopped."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    ctx, sink = setup(config, sink)
    start, reference_state = 0, None
    ckpt = checkpoint_path(config, ctx.run_name)
    if config.resume:
        state = load_checkpoint(ctx, ckpt)
        start, reference_state = state["step"], state.get("reference")
    from forksight.trainer.reference import make_reference

    ctx.reference = make_reference(ctx, sink, reference_state)      # a resumed run keeps its set
    if ctx.reference is not None and ctx.reference.base is None:
        ctx.reference.rescore(ctx.model, start)                     # the base: the policy as the run starts
    run_id = getattr(sink, "run_id", None) or ctx.run_name
    bar = tqdm(total=config.steps, initial=start, desc=run_id, unit="step",
               disable=not config.progress or ctx.rank != 0)
    trackers = None
    if config.report_to and ctx.rank == 0:            # --report-to: the run in the user's own trackers
        from forksight.trainer.trackers import OwnTrackers

        trackers = OwnTrackers(config, run_id, sink)
    scalars: dict[str, float] = {}
    last_eval: dict[str, float] = {}
    stopped = interrupted = False
    done = start  # last completed step
    stop_request = _StopRequest()
    if config.eval_every and start == 0 and ctx.rank == 0:
        # the base model's held-out pass@k at step 0: the line a collapse's cost is read against
        last_eval = evaluate(ctx, 0)
        sink.log_scalars(0, last_eval)
    try:
        for step in range(start + 1, config.steps + 1):
            if stop_request.is_set():
                raise KeyboardInterrupt
            with stop_request:  # a step is atomic: Ctrl-C ends the run after it, not inside it
                scalars = train_step(ctx, step)
                # counted inside: a signal landing as the handlers are restored raises on the way
                # out, and the step whose records were streamed must still be the one reported
                done = step
            if trackers is not None:
                trackers.step(step, scalars, ctx.reporter.last_tokens)
            bar.update(1)
            bar.set_postfix(reward=f"{scalars.get('reward/mean', 0):.2f}",
                            H=f"{scalars.get('entropy/mean', 0):.3f}",
                            p1=f"{scalars.get('pass@1', 0):.2f}")
            if config.eval_every and step % config.eval_every == 0 and ctx.rank == 0:
                last_eval = evaluate(ctx, step)
                sink.log_scalars(step, last_eval)
            if ctx.reference is not None and ctx.reference.due(step):
                ctx.reference.rescore(ctx.model, step)
            if ctx.rank == 0 and config.save_every and step % config.save_every == 0:
                save_checkpoint(ctx, ckpt, step, run_id)
            if _should_stop(sink, ctx.world):
                stopped = True
                break
        if stop_request.is_set():
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        stopped = interrupted = True
    bar.close()
    if ctx.rank == 0 and done > start:
        if not interrupted and (not config.eval_every or done % config.eval_every):
            last_eval = evaluate(ctx, done)
            sink.log_scalars(done, last_eval)
        save_checkpoint(ctx, ckpt, done, run_id)
    if not interrupted:  # after Ctrl-C the other ranks may be gone: do not wait for them
        _barrier(ctx.world)
    sink.finish(status="stopped" if stopped else "finished")
    if trackers is not None:        # alerts the last steps raised (finish has judged them) go too
        trackers.send_alerts(done)
        trackers.finish()
    return TrainResult(run_id=run_id, steps=done, final=scalars, eval=last_eval,
                       stopped_early=stopped, checkpoint=str(ckpt),
                       seconds=round(time.perf_counter() - started, 2))


class _StopRequest:
    """While entered, SIGINT/SIGTERM only set a flag (a second one raises at once), so the
    step's optimiser update, its records and the step counter stay consistent."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._previous: dict = {}

    def is_set(self) -> bool:
        return self._event.is_set()

    def _on_signal(self, signum, frame) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt
        self._event.set()

    def __enter__(self) -> "_StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _should_stop(sink: Sink, world: int) -> bool:
    """Any rank's sink saw a critical alert (with stop_on_alert): every rank stops together."""
    flag = torch.tensor([1.0 if getattr(sink, "should_stop", False) else 0.0])
    if world > 1 and torch.distributed.get_backend() == "nccl":
        flag = flag.cuda()
    if world > 1:
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())
