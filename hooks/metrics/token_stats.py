"""Per-token statistics in one pass over the vocabulary: Shannon/Rényi-2 entropy, top-1, log p,
ICT JS to the group mean, and the reverse KL to a teacher (docs/algorithms.md §1, §3, §5).

Everything heavy works on blocks of token rows in float32 scratch, so the extra memory stays
bounded by `chunk_size × V × 4` bytes however large B·T is. Per block the logits are read twice
(max, then shift-and-convert); exp is taken once and H, H2, top-1 and log p come from three row
sums of the same exp. Where torch.compile works, each block's sums run as one compiled kernel and
JS as a second one over the same block, converting bf16/fp16 in registers and writing nothing of
size V (hooks/metrics/fused.py); on the CPU C++ kernels take both, and keep each row's exp for
the JS pass (hooks/metrics/native.py). These eager ops are the fallback. bench/metrics.py measures both
against the fastest chunked log_softmax + gather.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from forksight.hooks.metrics import fused as _fused
from forksight.hooks.metrics.logits_source import (LogitsSource, as_groups, as_mask, as_tokens, check_chunk,
                                           check_temperature)


# Scratch is counted in rows of V float32 values; `chunk_size` caps the rows alive at once, so the
# extra memory is at most chunk_size × V × 4 bytes (JS needs one position: 6B rows, at least).
_STATS_ROWS = 4  # per token: e, s (later e·s), e², and a gathered or projected copy of the logits
# Default cap on scratch, below chunk_size when V is large: 128 MB. Measured on 2 shared cores
# (bench/metrics.py): blocks of a few MB lose to per-op thread barriers, blocks of 100s of MB
# to cache misses; 32-64 MB blocks sat in between.
_BLOCK_FLOATS = 1 << 25


@dataclass
class TokenStats:
    """Per-token statistics, each float32 [B, T] on the input's device, 0 where mask is 0."""

    entropy: Tensor
    renyi2: Tensor
    top1: Tensor
    logp: Tensor | None
    js: Tensor | None
    mask: Tensor


# ---------------------------------------------------------------------------- the one pass


def _shift_exp(z: Tensor, inv_temp: float, s_out: Tensor, e_out: Tensor) -> Tensor:
    """Writes s = (z − max z)/temp in float32 (one read of z) and e = exp(s); returns max z."""
    m = z.amax(dim=-1, keepdim=True)
    neg = m.to(torch.float32).mul_(-inv_temp)
    torch.add(neg, z, alpha=inv_temp, out=s_out)  # promotes bf16/fp16 to float32 on the fly
    torch.exp(s_out, out=e_out)
    return m.squeeze(-1)


