"""The one keep-rule of every downsampled read (TensorBoard's is a reservoir; ours is a stride, so
a live curve's old points never move): of n points keep every s-th from the first, plus the last,
with s = ceil((n-1)/(max_points-1)) — at most max_points, first and last always kept. The SQL
(the Reader) and numpy (the figures) forms below are the same rule, tested against each other."""
from __future__ import annotations

import numpy as np


def max_points_of(max_points: int) -> int:
    """The bound as both forms use it: at least 2 (both endpoints)."""
    return max(2, int(max_points))


def keep_sql(rn: str = "rn", n: str = "n") -> str:
    """A SQL condition over a 1-based row number `rn` among `n` rows; one `?` = max_points_of(...)."""
    return f"(({rn} - 1) % greatest(1, CAST(ceil(({n} - 1) / (? - 1.0)) AS BIGINT)) = 0 OR {rn} = {n})"


def keep_indices(n: int, max_points: int | None) -> np.ndarray:
    """0-based indices of the kept points among n (all of them when max_points is None or ≥ n)."""
    if max_points is None or n <= max_points:
        return np.arange(n)
    stride = max(1, int(np.ceil((n - 1) / (max_points_of(max_points) - 1))))
    kept = np.arange(0, n, stride)
    return kept if kept[-1] == n - 1 else np.append(kept, n - 1)
