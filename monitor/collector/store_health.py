"""The store's health (a mixin of Store): lost rows from the ledger, storage faults (a full disk,
a database DuckDB invalidated), what /api/health reports, and recovery: an invalidated file is
reopened in place (DuckDB replays its .wal) once the disk has room."""
from __future__ import annotations

import logging
import os
import time
from typing import Protocol

from forksight.monitor.collector.dbfile import connect
from forksight.monitor.collector.faults import LOW_SPACE, Fault, StoreUnavailable, free_bytes

log = logging.getLogger("forksight.store")


class _Closed:
    """Stands in for a connection that could not be reopened: every use says why."""

    def __init__(self, why: str):
        self.why = why

    def cursor(self):
        raise StoreUnavailable(self.why)

    def __getattr__(self, name):
        raise StoreUnavailable(self.why)

    def close(self) -> None:
        pass


class LakeOutbox(Protocol):
    """What a lake attaches to the store (Store.attach_lake); both run on the writer thread, inside the write."""

    def tag(self, table: str, run_id: str, data) -> tuple[dict, list | None]:
        """(SQL constants for every inserted row, the outbox entry to put, or None for a table not kept)."""

    def put(self, cur, entries: list[list]) -> None:
        """Record the write group's entries in its transaction."""


class StoreHealth:
    """Mixed into Store: needs path, reader, _conn, _wcur, _config, _ledger, _fault, _tried,
    _closed, submit and call."""

    lake_health = None     # Store.attach_lake's: () -> the lake's state, for /api/health

    # -- the store's health: the row ledger (monitor/collector/ledger.py) and storage faults
    @property
    def missing_rows(self) -> dict[str, int]:
        """Rows per table acknowledged before but not found in the file at this open."""
        return dict(self._ledger.found)

    @property
    def lost_rows(self) -> dict[str, int]:
        """Rows found lost at this or an earlier open and not acknowledged yet (acknowledge_lost)."""
        return dict(self._ledger.lost)

    def acknowledge_lost(self) -> dict[str, int]:
        """An operator has seen the loss: stop reporting it. Returns what was reported."""
        return self.call(lambda cur: self._ledger.acknowledge())

    def health(self, wait: float = 2.0) -> dict:
        """What the store can do now: writable, disk_full, invalidated, read_only, free and needed
        bytes, DuckDB's error, lost rows. A fault triggers a recovery attempt (up to `wait` s)."""
        if self._fault is not None and not self._closed:
            try:
                self.submit(lambda cur: self._recover(force=True)).result(timeout=wait)
            except Exception:  # noqa: BLE001 - busy or still failing: report what is known
                pass
        fault, d = self._fault, os.path.dirname(os.path.abspath(self.path))
        read_only = not (os.access(d, os.W_OK) and (not os.path.exists(self.path) or os.access(self.path, os.W_OK)))
        free = free_bytes(self.path)
        disk_full = bool(fault and fault.disk_full) or (free is not None and free < LOW_SPACE)
        state = {"writable": fault is None and not disk_full and not read_only and not self._closed,
                 "disk_full": disk_full, "invalidated": bool(fault and fault.kind == "invalidated"),
                 "read_only": read_only, "closed": self._closed, "free_bytes": free,
                 "needed_bytes": fault.needed if fault else None, "error": fault.message(self.path) if fault else None,
                 "lost_rows": self.lost_rows, "lost_since": self._ledger.lost_since}
        if self.lake_health is not None:     # the lake's backlog waits in the file: ingest is unaffected
            state["lake"] = self.lake_health()
        return state

    def _note(self, exc: BaseException, batch_bytes: int = 0) -> StoreUnavailable | None:
        """Remember a storage fault; the error to hand to callers (None: no storage fault)."""
        fault = Fault.of(exc, self.path, batch_bytes)
        if fault is None:
            return None
        if self._fault is None or self._fault.kind != "invalidated":
            self._fault = fault
        log.error("%s: %s", self.path, fault.message(self.path))
        return fault.error_for_client(self.path)

    def _recover(self, force: bool = False) -> None:
        """On the writer thread: after a fault, reopen an invalidated file (DuckDB replays its .wal)
        once the disk may have room; a full disk counts as writable again once there is room."""
        fault = self._fault
        if fault is None:
            return
        room = fault.room(self.path)
        if not room and not force and time.monotonic() - self._tried < 5.0:
            return
        self._tried = time.monotonic()
        if fault.kind == "disk_full":
            if room:
                self._fault = None       # the next write says whether it fits
            return
        with self.reader._lock:
            for thing in (self._wcur, self._conn):
                try:
                    thing.close()
                except Exception:  # noqa: BLE001 - an invalidated database may refuse even this
                    pass
            try:
                self._conn = connect(self.path, False, self._config)     # replays and checkpoints the .wal
            except RuntimeError as exc:
                self._conn = self._wcur = _Closed(str(exc))
                self.reader._conn = self._conn
                fault.error = str(exc).splitlines()[0][:300]
                log.warning("%s: reopening failed: %s", self.path, exc)
                return
            self.reader._conn, self._wcur = self._conn, self._conn.cursor()
        self._fault = None
        log.warning("%s: reopened after %s; the .wal was replayed, writes go on", self.path, fault.kind)
