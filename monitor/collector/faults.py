"""Storage faults in words: a full disk (507) and a database DuckDB invalidated (503), told apart
from other errors by DuckDB's message, with the free space and the space a write needs."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "not enough space")
INVALIDATED_TEXT = ("has been invalidated", "must be restarted")
LOW_SPACE = 1 << 20      # less free than this: health says disk full (DuckDB writes 256 KiB blocks)


class StoreUnavailable(RuntimeError):
    """The store cannot write now; `status` is the HTTP answer (503, or 507 for a full disk)."""

    status = 503


class DiskFull(StoreUnavailable):
    status = 507


def is_disk_full(exc: BaseException) -> bool:
    return getattr(exc, "errno", None) == 28 or any(s in str(exc) for s in DISK_FULL_TEXT)


def is_invalidated(exc: BaseException) -> bool:
    try:
        import duckdb

        if isinstance(exc, duckdb.FatalException):
            return True
    except ImportError:        # pragma: no cover - duckdb is a dependency
        pass
    return any(s in str(exc) for s in INVALIDATED_TEXT)


def free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(os.path.dirname(os.path.abspath(path)) or ".").free
    except OSError:
        return None


def wal_bytes(path: str) -> int:
    try:
        return os.path.getsize(path + ".wal")
    except OSError:
        return 0


def mib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**20:.1f} MiB"


@dataclass
class Fault:
    """Why the store cannot write: kind 'disk_full' or 'invalidated', DuckDB's words, the space
    a write needs (an estimate: the batch, plus the .wal a checkpoint copies into the file)."""

    kind: str
    error: str
    needed: int
    since: float
    free_then: int | None = None

    @classmethod
    def of(cls, exc: BaseException, path: str, batch_bytes: int = 0) -> "Fault | None":
        if not (is_invalidated(exc) or is_disk_full(exc)):
            return None
        kind = "invalidated" if is_invalidated(exc) else "disk_full"
        error = str(exc).splitlines()[0][:300]
        # a checkpoint copies the .wal into the file: it needs about the .wal's size besides the batch
        needed = batch_bytes + (wal_bytes(path) if kind == "invalidated" else 0)
        return cls(kind, error, max(needed, LOW_SPACE), time.time(), free_bytes(path))

    def room(self, path: str) -> bool:
        """True once the disk may take the write again: the space it needs, or room freed since."""
        free = free_bytes(path)
        return free is None or free >= self.needed or free >= (self.free_then or 0) + LOW_SPACE

    @property
    def disk_full(self) -> bool:
        return self.kind == "disk_full" or any(s in self.error for s in DISK_FULL_TEXT)

    def message(self, path: str) -> str:
        free = free_bytes(path)
        room = (f"disk full: it needs about {mib(self.needed)} free on the disk of {path} (free now: {mib(free)})"
                if self.disk_full else f"the database of {path} cannot write ({self.error})")
        if self.kind == "invalidated":
            return (f"{room}; DuckDB invalidated the open database ({self.error}). Nothing acknowledged is "
                    "lost (it is in the .wal); the collector reopens the file by itself once there is room. "
                    "Clients keep their batches and send them again")
        return f"{room}; nothing of this batch was stored: free space, then send it again"

    def error_for_client(self, path: str) -> StoreUnavailable:
        cls = DiskFull if self.disk_full else StoreUnavailable
        return cls(self.message(path))
