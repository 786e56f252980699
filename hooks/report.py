"""One step's tensors → records for the sink: the single home shared by the bundled trainer,
`hooks.attach` and the TRL callback. Producers compute `TokenStats` once (they need it anyway);
the reporter only summarises and ships what was computed — no second pass over the vocabulary.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Sequence

import numpy as np
import torch

from forksight.hooks import metrics


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return np.asarray(x)


def group_scalars(group_ids: Sequence[int], rewards: Sequence[float], correct: Sequence[bool]) -> dict[str, float]:
    """reward/mean, reward/std, pass@1..pass@G and the fraction of zero-variance groups."""
    by_group: dict[int, list[int]] = defaultdict(list)
    for row, gid in enumerate(group_ids):
        by_group[int(gid)].append(row)
    rewards_arr = np.asarray(rewards, dtype=np.float64)
    out = {"reward/mean": float(rewards_arr.mean()), "reward/std": float(rewards_arr.std())}
    verdicts = [[bool(correct[r]) for r in rows] for rows in by_group.values()]
    for k, value in metrics.pass_at_k_groups(verdicts).items():
        out[f"pass@{k}"] = float(value)
    zero_var = [np.ptp(rewards_arr[rows]) == 0 for rows in by_group.values()]
    out["groups/zero_var_frac"] = float(np.mean(zero_var))
    return out


class StepReporter:
    """Summarise a step (scalars, entropy histogram, token rows of a bounded sample, samples)."""

    def __init__(self, sink, tokenizer=None, token_groups: int = 1, max_token_rows: int = 4096,
                 fork_threshold: float = 0.672):
        self.sink = sink
        self.tokenizer = tokenizer
        self.token_groups = token_groups
        self.max_token_rows = max_token_rows
        self.fork_threshold = fork_threshold

    def report(self, step: int, stats: "metrics.TokenStats", token_ids: torch.Tensor, *,
               selected: torch.Tensor | None = None, fork: torch.Tensor | None = None,
               group_ids: Sequence[int] | torch.Tensor | None = None,
               advantages: torch.Tensor | None = None, samples: list[dict] | None = None,
               extra: dict[str, float] | None = None, weight: float | None = None,
               sample_ids: Sequence[int] | None = None) -> dict[str, float]:
        """Ship one step to the sink and return its scalars (for progress bars).

        sample_ids: the stored id of each row (default its row index); several ranks of one run
        pass ids (and group ids) that do not collide, so a sample's rows never mix across ranks.
        """
        mask = stats.mask.bool()
        if fork is None:
            fork = (stats.entropy >= self.fork_threshold) & mask
        n_tokens = int(mask.sum())
        scalars = metrics.summarize(stats)
        if n_tokens:
            scalars["fork/threshold"] = float(metrics.fork_mask(stats.entropy, mask, 0.2)[1])
            scalars["length/mean"] = float(mask.sum(dim=1).float().mean())
        if selected is not None and n_tokens:
            scalars["selected/frac"] = float((selected.bool() & mask).sum()) / n_tokens
        if advantages is not None and stats.logp is not None and n_tokens:
            cov = metrics.token_covariance(advantages, stats.logp, mask)
            scalars["cov/logp_adv"] = float(cov[mask].mean())
        if group_ids is None:
            group_ids = list(range(mask.shape[0]))
        group_list = [int(g) for g in _np(group_ids).tolist()]
        ids = list(range(mask.shape[0])) if sample_ids is None else [int(i) for i in sample_ids]
        if len(ids) != mask.shape[0]:
            raise ValueError(f"sample_ids has {len(ids)} entries for {mask.shape[0]} rows: give one id per row")
        if samples:
            scalars.update(group_scalars(group_list, [s["reward"] for s in samples],
                                         [bool(s.get("correct", False)) for s in samples]))
        for key, value in (extra or {}).items():
            if value is not None:
                scalars[key] = float(value)
        self.sink.log_scalars(step, scalars, weight=weight if weight is not None else n_tokens)
        if n_tokens:
            counts = metrics.histogram(_np(stats.entropy[mask]), metrics.ENTROPY_EDGES)
            self.sink.log_histogram(step, "entropy", counts, metrics.ENTROPY_EDGES)
        rows = self._token_rows(stats, token_ids, mask, fork, selected, group_list, ids)
        if rows:
            self.sink.log_tokens(step, rows)
        if samples:
            self.sink.log_samples(step, self._sample_rows(samples, group_list, mask, ids))
        return scalars

    def _token_rows(self, stats, token_ids, mask, fork, selected, group_list, sample_ids) -> dict[str, list] | None:
        """Token rows for every rollout of the first `token_groups` groups, capped in size."""
        chosen_groups = list(dict.fromkeys(group_list))[: self.token_groups]
        rows = [r for r, g in enumerate(group_list) if g in chosen_groups]
        cols: dict[str, list] = defaultdict(list)
        ids = _np(token_ids)
        arrays = {name: _np(t) for name, t in (("entropy", stats.entropy), ("renyi2", stats.renyi2),
                                               ("top1", stats.top1), ("logp", stats.logp),
                                               ("js", stats.js)) if t is not None}
        fork_np = _np(fork).astype(bool)
        sel_np = _np(selected).astype(bool) if selected is not None else None
        mask_np = _np(mask).astype(bool)
        for r in rows:
            positions = np.flatnonzero(mask_np[r])
            if len(cols["pos"]) + len(positions) > self.max_token_rows:
                break
            n = len(positions)
            cols["sample_id"] += [sample_ids[r]] * n
            cols["pos"] += list(range(n))
            cols["token_id"] += ids[r, positions].tolist()
            cols["token"] += self._token_texts(ids[r, positions].tolist())
            for name in ("entropy", "renyi2", "top1", "logp", "js"):
                # NaN = not computed for this token (e.g. JS on a sample of groups): stored as null
                values = arrays[name][r, positions].tolist() if name in arrays else [None] * n
                cols[name] += [None if v is not None and math.isnan(v) else v for v in values]
            cols["fork"] += fork_np[r, positions].tolist()
            cols["selected"] += sel_np[r, positions].tolist() if sel_np is not None else [False] * n
        return dict(cols) if cols.get("pos") else None

    def _token_texts(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [str(i) for i in ids]
        return self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)

    @staticmethod
    def _sample_rows(samples: list[dict], group_list: list[int], mask: torch.Tensor,
                     sample_ids: list[int]) -> list[dict]:
        lengths = mask.sum(dim=1).tolist()
        return [
            {
                "sample_id": sample_ids[i],
                "group_id": group_list[i],
                "prompt": s.get("prompt", ""),
                "completion": s.get("completion", ""),
                "reward": float(s["reward"]),
                "correct": bool(s.get("correct", False)),
                "length": int(s.get("length", lengths[i])),
                "source": s.get("source", ""),
            }
            for i, s in enumerate(samples)
        ]
