"""The fused path of token_stats: each block's sums in one compiled kernel (torch.compile: C++ on
the CPU, Triton on CUDA), the eager path in token_stats.py being the fallback (docs:
docs/algorithms.md §1, §3). On the CPU the C++ kernels of native.py go first (they build in a
second, not 10-30 s, and with JS keep exp between the passes, which no inductor graph here did
as fast); these compiled ones are their fallback there and the path on CUDA.

Per block of rows, after an eager max m (one cheap read, and the NaN/inf check):
  `sums`   one read of the logits: s = (z − m)/temp, e = exp(s), and Σe, Σe·s, Σe² accumulated
           from the same e; nothing of size V is written.
  `js`     a second read of one position's whole group [G, k, V], after `sums`: e recomputed,
           ½P̄ = Σ_j ½w_j e_j (w_j = 1/(|A|·Σe_j), 0 for inactive rows) formed in registers, and
           Σ_v ½P̄ log P̄ − M_i log M_i summed per row (M_i = ½(p_i + P̄)); JS_i is that − ½H(p_i).
exp is a degree-7 polynomial with a power-of-two scale (Cephes expf, rel. error < 1e-7; in `js`
a degree-5 one, rel. error ~1e-6, as P̄ and M only scale its terms), log a
degree-8 one after splitting off the exponent (rel. error < 4e-7): inductor's exp and log on the
CPU are the accurate SLEEF ones (log: 2x slower), and every JS term needs a log. The kernels are
compiled with fused multiply-adds (_OPTIONS). s is kept ≥ −87 (e ≥ 1.6e-38) by a select, so −inf
logits give a negligible term and NaN garbage in padding never reaches a sum of another row.
"""
from __future__ import annotations

import os
import threading
import warnings

import torch
from torch import Tensor

from forksight.hooks.metrics import native

_LOG2E = 1.4426950408889634
_EXP_MIN = -87.0  # exp(−87) ≈ 1.6e-38, still a normal float32
_LN2 = 0.6931471805599453
_LN2_HI, _LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 = HI + LO, HI exact in a few bits
# Work (rows × V) below which the eager path is used: torch.compile's first compile takes 10-30 s;
# the C++ kernels' build about a second, once per machine (then 0.1 s to load), and they beat the
# eager ops from small sizes on.
FUSED_MIN_ELEMENTS = 1 << 24
NATIVE_MIN_ELEMENTS = 1 << 16
ENV_SWITCH = "FORKSIGHT_FUSED"  # "0": never compile; "1": the default (compile where it pays)
# Blocks (rows × V floats), chosen with bench/metrics.py --sweep at [6, 256, 151936], 1 thread:
# without JS nothing of size V is written and bigger blocks amortise the per-block calls (~110
# rows); with JS the JS kernel reads the block the sums kernel just read, so it stays cache-sized
# (one position of 6 rows).
TOKEN_FLOATS = 1 << 24
JS_FLOATS = 1 << 20
# bf16/fp16 logits are converted inside the kernels (measured 20% faster than converting each
# block into a float32 buffer first, at torch 2.13).


