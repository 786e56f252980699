"""A probed step's `probe/*` scalars (docs/algorithms.md §12): are the forks the pivotal tokens?
fork precision (share of probed forks that are pivotal), the share of pivotal tokens that are
forks, mean |Δ| on fork and non-fork tokens, Spearman ρ(H, |Δ|), pivotal tokens per completion, and
each selection rule's recall of the pivotal tokens, the rules computed on the same completions:
`fork` (top-20% entropy of the probed completions' tokens), `ict` (top-10% JS per response),
`random` (as many tokens as `fork`, per completion) and `own` (what the run trained on). The rules
pick unequal counts (20%, 10% per response, all or some), so each has its own random baseline of the
same count per completion: `random` for `fork`, `random/ict`, `random/own`; a rule beats chance only
against its own. Recall is over the probed positions: with `positions=all` it is the recall of every
pivotal token."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

import torch

from forksight.hooks.metrics.token_select import top_rho_mask, top_rho_per_response


@dataclass
class TokenSignals:
    """One probed completion's per-position numbers the rules read (None: not known)."""

    sample_id: int
    entropy: Sequence[float | None] | None = None
    js: Sequence[float | None] | None = None
    selected: Sequence[bool] | None = None


def _padded(rows: list[Sequence[float | None]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(r) for r in rows), default=0)
    values = torch.full((len(rows), width), float("nan"), dtype=torch.float64)
    for i, r in enumerate(rows):
        values[i, :len(r)] = torch.tensor([math.nan if v is None else float(v) for v in r], dtype=torch.float64)
    return values, ~torch.isnan(values)


def rule_masks(signals: Sequence[TokenSignals], *, fork_rho: float = 0.2, ict_rho: float = 0.1,
               seed: int = 0) -> dict[str, dict[int, set[int]]]:
    """rule -> sample_id -> selected positions, for the rules whose inputs are known."""
    out: dict[str, dict[int, set[int]]] = {}
    ids = [s.sample_id for s in signals]
    with_h = [s for s in signals if s.entropy is not None]
    if with_h:
        values, valid = _padded([s.entropy for s in with_h])
        mask, _ = top_rho_mask(values.float(), valid, fork_rho)
        out["fork"] = {s.sample_id: set(mask[i].nonzero().flatten().tolist()) for i, s in enumerate(with_h)}
    with_js = [s for s in signals if s.js is not None and any(v is not None for v in s.js)]
    if with_js:
        values, valid = _padded([s.js for s in with_js])
        mask = top_rho_per_response(values.float(), valid, ict_rho)
        out["ict"] = {s.sample_id: set(mask[i].nonzero().flatten().tolist()) for i, s in enumerate(with_js)}
    if signals and all(s.selected is not None for s in signals):
        out["own"] = {s.sample_id: {t for t, on in enumerate(s.selected) if on} for s in signals}
    out = {rule: picked for rule, picked in out.items() if set(picked) == set(ids)}
    lengths = {s.sample_id: _length(s) for s in signals}
    for rule in [r for r in ("fork", "ict", "own") if r in out]:
        # fork's baseline keeps the name `random` and its draws (the stored figures' baseline)
        rng = random.Random(seed if rule == "fork" else f"{seed}/{rule}")
        out["random" if rule == "fork" else f"random/{rule}"] = {
            sid: set(rng.sample(range(lengths[sid]), min(lengths[sid], len(out[rule][sid])))) for sid in ids}
    return out


def _length(s: TokenSignals) -> int:
    """A completion's scored token count, as the rules see it (positions with a known value)."""
    values = s.entropy if s.entropy is not None else s.js
    if values is None:
        return len(s.selected or ())
    return sum(v is not None and not math.isnan(float(v)) for v in values)


def _spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    # average ranks for ties (|Δ| is often exactly 0)
    rx, ry = _ranks(torch.tensor(x, dtype=torch.float64)), _ranks(torch.tensor(y, dtype=torch.float64))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(torch.corrcoef(torch.stack([rx, ry]))[0, 1])


def _ranks(v: torch.Tensor) -> torch.Tensor:
    """Average ranks (ties share the mean of their ranks), as scipy.stats.rankdata."""
    order = v.argsort(stable=True)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(1, len(v) + 1, dtype=torch.float64)
    for value in v.unique():
        tie = v == value
        if int(tie.sum()) > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def one_token(row: dict) -> bool:
    """A row of one token (not a bisection segment searched no further: span > 1)."""
    span = row.get("span")
    return span is None or span != span or int(span) == 1


def covered(rows: Sequence[dict], signals: Sequence[TokenSignals]) -> set[int]:
    """The completions whose every position the rows account for: each probed (`all`), or probed or
    inside a segment whose ends differ by less than the pivotal δ (`search`: no single pivot there)."""
    seen: dict[int, set[int]] = {}
    for r in rows:
        span = 1 if one_token(r) else int(r["span"])
        seen.setdefault(int(r["sample_id"]), set()).update(range(int(r["pos"]), int(r["pos"]) + span))
    return {s.sample_id for s in signals if _length(s) and seen.get(s.sample_id, set()) >= set(range(_length(s)))}


def probe_scalars(rows: Sequence[dict], signals: Sequence[TokenSignals], completions: int, *,
                  seed: int = 0) -> dict[str, float]:
    """The `probe/*` scalars of one probed step from its probe rows (value_probe.probe) and the
    probed completions' signals; a number with nothing to count is left out, never 0 or NaN. The
    per-token figures read one-token rows (a bisection's unsearched segments are not tokens); each
    rule's precision (`probe/precision/<rule>`: its picks that are pivotal) reads the completions the
    rows cover whole (`all`, `search`), where a token no row names is not pivotal."""
    out: dict[str, float] = {}
    whole = covered(rows, signals)
    rows = [r for r in rows if one_token(r)]
    pivotal = [r for r in rows if r["pivotal"]]
    forks = [r for r in rows if r["fork"]]
    if completions:
        out["probe/completions"] = float(completions)
        out["probe/positions"] = float(len(rows))
        out["probe/pivotal_per_completion"] = len(pivotal) / completions
    if forks:
        out["probe/fork_precision"] = sum(r["pivotal"] for r in forks) / len(forks)
        out["probe/delta_abs_fork"] = sum(abs(r["delta"]) for r in forks) / len(forks)
    others = [r for r in rows if not r["fork"]]
    if others:
        out["probe/delta_abs_nonfork"] = sum(abs(r["delta"]) for r in others) / len(others)
    if rows:
        out["probe/pivotal_frac"] = len(pivotal) / len(rows)
    if pivotal:
        out["probe/pivot_fork_share"] = sum(r["fork"] for r in pivotal) / len(pivotal)
    known = [r for r in rows if r.get("entropy") is not None]
    rho = _spearman([r["entropy"] for r in known], [abs(r["delta"]) for r in known])
    if rho is not None:
        out["probe/spearman_entropy_delta"] = rho
    masks = rule_masks(signals, seed=seed) if pivotal or whole else {}
    if pivotal:
        for rule, picked in masks.items():
            hits = sum(r["pos"] in picked.get(r["sample_id"], ()) for r in pivotal)
            out[f"probe/recall/{rule}"] = hits / len(pivotal)
    pivots = {(int(r["sample_id"]), int(r["pos"])) for r in pivotal if int(r["sample_id"]) in whole}
    for rule, picked in masks.items():
        chosen = [(sid, t) for sid in whole for t in picked.get(sid, ())]
        if chosen:
            out[f"probe/precision/{rule}"] = sum(c in pivots for c in chosen) / len(chosen)
    return out
