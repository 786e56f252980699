"""The producers' per-token math under one name (docs: docs/algorithms.md §1–§7); each
piece has its own module: `token_stats` (entropy, Rényi-2, top-1, log p, JS, KL), `passk`,
`token_select` (top-ρ masks, token covariance), `summary` (step scalars, histogram) and `mismatch`
(training–inference mismatch from the sampler's log p).
"""
from __future__ import annotations

from forksight.base.constants import ENTROPY_EDGES, FORK_ENTROPY
from forksight.hooks.metrics.mismatch import mismatch_scalars
from forksight.hooks.metrics.passk import pass_at_k, pass_at_k_groups
from forksight.hooks.metrics.summary import group_scalars, histogram, summarize
from forksight.hooks.metrics.token_select import token_covariance, top_rho_mask, top_rho_per_response
from forksight.hooks.metrics.token_stats import TokenStats, token_kl, token_stats

__all__ = [
    "TokenStats",
    "token_stats",
    "token_kl",
    "pass_at_k",
    "pass_at_k_groups",
    "top_rho_mask",
    "top_rho_per_response",
    "token_covariance",
    "ENTROPY_EDGES",
    "FORK_ENTROPY",
    "histogram",
    "summarize",
    "group_scalars",
    "mismatch_scalars",
]
