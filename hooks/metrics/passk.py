"""Unbiased pass@k (Chen et al. 2021; docs: docs/algorithms.md §6), per problem and over groups."""
from __future__ import annotations

from typing import Iterable

import numpy as np
from torch import Tensor



def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k), stable product form."""
    n, c, k = _check_count("n", n), _check_count("c", c), _check_count("k", k)
    if n < 1 or c < 0 or k < 1:
        raise ValueError(f"need n >= 1, c >= 0, k >= 1; got n={n}, c={c}, k={k}")
    if c > n:
        raise ValueError(f"c (correct samples) = {c} cannot exceed n (samples) = {n}")
    if k > n:
        raise ValueError(f"k = {k} needs at least k samples, but n = {n}; draw more samples or lower k")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_groups(correct, ks: Iterable[int] | None = None) -> dict[int, float]:
    """Mean pass@k over groups; correct is [num_groups, G] bools or a list of ragged lists.

    ks defaults to 1..max G. For ragged groups each uses its own n, and a group with n < k is
    left out of that k's mean (a k no group reaches raises).
    """
    if isinstance(correct, Tensor):
        correct = correct.detach().cpu().numpy()
    groups = [np.asarray(g).reshape(-1) for g in correct]
    if not groups or all(g.size == 0 for g in groups):
        raise ValueError("pass_at_k_groups needs at least one non-empty group of results")
    counts = [(int(g.size), int(np.count_nonzero(g))) for g in groups if g.size]
    max_n = max(n for n, _ in counts)
    ks = list(range(1, max_n + 1)) if ks is None else [_check_count("k", k) for k in ks]
    result: dict[int, float] = {}
    for k in ks:
        if k < 1 or k > max_n:
            raise ValueError(f"k = {k} is outside 1..{max_n} (the largest group size)")
        values = [pass_at_k(n, c, k) for n, c in counts if n >= k]
        result[k] = float(np.mean(values))
    return result
