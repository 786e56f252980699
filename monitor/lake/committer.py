"""The committer: a thread that drains the outbox into the lake exactly once. Each commit appends one
range of outbox sequence numbers and, in the same Iceberg commit, records the range in the snapshot's
summary and the collector's watermark in the table's properties; only then are the rows deleted from
the outbox. A crash between the two leaves rows the lake already holds: every cycle (and the start)
first drops the outbox rows at or below the lake's watermark, so they are never committed twice."""
from __future__ import annotations

import logging
import os
import random
import threading
import time

from forksight.monitor.lake.catalog import redact
from forksight.monitor.lake.outbox import Outbox, backlog
from forksight.monitor.lake.schema import LAKE_TABLES, STEP_TABLES
from forksight.monitor.lake.writer import LakeWriter
from forksight.monitor.lake.writer_process import CatalogStalled

log = logging.getLogger("forksight.lake")

POLL_S = 0.5             # how often the outbox is looked at
MAX_BACKOFF_S = 30.0     # a catalog that is down is asked again at most this far apart
STOP_DRAIN_S = 30.0      # stop() drains the whole backlog for at most this long
NICE = 10                # the committer thread's OS priority: below ingest's (Linux: a per-thread nice)
EXPIRE_EVERY_S = 3600.0  # how often the committer expires each table's snapshots past its max age


