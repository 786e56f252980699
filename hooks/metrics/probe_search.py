"""Pivotal Token Search by bisection (Phi-4 technical report, arXiv 2412.08905, §4.3; docs/algorithms.md
§12): V at a completion's start and end; a segment [a, b) of prefix lengths whose end values differ by at
least the split threshold (value_probe.split_at: half the pivotal δ by default) and that holds more than
one token is split at its midpoint, and so on; a one-token segment is a probed token (pivotal when
|Δ| ≥ δ and > pivot_se SE). A segment whose ends differ by less is not searched inside: about p·log2(T)
values for p pivots instead of the T + 1 of every position.

Where it misses: jumps of opposite sign inside one segment cancel (V rises by 0.3 at one token and falls
by 0.3 at a later one: the segment's ends agree and neither token is found), and each end is an
estimate, so noise at an end can stop a split or start one (measured on real completions against the
sweep over every position: bench/probe_search.py, docs/probe_search.md)."""
from __future__ import annotations

from typing import Sequence

from forksight.hooks.metrics.probe_values import Prefixes


def bisect(values: Prefixes, completions: dict[int, Sequence[int]], split: float,
           progress=None) -> dict[int, list[tuple[int, int]]]:
    """input index -> the leaf segments (a, b) of its completion, ascending and covering 0..T: the
    values of both ends of each are in `values`. Every input's rounds share one estimate call per
    level, so a round's continuations are batched across completions."""
    comps = {i: [int(t) for t in comp] for i, comp in completions.items() if len(comp)}

    def value(i: int, n: int) -> float:
        return values[values.want(i, comps[i][:n])].mean

    for i, comp in comps.items():
        values.want(i, [])
        values.want(i, comp)
    values.estimate(progress)
    leaves: dict[int, list[tuple[int, int]]] = {i: [] for i in comps}
    pending = {i: [(0, len(comp))] for i, comp in comps.items()}
    while pending:
        halves: dict[int, list[tuple[int, int]]] = {}
        for i, segments in pending.items():
            for a, b in segments:
                if b - a > 1 and abs(value(i, b) - value(i, a)) >= split:
                    mid = (a + b) // 2
                    values.want(i, comps[i][:mid])
                    halves.setdefault(i, []).extend([(a, mid), (mid, b)])
                else:
                    leaves[i].append((a, b))
        values.estimate(progress)
        pending = halves
    return {i: sorted(segments) for i, segments in leaves.items()}
