"""Inputs of the per-token math, checked and normalised: masks, token ids, group ids, and the
logits source (logits [B, T, V], or hidden [B, T, H] × Wᵀ computed block by block).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

# ---------------------------------------------------------------------------- input checks


def as_mask(mask, shape: tuple[int, int], device) -> Tensor:
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    mask = torch.as_tensor(mask, device=device)
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}; expected [B, T] = {list(shape)}")
    return mask.detach().to(torch.bool)


def as_tokens(tokens, mask: Tensor, vocab: int) -> Tensor | None:
    if tokens is None:
        return None
    tokens = torch.as_tensor(tokens, device=mask.device).detach()
    if tuple(tokens.shape) != tuple(mask.shape):
        raise ValueError(f"tokens has shape {tuple(tokens.shape)}; expected [B, T] = {list(mask.shape)}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be integer token ids, got dtype {tokens.dtype}")
    tokens = tokens.long()
    valid = tokens[mask]
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= vocab):
        raise ValueError(
            f"token ids at valid positions must lie in [0, {vocab}); got min {int(valid.min())}, "
            f"max {int(valid.max())} (mask out padding such as -100)"
        )
    return tokens.masked_fill(~mask, 0)  # padding ids become harmless indices


def as_groups(group_ids, batch: int, device) -> Tensor | None:
    if group_ids is None:
        return None
    g = torch.as_tensor(group_ids, device=device).detach().reshape(-1)
    if g.numel() != batch:
        raise ValueError(f"group_ids has {g.numel()} entries; expected one per row (B = {batch})")
    if g.dtype.is_floating_point and g.numel():  # an empty list arrives as float32
        raise ValueError(f"group_ids must be integers, got dtype {g.dtype}")
    return torch.unique(g.long(), return_inverse=True)[1]  # dense ids 0..n_groups-1


def check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    return t


def check_chunk(chunk_size: int) -> int:
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1 (rows of the vocabulary per chunk), got {chunk_size}")
    return int(chunk_size)


# ---------------------------------------------------------------------------- logits source


class LogitsSource:
    """Yields float32-ready logits for selected rows, from logits or from hidden·Wᵀ (+bias)."""

    def __init__(self, logits, hidden, weight, bias):
        if (logits is None) == (hidden is None):
            raise ValueError("pass exactly one of logits [B, T, V] or hidden [B, T, H] with weight [V, H]")
        if logits is not None:
            logits = torch.as_tensor(logits).detach()
            if logits.dim() != 3 or not logits.dtype.is_floating_point:
                raise ValueError(
                    f"logits must be a float tensor [B, T, V]; got shape {tuple(logits.shape)}, dtype {logits.dtype}"
                )
            self.batch, self.time, self.vocab = logits.shape
            self.device = logits.device
        else:
            hidden = torch.as_tensor(hidden).detach()
            if weight is None:
                raise ValueError("hidden states need the output matrix: pass weight [V, H] (lm_head.weight)")
            weight = torch.as_tensor(weight).detach()
            if hidden.dim() != 3 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
                raise ValueError(
                    f"hidden must be [B, T, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
                )
            if not (hidden.dtype.is_floating_point and weight.dtype.is_floating_point):
                raise ValueError("hidden and weight must be floating-point tensors")
            if bias is not None:
                bias = torch.as_tensor(bias).detach()
                if tuple(bias.shape) != (weight.shape[0],):
                    raise ValueError(f"bias must be [V] = [{weight.shape[0]}], got {tuple(bias.shape)}")
            self.batch, self.time, _ = hidden.shape
            self.vocab = weight.shape[0]
            self.device = hidden.device
        if self.vocab < 1:
            raise ValueError("the vocabulary dimension V is empty")
        self.logits, self.hidden, self.weight, self.bias = logits, hidden, weight, bias

    @property
    def dtype(self) -> torch.dtype:
        """The dtype blocks come in: the logits', or the weight's (the projection's)."""
        return (self.logits if self.logits is not None else self.weight).dtype

    def block(self, t_pos: Tensor, t_host: Tensor) -> Tensor:
        """Logits of all B rows at positions t_pos as [c, B, V]; a strided view when the positions
        (t_host: the same, sorted, on the CPU) form a run."""
        if self.logits is not None:
            if _is_run(t_host):
                return self.logits[:, int(t_host[0]) : int(t_host[-1]) + 1].transpose(0, 1)
            return self.logits[:, t_pos].transpose(0, 1)
        return self._project(self.hidden[:, t_pos].transpose(0, 1))

    def _project(self, h: Tensor) -> Tensor:
        # The model computes its logits in the weight's dtype; doing the same keeps this path
        # equal to the logits path (float32 afterwards, like every other path).
        z = h.to(self.weight.dtype) @ self.weight.T
        if self.bias is not None:
            z = z + self.bias.to(z.dtype)
        return z

    def rows(self, flat: Tensor, flat_host: Tensor) -> Tensor:
        """Logits of the rows at flat indices b·T + t as [R, V]; a view when flat_host (the same,
        sorted, on the CPU) is a run, so the common unpadded case copies nothing."""
        if self.logits is not None:
            view = _flat_view(self.logits)
            if view is not None and _is_run(flat_host):
                return view[int(flat_host[0]) : int(flat_host[-1]) + 1]
            return self.logits[flat // self.time, flat % self.time]
        return self._project(self.hidden[flat // self.time, flat % self.time])


def _flat_view(x: Tensor) -> Tensor | None:
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:  # non-viewable strides: fall back to gathering rows
        return None


def _is_run(sorted_host: Tensor) -> bool:
    """Whether sorted distinct indices (on the CPU: no device sync) are consecutive."""
    return sorted_host.numel() > 0 and int(sorted_host[-1]) - int(sorted_host[0]) + 1 == sorted_host.numel()
