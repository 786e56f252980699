"""The CPU kernels of token_stats (token_kernels.cpp; docs/algorithms.md §1, §2).

Built once per machine and instruction set by torch.utils.cpp_extension (cached in
TORCH_EXTENSIONS_DIR, with its lock for processes building at once, rebuilt when the source
changes; about a second, where torch.compile's first compile takes 10-30 s) and called through
ctypes, which releases the GIL: a block's rows or positions are split across torch's thread count.
With JS it keeps each row's exp from the sums pass for the JS pass, where the compiled kernel
(fused.py) computes exp twice: measured 1.7x the log-prob floor against 2.4x.
`rows` and `position` return None where they cannot run (a GPU tensor, another dtype, groups
over 64 rows, no C++ compiler): the caller then takes the compiled or eager path.
FORKSIGHT_NATIVE=0 skips them.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shutil
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import torch
from torch import Tensor

ENV_SWITCH = "FORKSIGHT_NATIVE"
SOURCE = Path(__file__).with_name("token_kernels.cpp")
MAX_ROWS = 64  # rows per group: the kernel keeps a group's e (k × V floats) per thread
# Logits per thread in one block (token_stats sizes its blocks with this): scratch is k × V per
# thread whatever the block, so blocks only bound the logits a hidden-state source materialises.
BLOCK_FLOATS = 1 << 23
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_ARGTYPES = {
    "position": [ctypes.c_void_p] + [ctypes.c_int64] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                                                            ctypes.c_int64],
    "rows": [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64],
}


def _isa() -> tuple[str, list[str]]:
    """A name for the instruction set the library is built for, and its compiler flags."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if x86 and torch.backends.cpu.get_cpu_capability().startswith(("AVX2", "AVX512")):
        return "avx2", ["-mavx2", "-mfma"]
    return "generic", []  # the vector types lower to SSE2 or NEON


