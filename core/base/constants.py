"""Numbers every room shares (torch-free): the fork-entropy reference and the histogram bins.

The producers compute with them, the collector's detectors and the dashboard draw and judge
with them; one definition here keeps the three in agreement.
"""
from __future__ import annotations

import numpy as np

# The 80th entropy percentile reported by "Beyond the 80/20 Rule" (Qwen3-8B CoT). An ABSOLUTE
# reference: `fork/frac` counts tokens with H >= FORK_ENTROPY so runs can be compared with the
# paper's line. Not to be confused with the `fork` strategy's top-rho quantile, which is relative
# to each batch (see forksight.hooks.metrics.token_select.top_rho_mask).
FORK_ENTROPY = 0.672


def _entropy_edges() -> np.ndarray:
    """0; 10 log bins per decade from 1e-4 to 1 nat (over half the tokens are < 0.01); 0.1-nat bins
    to 4; 0.25-nat bins to 12 (≥ log 151936 ≈ 11.93). FORK_ENTROPY is an edge of its own."""
    fine = np.round(np.logspace(-4, 0, 41), 6)
    mid = np.round(np.arange(1.1, 4.0 + 1e-9, 0.1), 6)
    wide = np.round(np.arange(4.25, 12.0 + 1e-9, 0.25), 6)
    return np.unique(np.concatenate([[0.0, FORK_ENTROPY], fine, mid, wide]))


# fixed histogram bin edges (nats) shared by every producer, so ranks and steps add up bin by bin
ENTROPY_EDGES: np.ndarray = _entropy_edges()

# Training–inference mismatch: the per-token log ratio log r = log p_train − log p_sampler (nats).
# The ratio bands verl and the published diagnostic plot mark: r outside [1/2, 2] and [1/5, 5].
MISMATCH_BANDS: tuple[float, float] = (2.0, 5.0)
MISMATCH_LIMIT = 4.0   # |log r| past this (a ratio over ~55x) goes to the end bins


def _mismatch_edges() -> np.ndarray:
    """Symmetric log-ratio bins: 8 log bins per decade of |log r| from 1e-4 to 0.1 nat, 0.05-nat bins
    to 1, 0.25-nat bins to MISMATCH_LIMIT, with 0 and the ±log 2, ±log 5 bands as edges of their own."""
    fine = np.logspace(-4, -1, 25)
    mid = np.arange(0.15, 1.0 + 1e-9, 0.05)
    wide = np.arange(1.25, MISMATCH_LIMIT + 1e-9, 0.25)
    bands = np.log(np.asarray(MISMATCH_BANDS))
    half = np.unique(np.round(np.concatenate([fine, mid, wide, bands]), 6))
    return np.concatenate([-half[::-1], [0.0], half])


# fixed bins of the `mismatch_log_ratio` histogram shared by every producer (ranks and steps add up)
MISMATCH_EDGES: np.ndarray = _mismatch_edges()

# The media type of an Arrow IPC stream body (token batches): the sinks send it, the collector
# requires it on its Arrow routes.
ARROW_MEDIA_TYPE = "application/vnd.apache.arrow.stream"