def _row_sums(planes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Σe, Σe·s and Σe² per row from planes [3, ..., V] = (e, s, scratch), in one reduction.

    s is overwritten; nothing else is allocated. -inf logits (e = 0, s = -inf) contribute 0,
    never NaN. torch.sum sums in a cascade (bmm's dot products were 8x slower and 4e-4 nats off).
    """
    e, s, sq = planes[0], planes[1], planes[2]
    torch.mul(e, s, out=s)
    torch.mul(e, e, out=sq)
    s1, sz, s2 = planes.sum(-1)
    bad = torch.isnan(sz)
    if bool(bad.any()):  # only rows with -inf logits pay: there 0·(-inf) = NaN stands for 0
        sz[bad] = torch.nan_to_num(s[bad], nan=0.0).sum(-1)
    return s1, sz, s2


def _stats_from_sums(s1: Tensor, sz: Tensor, s2: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Shannon H = log Σe - Σe·s/Σe, Rényi-2 H2 = 2 log Σe - log Σe², top-1 = 1/Σe, and log Σe."""
    log_s1 = s1.log()
    entropy = (log_s1 - sz / s1).clamp_(min=0.0)
    renyi2 = (2.0 * log_s1 - s2.log()).clamp_(min=0.0)
    renyi2 = torch.minimum(renyi2, entropy)  # H2 ≤ H holds exactly; rounding may flip it by 1 ulp
    return entropy, renyi2, s1.reciprocal(), log_s1


def _raise_nonfinite(m: Tensor, active: Tensor) -> None:
    bad = ~torch.isfinite(m) & active
    if bool(bad.any()):
        raise ValueError(
            f"{int(bad.sum())} valid token position(s) have NaN/+inf logits or only -inf logits; "
            "fix the model output or mask those positions out"
        )


def _block_rows(chunk_size: int, rows_per_item: int, vocab: int, budget: int = _BLOCK_FLOATS) -> int:
    """How many items (tokens or positions) a block holds within the scratch budget (≥ 1)."""
    return max(1, min(chunk_size, budget // vocab) // rows_per_item)


class _Sums:
    """Per-row raw sums filled block by block; the statistics come from them in one go at the end."""

    def __init__(self, shape: tuple[int, ...], device, with_logp: bool):
        new = lambda: torch.empty(shape, dtype=torch.float32, device=device)  # noqa: E731
        self.max, self.s1, self.sz, self.s2 = new(), new(), new(), new()
        self.s_y = new() if with_logp else None  # shifted logit of the sampled token

    def fill(self, index, planes: Tensor, m: Tensor, tokens: Tensor | None) -> None:
        """Takes one block's planes (e = exp(s), s = shifted logits, scratch); s is overwritten."""
        self.max[index] = m
        if tokens is not None:
            self.s_y[index] = planes[1].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        self.s1[index], self.sz[index], self.s2[index] = _row_sums(planes)

    def fill_fused(self, index, z: Tensor, inv_temp: float, tokens: Tensor | None) -> bool:
        """The same from a compiled kernel (z in any float dtype, converted in it); False: use eager."""
        got = _fused.row_sums(z, inv_temp)
        if got is None:
            return False
        self.fill_sums(index, z, got[0], got[1:], inv_temp, tokens)
        return True

    def fill_sums(self, index, z: Tensor | None, m: Tensor, got, inv_temp: float, tokens: Tensor | None,
                  z_y: Tensor | None = None) -> None:
        """Takes the row max m and (Σe, Σe·s, Σe²) of a block of logits z, from a compiled kernel, and
        the sampled tokens' logits z_y (gathered from z at tokens when not given)."""
        self.max[index] = m
        self.s1[index], self.sz[index], self.s2[index] = got
        if tokens is not None:
            z_y = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        if z_y is not None:
            self.s_y[index] = (z_y.to(torch.float32) - m.to(torch.float32)) * inv_temp

    def finish(self, active: Tensor) -> dict[str, Tensor | None]:
        _raise_nonfinite(self.max, active)
        entropy, renyi2, top1, log_s1 = _stats_from_sums(self.s1, self.sz, self.s2)
        logp = self.s_y - log_s1 if self.s_y is not None else None
        return {"entropy": entropy, "renyi2": renyi2, "top1": top1, "logp": logp}


# ---------------------------------------------------------------------------- public: stats


def token_stats(
    logits: Tensor | None = None,
    *,
    hidden: Tensor | None = None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    tokens: Tensor | None = None,
    temperature: float = 1.0,
    group_ids=None,
    chunk_size: int = 1024,
    fused: bool | None = None,
) -> TokenStats:
    """Shannon/Rényi-2 entropy, top-1 prob, log p(token) and ICT JS to the group mean, per token.

    Give logits [B, T, V] (any float dtype) or hidden [B, T, H] + weight [V, H] (+ bias [V]).
    chunk_size bounds the extra memory to chunk_size × V × 4 bytes. With group_ids a block is at
    least one position of the whole batch (about 6·B rows of V), whatever chunk_size says.
    fused: None (default) runs each block as one compiled kernel (hooks/metrics/fused.py: C++ on
    the CPU, torch.compile elsewhere) when the call is large enough to repay the build and it
    works here, else the eager ops; True insists on a compiled kernel, False never compiles. They
    agree to float32 rounding.
    Raises ValueError on bad shapes, ids out of range, or NaN/+inf logits at valid positions.
    """
    src = LogitsSource(logits, hidden, weight, bias)
    shape = (src.batch, src.time)
    valid = as_mask(mask, shape, src.device)
    toks = as_tokens(tokens, valid, src.vocab)
    groups = as_groups(group_ids, src.batch, src.device)
    inv_temp = 1.0 / check_temperature(temperature)
    chunk_size = check_chunk(chunk_size)

    out = {k: torch.zeros(shape, dtype=torch.float32, device=src.device) for k in ("entropy", "renyi2", "top1")}
    out["logp"] = torch.zeros(shape, dtype=torch.float32, device=src.device) if toks is not None else None
    out["js"] = torch.zeros(shape, dtype=torch.float32, device=src.device) if groups is not None else None
    with torch.no_grad():
        work = src.batch * src.time * src.vocab
        n_groups = int(groups.max()) + 1 if groups is not None and groups.numel() else None  # one sync
        group_rows = None if n_groups is None else src.batch // n_groups
        use_fused = _fused.use_fused(fused, work, src.device, src.dtype, group_rows)
        if groups is None:
            done = _stats_by_tokens(src, valid, toks, inv_temp, chunk_size, out, use_fused)
        else:
            done = _stats_by_positions(src, valid, toks, groups, n_groups, inv_temp, chunk_size, out, use_fused)
        if not done:  # the compiled kernel could not run here: once more, eager
            if fused:
                raise RuntimeError(f"the fused per-token kernels cannot run here: {_fused.failure()}")
            return token_stats(src.logits, hidden=src.hidden, weight=src.weight, bias=src.bias, mask=valid,
                               tokens=toks, temperature=temperature, group_ids=groups,
                               chunk_size=chunk_size, fused=False)
    return TokenStats(mask=valid, **out)


def _stats_by_tokens(src: LogitsSource, valid: Tensor, toks, inv_temp: float, chunk_size: int, out: dict,
                     use_fused: bool) -> bool:
    """Without JS: blocks of valid tokens only (masked positions cost nothing). False: the fused
    kernel could not run (nothing written)."""
    flat, flat_host = _valid_rows(valid)
    n = flat_host.numel()
    if n == 0:
        return True
    b_all, t_all = flat // src.time, flat % src.time
    rows = (_block_rows(chunk_size, 1, src.vocab, _fused.TOKEN_FLOATS) if use_fused
            else _block_rows(chunk_size, _STATS_ROWS, src.vocab))
    buf = None if use_fused else torch.empty((3, min(rows, n), src.vocab), dtype=torch.float32, device=src.device)
    sums = _Sums((n,), src.device, toks is not None)
    tok_valid = toks[b_all, t_all] if toks is not None else None
    for start in range(0, n, rows):
        blk = slice(start, start + rows)
        z = src.rows(flat[blk], flat_host[blk])
        tok_blk = tok_valid[blk] if toks is not None else None
        if use_fused:
            if not sums.fill_fused(blk, z, inv_temp, tok_blk):
                return False
            continue
        planes = buf[:, : flat[blk].numel()]
        m = _shift_exp(z, inv_temp, planes[1], planes[0])
        sums.fill(blk, planes, m, tok_blk)
    for name, value in sums.finish(torch.ones(n, dtype=torch.bool, device=src.device)).items():
        if value is not None:
            out[name][b_all, t_all] = value
    return True


def _valid_rows(valid: Tensor) -> tuple[Tensor, Tensor]:
    """Flat indices b·T + t of the valid tokens, on the device and (one sync) on the CPU."""
    flat = valid.reshape(-1).nonzero().squeeze(1)
    return flat, flat.cpu()


def _stats_by_positions(
    src: LogitsSource, valid: Tensor, toks, groups: Tensor, n_groups: int | None, inv_temp: float,
    chunk_size: int, out: dict, use_fused: bool,
) -> bool:
    """With JS: blocks of positions × all B rows, so each group's rollouts sit side by side.

    JS(p‖P̄) = H(M) − ½H(p) − ½H(P̄) with M = ½(p + P̄). One small batched matmul per block
    gives every row's M and every group's P̄ straight from exp(s) (the 1/Σe folded into it); the
    fused path does the same in a compiled kernel when the groups are runs of equal size (the
    usual layout; others take the eager path). n_groups: max(groups) + 1 (None with no rows).
    False: the fused kernel could not run.
    """
    batch, vocab, device = src.batch, src.vocab, src.device
    positions = valid.any(0).nonzero().squeeze(1)  # only positions some row needs
    positions_host = positions.cpu()
    n_pos = positions.numel()
    if n_pos == 0:
        return True
    if use_fused and _fused.equal_runs(groups, n_groups):
        return _stats_by_positions_fused(src, valid, toks, groups, n_groups, positions, positions_host,
                                         inv_temp, chunk_size, out)
    onehot = torch.nn.functional.one_hot(groups, n_groups).to(torch.float32)  # [B, G]
    act = valid[:, positions].T.contiguous()  # [P, B]
    count = act.to(torch.float32) @ onehot  # [P, G] active rollouts per group and position
    # weight of row j in its group's mean at each position (0 when inactive): 1/count
    mean_weight = act / count.clamp(min=1)[:, groups]  # [P, B]
    # [M; P̄] = ((D + C·w) / Σe) · e with D = [½I; 0] and C = [½·same group; group membership]
    same = onehot @ onehot.T
    c_mat = torch.cat([0.5 * same, onehot.T])  # [B + G, B]
    d_mat = torch.cat([0.5 * torch.eye(batch, device=device), torch.zeros(n_groups, batch, device=device)])
    has_inactive = (~act).any(1).tolist()  # one host sync up front, not one per block

    width = batch + n_groups  # rows of [M; P̄] per position
    # per position: 3B rows of planes (their last 2B later hold [M; P̄]), B + G rows of log [M; P̄],
    # B rows of a logits copy when the positions are not a run
    per_block = _block_rows(chunk_size, 3 * batch + width + batch, vocab)
    buf = torch.empty((3, per_block * batch, vocab), dtype=torch.float32, device=device)
    log_buf = torch.empty((per_block * width, vocab), dtype=torch.float32, device=device)
    sums = _Sums((n_pos, batch), device, toks is not None)
    neg_h = torch.empty((n_pos, width), dtype=torch.float32, device=device)  # Σ x log x of [M; P̄]
    toks_pos = toks[:, positions].T if toks is not None else None
    for start in range(0, n_pos, per_block):
        blk = slice(start, start + per_block)
        t_pos = positions[blk]
        c = t_pos.numel()
        planes = buf[:, : c * batch].view(3, c, batch, vocab)
        e = planes[0]
        m = _shift_exp(src.block(t_pos, positions_host[blk]), inv_temp, planes[1], e)  # block: [c, B, V]
        sums.fill(blk, planes, m, toks_pos[blk] if toks is not None else None)
        inv_s1 = sums.s1[blk].reciprocal()
        if any(has_inactive[blk]):
            # inactive rows (padding) get weight 0 in every mean; only garbage there (NaN/inf,
            # seen in Σe) could still leak, as 0·NaN, so only such rows are zeroed
            inv_s1 = inv_s1.masked_fill(~act[blk], 0.0)
            garbage = ~torch.isfinite(sums.s1[blk]).view(-1)
            if bool(garbage.any()):
                e.view(-1, vocab)[garbage] = 0.0
        mixing = (d_mat + c_mat * mean_weight[blk].unsqueeze(1)) * inv_s1.unsqueeze(1)  # [c, B+G, B]
        free = buf[1:].view(-1, vocab)[: c * width].view(c, width, vocab)  # s and e² are spent
        mixes = torch.bmm(mixing, e, out=free)
        neg_h[blk] = _sum_xlogx(mixes, log_buf[: c * width].view(c, width, vocab))

    _finish_js(sums, act, neg_h, count, groups, positions, out)
    return True


def _finish_js(sums: _Sums, act: Tensor, neg_h: Tensor, count: Tensor, groups: Tensor, positions: Tensor,
               out: dict) -> None:
    """The statistics and JS from the per-position sums (eager path); written to out at the positions."""
    batch = act.shape[1]
    stats = sums.finish(act)
    h_mix, h_mean = -neg_h[:, :batch], -neg_h[:, batch:]
    _write_positions(stats, h_mix - 0.5 * stats["entropy"] - 0.5 * h_mean[:, groups], act, count, groups,
                     positions, out)


def _write_positions(stats: dict, js: Tensor, act: Tensor, count: Tensor, groups: Tensor, positions: Tensor,
                     out: dict) -> None:
    """Writes the statistics and JS [P, B] to out at the positions (0 where inactive)."""
    js = js.clamp_(0.0, math.log(2.0))
    stats["js"] = js.masked_fill(count[:, groups] < 2, 0.0)  # a lone active rollout is its own mean
    for name, value in stats.items():
        if value is not None:
            out[name][:, positions] = value.masked_fill(~act, 0.0).T


def _stats_by_positions_fused(src: LogitsSource, valid: Tensor, toks, groups: Tensor, n_groups: int,
                              positions: Tensor, positions_host: Tensor, inv_temp: float, chunk_size: int,
                              out: dict) -> bool:
    """The fused JS path: per block one compiled call (fused.position) for the max, the sums and
    JS + ½H straight from the logits (exp recomputed, P̄ formed in registers: nothing of size V is
    written)."""
    batch, vocab, device = src.batch, src.vocab, src.device
    n_pos, k = positions.numel(), batch // n_groups
    act = valid[:, positions].T.contiguous()  # [P, B]
    count = act.to(torch.float32).view(n_pos, n_groups, k).sum(-1)  # [P, G]
    mean_weight = act / count.clamp(min=1)[:, groups]  # [P, B]; 0 when inactive
    per_block = _block_rows(chunk_size, batch, vocab, _fused.js_block_floats(device, src.dtype, k))
    toks_pos = toks[:, positions].T if toks is not None else None
    parts = []  # per block: m, Σe, Σe·s, Σe², JS + ½H and the sampled token's logit, [c, B] each;
    for start in range(0, n_pos, per_block):  # joined once at the end (one block is one position)
        blk = slice(start, start + per_block)
        c = positions[blk].numel()
        z = src.block(positions[blk], positions_host[blk])  # [c, B, V], any float dtype
        got = _fused.position(z.view(c, n_groups, k, vocab), inv_temp, mean_weight[blk].view(c, n_groups, k))
        if got is None:
            return False
        z_y = z.gather(-1, toks_pos[blk].unsqueeze(-1)) if toks is not None else None
        parts.append([x.reshape(c, batch) for x in got] + ([z_y.view(c, batch)] if toks is not None else []))
    m, s1, sz, s2, js, *z_y = (torch.cat(column) for column in zip(*parts))
    sums = _Sums((n_pos, batch), device, toks is not None)
    sums.fill_sums(slice(None), None, m, (s1, sz, s2), inv_temp, None, z_y[0] if z_y else None)
    stats = sums.finish(act)
    _write_positions(stats, js - 0.5 * stats["entropy"], act, count, groups, positions, out)
    return True


def _sum_xlogx(x: Tensor, buf: Tensor) -> Tensor:
    """Σ x log x over the last dim with 0·log 0 = 0; buf (same shape) is scratch space."""
    terms = torch.mul(x, torch.log(x, out=buf), out=buf)
    total = terms.sum(-1)
    bad = torch.isnan(total)
    if bool(bad.any()):  # zeros in x (masked vocabulary, exp underflow): only those rows pay
        total[bad] = torch.nan_to_num(terms[bad], nan=0.0).sum(-1)
    return total


def token_kl(
    student_logits: Tensor, teacher_logits: Tensor, mask: Tensor | None = None, chunk_size: int = 1024
) -> Tensor:
    """Reverse KL(p_student ‖ p_teacher) per token over the full vocabulary, float32 [B, T] (§4).

    0 where mask is 0; +inf where the teacher gives -inf to a token the student can sample.
    """
    student = LogitsSource(student_logits, None, None, None)
    teacher = LogitsSource(teacher_logits, None, None, None)
    if (student.batch, student.time, student.vocab) != (teacher.batch, teacher.time, teacher.vocab):
        raise ValueError(
            f"student logits {tuple(student.logits.shape)} and teacher logits {tuple(teacher.logits.shape)} must match"
        )
    shape, vocab = (student.batch, student.time), student.vocab
    valid = as_mask(mask, shape, student.device)
    out = torch.zeros(shape, dtype=torch.float32, device=student.device)
    flat, flat_host = _valid_rows(valid)
    n = flat_host.numel()
    if n == 0:
        return out
    rows = _block_rows(check_chunk(chunk_size), 6, vocab)  # 4 buffers + 2 possible copies
    bufs = [torch.empty((min(rows, n), vocab), dtype=torch.float32, device=student.device) for _ in range(4)]
    kl = torch.empty(n, dtype=torch.float32, device=student.device)
    maxes = torch.empty((2, n), dtype=torch.float32, device=student.device)
    with torch.no_grad():
        for start in range(0, n, rows):
            blk = slice(start, start + rows)
            s_s, e_s, s_t, e_t = (buf[: flat[blk].numel()] for buf in bufs)
            maxes[0, blk] = _shift_exp(student.rows(flat[blk], flat_host[blk]), 1.0, s_s, e_s)
            maxes[1, blk] = _shift_exp(teacher.rows(flat[blk], flat_host[blk]), 1.0, s_t, e_t)
            s1_s, s1_t = e_s.sum(-1), e_t.sum(-1)
            # log p_s − log p_t = (s_s − s_t) − log Σe_s + log Σe_t, differenced per element
            terms = torch.mul(e_s, torch.sub(s_s, s_t, out=s_t), out=s_t)
            cross = terms.sum(-1)
            bad = torch.isnan(cross)
            if bool(bad.any()):  # 0 · (±inf or NaN) where the student puts no mass: counts 0
                cross[bad] = torch.nan_to_num(terms[bad], nan=0.0, posinf=math.inf).sum(-1)
            kl[blk] = cross / s1_s - s1_s.log() + s1_t.log()
    _raise_nonfinite(maxes, torch.ones_like(maxes, dtype=torch.bool))
    out.view(-1)[flat] = kl.clamp_(min=0.0)
    return out