class _Library:
    """The built library, built on first use; `failed` once a build or load broke."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lib: ctypes.CDLL | None = None
        self.failed: str | None = None
        self.ran: set[str] = set()
        self.pool: ThreadPoolExecutor | None = None

    def get(self) -> ctypes.CDLL | None:
        with self.lock:
            if self.lib is None and self.failed is None:
                try:
                    self.lib = _build()
                except Exception as err:  # no compiler, no ninja, a read-only cache: compiled path instead
                    self.failed = f"{type(err).__name__}: {err}".splitlines()[0][:300]
                    warnings.warn(
                        f"forksight: building the C++ per-token kernels failed ({self.failed}); using the "
                        f"compiled or eager path (set {ENV_SWITCH}=0 to skip the attempt)",
                        RuntimeWarning,
                        stacklevel=4,
                    )
            return self.lib

    def map(self, fn, parts: list[tuple[int, int]]) -> None:
        with self.lock:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="forksight-kernel")
        for done in [self.pool.submit(fn, *part) for part in parts]:
            done.result()


def _pip_ninja_dir() -> str | None:
    """The folder of the `ninja` executable that pip's ninja package (a dependency) installed:
    read from its installed file list, so it is found wherever its environment is."""
    try:
        files = metadata.files("ninja") or []
    except metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name in ("ninja", "ninja.exe") and file.parent.name in ("bin", "Scripts"):
            return str(Path(file.locate()).resolve().parent)
    return None


@contextlib.contextmanager
def _ninja_on_path():
    """cpp_extension runs `ninja` from PATH; pip's ninja is not on PATH when a venv's python runs
    without activating it: put it there meanwhile."""
    folder = _pip_ninja_dir() if shutil.which("ninja") is None else None
    if folder is None:
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([folder, before]) if before else folder
    try:
        yield
    finally:
        os.environ["PATH"] = before


def _build() -> ctypes.CDLL:
    from torch.utils import cpp_extension

    tag, flags = _isa()
    with _ninja_on_path():
        path = cpp_extension.load(
            f"forksight_token_kernels_{tag}",
            [str(SOURCE)],
            extra_cflags=["-O3", "-ffp-contract=fast", *flags],
            is_python_module=False,
            verbose=False,
        )
    lib = ctypes.CDLL(path)
    for kernel, argtypes in _ARGTYPES.items():
        for suffix in _SUFFIX.values():
            getattr(lib, f"forksight_{kernel}_{suffix}").argtypes = argtypes
            getattr(lib, f"forksight_{kernel}_{suffix}").restype = ctypes.c_int
    return lib


_LIBRARY = _Library()


def _after_fork_in_child() -> None:
    """A forked child has none of the pool's threads (an inherited executor would queue work no
    thread runs) and maybe a lock held by a thread that is gone: fresh ones, built on next use."""
    _LIBRARY.lock = threading.Lock()
    _LIBRARY.pool = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def usable(device: torch.device, dtype: torch.dtype, group_rows: int | None = None) -> bool:
    """Whether the kernels take logits of this device and dtype, in groups of group_rows rows
    (the CPU; float32 or bfloat16; ≤ MAX_ROWS; not switched off; a library that built or has not
    been tried yet)."""
    return (torch.device(device).type == "cpu" and dtype in _SUFFIX and _LIBRARY.failed is None
            and (group_rows is None or group_rows <= MAX_ROWS) and os.environ.get(ENV_SWITCH, "1") != "0")


def _split(n: int, run) -> None:
    """run(first, last) over [0, n) in one contiguous part per thread (torch's thread count)."""
    threads = min(torch.get_num_threads(), n)
    if threads <= 1:
        run(0, n)
        return
    bounds = [n * i // threads for i in range(threads + 1)]
    _LIBRARY.map(run, list(zip(bounds[:-1], bounds[1:])))


def _kernel(name: str, z: Tensor):
    lib = _LIBRARY.get()
    return None if lib is None else getattr(lib, f"forksight_{name}_{_SUFFIX[z.dtype]}")


def rows(z: Tensor, inv_temp: float) -> tuple[Tensor, ...] | None:
    """(m, Σe, Σe·s, Σe²) per row [n] of the logits z [n, V] (fused.row_sums' contract); None: this
    kernel cannot take z, use another path."""
    n, vocab = z.shape
    if not usable(z.device, z.dtype) or z.stride(-1) != 1 or (kernel := _kernel("rows", z)) is None:
        return None
    out = torch.empty((4, n), dtype=torch.float32)
    item = z.element_size()

    def run(first: int, last: int) -> None:
        kernel(z.data_ptr() + first * z.stride(0) * item, last - first, vocab, z.stride(0), inv_temp,
               out.data_ptr() + first * 4, n)

    _split(n, run)
    _LIBRARY.ran.add("rows")
    return tuple(out)


def position(z: Tensor, inv_temp: float, w_norm: Tensor) -> tuple[Tensor, ...] | None:
    """(m, Σe, Σe·s, Σe², JS + ½H) per row [c, G, k] of the logits z [c, G, k, V] of c positions,
    rows weighing w_norm [c, G, k] in their group's mean (fused.position's contract); None: this
    kernel cannot take z, use another path."""
    c, groups, k, vocab = z.shape
    if (not usable(z.device, z.dtype, k) or z.stride(-1) != 1 or z.stride(1) != k * z.stride(2)
            or (kernel := _kernel("position", z)) is None):
        return None
    weights = w_norm.to(torch.float32).contiguous()
    out = torch.empty((5, c, groups, k), dtype=torch.float32)
    per, item = groups * k, z.element_size()

    def run(first: int, last: int) -> None:
        if kernel(z.data_ptr() + first * z.stride(0) * item, last - first, groups, k, vocab, z.stride(0),
                  z.stride(2), inv_temp, weights.data_ptr() + first * per * 4, out.data_ptr() + first * per * 4,
                  c * per):
            raise MemoryError(f"the C++ JS kernel could not allocate {k} x {vocab} floats for a group's exp; "
                              "lower the group size or pass fused=False")

    _split(c, run)
    _LIBRARY.ran.add("position")
    return tuple(out)


def failure() -> str | None:
    """Why the C++ kernel cannot run here (None: it can, or was not tried)."""
    return _LIBRARY.failed


def ran() -> set[str]:
    """The C++ kernels that have run in this process (bench/metrics.py reports them)."""
    return set(_LIBRARY.ran)
