"""Where the trust region binds (docs/algorithms.md §14; DPPO, Qi et al., arXiv 2602.04879): per
trained token, the PPO ratio clip as TRL and verl define it beside direct estimates of how far the
policy moved from the policy that sampled the batch — binary TV |π(y) − π_old(y)|, binary KL, top-K
KL (the rest of the vocabulary as one bucket) and full-vocabulary KL — the step's `trust/*` scalars
split by fork and entropy quartile, and DPPO's mask: a token outside the region loses the gradient
that would take it further out (A > 0 and π(y) > π_old(y), or A < 0 and π(y) < π_old(y)).

π_old is the policy the batch was sampled from, as the trainer recomputes it before its first
update of the batch (PPO's `old_logp`, TRL's `old_per_token_logps`, verl's `old_log_probs`), so on
that first update every divergence is exactly 0 and the ratio exactly 1.
"""
from __future__ import annotations

import torch

from forksight.base.constants import FORK_ENTROPY

# DPPO's regions (trainer/config.py's TrustRegion: these and "ratio") and their thresholds (verl's examples/dppo_trainer/run_qwen30b_dppo.sh): TV 0.15, KL 0.05
DEFAULT_DELTA = {"tv": 0.15, "binary-kl": 0.05, "topk-kl": 0.05, "kl": 0.05}
TOPK = 20               # top-K tokens of π_old kept per trained token for the top-K KL
_EPS = 1e-12


def ratio_clipped(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """Tokens whose ratio the PPO clip bound, as TRL's `clip_ratio/region_mean` counts them: outside
    [1 − ε_low, 1 + ε_high] on the side its advantage pushes (r < 1 − ε_low with A < 0, or
    r > 1 + ε_high with A > 0). adv broadcasts against ratio."""
    return ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))


