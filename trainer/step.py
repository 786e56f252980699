"""One RL step in stages of one job each: rollout → score → forward → statistics → selection →
update → report. `train_step` reads top to bottom; `Context` holds what every stage needs.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from forksight.hooks import metrics
from forksight.hooks.metrics.mismatch import log_ratio
from forksight.trainer import loss as losses
from forksight.trainer.config import TrainConfig
from forksight.trainer.rollout import Rollout, completion_hidden, completion_logits, generate, token_logp
from forksight.trainer.selection import Selection, select
from forksight.trainer.tasks import Task
from forksight.trainer.trust_region import TrustTracker


@dataclass
class Context:
    """Everything one step needs; built once by `loop.setup`, reusable by benchmarks."""

    config: TrainConfig
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    task: Task
    reporter: Any = None          # hooks.report.StepReporter, or None to stream nothing
    ref: Any = None               # reference model (beta > 0)
    teacher: Any = None           # teacher model (distillation strategies)
    rank: int = 0
    world: int = 1
    model_path: str = ""
    run_name: str = ""
    split_head: bool = False      # logits == output_layer(base_model(...)): sparse backward works
    report_seconds: float = 0.0   # time the last StepReporter.report call took
    sampler: Any = None           # trainer.sampler.Sampler; None = the policy samples, no sampler log p
    capture_sampler_logp: bool = True  # False: the sampler's log p is neither computed nor shipped (benchmarks)
    prober: Any = None            # hooks.capture.step_probe.StepProber (--probe-every), or None
    reference: Any = None         # hooks.capture.reference.ReferenceScorer (--reference-every), or None


@dataclass
class Batch:
    """A step's rollouts with their verdicts."""

    roll: Rollout
    problems: list
    rewards: torch.Tensor
    correct: list[bool]


# Strategies that train on a small fraction of tokens: the output layer (V × H, the largest
# matrix in a small model's step) runs with grad on the selected rows only.
SPARSE_STRATEGIES = ("fork", "ict", "random", "maxtok", "mintok", "rand1tok")


def _step_seed(config: TrainConfig, rank: int, step: int) -> int:
    """Every (seed, rank, step) draws its own prompts and samples: resume replays exactly."""
    return (config.seed * 1_000_003 + rank * 7919 + step) % (2**31)


def _needs_stats(strategy: str) -> bool:
    return strategy in ("fork", "ict", "stapo")


# ---------------------------------------------------------------------------------------------
# stages


def rollout(ctx: Context, step: int, capture: bool = True) -> tuple[Rollout, list]:
    """Prompts for this rank and step, G samples each; with capture, the sampler's log p too."""
    cfg = ctx.config
    rng = random.Random(_step_seed(cfg, ctx.rank, step))
    problems = [ctx.task.sample(rng) for _ in range(cfg.prompts_per_step)]
    torch.manual_seed(_step_seed(cfg, ctx.rank, step))
    prompts, offset = [p.prompt for p in problems], ctx.rank * cfg.prompts_per_step  # group ids unique across ranks
    if ctx.sampler is None:
        roll = generate(ctx.model, ctx.tokenizer, prompts, cfg.group_size, temperature=cfg.temperature,
                        max_new_tokens=cfg.max_new_tokens, group_offset=offset)
    else:
        roll = ctx.sampler.generate(ctx.tokenizer, prompts, cfg.group_size, step=step, temperature=cfg.temperature,
                                    max_new_tokens=cfg.max_new_tokens, group_offset=offset,
                                    capture_logp=capture or cfg.tis_cap is not None)
    return roll, problems


