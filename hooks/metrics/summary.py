"""The one definition of every per-step scalar a producer streams (`summarize`, `group_scalars`)
and the fixed entropy histogram. The trainer, `forksight.attach` and the TRL callback all
call these; none computes a step scalar of its own.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from forksight.base.constants import ENTROPY_EDGES, FORK_ENTROPY
from forksight.hooks.metrics.passk import pass_at_k_groups
from forksight.hooks.metrics.token_select import token_covariance
from forksight.hooks.metrics.token_stats import TokenStats


def histogram(values, edges: Sequence[float] | np.ndarray = ENTROPY_EDGES) -> np.ndarray:
    """Counts per bin [edges[i], edges[i+1]); values past either end go to the first/last bin."""
    edges = np.asarray(edges, dtype=np.float64)
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError("edges must be a strictly increasing 1-D sequence of at least 2 numbers")
    if isinstance(values, Tensor):
        values = values.detach().to(torch.float64).cpu().numpy()
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if np.isnan(values).any():
        raise ValueError("histogram got NaN values; mask invalid tokens out before binning")
    index = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, edges.size - 2)
    return np.bincount(index, minlength=edges.size - 1).astype(np.int64)


def _mean(field: Tensor, valid: Tensor, parts: Tensor | None) -> float | None:
    """Mean over valid tokens that have a value (NaN = not computed); with parts, the mean of
    each part's token mean (TRL logs entropy per micro-batch and averages those)."""
    values = field.detach().to(torch.float64).cpu()
    known = valid & ~torch.isnan(values)
    if not bool(known.any()):
        return None
    if parts is None:
        return float(values[known].mean())
    row_part = parts.cpu()[:, None].expand_as(known)
    means = [values[known & (row_part == p)].mean() for p in row_part[known].unique().tolist()]
    return float(torch.stack(means).mean())


def summarize(stats: TokenStats, *, selected: Tensor | None = None, advantages=None,
              parts: Tensor | None = None, fork_entropy: float = FORK_ENTROPY) -> dict[str, float]:
    """tokens/count, entropy/mean, /p20…/p95, fork/frac (H ≥ fork_entropy), renyi2/top1/logp/js means,
    length/mean (rows with tokens), selected/frac, cov/logp_adv, over mask-valid tokens (NaN: not
    computed, skipped; None: key left out). parts [B]: each mean is the mean of per-part means."""
    valid = stats.mask.detach().bool().cpu()
    n_tokens = int(valid.sum())
    out: dict[str, float] = {"tokens/count": float(n_tokens)}
    if not n_tokens:
        return out
    h = stats.entropy.detach().to(torch.float64).cpu() if stats.entropy is not None else None
    if h is not None:
        known = h[valid & ~torch.isnan(h)]
        if known.numel():
            out["entropy/mean"] = _mean(h, valid, parts)
            qs = np.quantile(known.numpy(), [0.2, 0.5, 0.8, 0.95])  # numpy: torch.quantile caps at 2^24 values
            for name, q in zip(("p20", "p50", "p80", "p95"), qs):
                out[f"entropy/{name}"] = float(q)
            out["fork/frac"] = float((known >= fork_entropy).to(torch.float64).mean())
    for key, field in (("renyi2", stats.renyi2), ("top1", stats.top1), ("logp", stats.logp), ("js", stats.js)):
        value = _mean(field, valid, parts) if field is not None else None
        if value is not None:
            out[f"{key}/mean"] = value
    lengths = valid.sum(1)
    out["length/mean"] = float(lengths[lengths > 0].to(torch.float64).mean())
    if selected is not None:
        out["selected/frac"] = float((selected.detach().bool().cpu() & valid).sum()) / n_tokens
    if advantages is not None and stats.logp is not None:
        cov = token_covariance(advantages, stats.logp, stats.mask)
        out["cov/logp_adv"] = float(cov[stats.mask.bool()].double().mean())
    return out


def length_reward_corr(group_ids: Sequence[int], rewards: Sequence[float],
                       lengths: Sequence[float | None]) -> float | None:
    """Mean over groups of the Pearson correlation of reward and completion length inside the group
    (groups of ≥ 3 known lengths whose rewards and lengths both vary); None when no group qualifies.
    Positive: longer completions of the same prompt earn more (length_hacking's mechanism)."""
    by_group: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for gid, r, n in zip(group_ids, rewards, lengths):
        if n is not None and np.isfinite(r):
            by_group[int(gid)].append((float(r), float(n)))
    values = []
    for pairs in by_group.values():
        if len(pairs) >= 3:
            r, n = np.asarray(pairs, dtype=np.float64).T
            if np.ptp(r) > 0 and np.ptp(n) > 0:
                values.append(float(np.corrcoef(r, n)[0, 1]))
    return float(np.mean(values)) if values else None


def group_scalars(group_ids: Sequence[int], rewards: Sequence[float], correct: Sequence[bool],
                  lengths: Sequence[float | None] | None = None) -> dict[str, float]:
    """reward/mean, reward/std, pass@1..pass@G, the fraction of zero-variance groups and, given the
    completions' lengths, groups/length_reward_corr (length_reward_corr)."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for row, gid in enumerate(group_ids):
        by_group[int(gid)].append(row)
    rewards_arr = np.asarray(rewards, dtype=np.float64)
    out = {"reward/mean": float(rewards_arr.mean()), "reward/std": float(rewards_arr.std())}
    verdicts = [[bool(correct[r]) for r in rows] for rows in by_group.values()]
    for k, value in pass_at_k_groups(verdicts).items():
        out[f"pass@{k}"] = float(value)
    zero_var = [np.ptp(rewards_arr[rows]) == 0 for rows in by_group.values()]
    out["groups/zero_var_frac"] = float(np.mean(zero_var))
    corr = length_reward_corr(group_ids, rewards, lengths) if lengths is not None else None
    if corr is not None:
        out["groups/length_reward_corr"] = corr
    return out
