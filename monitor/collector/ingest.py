"""Ingest: the one write path of the HTTP routes and LocalSink. Stores a batch, then (writer thread,
commit order) judges each step that became complete with the alert hub, reading its merged
scalars through the Reader. (HTTP bodies become Records in bodies.py.)"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from forksight.base.runconfig import vocab_size_of
from forksight.base.interfaces import AlertHub
from forksight.base.limits import RUN_ID_RE
from forksight.base.errors import ApiError, unknown_run
from forksight.base.records import Records, alerts_table, finite_or_null
from forksight.monitor.collector.faults import StoreUnavailable
from forksight.monitor.collector.reader import Reader
from forksight.monitor.collector.inserts import insert_arrow
from forksight.monitor.collector.store import BatchConflict, Committed, Store
from forksight.base.tables import HISTOGRAMS, SCALARS

log = logging.getLogger("forksight.ingest")


@dataclass
class Ingested:
    """What one batch did: stored False when its batch id was already stored; alerts it raised."""

    stored: bool
    rows: dict[str, int] = field(default_factory=dict)
    alerts: list[dict] = field(default_factory=list)


class Ingest:
    """Stores batches and feeds each complete, rank-merged step to the alert hub once."""

    def __init__(self, store: Store, hub: AlertHub | None = None, *, alerts: bool = True):
        """hub: an AlertHub (None: one from the environment's defaults, unless alerts=False)."""
        if hub is None and alerts:
            from forksight.monitor.alerts.hub import AlertHub

            hub = AlertHub()
        self.store, self.hub = store, hub
        self._last: dict[str, int] = {}          # newest step judged, per run (writer thread)
        self._pending: dict[str, set[int]] = {}  # steps seen but not judged yet, per run
        self._vocab: dict[str, int | None] = {}
        self._known: set[str] = set()
        if hub is not None:
            import duckdb

            # the rows of steps not judged yet, shown to the same Reader as its `scalars` and
            # `histograms`: one merge rule, at a cost that does not grow with the run
            self._steps = duckdb.connect(":memory:")
            self._steps_reader = Reader(self._steps, private=True)
            self._rows: dict[str, dict[str, list[pa.Table]]] = {}   # run -> table -> pending rows
            store.on_close(self._steps.close)
            if hasattr(hub, "close"):
                store.on_close(hub.close)

    def write(self, run_id: str, records: Records, batch_id: str | None = None) -> Future:
        """Queue one batch; the Future gives an Ingested once it is committed and judged."""
        out: Future = Future()
        if self.hub is not None and run_id not in self._last:
            # before the write, in queue order: steps stored by an earlier process count as judged
            self.store.submit(lambda cur: self._load_last(cur, run_id))
        fut = self.store.write(run_id, records, batch_id, after=self._committed, context=out)
        fut.add_done_callback(lambda f: self._settle(f, out))
        return out

    @staticmethod
    def _settle(fut: Future, out: Future) -> None:
        # normally `_committed` resolved `out` already; this covers a failed write (or hook)
        if out.done():
            return
        if fut.exception() is not None:
            out.set_exception(fut.exception())
        else:
            out.set_result(Ingested(fut.result().stored, fut.result().rows))

    def update_run(self, run_id: str, *, status: str | None = None, strategy: str | None = None,
                   model: str | None = None, config: dict | None = None) -> list[dict] | None:
        """Change a run's status/metadata; None if no such run. Ending it judges its last step."""
        if not self.store.update_run(run_id, status=status, strategy=strategy, model=model, config=config):
            return None
        self._vocab.pop(run_id, None)
        if self.hub is None or status in (None, "live"):
            return []
        return self.store.call(lambda cur: self._judge(cur, run_id, final=True))

    def has_run(self, run_id: str) -> bool:
        """True when the run exists (remembered once seen: runs are never deleted)."""
        if run_id in self._known:
            return True
        if RUN_ID_RE.match(run_id) and self.store.reader.has_run(run_id):
            self._known.add(run_id)
            return True
        return False

    # -- on the writer thread
    def _load_last(self, cur, run_id: str) -> None:
        # the run's row keeps its last step: no scan of every run's scalars per new run
        row = cur.execute("SELECT last_step FROM runs WHERE run_id = ?", [run_id]).fetchall()
        self._last.setdefault(run_id, -1 if not row or row[0][0] is None else int(row[0][0]))

    def _committed(self, cur, committed: list[Committed]) -> None:
        """A committed group: buffer its new steps, judge each run once (its alerts go back with the
        run's last batch that carried scalars), resolve the callers' Futures."""
        alerts: dict[int, list[dict]] = {}
        if self.hub is not None:
            judge: dict[str, int] = {}
            for i, c in enumerate(committed):
                if c.result.stored:
                    self._buffer(c.run_id, c.records)
                    if c.records.scalars is not None and c.records.scalars.num_rows:
                        judge[c.run_id] = i          # only new scalars complete a step
            for run_id, i in judge.items():
                try:
                    alerts[i] = self._judge(cur, run_id)
                except Exception:  # noqa: BLE001 - a detector bug must not fail a stored batch
                    log.exception("alerts failed on run %s", run_id)
        for i, c in enumerate(committed):
            c.context.set_result(Ingested(c.result.stored, c.result.rows, alerts.get(i, [])))

    def _buffer(self, run_id: str, records: Records) -> None:
        last = self._last.get(run_id, -1)
        rows = self._rows.setdefault(run_id, {"scalars": [], "histograms": []})
        for name, parts in rows.items():
            table = getattr(records, name)
            if table is None or not table.num_rows:
                continue
            keep = pc.greater(table["step"], last)
            if name == "histograms":            # percentiles are merged from the entropy histogram
                keep = pc.and_(keep, pc.equal(table["key"], "entropy"))
            table = table.filter(keep)
            if table.num_rows:
                parts.append(table)
                self._pending.setdefault(run_id, set()).update(pc.unique(table["step"]).to_pylist())

    def _ready_rows(self, run_id: str, ready: list[int]) -> None:
        """Show the Reader the ready steps' rows as `scalars`/`histograms`; keep the later ones."""
        empty = {"scalars": SCALARS, "histograms": HISTOGRAMS}
        for name, parts in self._rows.get(run_id, {}).items():
            table = pa.concat_tables(parts) if parts else empty[name].arrow_schema().empty_table()
            later = pc.greater(table["step"], ready[-1])
            parts[:] = [table.filter(later)] if parts else []
            table = table.filter(pc.invert(later))
            self._steps.register(name, table.append_column("run_id", pa.array([run_id] * table.num_rows, pa.string())))

    def _judge(self, cur, run_id: str, final: bool = False) -> list[dict]:
        """Judge the run's steps that are complete now; store and return the alerts raised."""
        pending = self._pending.setdefault(run_id, set())
        newest = max(pending, default=None)
        ready = sorted(s for s in pending if final or s < newest)
        if not ready:
            return []
        pending.difference_update(ready)
        self._last[run_id] = ready[-1]
        self._ready_rows(run_id, ready)
        merged = self._steps_reader.steps_scalars(run_id, ready)
        rows: list[dict] = []
        for step in ready:
            if not merged.get(step):
                continue
            try:
                found = self.hub.on_step(run_id, step, merged[step], self._vocab_size(cur, run_id)) or []
            except Exception:  # noqa: BLE001 - a detector bug must not stop ingest
                log.exception("alert hub failed on run %s step %s", run_id, step)
                found = []
            for row in found:
                # JSON answers cannot carry NaN/inf: a non-finite alert field becomes null
                row = finite_or_null(row)
                row["run_id"] = run_id
                row.setdefault("step", step)
                row.setdefault("wall_time", time.time())
                rows.append(row)
        if rows:
            try:
                insert_arrow(cur, "alerts", alerts_table(rows))
            except Exception:  # noqa: BLE001 - the alerts still reach the client
                log.exception("could not store %d alert(s)", len(rows))
        return rows

    def _vocab_size(self, cur, run_id: str) -> int | None:
        if run_id not in self._vocab:
            row = cur.execute("SELECT config FROM runs WHERE run_id = ?", [run_id]).fetchall()
            self._vocab[run_id] = vocab_size_of(row[0][0]) if row else None
        return self._vocab[run_id]


# ---------------------------------------------------------------------------- route helpers
def require_run(ingest: Ingest, run_id: str) -> None:
    """404 unless the run exists."""
    if not ingest.has_run(run_id):
        raise unknown_run(run_id)


async def ingest_impl(ingest: Ingest, run_id: str, records: Records, batch_id: str) -> dict:
    """Store one batch (once per batch id) and return what happened, with any alerts. The route
    has checked the run (require_run) before reading the body."""
    try:
        result = await asyncio.wrap_future(ingest.write(run_id, records, batch_id))
    except BatchConflict as exc:
        raise ApiError(409, str(exc)) from None
    except StoreUnavailable as exc:          # a full disk (507), an invalidated file (503): said so
        raise ApiError(exc.status, str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - nothing of the batch was stored (one transaction)
        log.exception("write of batch %s for run %s failed", batch_id, run_id)
        raise ApiError(500, f"the store could not write batch {batch_id} ({type(exc).__name__}: {exc}); "
                       "nothing of it was stored: send it again") from None
    return {"run_id": run_id, "batch_id": batch_id, "stored": result.stored,
            "duplicate": not result.stored, "rows": result.rows, "alerts": result.alerts}
