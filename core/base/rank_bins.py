"""Equal-count bins by rank (torch-free: the pages and the metrics share it): each value's bin 0..n−1
in the order of the values, ties broken by position, so each bin holds 1/n of them even where many
values are equal (entropies at 0). The reference set's base-entropy deciles (docs/algorithms.md §15)."""
from __future__ import annotations

import numpy as np


def rank_bins(values, n: int = 10) -> np.ndarray:
    """The bin 0 (lowest) .. n−1 (highest) of each value, by rank."""
    order = np.argsort(np.asarray(values), kind="stable")
    out = np.empty(len(order), dtype=np.int64)
    out[order] = (np.arange(len(order)) * n) // max(len(order), 1)
    return out
