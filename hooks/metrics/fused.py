"""The fused path of token_stats: each block's sums in one compiled kernel (torch.compile: C++ on
the CPU, Triton on CUDA), the eager path in token_stats.py being the fallback (docs:
docs/algorithms.md §1, §3).

Per block of rows, after an eager max m (one cheap read, and the NaN/inf check):
  `sums`   one read of the logits: s = (z − m)/temp, e = exp(s), and Σe, Σe·s, Σe² accumulated
           from the same e; nothing of size V is written.
  `sums_e` the same, also writing e (float32) into a scratch buffer, for JS.
  `js`     from e of one position's whole group [G, k, V]: P̄ = Σ_j w_j e_j (w_j = 1/(|A|·Σe_j),
           0 for inactive rows) and Σ M log M, Σ P̄ log P̄ for M_i = ½(e_i/Σe_i + P̄).
exp is a degree-7 polynomial with a power-of-two scale (Cephes expf, rel. error < 1e-7): inductor's
exp on the CPU is the accurate SLEEF one, 2-3x slower than the exp PyTorch's own softmax uses,
which made the compiled kernel lose to the log-softmax it was measured against (bench/metrics.py).
s is clamped at −87 (e ≥ 1.6e-38) so −inf logits give a negligible term, never NaN.
"""
from __future__ import annotations

import os
import threading
import warnings

import torch
from torch import Tensor

_LOG2E = 1.4426950408889634
_EXP_MIN = -87.0  # exp(−87) ≈ 1.6e-38, still a normal float32
_XLOGX_MIN = 1e-37  # Σ x log x clamps x here: 0·log 0 = 0 up to 1e-35 per term
# Work (rows × V) below which the eager path is used: a first compile takes tens of seconds.
FUSED_MIN_ELEMENTS = 1 << 24
ENV_SWITCH = "FORKSIGHT_FUSED"  # "0": never compile; "1": the default (compile where it pays)
# Blocks (rows × V floats), chosen with bench/metrics.py --sweep at [6, 256, 151936], 1 thread:
# without JS nothing of size V is written and bigger blocks amortise the per-block calls (~110
# rows); with JS e is written and read back, so its block stays cache-sized (~34 rows).
TOKEN_FLOATS = 1 << 24
JS_FLOATS = 5 << 20
# bf16/fp16 logits on the CPU: inductor's in-kernel conversion ran the kernel 2-3x slower, so
# each block is first converted to float32 into one reused buffer, in blocks of ~8 rows.
CONVERT_FLOATS = 5 << 18