def binary_tv(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """DPPO's single-sample total variation |π(y_t) − π_old(y_t)|."""
    return (torch.exp(logp.float()) - torch.exp(old_logp.float())).abs()


def binary_kl(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """KL(π_old ‖ π) on the two outcomes {y_t, not y_t}: p_old log(p_old/p) + (1−p_old) log((1−p_old)/(1−p))."""
    logp, old_logp = logp.float(), old_logp.float()
    p, p_old = torch.exp(logp), torch.exp(old_logp)
    rest = (1 - p_old) * (torch.log((1 - p_old).clamp_min(_EPS)) - torch.log((1 - p).clamp_min(_EPS)))
    return (p_old * (old_logp - logp) + rest).clamp_min(0.0)


def old_topk(logits: torch.Tensor, temperature: float, k: int = TOPK) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs) of π_old's top-k tokens at each row of logits [N, V], kept for topk_kl."""
    logq = torch.log_softmax(logits.detach().float() / temperature, dim=-1)
    values, ids = torch.topk(logq, min(k, logq.shape[-1]), dim=-1)
    return ids, values


def topk_kl(logits: torch.Tensor, ids: torch.Tensor, old_logp_k: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(π_old ‖ π) over π_old's top-k tokens plus the rest of the vocabulary as one token (DPPO's
    top-K approximation, a lower bound of the full KL). logits [N, V] of π; ids, old_logp_k [N, k]."""
    logq = torch.log_softmax(logits.detach().float() / temperature, dim=-1)
    q_k = torch.gather(logq, -1, ids)
    p_mass = torch.exp(old_logp_k).sum(-1)
    q_mass = torch.exp(q_k).sum(-1)
    head = (torch.exp(old_logp_k) * (old_logp_k - q_k)).sum(-1)
    p_rest, q_rest = (1 - p_mass).clamp_min(_EPS), (1 - q_mass).clamp_min(_EPS)
    return (head + p_rest * (torch.log(p_rest) - torch.log(q_rest))).clamp_min(0.0)


def full_kl(logits: torch.Tensor, old_logq: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(π_old ‖ π) over the whole vocabulary; old_logq [N, V]: π_old's log-softmax at those rows."""
    logq = torch.log_softmax(logits.detach().float() / temperature, dim=-1)
    return (torch.exp(old_logq) * (old_logq - logq)).sum(-1).clamp_min(0.0)


def dppo_keep(divergence: torch.Tensor, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
              delta: float) -> torch.Tensor:
    """DPPO's mask (bool, True = keeps its gradient): a token is cut where the divergence exceeds δ
    and its advantage pushes it further out (A > 0 with π(y) > π_old(y), A < 0 with π(y) < π_old(y))."""
    up, down = logp > old_logp, logp < old_logp
    leaving = ((adv > 0) & up) | ((adv < 0) & down)
    return ~(leaving & (divergence > delta))


def quartile_of(entropy: torch.Tensor) -> torch.Tensor:
    """Each value's entropy quartile within the given tokens, 1 (lowest) to 4 (by rank, ties by
    order: equal counts whatever the ties)."""
    n = entropy.numel()
    order = torch.argsort(entropy, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n, device=entropy.device)
    return (rank * 4 // max(n, 1)) + 1


def step_scalars(*, clipped: torch.Tensor, tv: torch.Tensor, entropy: torch.Tensor | None,
                 tv_delta: float, fork_entropy: float = FORK_ENTROPY) -> dict[str, float]:
    """trust/* of one update over its trained tokens (1-D tensors of the same length): the ratio
    clip's share, TV's mean and share above δ, each split by fork (H ≥ fork_entropy) / non-fork
    and by entropy quartile
    (`/q1` lowest … `/q4` highest), and the disagreement DPPO is about — the share of clipped tokens
    inside the TV region (clipped though they barely moved) and of unclipped ones outside it."""
    n = clipped.numel()
    if n == 0:
        return {}
    clipped, tv = clipped.bool(), tv.float()
    outside = tv > tv_delta
    out = {"trust/clip_frac": float(clipped.float().mean()), "trust/tv_mean": float(tv.mean()),
           "trust/tv_max": float(tv.max()), "trust/tv_outside_frac": float(outside.float().mean()),
           "trust/tv_delta": float(tv_delta)}
    if clipped.any():
        out["trust/clipped_inside_frac"] = float((~outside[clipped]).float().mean())
    if (~clipped).any():
        out["trust/unclipped_outside_frac"] = float(outside[~clipped].float().mean())
    groups: dict[str, torch.Tensor] = {}
    if entropy is not None:
        fork = entropy.float() >= fork_entropy
        quartile = quartile_of(entropy.float())
        groups.update({"fork": fork, "nonfork": ~fork, **{f"q{q}": quartile == q for q in range(1, 5)}})
    for name, rows in groups.items():
        if rows.any():
            out[f"trust/clip_frac/{name}"] = float(clipped[rows].float().mean())
            out[f"trust/tv_mean/{name}"] = float(tv[rows].mean())
            out[f"trust/tv_outside_frac/{name}"] = float(outside[rows].float().mean())
    return out


def token_columns(shape: tuple[int, int], rows: tuple[torch.Tensor, torch.Tensor], ratio: torch.Tensor,
                  tv: torch.Tensor, clipped: torch.Tensor) -> dict[str, torch.Tensor]:
    """The stored token columns `ratio`, `tv` ([B, T] float32, NaN off the trained tokens) and
    `clipped` ([B, T] bool) from one update's values at the trained tokens `rows`."""
    out = {}
    for name, values in (("ratio", ratio), ("tv", tv)):
        grid = torch.full(shape, float("nan"), dtype=torch.float32)
        grid[rows[0].cpu(), rows[1].cpu()] = values.detach().float().cpu()
        out[name] = grid
    grid = torch.zeros(shape, dtype=torch.bool)
    grid[rows[0].cpu(), rows[1].cpu()] = clipped.detach().bool().cpu()
    out["clipped"] = grid
    return out


def measure(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, *, clip_low: float, clip_high: float,
            entropy: torch.Tensor | None, tv_delta: float, shape: tuple[int, int],
            rows: tuple[torch.Tensor, torch.Tensor]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """One update's trust region at its trained tokens (1-D logp, old_logp, adv, entropy in the order of
    `rows`, their (row, col) in the [B, T] batch of `shape`): its trust/* scalars and its token columns.
    The one place the bundled trainer and the TRL integration both measure an update."""
    ratio = torch.exp(logp - old_logp)
    clipped = ratio_clipped(ratio, adv, clip_low, clip_high)
    tv = binary_tv(logp, old_logp)
    return (step_scalars(clipped=clipped, tv=tv, entropy=entropy, tv_delta=tv_delta),
            token_columns(shape, rows, ratio, tv, clipped))


def mean_of(updates: list[dict[str, float]]) -> dict[str, float]:
    """The step's trust/* as the mean over its updates of each key (a key absent from an update,
    e.g. a split with no token, is averaged over the updates that have it), as TRL logs a step."""
    keys = dict.fromkeys(k for u in updates for k in u)
    return {k: sum(u[k] for u in updates if k in u) / sum(k in u for u in updates) for k in keys}
