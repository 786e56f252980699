"""Why ICT loses on a task (issue 36 item 0): a short run through the trainer's own step stages,
printing per step (JSON lines) the reward, the batch entropy and its change over the update
(same rollouts, before vs after), and among the selected vs all valid tokens the share whose
sampled token has p(y) < β = Σp² (docs/algorithms.md §3: an update on such a token raises H₂ when
A > 0) and the |A|-weighted share of the update that pushes H₂ up (A > 0 with p < β, A < 0 with
p ≥ β). Controls: --select random (ICT's count per response, uniformly), --select next (token t
scored by the JS of t + 1: the deviation its choice caused), --norm (another loss normaliser).

    python bench/ict_diagnosis.py --preset readable --strategy ict --steps 60 [--lr 5e-5]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from forksight.hooks import metrics
from forksight.trainer import loss as losses
from forksight.trainer import step as stages
from forksight.trainer.config import load_config
from forksight.trainer.loop import setup
from forksight.trainer.selection import Selection


def control(kind: str | None, sel: Selection, js: torch.Tensor, valid: torch.Tensor, rho: float,
            seed: int) -> Selection:
    """The selection a control run trains on instead of ICT's own."""
    if kind == "random":  # as many tokens per response as ICT chose, uniformly among the valid ones
        noise = torch.rand(valid.shape, generator=torch.Generator().manual_seed(seed)).masked_fill(~valid, -1)
        rank = noise.argsort(1, descending=True).argsort(1)
        return Selection(rank < sel.mask.sum(1, keepdim=True), sel.normalizer)
    if kind == "next":
        shifted = torch.zeros_like(js)
        shifted[:, :-1] = js[:, 1:]
        return Selection(metrics.top_rho_per_response(shifted, valid, rho), sel.normalizer)
    return sel


def token_weights(mask: torch.Tensor, valid: torch.Tensor, normalizer: str) -> torch.Tensor:
    """Each token's weight in the loss (the table in docs/algorithms.md §8)."""
    m = mask.float()
    if normalizer == "tokens":
        return m / valid.sum()
    if normalizer == "selected":
        return m / m.sum().clamp(min=1)
    return m / m.sum(1, keepdim=True).clamp(min=1) / (m.sum(1) > 0).sum().clamp(min=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="readable")
    ap.add_argument("--strategy", default="ict")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--rho", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--select", choices=["random", "next"])
    ap.add_argument("--norm", choices=["tokens", "selected", "response"])
    args = ap.parse_args()
    cfg = load_config(preset=args.preset, overrides=dict(strategy=args.strategy, steps=args.steps, lr=args.lr,
                                                          rho=args.rho, seed=args.seed, stream=False, progress=False))
    ctx, _ = setup(cfg)
    for step in range(1, cfg.steps + 1):
        start = time.perf_counter()
        batch = stages.score(ctx, *stages.rollout(ctx, step))
        roll, valid = batch.roll, batch.roll.mask
        adv = losses.group_advantages(batch.rewards, roll.group_ids, scale=cfg.scale_rewards)
        logits, hidden = stages.forward(ctx, roll, ctx.split_head and cfg.strategy in stages.SPARSE_STRATEGIES)
        stats = metrics.token_stats(logits.detach(), mask=valid, tokens=roll.completion,
                                    temperature=cfg.temperature, group_ids=roll.group_ids)
        sel, teacher_logits, _ = stages.selection(ctx, step, roll, logits, stats, adv)
        sel = control(args.select, sel, stats.js, valid, cfg.effective_rho, step)
        if args.norm:
            sel = Selection(sel.mask, args.norm, sel.info)
        chosen = sel.mask & valid
        low = stats.logp.exp() < torch.exp(-stats.renyi2)  # p(y) < β = Σp²
        a = adv[:, None].expand_as(low)
        raising = ((a > 0) & low) | ((a < 0) & ~low)  # the update on these tokens raises H₂
        w = token_weights(chosen, valid, sel.normalizer) * a.abs()
        trained, _ = stages.update(ctx, roll, logits, hidden, adv, sel, teacher_logits)
        with torch.no_grad():
            after = stages.completion_logits(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len)
            entropy_after = metrics.token_stats(after, mask=valid, temperature=cfg.temperature).entropy
        row = {"step": step, "reward": float(batch.rewards.mean()), "entropy": float(stats.entropy[valid].mean()),
               "entropy_change": float((entropy_after - stats.entropy)[valid].mean()),
               "selected_frac": float(chosen.sum() / valid.sum()),
               "lowp_selected": float(low[chosen].float().mean()), "lowp_all": float(low[valid].float().mean()),
               "h2_raising_weight": float((w * raising).sum() / w.sum().clamp(min=1e-12)),
               "entropy_selected": float(stats.entropy[chosen].mean()), "grad_norm": trained["grad_norm"],
               "seconds": round(time.perf_counter() - start, 2)}
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    for i, text in enumerate(roll.texts[: cfg.group_size]):
        print(json.dumps({"reward": float(batch.rewards[i]), "completion": text}))


if __name__ == "__main__":
    main()