def _lower_priority() -> None:
    """Run this thread at nice NICE, so what it does itself (reading the outbox) goes after ingest;
    where a per-thread nice is not there, nothing changes."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError) as exc:
        log.info("lake: the committer runs at normal priority (%s)", exc)


class Committer:
    """Drains `outbox` into `catalog` in batches of `commit_rows` rows or every `commit_seconds`."""

    def __init__(self, store, outbox: Outbox, catalog, *, uri: str, warehouse: str,
                 commit_rows: int, commit_seconds: float, writer=None, options: dict | None = None,
                 expire_every_s: float = EXPIRE_EVERY_S, scrub=None):
        """writer: where the Iceberg commits run (LakeWriter: this thread; writer_process.ProcessWriter:
        a child process); default this thread. options: the catalog options as they may be shown;
        scrub(text): a failure's message without the catalog's secrets (LakeSettings.scrub)."""
        self.scrub = scrub or (lambda text: text)
        self.store, self.outbox, self.catalog = store, outbox, catalog
        self.collector = outbox.collector_id
        self.writer = writer or LakeWriter(catalog, self.collector)
        self.uri, self.warehouse, self.options = redact(uri), warehouse, dict(options or {})
        self.expire_every_s = expire_every_s
        self._next_expire = time.monotonic() + min(60.0, expire_every_s)   # not in the start's way
        self._data_runs: set[str] = set()     # runs whose rows landed since the last sync: their row too
        self._stalled = False
        self._started = time.time()
        self.commit_rows, self.commit_seconds = commit_rows, commit_seconds
        self._first_seen: dict[str, float] = {}
        self._synced = dict(((r, (a, b)) for r, a, b in store.call(
            lambda cur: cur.execute("SELECT run_id, runs, alerts FROM lake_synced").fetchall())))
        self._last_sync = 0.0
        self._error: str | None = None
        self._failing_since: float | None = None
        self._last_commit: float | None = None
        self._committed: dict[str, int] = {}
        self._stop = threading.Event()
        self._cycle_lock = threading.Lock()     # one cycle at a time: two would both commit what waits
        self._thread = threading.Thread(target=self._loop, name="forksight-lake-committer", daemon=True)

    # -- lifecycle
    def recover(self) -> dict[str, int]:
        """On start: drop outbox rows the lake already holds (a crash after a commit); rows dropped per table."""
        dropped, top = {}, 0
        for spec in STEP_TABLES:
            done = self.writer.committed(spec.name)
            top = max(top, done)
            if done:
                dropped[spec.name] = self.outbox.drop(spec.name, done)
        self.outbox.raise_floor(top)
        if any(dropped.values()):
            log.warning("lake: %s outbox rows were committed before a restart; not committed again", dropped)
        return dropped

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = STOP_DRAIN_S) -> dict[str, int]:
        """Stop after draining the whole backlog, for at most `timeout` seconds; the rows left (the
        catalog refused, or time ran out) wait in the file for the next start and are logged."""
        self._drain_until = time.monotonic() + timeout
        self._stop.set()
        self._thread.join(timeout + 5.0)     # a commit under way when time runs out is let finish
        if not self._thread.is_alive():
            self.writer.close()
        left = self.health()["backlog_rows"]
        if sum(left.values()):
            log.warning("lake: stopped with %s rows still in the outbox (%s); they are committed at the next "
                        "start", sum(left.values()), ", ".join(f"{k} {v}" for k, v in left.items() if v))
        return left

    # -- the loop
    _drain_until = 0.0

    def _loop(self) -> None:
        _lower_priority()
        delay, backoff = 0.0, 1.0
        while not self._stop.wait(delay):
            if self._cycle_safely():
                delay, backoff = (0.0 if self._busy else POLL_S), 1.0
            else:
                delay, backoff = backoff * random.uniform(0.8, 1.2), min(backoff * 2, MAX_BACKOFF_S)
        # the last drain: every table, batch after batch, until empty, failing or out of time
        while self._cycle_safely(force=True) and self._busy and time.monotonic() < self._drain_until:
            pass

    _busy = False

    def _cycle_safely(self, force: bool = False) -> bool:
        try:
            self._busy = self.cycle(force)
        except Exception as exc:  # noqa: BLE001 - a catalog that is down: the backlog waits, health says so
            said = self.scrub(f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:300]
            if self._error is None:
                log.warning("lake: commit failed, the backlog waits in DuckDB: %s", said)
            self._error = said
            self._failing_since = self._failing_since or time.time()
            # stalled until a commit goes through (a new writer's connect timing out is the same stall)
            self._stalled = self._stalled or isinstance(exc, CatalogStalled)
            return False
        if self._error is not None:
            log.warning("lake: committing again after %.0f s", time.time() - (self._failing_since or time.time()))
        self._error, self._failing_since, self._stalled = None, None, False
        return True

    def cycle(self, force: bool = False) -> bool:
        """One pass: drain each table that is due (force: every table); sync runs and alerts when due.
        True when a commit was made (more may be waiting)."""
        with self._cycle_lock:
            return self._cycle(force)

    def _cycle(self, force: bool) -> bool:
        cur = self.store.read_cursor()
        try:
            busy = False
            for spec in STEP_TABLES:
                busy = self._drain(cur, spec.name, force) or busy
            if force or time.monotonic() - self._last_sync >= self.commit_seconds:
                self._sync_state(cur)
                self._last_sync = time.monotonic()
            if not force and time.monotonic() >= self._next_expire:
                self._expire()
            return busy
        finally:
            cur.close()

    def _drain(self, cur, name: str, force: bool) -> bool:
        seqs = self.outbox.sequences(cur, name)
        if not seqs:
            self._first_seen.pop(name, None)
            return False
        first = self._first_seen.setdefault(name, time.monotonic())
        if not force and sum(n for _, n in seqs) < self.commit_rows and \
                time.monotonic() - first < self.commit_seconds:
            return False
        done = self.writer.committed(name)
        if seqs[0][0] <= done:           # committed, but the delete did not happen (a crash, a lost answer)
            self.outbox.drop(name, done)
            seqs = [s for s in seqs if s[0] > done]
            if not seqs:
                return True
        take, rows = [], 0
        for seq, n in seqs:
            take.append(seq)
            rows += n
            if rows >= self.commit_rows:
                break
        lo, hi = take[0], take[-1]
        rows = self.outbox.rows(cur, name, lo, hi)
        appended = self.writer.append(name, rows, lo, hi)
        self._data_runs.update(rows["run_id"].unique().to_pylist())
        self.after_commit(name, lo, hi)
        self.outbox.drop(name, hi)
        self._committed[name] = self._committed.get(name, 0) + appended
        self._last_commit = time.time()
        self._first_seen[name] = time.monotonic()
        return True

    def after_commit(self, name: str, lo: int, hi: int) -> None:
        """Test seam: called between a commit and its outbox delete (a crash there must not commit twice)."""

    def _expire(self) -> None:
        """Each table's snapshots past its max age (history.expire.max-snapshot-age-ms), on this schedule:
        a failure is logged and tried at the next turn, never in the commits' way."""
        self._next_expire = time.monotonic() + self.expire_every_s
        for name in LAKE_TABLES:
            try:
                n = self.writer.expire(name)
            except CatalogStalled:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. a conflict with another collector's expiry
                log.info("lake: expiring %s's old snapshots failed (%s); next time", name, self.scrub(str(exc)))
                continue
            if n:
                log.info("lake: expired %d old snapshots of %s", n, name)

    # -- runs and alerts: overwritten per changed run (idempotent, so a crash just repeats it). A run's
    # row counts as changed when anything but its heartbeat changed, or its rows landed since the last sync
    # (the heartbeat alone, every 30 s of a live run, would make a snapshot per commit cycle)
    def _sync_state(self, cur) -> None:
        from forksight.base.tables import RUNS

        cols = ", ".join(c for c in RUNS.names if c != "heartbeat")
        runs = dict(cur.execute(f"SELECT run_id, hash(row({cols}))::VARCHAR FROM runs").fetchall())
        landed = set(self._data_runs)
        alerts = dict(cur.execute("SELECT run_id, sum(hash(a))::VARCHAR FROM alerts a GROUP BY run_id").fetchall())
        changed: dict[str, list[str]] = {"runs": [], "alerts": []}
        for run_id in runs.keys() | alerts.keys():
            old = self._synced.get(run_id, (None, None))
            if runs.get(run_id) != old[0] or (run_id in landed and run_id in runs):
                changed["runs"].append(run_id)
            if alerts.get(run_id) != old[1]:
                changed["alerts"].append(run_id)
        for name, ids in changed.items():
            if not ids:
                continue
            rows = cur.sql(f"SELECT * FROM {name} WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                           params=[sorted(ids)]).to_arrow_table()
            self.writer.overwrite(name, rows, sorted(ids))
        ids = set(changed["runs"]) | set(changed["alerts"])
        if ids:
            synced = [(i, runs.get(i), alerts.get(i)) for i in sorted(ids)]

            def keep(c) -> None:
                c.executemany("INSERT OR REPLACE INTO lake_synced VALUES (?, ?, ?)", synced)
            self.store.submit(keep).result()
            self._synced.update({i: (r, a) for i, r, a in synced})
        self._data_runs -= landed

    # -- health
    def health(self) -> dict:
        """The lake's state for /api/health: ok or degraded (the catalog refuses commits), the backlog."""
        try:
            cur = self.store.read_cursor()
            try:
                rows = backlog(cur)
            finally:
                cur.close()
        except Exception:  # noqa: BLE001 - a store that cannot be read: its own health says why
            rows = {}
        last = self._last_commit
        return {"state": "stalled" if self._stalled else "degraded" if self._error else "ok",
                "collector_id": self.collector, "catalog": self.uri, "warehouse": self.warehouse,
                "options": self.options, "backlog_rows": rows,
                "seconds_since_commit": round(time.time() - (last or self._started), 1),
                "call_deadline_s": getattr(self.writer, "deadline", None),
                "backlog_total": sum(rows.values()), "error": self._error, "failing_since": self._failing_since,
                "last_commit_at": self._last_commit, "committed_rows": dict(self._committed),
                "commit_rows": self.commit_rows, "commit_seconds": self.commit_seconds}