def _exp(s: Tensor) -> Tensor:
    """exp(s) for s in [−87, 0]: 2**n · P(r) with n = round(s·log2 e), r = s − n·ln 2 (Cephes)."""
    n = torch.floor(s * _LOG2E + 0.5)
    r = s - n * 0.693359375 + n * 2.12194440e-4
    p = r * 1.9875691500e-4 + 1.3981999507e-3
    for c in (8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c
    p = p * r * r + r + 1.0
    return p * ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def _exp_fast(s: Tensor) -> Tensor:
    """exp(s) for s in [−87, 0] with a degree-5 polynomial (ATen's exp_u20 coefficients, rel. error
    ~1e-6): for JS, whose terms it only scales."""
    n = torch.floor(s * _LOG2E + 0.5)
    r = s - n * 0.693359375 + n * 2.12194440e-4
    p = r * 0.00828929059 + 0.0418978221
    for c in (0.166676521, 0.499991506, 0.999999701):
        p = p * r + c
    return (p * r + 1.0) * ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def _shifted(z: Tensor, m: Tensor, inv_temp: float) -> Tensor:
    """s = (z − m)/temp, at least _EXP_MIN; a select, not a clamp: NaN (padding garbage) becomes
    _EXP_MIN too, and the select is cheaper than a NaN-propagating max."""
    s = (z.to(torch.float32) - m.unsqueeze(-1)) * inv_temp
    return torch.where(s > _EXP_MIN, s, _EXP_MIN)


def _sums(z: Tensor, m: Tensor, inv_temp: float) -> tuple[Tensor, Tensor, Tensor]:
    s = _shifted(z, m, inv_temp)
    e = _exp(s)
    return e.sum(-1), (e * s).sum(-1), (e * e).sum(-1)


def _log(x: Tensor) -> Tensor:
    """log x for normal positive float32: x = 2**n · f with f in [2/3, 4/3), log f = r − r²/2 + r³·P(r)
    (r = f − 1, P of degree 5 fitted on that range; rel. error < 4e-7), no division, unlike
    inductor's SLEEF log. Zero gives a finite value (only ever multiplied by zero here)."""
    bits = x.view(torch.int32)
    n = (bits - 0x3F2AAAAB) >> 23  # exponent such that the mantissa lands in [2/3, 4/3)
    r = (bits - (n << 23)).view(torch.float32) - 1.0
    r2 = r * r
    p = r * -0.15630834 + 0.17128032
    for c in (-0.16382664, 0.19796002, -0.25008026, 0.33337551):
        p = p * r + c
    nf = n.to(torch.float32)
    return (r2 * (r * p - 0.5) + nf * _LN2_LO) + r + nf * _LN2_HI


def _js(z: Tensor, scale: Tensor, shift: Tensor, half_inv_s1: Tensor, half_w: Tensor) -> Tensor:
    """Σ_v ½P̄ log P̄ − M_i log M_i (M_i = ½(p_i + P̄)) per row from the logits z [c, G, k, V] of one
    position's groups; JS_i is this minus ½H(p_i), which the caller has from `sums`. Per row
    [c, G, k]: s = z·scale + shift (scale = 1/temp, shift = −m/temp), ½/Σe and ½w (w: the row's
    weight in P̄, 1/(|A|·Σe), 0 when inactive), computed outside so the loop only loads them.

    Written out per row (k is fixed per trace): e is recomputed from z (nothing of size V is
    written) and ½P̄ and the k sums share one loop over V. Garbage (NaN/inf) in an inactive row
    becomes s = _EXP_MIN, so weight 0 keeps it out of P̄ without a select."""
    k = z.shape[2]
    half_mean, half_ps = None, []
    for j in range(k):
        s = z[:, :, j, :].to(torch.float32) * scale[:, :, j:j + 1] + shift[:, :, j:j + 1]
        e = _exp_fast(torch.where(s > _EXP_MIN, s, _EXP_MIN))
        half_ps.append(e * half_inv_s1[:, :, j:j + 1])
        term = e * half_w[:, :, j:j + 1]
        half_mean = term if half_mean is None else half_mean + term
    # ½P̄ log P̄ = ½P̄ (log ½P̄ + log 2), the same for every row of the group: summed once
    shared = (half_mean * (_log(half_mean) + _LN2)).sum(-1, keepdim=True)
    rows = [-((half_ps[i] + half_mean) * _log(half_ps[i] + half_mean)).sum(-1) for i in range(k)]
    return torch.stack(rows, -1) + shared


def _js_wide(z: Tensor, scale: Tensor, shift: Tensor, half_inv_s1: Tensor, half_w: Tensor) -> Tensor:
    """_js for large groups (k > MAX_UNROLLED): ½P̄ as a reduction over k, then the sums."""
    s = z.to(torch.float32) * scale.unsqueeze(-1) + shift.unsqueeze(-1)
    e = _exp_fast(torch.where(s > _EXP_MIN, s, _EXP_MIN))
    half_mean = (e * half_w.unsqueeze(-1)).sum(2, keepdim=True)
    mix = e * half_inv_s1.unsqueeze(-1) + half_mean
    return (half_mean * (_log(half_mean) + _LN2)).sum(-1) - (mix * _log(mix)).sum(-1)


def _position(z: Tensor, inv_temp: float, w_norm: Tensor) -> tuple[Tensor, ...]:
    """One call per block of positions z [c, G, k, V]: the row max m, `sums` and `js` (w_norm: each
    row's share of P̄, 1/|A| or 0 when inactive, [c, G, k]); the small steps between them are traced
    into the same graph instead of costing an eager op each."""
    m = z.amax(-1).to(torch.float32)
    s1, sz, s2 = _sums(z, m, inv_temp)
    half_inv_s1 = 0.5 / s1  # Σe ≥ 1, even for garbage rows (their s are all −87 but one)
    kernel = _js if z.shape[2] <= MAX_UNROLLED else _js_wide
    return m, s1, sz, s2, kernel(z, torch.full_like(m, inv_temp), m * -inv_temp, half_inv_s1, w_norm * half_inv_s1)


MAX_UNROLLED = 16
# a·b + c as one fused multiply-add in the C++ kernels (inductor compiles with -ffp-contract=off by
# default): the polynomials above are chains of them; measured 20% faster, and no less accurate
_OPTIONS = {"cpp.enable_floating_point_contract_flag": "fast"}
# For float32 logits, higher realize thresholds keep inductor from storing exp's intermediates
# (n, r) into V-sized buffers nothing reads (dead stores that evict L2): with JS, measured 8%
# faster at [6, 256, 151936] and 2x at [6, 256, 32768]; for bf16 they made the kernels 2x slower.
_OPTIONS_F32 = dict(_OPTIONS, realize_reads_threshold=100, realize_cpu_opcount_threshold=10_000)


class _Kernels:
    """The compiled functions, compiled on first use; `failed` once a compile or first run broke."""

    def __init__(self):
        self.lock = threading.Lock()
        self.compiled: dict[tuple[str, bool], object] = {}  # (name, float32 logits)
        self.proven: set[tuple] = set()  # (name, device type, dtype, ndim) that ran once
        self.failed: str | None = None

    def call(self, name: str, fn, key: tuple, *args):
        f32 = key[2] == torch.float32  # key: (name, device type, dtype, ...)
        with self.lock:
            compiled = self.compiled.get((name, f32))
            if compiled is None:
                compiled = self.compiled[(name, f32)] = torch.compile(
                    fn, dynamic=True, fullgraph=True, options=_OPTIONS_F32 if f32 else _OPTIONS)
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


def use_fused(fused: bool | None, elements: int, device: torch.device, dtype: torch.dtype,
              group_rows: int | None = None) -> bool:
    """Whether this call takes the fused path: fused=True forces it (an error if it cannot run),
    False never; None (default) takes it when it pays and can run: from NATIVE_MIN_ELEMENTS where
    the C++ kernels take it (a build of about a second, once per machine), else from
    FUSED_MIN_ELEMENTS (torch.compile's first compile). group_rows: rows per group, with JS."""
    if fused is False:
        return False
    cpp = native.usable(device, dtype, group_rows)
    if fused is None:
        if os.environ.get(ENV_SWITCH, "1") == "0":
            return False
        if cpp:
            return elements >= NATIVE_MIN_ELEMENTS
        return (_KERNELS.failed is None and device.type in ("cpu", "cuda")
                and elements >= FUSED_MIN_ELEMENTS)
    if not cpp and _KERNELS.failed is not None:
        raise RuntimeError(f"the fused per-token kernels cannot run here: {_KERNELS.failed}")
    return True


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


def kernels_run() -> list[str]:
    """The compiled kernels that have run in this process (bench/metrics.py reports them)."""
    return sorted({key[0] for key in _KERNELS.proven} | {f"{name} (C++)" for name in native.ran()})


def js_block_floats(device: torch.device, dtype: torch.dtype, group_rows: int) -> int:
    """Logits per block of the JS path: cache-sized for the compiled kernel, which reads each
    block twice; larger, and per thread, for the C++ one."""
    if native.usable(device, dtype, group_rows):
        return native.BLOCK_FLOATS * torch.get_num_threads()
    return JS_FLOATS


def _key(name: str, z: Tensor) -> tuple:
    return (name, z.device.type, z.dtype, z.dim())


def row_sums(z: Tensor, inv_temp: float):
    """(m, Σe, Σe·s, Σe²) per row of z [n, V], or None when no kernel can run (use eager). On the
    CPU the C++ kernel (native.py) takes it where it can, this module's compiled one elsewhere."""
    got = native.rows(z, inv_temp)
    if got is not None:
        return got
    m = z.amax(dim=-1)
    got = _KERNELS.call("sums", _sums, _key("sums", z), z, m.to(torch.float32), inv_temp)
    return None if got is None else (m, *got)


def position(z: Tensor, inv_temp: float, w_norm: Tensor):
    """(m, Σe, Σe·s, Σe², JS + ½H) per row [c, G, k] of the logits z [c, G, k, V] of c positions, for
    rows weighing w_norm [c, G, k] in their group's mean; None: use eager. On the CPU the C++
    kernel (native.py) takes it where it can, this module's compiled one elsewhere."""
    got = native.position(z, inv_temp, w_norm)
    if got is not None:
        return got
    return _KERNELS.call("position", _position, _key("position", z) + (z.shape[2],), z, inv_temp, w_norm)