def _exp(s: Tensor) -> Tensor:
    """exp(s) for s in [−87, 0]: 2**n · P(r) with n = round(s·log2 e), r = s − n·ln 2 (Cephes)."""
    n = torch.floor(s * _LOG2E + 0.5)
    r = s - n * 0.693359375 + n * 2.12194440e-4
    p = r * 1.9875691500e-4 + 1.3981999507e-3
    for c in (8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c
    p = p * r * r + r + 1.0
    return p * ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def _shifted(z: Tensor, m: Tensor, inv_temp: float) -> Tensor:
    return ((z.to(torch.float32) - m.unsqueeze(-1)) * inv_temp).clamp(min=_EXP_MIN)


def _sums(z: Tensor, m: Tensor, inv_temp: float) -> tuple[Tensor, Tensor, Tensor]:
    s = _shifted(z, m, inv_temp)
    e = _exp(s)
    return e.sum(-1), (e * s).sum(-1), (e * e).sum(-1)


def _sums_e(z: Tensor, m: Tensor, inv_temp: float, e_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s = _shifted(z, m, inv_temp)
    e = _exp(s)
    e_out.copy_(e)
    return e.sum(-1), (e * s).sum(-1), (e * e).sum(-1)


def _js(e: Tensor, inv_s1: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """e [c, G, k, V]; inv_s1, w [c, G, k]. Returns Σ M log M [c, G, k] and Σ P̄ log P̄ [c, G].

    Written out per row (k is fixed per trace): all k + 1 sums then share one loop over V and P̄
    is never stored (18% faster than a reduction over k followed by a second pass)."""
    k = e.shape[2]
    mean = None
    for j in range(k):
        # a select, not a product: an inactive row may hold NaN (padding garbage), 0·NaN = NaN
        term = torch.where(w[:, :, j:j + 1] > 0, e[:, :, j, :] * w[:, :, j:j + 1], 0.0)
        mean = term if mean is None else mean + term
    sums = []
    for i in range(k):
        mix = ((e[:, :, i, :] * inv_s1[:, :, i:i + 1] + mean) * 0.5).clamp(min=_XLOGX_MIN)
        sums.append((mix * mix.log()).sum(-1))
    mean = mean.clamp(min=_XLOGX_MIN)
    return torch.stack(sums, -1), (mean * mean.log()).sum(-1)


def _js_wide(e: Tensor, inv_s1: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """_js for large groups (k > MAX_UNROLLED): P̄ as a reduction over k, then Σ x log x."""
    w = w.unsqueeze(-1)
    mean = torch.where(w > 0, e * w, 0.0).sum(2, keepdim=True)
    mix = ((e * inv_s1.unsqueeze(-1) + mean) * 0.5).clamp(min=_XLOGX_MIN)
    mean = mean.clamp(min=_XLOGX_MIN)
    return (mix * mix.log()).sum(-1), (mean * mean.log()).sum(-1).squeeze(-1)


MAX_UNROLLED = 16


class _Kernels:
    """The compiled functions, compiled on first use; `failed` once a compile or first run broke."""

    def __init__(self):
        self.lock = threading.Lock()
        self.compiled: dict[str, object] = {}
        self.proven: set[tuple] = set()  # (name, device type, dtype, ndim) that ran once
        self.failed: str | None = None

    def call(self, name: str, fn, key: tuple, *args):
        with self.lock:
            compiled = self.compiled.get(name)
            if compiled is None:
                compiled = self.compiled[name] = torch.compile(fn, dynamic=True, fullgraph=True)
        if key in self.proven:
            return compiled(*args)
        try:
            out = compiled(*args)
        except Exception as err:  # no compiler, no Triton, an unsupported device: eager from now on
            self.failed = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            warnings.warn(
                f"forksight: torch.compile of the per-token kernels failed ({self.failed}); "
                f"using the eager path (set {ENV_SWITCH}=0 to skip the attempt)",
                RuntimeWarning,
                stacklevel=4,
            )
            return None
        self.proven.add(key)
        return out


_KERNELS = _Kernels()


def use_fused(fused: bool | None, elements: int, device: torch.device) -> bool:
    """Whether this call takes the fused path: fused=True forces it (an error if it cannot run),
    False never; None (default) takes it when it pays (≥ FUSED_MIN_ELEMENTS) and can run."""
    if fused is False:
        return False
    if fused is None:
        if os.environ.get(ENV_SWITCH, "1") == "0" or _KERNELS.failed is not None:
            return False
        if device.type not in ("cpu", "cuda") or elements < FUSED_MIN_ELEMENTS:
            return False
    elif _KERNELS.failed is not None:
        raise RuntimeError(f"the fused per-token kernels cannot run here: {_KERNELS.failed}")
    return True


def needs_conversion(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether blocks are converted to float32 before the kernel (non-float32 on the CPU)."""
    return dtype != torch.float32 and device.type == "cpu"


def equal_runs(groups: Tensor, n_groups: int) -> bool:
    """Whether the rows come as n_groups runs of equal size, group 0 first (dense ids): the
    layout the JS kernel takes ([c, G, k, V]); TRL and verl lay groups out this way."""
    batch = groups.numel()
    if batch % n_groups:
        return False
    expected = torch.arange(n_groups, device=groups.device).repeat_interleave(batch // n_groups)
    return bool(torch.equal(groups, expected))


def failure() -> str | None:
    """Why the compiled kernels cannot run here (None: they can, or were not tried)."""
    return _KERNELS.failed


def _key(name: str, z: Tensor) -> tuple:
    return (name, z.device.type, z.dtype, z.dim())


def sums(z: Tensor, m: Tensor, inv_temp: float):
    """(Σe, Σe·s, Σe²) per row of z [..., V], or None when the kernel cannot run (use eager)."""
    return _KERNELS.call("sums", _sums, _key("sums", z), z, m.to(torch.float32), inv_temp)


def sums_e(z: Tensor, m: Tensor, inv_temp: float, e_out: Tensor):
    """As `sums`, also writing e = exp(s) into e_out (float32, z's shape); None: use eager."""
    return _KERNELS.call("sums_e", _sums_e, _key("sums_e", z), z, m.to(torch.float32), inv_temp, e_out)


def js(e: Tensor, inv_s1: Tensor, w: Tensor):
    """(Σ M log M [c, G, k], Σ P̄ log P̄ [c, G]) of e [c, G, k, V]; None: use eager."""
    if e.shape[2] > MAX_UNROLLED:
        return _KERNELS.call("js_wide", _js_wide, _key("js_wide", e), e, inv_s1, w)
    return _KERNELS.call("js", _js, _key("js", e) + (e.shape[2],), e, inv_s1, w)

