"""One step's tensors → records for the sink: the single home shared by the bundled trainer,
`hooks.attach` and the TRL callback. Producers compute `TokenStats` once (they need it anyway);
the reporter only summarises and ships what was computed — no second pass over the vocabulary.
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from typing import Any, Sequence

import numpy as np
import torch

from forksight.base.interfaces import Sink
from forksight.base.constants import MISMATCH_EDGES
from forksight.base.fork_rule import ForkRule
from forksight.hooks import metrics
from forksight.hooks.metrics.mismatch import clean_sampler_logp, log_ratio, ratio_scalars
from forksight.hooks.metrics.token_select import fork_threshold


def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    return np.asarray(x)


_TOKEN_FIELDS = ("entropy", "renyi2", "top1", "logp", "js")


class StepReporter:
    """Summarise a step (scalars, entropy histogram, token rows of a bounded sample, samples).
    fork_rule (forksight.base.fork_rule: `abs:τ` or `top:q`, default abs:0.672) decides the `fork`
    column, `fork/frac` and `fork/threshold` (the step's τ in nats; under `top:q` also
    `fork/quantile` = q), not a strategy's own selection (that arrives as `selected`)."""

    def __init__(self, sink: Sink, tokenizer=None, token_groups: int = 1, max_token_rows: int = 4096,
                 fork_rule: "ForkRule | str | None" = None):
        self.sink = sink
        self.tokenizer = tokenizer
        self.token_groups = token_groups
        self.max_token_rows = max_token_rows
        self.fork_rule = ForkRule.parse(fork_rule)
        self._texts: dict[int, str] = {}  # token id -> its text
        self.last_tokens: tuple[int, dict | None] | None = None
        self._warned: set[str] = set()

    def report(self, step: int, stats: "metrics.TokenStats", token_ids: torch.Tensor, *,
               selected: torch.Tensor | None = None, fork: torch.Tensor | None = None,
               group_ids: Sequence[int] | torch.Tensor | None = None,
               advantages: torch.Tensor | None = None, samples: list[dict] | None = None,
               extra: dict[str, float] | None = None, weight: float | None = None,
               sample_ids: Sequence[int] | None = None, parts: torch.Tensor | None = None,
               env_mask: torch.Tensor | None = None, sampler_logp: torch.Tensor | None = None,
               corrected: torch.Tensor | None = None,
               trust: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """Ship one step to the sink and return its scalars. sample_ids: stored id per row (unique across
        ranks); parts: micro-batch per row (means per micro-batch, as TRL logs them); env_mask: tokens
        a tool wrote, stored as token rows with null statistics and never counted. sampler_logp [B, T]:
        the inference engine's log p of each sampled token, aligned with stats.logp (NaN: unknown);
        corrected [B, T]: tokens the run's own mismatch correction truncated or masked. trust: the
        `ratio`, `tv` ([B, T] float, NaN: unknown) and `clipped` ([B, T] bool) of each trained token
        at the batch's last update (hooks/metrics/trust.py: `token_columns`), stored as token columns."""
        mask = stats.mask.bool()
        rule = self.fork_rule
        threshold = fork_threshold(rule, stats.entropy, mask)
        if fork is None:
            fork = (stats.entropy >= threshold) & mask
        n_tokens = int(mask.sum())
        scalars = metrics.summarize(stats, selected=selected, advantages=advantages, parts=parts,
                                    fork_entropy=threshold)
        if math.isfinite(threshold):
            scalars["fork/threshold"] = float(threshold)
        if rule.relative:
            scalars["fork/quantile"] = rule.value
        sampler_logp = self._sampler_logp(sampler_logp, mask)
        ratios = None
        if sampler_logp is not None and stats.logp is not None:
            corrected = corrected if corrected is None or corrected.shape == mask.shape else None
            ratios = log_ratio(stats.logp, sampler_logp, mask)
            scalars.update(ratio_scalars(ratios, fork=fork, corrected=corrected))
        if group_ids is None:
            group_ids = list(range(mask.shape[0]))
        group_list = [int(g) for g in _np(group_ids).tolist()]
        ids = list(range(mask.shape[0])) if sample_ids is None else [int(i) for i in sample_ids]
        if len(ids) != mask.shape[0]:
            raise ValueError(f"sample_ids has {len(ids)} entries for {mask.shape[0]} rows: give one id per row")
        if samples:
            lengths = [s.get("length", n) for s, n in zip(samples, mask.sum(dim=1).tolist())]
            scalars.update(metrics.group_scalars(group_list, [s["reward"] for s in samples],
                                                 [bool(s.get("correct", False)) for s in samples], lengths))
        for key, value in (extra or {}).items():
            if value is not None:
                scalars[key] = float(value)
        self.sink.log_scalars(step, scalars, weight=weight if weight is not None else n_tokens)
        if n_tokens:
            counts = metrics.histogram(_np(stats.entropy[mask]), metrics.ENTROPY_EDGES)
            self.sink.log_histogram(step, "entropy", counts, metrics.ENTROPY_EDGES)
        if "mismatch/tokens" in scalars:
            counts = metrics.histogram(ratios[~torch.isnan(ratios)].numpy(), MISMATCH_EDGES)
            self.sink.log_histogram(step, "mismatch_log_ratio", counts, MISMATCH_EDGES)
        env = env_mask.bool() & ~mask if env_mask is not None else torch.zeros_like(mask)
        rows = self._token_rows(stats, token_ids, mask, env, fork, selected, group_list, ids, sampler_logp,
                                self._trust(trust, mask))
        self.last_tokens = (step, rows)        # the step's stored token rows (the trackers' token views)
        if rows:
            self.sink.log_tokens(step, rows)
        if samples:
            self.sink.log_samples(step, self._sample_rows(samples, group_list, mask, ids))
        return scalars

    def _sampler_logp(self, sampler_logp: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor | None:
        """The sampler's log p checked against the step's shape and cleaned; a bad one is warned about
        once per kind and stored as null, never raised: monitoring must not stop training."""
        if sampler_logp is None:
            return None
        if tuple(sampler_logp.shape) != tuple(mask.shape):
            self._warn("shape", f"sampler_logp has shape {tuple(sampler_logp.shape)} but the step's tokens are "
                                f"{tuple(mask.shape)}: give one sampler log p per completion token, aligned with "
                                f"the trainer's; this step's sampler log p is not stored")
            return None
        values, problem = clean_sampler_logp(sampler_logp, mask, "sampler_logp")
        if problem:
            self._warn("values", problem)
        return values

    def _trust(self, trust: dict[str, torch.Tensor] | None, mask: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """The trust columns if they match the step's shape (else warned once and stored as null)."""
        if not trust:
            return None
        bad = [k for k, v in trust.items() if tuple(v.shape) != tuple(mask.shape)]
        if bad:
            self._warn("trust_shape", f"trust columns {bad} do not have the step's token shape {tuple(mask.shape)}: "
                                      "this step's ratio, tv and clipped are not stored")
            return None
        return trust

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn(message, stacklevel=3)

    def _token_rows(self, stats, token_ids, mask, env, fork, selected, group_list, sample_ids,
                    sampler_logp=None, trust=None) -> dict[str, list] | None:
        """Token rows for every rollout of the first `token_groups` groups, capped in size; the
        environment's tokens keep their place in the text with null statistics."""
        shown = (mask | env).any(1).tolist()  # a rank's rows: other ranks' rows have no tokens here
        chosen_groups = list(dict.fromkeys(g for g, has in zip(group_list, shown) if has))[: self.token_groups]
        rows = [r for r, g in enumerate(group_list) if g in chosen_groups]
        cols: dict[str, list] = defaultdict(list)
        ids = _np(token_ids)
        arrays = {name: _np(getattr(stats, name)) for name in _TOKEN_FIELDS if getattr(stats, name) is not None}
        fields = _TOKEN_FIELDS
        if sampler_logp is not None:
            arrays["sampler_logp"], fields = _np(sampler_logp), _TOKEN_FIELDS + ("sampler_logp",)
        clipped_np = None
        if trust is not None:       # ratio, tv: NaN (null) off the trained tokens; clipped null there too
            arrays.update(ratio=_np(trust["ratio"]), tv=_np(trust["tv"]))
            fields, clipped_np = fields + ("ratio", "tv"), _np(trust["clipped"]).astype(bool)
        fork_np = _np(fork).astype(bool)
        sel_np = _np(selected).astype(bool) if selected is not None else None
        mask_np, env_np = _np(mask).astype(bool), _np(env).astype(bool)
        for r in rows:
            positions = np.flatnonzero(mask_np[r] | env_np[r])
            if len(cols["pos"]) + len(positions) > self.max_token_rows:
                break
            n = len(positions)
            model = mask_np[r, positions]
            cols["sample_id"] += [sample_ids[r]] * n
            cols["pos"] += list(range(n))
            cols["token_id"] += ids[r, positions].tolist()
            cols["token"] += self._token_texts(ids[r, positions].tolist())
            for name in fields:
                # NaN = not computed (JS on a sample of groups), env text = never scored: both null
                values = arrays[name][r, positions].tolist() if name in arrays else [None] * n
                cols[name] += [None if v is None or not m or math.isnan(v) else v for v, m in zip(values, model)]
            cols["fork"] += (fork_np[r, positions] & model).tolist()
            cols["selected"] += (sel_np[r, positions] & model).tolist() if sel_np is not None else [False] * n
            cols["env"] += (~model).tolist()
            if clipped_np is not None:
                known = model & ~np.isnan(arrays["tv"][r, positions])
                cols["clipped"] += [bool(c) if k else None for c, k in zip(clipped_np[r, positions], known)]
        return dict(cols) if cols.get("pos") else None

    def _token_texts(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [str(i) for i in ids]
        # decoding every stored token anew cost ~1 ms a step on the tiny model; the cache is bounded by |V|
        new = [i for i in dict.fromkeys(ids) if i not in self._texts]
        if new:
            self._texts.update(zip(new, self.tokenizer.batch_decode([[i] for i in new], skip_special_tokens=False)))
        return [self._texts[i] for i in ids]

    @staticmethod
    def _sample_rows(samples: list[dict], group_list: list[int], mask: torch.Tensor,
                     sample_ids: list[int]) -> list[dict]:
        from forksight.base.tables import SAMPLE_FIELDS   # the samples table's spec: a new field flows through

        lengths = mask.sum(dim=1).tolist()
        defaults = {"prompt": "", "completion": "", "correct": False, "source": ""}
        rows = []
        for i, s in enumerate(samples):
            row = {name: s.get(name, defaults.get(name)) for name in SAMPLE_FIELDS}
            row.update(sample_id=sample_ids[i], group_id=group_list[i], reward=float(s["reward"]),
                       correct=bool(row["correct"]), length=int(s.get("length", lengths[i])))
            rows.append(row)
        return rows
