"""trust/* on a TRL GRPOTrainer run that reuses its generation batches (num_iterations > 1, or more
steps per generation than accumulation steps: TRL then keeps `old_per_token_logps`). Each training
micro-batch's ratio and binary TV come from TRL's own per-token log p (the one its loss uses) and its
`old_per_token_logps`, over the tokens TRL's clip metrics count (completion mask × tool mask); at
each of TRL's logging steps the mean over the micro-batches since the last one is logged, as TRL logs
`clip_ratio/region_mean`. Single-process exact; under several processes each rank's own tokens (TRL
reduces its clip metrics over ranks, forksight's trust/* are rank 0's). Formulas: hooks/metrics/trust.py."""
from __future__ import annotations

import logging

import torch

from forksight.hooks.metrics import trust

log = logging.getLogger("forksight.trl")
_TOKEN_LEVEL_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")   # the loss types TRL clips the ratio for


def applies(trainer) -> bool:
    """Whether TRL clips a token-level ratio on this trainer (the losses its clip_ratio/* cover)."""
    return (getattr(trainer, "loss_type", None) in _TOKEN_LEVEL_LOSSES
            and getattr(trainer, "importance_sampling_level", "token") == "token"
            and hasattr(trainer, "_compute_loss") and hasattr(trainer, "_get_per_token_logps_and_entropies"))


class TrlTrust:
    """Wraps the trainer's `_compute_loss` and `_get_per_token_logps_and_entropies` (instance
    attributes: `detach` deletes them) to record each training micro-batch's trust/*."""

    def __init__(self, trainer, tv_delta: float = trust.DEFAULT_DELTA["tv"], records=None):
        """records: () -> the forward records of the step being accumulated (the callback's buffer):
        the micro-batch's ratio, TV and clip per token go onto the record of its forward."""
        self.trainer, self.tv_delta, self.records = trainer, tv_delta, records
        self.pending: list[dict[str, float]] = []
        self._inside, self._last, self._failed = False, None, False
        inner_logps, inner_loss = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

        def logps_and_entropies(*args, **kwargs):
            out = inner_logps(*args, **kwargs)
            if self._inside:        # the call _compute_loss makes for the policy being trained
                self._last = out
            return out

        def compute_loss(model, inputs):
            self._inside, self._last = True, None
            try:
                loss = inner_loss(model, inputs)
            finally:
                self._inside = False
            if trainer.model.training and self._last is not None and inputs.get("old_per_token_logps") is not None:
                try:
                    self._record(inputs)
                except Exception as exc:  # noqa: BLE001 - monitoring must never stop training
                    if not self._failed:
                        self._failed = True
                        log.warning("forksight: trust/* not computed for this TRL run (%r); training goes on", exc)
            return loss

        trainer._get_per_token_logps_and_entropies = logps_and_entropies
        trainer._compute_loss = compute_loss

    @torch.no_grad()
    def _record(self, inputs: dict) -> None:
        trainer = self.trainer
        logps, entropies = self._last[0].detach(), self._last[1]
        old = inputs["old_per_token_logps"].detach()
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        mask = mask.bool()
        adv = inputs["advantages"]
        adv = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(logps)
        h = entropies.detach()[mask].float() if entropies is not None else None
        scalars, columns = trust.measure(logps[mask].float(), old[mask].float(), adv[mask].float(),
                                         clip_low=trainer.epsilon_low, clip_high=trainer.epsilon_high, entropy=h,
                                         tv_delta=self.tv_delta, shape=tuple(mask.shape),
                                         rows=mask.nonzero(as_tuple=True))
        self.pending.append(scalars)
        self._attach(columns)

    def _attach(self, columns: dict[str, torch.Tensor]) -> None:
        """Put the micro-batch's columns on the record of the forward `_compute_loss` just made (the
        record keeps the last `width` completion columns); a later update of the same rows overwrites."""
        records = self.records() if self.records is not None else None
        if not records or records[-1].mask.shape[0] != columns["tv"].shape[0]:
            return
        record, width = records[-1], records[-1].mask.shape[1]
        if width > columns["tv"].shape[1]:
            return
        for name, grid in columns.items():
            setattr(record, name, grid[:, grid.shape[1] - width:].to(record.mask.device))

    def flush(self) -> dict[str, float]:
        """The mean of each trust/* over the micro-batches since the last flush (TRL's logging window)."""
        out, self.pending = trust.mean_of(self.pending) if self.pending else {}, []
        return out

    def detach(self) -> None:
        self.trainer.__dict__.pop("_compute_loss", None)
        self.trainer.__dict__.pop("_get_per_token_logps_and_entropies", None)