def score(ctx: Context, roll: Rollout, problems: list) -> Batch:
    """Each completion's reward and verdict from the task's verifier."""
    verdicts = [ctx.task.verify(problems[i // ctx.config.group_size], text) for i, text in enumerate(roll.texts)]
    rewards = torch.tensor([r for r, _ in verdicts], dtype=torch.float32, device=roll.completion.device)
    return Batch(roll, problems, rewards, [c for _, c in verdicts])


def forward(ctx: Context, roll: Rollout, sparse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits, hidden): with sparse, logits carry no graph and the loss later runs the head on
    the selected rows of hidden only; otherwise logits carry the graph and hidden is None."""
    if not sparse:
        return completion_logits(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len), None
    hidden = completion_hidden(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len)
    with torch.no_grad():
        return ctx.model.get_output_embeddings()(hidden.detach()), hidden


def statistics(ctx: Context, roll: Rollout, logits: torch.Tensor, report: bool) -> metrics.TokenStats:
    """The one pass over the vocabulary: selection reads it, the reporter ships it."""
    cfg = ctx.config
    if not (report or _needs_stats(cfg.strategy)):  # all / random / distillation need only the mask
        return metrics.TokenStats(entropy=None, renyi2=None, top1=None, logp=None, js=None, mask=roll.mask)
    return metrics.token_stats(logits.detach(), mask=roll.mask, tokens=roll.completion, temperature=cfg.temperature,
                               group_ids=roll.group_ids if report or cfg.strategy == "ict" else None)


def selection(ctx: Context, step: int, roll: Rollout, logits: torch.Tensor, stats: metrics.TokenStats,
              adv: torch.Tensor) -> tuple[Selection, torch.Tensor | None, torch.Tensor | None]:
    """The tokens to train on, plus the teacher's logits and KL (distillation strategies)."""
    cfg = ctx.config
    teacher_logits = kl = None
    if ctx.teacher is not None:
        with torch.no_grad():
            teacher_logits = completion_logits(ctx.teacher, roll.input_ids, roll.attention_mask, roll.prompt_len)
        kl = metrics.token_kl(logits.detach() / cfg.temperature, teacher_logits / cfg.temperature, roll.mask)
    gen = torch.Generator().manual_seed(_step_seed(cfg, ctx.rank, step))
    sel = select(cfg.strategy, stats, advantages=adv, rho=cfg.effective_rho, normalizer=cfg.normalizer,
                 generator=gen, stapo_tau_p=cfg.stapo_tau_p, stapo_entropy_q=cfg.stapo_entropy_q, kl=kl,
                 distill_tokens=cfg.distill_tokens)
    if kl is not None:
        sel.info["distill/kl_mean"] = float(kl[roll.mask].mean()) if roll.mask.any() else 0.0
    return sel, teacher_logits, kl


def update(ctx: Context, roll: Rollout, logits: torch.Tensor, hidden: torch.Tensor | None, adv: torch.Tensor,
           sel: Selection, teacher_logits: torch.Tensor | None,
           entropy: torch.Tensor | None = None) -> tuple[dict[str, float], dict[str, object]]:
    """Loss, backward, gradient all-reduce and optimiser step(s) on the selected tokens; also what
    the update learnt per token: `corrected`, the tokens the TIS correction truncated ([B, T] bool,
    None without tis_cap), and `trust`, the last update's ratio, TV and clip per token (None when
    the batch had one update under the ratio clip). entropy [B, T]: the step's H, for the trust/*
    splits by fork and quartile (None: unsplit)."""
    cfg, valid = ctx.config, roll.mask
    head = ctx.model.get_output_embeddings()
    ref_logp = None
    if ctx.ref is not None:
        with torch.no_grad():
            ref_logits = completion_logits(ctx.ref, roll.input_ids, roll.attention_mask, roll.prompt_len)
            ref_logp = token_logp(ref_logits, roll.completion, cfg.temperature)
    info: dict[str, float] = {}
    old_logp = is_weight = corrected = None
    rows = sel.mask.nonzero(as_tuple=True)
    region = TrustTracker(cfg, adv, rows, entropy)
    backward_seconds = 0.0
    for n in range(cfg.updates_per_batch):
        if n > 0 and hidden is not None:  # later updates see the moved policy: recompute its forward
            hidden = completion_hidden(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        elif n > 0:
            logits = completion_logits(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len)
        # logits with grad: selected rows only (sparse) or the whole batch
        picked = head(hidden[rows]) if hidden is not None else logits[rows]
        if teacher_logits is not None:
            loss = _distill(picked, teacher_logits[rows], cfg.temperature)
        else:
            logp = torch.zeros(valid.shape, dtype=torch.float32, device=picked.device)
            logp = logp.index_put(rows, token_logp(picked, roll.completion[rows], cfg.temperature))
            if old_logp is None:
                old_logp = logp.detach()
                region.anchor(picked)
                if cfg.tis_cap is not None and roll.sampler_logp is not None:
                    # r = p_train_old / p_sampler on the trained tokens (elsewhere logp is a 0 filler)
                    is_weight, corrected = losses.tis_weights(
                        log_ratio(old_logp, roll.sampler_logp, sel.mask & valid), cfg.tis_cap)
                    is_weight = is_weight.to(old_logp.device)
            loss, info = losses.grpo_loss(logp, old_logp, adv, sel.mask, valid, clip_low=cfg.clip_low,
                                          clip_high=cfg.clip_high, normalizer=sel.normalizer,
                                          ref_logp=ref_logp, beta=cfg.beta, is_weight=is_weight,
                                          keep=region.keep(picked, logp, old_logp))
        ctx.optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        loss.backward()
        backward_seconds = time.perf_counter() - start
        _all_reduce_grads(ctx.model, ctx.world)
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(ctx.model.parameters(), max_norm)
        ctx.optimizer.step()
    out = {**info, **region.scalars(), "loss": loss.item(), "grad_norm": float(grad_norm),
           "lr": ctx.optimizer.param_groups[0]["lr"],
           "time/backward": backward_seconds, "tokens/trained": float(len(rows[0]))}
    out.setdefault("kl", 0.0)
    out["kl/beta"] = float(cfg.beta)     # with kl = 0 it tells "no KL term" from "a KL term that does nothing"
    return out, {"corrected": corrected, "trust": region.tokens}


def report_step(ctx: Context, step: int, batch: Batch, stats: metrics.TokenStats, sel: Selection,
                adv: torch.Tensor, extra: dict[str, float], per_token: dict | None = None) -> dict[str, float]:
    """Ship the step through the StepReporter; sample and group ids are unique across ranks."""
    cfg, roll = ctx.config, batch.roll
    samples = [{"prompt": batch.problems[i // cfg.group_size].prompt, "completion": text,
                "reward": float(batch.rewards[i]), "correct": batch.correct[i], "source": ctx.task.name}
               for i, text in enumerate(roll.texts)]
    rows_here = roll.completion.shape[0]
    start = time.perf_counter()
    scalars = ctx.reporter.report(step, stats, roll.completion, selected=sel.mask, group_ids=roll.group_ids,
                                  advantages=adv, samples=samples, extra=extra, weight=float(roll.mask.sum()),
                                  sample_ids=range(ctx.rank * rows_here, (ctx.rank + 1) * rows_here),
                                  sampler_logp=roll.sampler_logp if ctx.capture_sampler_logp else None,
                                  **(per_token or {}))
    ctx.report_seconds = time.perf_counter() - start  # for benchmarks; not streamed
    return scalars


# ---------------------------------------------------------------------------------------------
# the step


def truncated_frac(ctx: Context, roll) -> float:
    """Share of completions cut off at max_new_tokens (no EOS): TRL's completions/clipped_ratio,
    verl's response_length/clip_ratio. Their reward measures the length cap, not the policy."""
    completion = roll.completion
    if completion.shape[1] < ctx.config.max_new_tokens:   # generation stopped early: every row ended
        return 0.0
    return float((~(completion == ctx.tokenizer.eos_token_id).any(dim=1)).float().mean())


def train_step(ctx: Context, step: int, *, report: bool = True) -> dict[str, float]:
    """One RL step; returns the scalars the reporter streamed (or the loss-side ones).
    report=False skips monitoring entirely (statistics the strategy does not need, reporting):
    the baseline the overhead benchmark compares against."""
    cfg = ctx.config
    t0 = time.perf_counter()
    batch = score(ctx, *rollout(ctx, step, capture=report and ctx.capture_sampler_logp))
    t_rollout = time.perf_counter()  # generation and verification
    adv = losses.group_advantages(batch.rewards, batch.roll.group_ids, scale=cfg.scale_rewards)
    logits, hidden = forward(ctx, batch.roll, ctx.split_head and cfg.strategy in SPARSE_STRATEGIES)
    t_forward = time.perf_counter()
    stats = statistics(ctx, batch.roll, logits, report)
    t_stats = time.perf_counter()
    sel, teacher_logits, _ = selection(ctx, step, batch.roll, logits, stats, adv)
    if ctx.prober is not None and ctx.prober.due(step):    # the policy of this step: before its update
        from forksight.trainer.probe import probe_step

        probe_step(ctx, step, batch, stats, sel.mask)
    trained, per_token = update(ctx, batch.roll, logits, hidden, adv, sel, teacher_logits, stats.entropy)
    extra = {**sel.info, **trained}
    extra.update({"time/rollout": t_rollout - t0, "time/stats": t_stats - t_forward,
                  "time/step": time.perf_counter() - t0, "length/clip_frac": truncated_frac(ctx, batch.roll)})
    if not report or ctx.reporter is None:
        return extra
    return report_step(ctx, step, batch, stats, sel, adv, extra, per_token)


def _all_reduce_grads(model, world: int) -> None:
    """Average gradients over ranks (manual DDP: the model also has to `generate`)."""
    if world == 1:
        return
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad)
        p.grad.div_(world)


def _distill(logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean reverse KL(student ‖ teacher) over the selected rows [N, V], with grad (the dense
    per-token KL that chose them came from metrics.token_kl, without grad)."""
    log_s = torch.log_softmax(logits.float() / temperature, dim=-1)
    log_t = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    per_token = F.kl_div(log_t, log_s, log_target=True, reduction="none").sum(-1)
    return losses.distill_loss(per_token, torch.ones_like(per_token, dtype=torch.bool))
