"""Tiered reads (docs/lake.md, "Reads"): the `Reader` protocol over the collector's DuckDB file and the
lake together. A run the file holds is read from the file, as without a lake; a run only the lake
holds (another collector's) is shown as '<run_id>@<collector>' and read by the SAME Reader SQL over a
per-run DuckDB whose step tables are views on the Parquet files its Iceberg scan plan lists. The list
of lake runs and alerts is cached and refreshed every REFRESH_S, not per request.

Caches, each for a cost measured per page: loaded tables (CachedTables: a catalog row and a metadata file
per load, tens of loads a page), the index of lake runs and alerts (a scan of two Iceberg tables), the open
lake runs (planning and views, seconds each) and the file's moved token steps (read once: only `compact
--to-lake` changes them, and it needs the file closed). Whether the file holds a run is asked of the file
each time (one indexed query): a cached 'no' went stale when the run arrived."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from forksight.base.limits import MAX_READ_TOKEN_ROWS
from forksight.base.tables import ALERTS, RUNS
from forksight.monitor.lake.move_tokens import MOVED
from forksight.monitor.lake.run_views import build_run_db, shown_id
from forksight.monitor.lake.schema import COLLECTOR, identifier
from forksight.monitor.lake.table_cache import CachedTables

if TYPE_CHECKING:
    import pandas as pd

REFRESH_S = 5.0        # how stale the list of lake runs (and a lake run's plan) may get
OPEN_RUNS = 32         # lake runs kept open (LRU); each holds its rollups and small tables only


class TieredReader:
    """The Reader protocol over `local` (the store's Reader) and the lake in `catalog`. `store`
    gives read cursors on the file (duck-typed); `own` is this collector's id in the lake;
    open_reader(conn) -> Reader (rollups built) is given by the roof, which knows the collector."""

    def __init__(self, local, store, catalog, own: str, open_reader: Callable, *,
                 refresh_s: float = REFRESH_S, open_runs: int = OPEN_RUNS):
        # a table loaded once per refresh: the index, the snapshots and a run's plans share it
        self.local, self.store, self.catalog, self.own = local, store, CachedTables(catalog, refresh_s), own
        self.open_reader, self.refresh_s, self.open_runs = open_reader, refresh_s, open_runs
        self.stale_after = local.stale_after
        self.store_health = getattr(local, "store_health", None)     # the runs page's disk note
        self._lock = threading.Lock()           # the index and the open runs
        self._build = threading.Lock()          # one run opened at a time
        self._index_at = -1e18
        self._lake: dict[str, tuple[str, str, dict]] = {}    # shown id -> (collector, run_id, runs row)
        self._runs = pa.table({c.name: pa.array([], c.arrow) for c in RUNS.columns})
        self._alerts = pa.table({c.name: pa.array([], c.arrow) for c in ALERTS.columns})
        self._open: OrderedDict[str, tuple] = OrderedDict()
        self._moved_rows: dict[str, dict[int, int]] | None = None    # run -> {moved step: its token rows}
        self.error: str | None = None           # the catalog's last failure (pages show the file's runs)

    # -- the lake's index of runs and alerts
    def _index(self) -> None:
        """Refresh the lake runs and alerts at most every refresh_s; a failing catalog keeps the last."""
        if time.monotonic() - self._index_at < self.refresh_s:
            return
        try:
            runs = self.catalog.load_table(identifier("runs")).scan().to_arrow()
            alerts = self.catalog.load_table(identifier("alerts")).scan().to_arrow()
        except Exception as exc:  # noqa: BLE001 - a catalog that is down: the file's runs still show
            self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            self._index_at = time.monotonic()
            return
        cur = self.store.read_cursor()
        try:
            local = {r[0] for r in cur.execute("SELECT run_id FROM runs").fetchall()}
        finally:
            cur.close()
        lake: dict[str, tuple[str, str, dict]] = {}
        for row in runs.to_pylist():
            if row[COLLECTOR] == self.own and row["run_id"] in local:
                continue                                   # this collector's own run: the file has it
            lake[shown_id(row["run_id"], row[COLLECTOR])] = (row[COLLECTOR], row["run_id"], row)
        shown_rows = [{c: row.get(c) for c in RUNS.names} | {"run_id": s, "name": shown_id(row.get("name") or
                                                                                          row["run_id"], col)}
                      for s, (col, _, row) in lake.items()]
        keep = [shown_id(r, c) in lake for r, c in zip(alerts["run_id"].to_pylist(),
                                                        alerts[COLLECTOR].to_pylist())]
        alerts = alerts.filter(pa.array(keep, pa.bool_()))
        shown_alerts = alerts.set_column(alerts.schema.get_field_index("run_id"), "run_id", pa.array(
            [shown_id(r, c) for r, c in zip(alerts["run_id"].to_pylist(), alerts[COLLECTOR].to_pylist())],
            pa.string())).drop_columns([COLLECTOR])
        with self._lock:
            self._lake = lake
            self._runs = pa.Table.from_pylist(shown_rows, schema=RUNS.arrow_schema(run_id=True))
            self._alerts = shown_alerts.select(list(ALERTS.names)).cast(ALERTS.arrow_schema(run_id=True))
            self._index_at = time.monotonic()
            self.error = None

    def lake_runs(self) -> list[str]:
        """The shown ids of the runs only the lake holds."""
        self._index()
        return list(self._lake)

    # -- one lake run
    def _lake_reader(self, run_id: str):
        """The per-run Reader of a lake-only run (opened, or re-planned when its tables moved on)."""
        self._index()
        with self._lock:
            found = self._lake.get(run_id)
        if found is None:
            return None
        collector, lake_id, row = found
        return self._open_run(run_id, collector, lake_id, row,
                              self._alerts.filter(pc.equal(self._alerts["run_id"], run_id)))

    def _open_run(self, key: str, collector: str, lake_id: str, row: dict, alerts: pa.Table):
        """The cached per-run Reader under `key`, re-planned when older than refresh_s and the lake's
        tables (or the run's row or alerts) moved on; at most open_runs kept, least recent dropped."""
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
        stamp = (row.get("heartbeat"), row.get("status"), alerts.num_rows)
        if entry is not None and time.monotonic() - entry[2] < self.refresh_s:
            return entry[0]
        with self._build:
            if entry is not None and entry[3] == stamp and self._snapshots(list(entry[1])) == dict(entry[1]):
                with self._lock:
                    self._open[key] = (entry[0], entry[1], time.monotonic(), stamp)
                return entry[0]
            reader, snaps = build_run_db(self.catalog, collector, lake_id, row, alerts, self.open_reader)
            with self._lock:
                self._open[key] = (reader, snaps, time.monotonic(), stamp)
                self._open.move_to_end(key)
                while len(self._open) > self.open_runs:
                    self._open.popitem(last=False)
        return reader

    def close_runs(self) -> None:
        """Drop every open lake run: the next read of one plans its tables again."""
        with self._lock:
            self._open.clear()

    # -- token steps `compact --to-lake` moved out of the file (this collector's own runs)
    def _moved(self, run_id: str) -> dict[int, int]:
        """Steps of a run in the file whose token rows live only in the lake (lake_token_steps), with
        their row counts."""
        if self._moved_rows is None:            # the file changes only while serve is stopped: read once
            cur = self.store.read_cursor()
            try:
                has = cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                                  [MOVED]).fetchall()[0][0]
                rows = cur.execute(f"SELECT run_id, step, rows FROM {MOVED}").fetchall() if has else []
            finally:
                cur.close()
            moved: dict[str, dict[int, int]] = {}
            for rid, step, n in rows:
                moved.setdefault(rid, {})[int(step)] = int(n)
            self._moved_rows = moved
        return self._moved_rows.get(run_id, {})

    def _own_lake(self, run_id: str):
        """The lake Reader of this collector's run `run_id` (its moved token steps), under its shown id."""
        row = self.local.run(run_id) or {"run_id": run_id}
        row = dict(row, config=None)
        empty = self._alerts.slice(0, 0)
        return self._open_run("own:" + run_id, self.own, run_id, row, empty), shown_id(run_id, self.own)

    def _snapshots(self, names) -> dict[str, int | None]:
        """The current snapshot of each step table in `names` (those a lake run has opened so far)."""
        out = {}
        for name in names:
            snap = self.catalog.load_table(identifier(name)).current_snapshot()
            out[name] = snap.snapshot_id if snap else None
        return out

    def _of(self, run_id: str):
        """The Reader holding `run_id`: the file's when it has it, else the lake run's, else the file's."""
        if self._is_local(run_id):
            return self.local
        return self._lake_reader(run_id) or self.local

    def _is_local(self, run_id: str) -> bool:
        """Whether the file holds `run_id`."""
        return self.local.has_run(run_id)

    def holder_of(self, run_id: str, step: int) -> tuple:
        """(the Reader holding `step`'s token rows of `run_id`, the id it knows the run by): what
        the token page route reads its keyset pages from."""
        reader = self._of(run_id)
        if reader is self.local and int(step) in self._moved(run_id):
            return self._own_lake(run_id)
        return reader, run_id

    # -- several runs: the file's and the lake's rows in one small in-memory DuckDB, the same SQL
    def _fleet(self):
        from forksight.monitor.lake.memdb import MemoryDb

        self._index()
        cur = self.store.read_cursor()
        try:
            runs = cur.sql(f"SELECT {', '.join(RUNS.names)} FROM runs").to_arrow_table()
            alerts = cur.sql(f"SELECT {', '.join(ALERTS.names)} FROM alerts").to_arrow_table()
        finally:
            cur.close()
        conn = MemoryDb()
        with self._lock:
            lake_runs, lake_alerts = self._runs, self._alerts
        for spec, mine, theirs in ((RUNS, runs, lake_runs), (ALERTS, alerts, lake_alerts)):
            conn.execute(spec.ddl())
            for i, data in enumerate((mine, theirs)):
                conn.register(f"_part{i}", data)
                conn.execute(f"INSERT INTO {spec.name} BY NAME SELECT * FROM _part{i}")
                conn.unregister(f"_part{i}")
        return self.open_reader(conn, rollups=False)

    # -- the Reader protocol
    def list_runs(self) -> pd.DataFrame:
        return self._fleet().list_runs()

    def runs_page(self, *, where: Sequence[tuple[str, str, object]] = (),
                  order: Sequence[tuple[str, bool]] = (), limit: int = 50, offset: int = 0):
        return self._fleet().runs_page(where=where, order=order, limit=limit, offset=offset)

    def read_alerts_page(self, *, run_ids: Sequence[str] = (), severities: Sequence[str] = (),
                         detectors: Sequence[str] = (), limit: int = 100, offset: int = 0):
        return self._fleet().read_alerts_page(run_ids=run_ids, severities=severities, detectors=detectors,
                                              limit=limit, offset=offset)

    def alert_detectors(self) -> list[str]:
        return self._fleet().alert_detectors()

    def read_alerts(self, run_id: str | None = None, since_step: int | None = None) -> pd.DataFrame:
        if run_id is None:
            return self._fleet().read_alerts(None, since_step)
        return self._of(run_id).read_alerts(run_id, since_step)

    def read_scalars_of_runs(self, keys: Sequence[str], downsample: int = 24,
                             run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        import pandas as pd

        lake = set(self.lake_runs())
        wanted = None if run_ids is None else list(run_ids)
        mine = self.local.read_scalars_of_runs(keys, downsample, None if wanted is None else
                                               [r for r in wanted if r not in lake])
        theirs = [self._lake_reader(r).read_scalars_of_runs(keys, downsample, [r])
                  for r in (lake if wanted is None else [r for r in wanted if r in lake])
                  if not self._is_local(r)]
        parts = [p for p in (mine, *theirs) if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else mine

    def run(self, run_id: str) -> dict | None:
        return self._of(run_id).run(run_id)

    def has_run(self, run_id: str) -> bool:
        return self._of(run_id).has_run(run_id)

    def scalar_keys(self, run_id: str) -> list[str]:
        return self._of(run_id).scalar_keys(run_id)

    def read_scalars(self, run_id: str, keys: Sequence[str] | None = None, downsample: int = 1000,
                     since_step: int | None = None) -> pd.DataFrame:
        return self._of(run_id).read_scalars(run_id, keys, downsample=downsample, since_step=since_step)

    def read_histograms(self, run_id: str, key: str = "entropy", downsample: int = 1000,
                        since_step: int | None = None) -> pd.DataFrame:
        return self._of(run_id).read_histograms(run_id, key, downsample=downsample, since_step=since_step)

    def read_histogram_ends(self, run_id: str, key: str, at: int | None = None) -> pd.DataFrame:
        return self._of(run_id).read_histogram_ends(run_id, key, at)

    def steps_scalars(self, run_id: str, steps: Sequence[int]) -> dict[int, dict[str, float]]:
        return self._of(run_id).steps_scalars(run_id, steps)

    def token_steps(self, run_id: str, since_step: int | None = None) -> list[int]:
        return self._of(run_id).token_steps(run_id, since_step)

    def token_step_span(self, run_id: str) -> tuple[int, int | None, int | None]:
        return self._of(run_id).token_step_span(run_id)

    def first_token_steps(self, run_id: str, n: int) -> list[int]:
        return self._of(run_id).first_token_steps(run_id, n)

    def nearest_token_steps(self, run_id: str, wanted: Sequence[int]) -> list[int | None]:
        return self._of(run_id).nearest_token_steps(run_id, wanted)

    def spread_token_steps(self, run_id: str, n: int) -> list[int]:
        return self._of(run_id).spread_token_steps(run_id, n)

    def read_token_history(self, run_id: str, steps: Sequence[int], metric: str | Sequence[str],
                           prompt: str | None = None, per_step: int = 20_000) -> pd.DataFrame:
        reader = self._of(run_id)
        moved = self._moved(run_id) if reader is self.local else {}
        here = [s for s in steps if int(s) not in moved]
        df = reader.read_token_history(run_id, here, metric, prompt=prompt, per_step=per_step)
        there = [s for s in steps if int(s) in moved]
        if not there:
            return df
        import pandas as pd

        lake, shown = self._own_lake(run_id)
        far = lake.read_token_history(shown, there, metric, prompt=prompt, per_step=per_step)
        # each part is ordered by (step, rank, sample, pos): a stable sort by step keeps that order
        return pd.concat([p for p in (df, far) if len(p)] or [df], ignore_index=True) \
            .sort_values("step", kind="stable").reset_index(drop=True)

    def read_tokens(self, run_id: str, step: int, sample_id: int | None = None,
                    limit: int = MAX_READ_TOKEN_ROWS) -> pd.DataFrame:
        reader, rid = self.holder_of(run_id, step)
        return reader.read_tokens(rid, step, sample_id, limit=limit)

    def read_samples(self, run_id: str, step: int | None = None, group_id: int | None = None,
                     limit: int = 10_000) -> pd.DataFrame:
        return self._of(run_id).read_samples(run_id, step, group_id, limit=limit)

    def probe_steps(self, run_id: str) -> list[int]:
        return self._of(run_id).probe_steps(run_id)

    def read_probes(self, run_id: str, step: int, sample_id: int | None = None,
                    limit: int = 100_000) -> pd.DataFrame:
        return self._of(run_id).read_probes(run_id, step, sample_id, limit=limit)

    def probe_page(self, run_id: str, step: int, sample_id: int | None, limit: int, after) -> tuple:
        return self._of(run_id).probe_page(run_id, step, sample_id, limit, after)

    def reference_steps(self, run_id: str) -> list[int]:
        return self._of(run_id).reference_steps(run_id)

    def read_reference(self, run_id: str, step: int, sample_id: int | None = None,
                       limit: int = 1_000_000) -> pd.DataFrame:
        return self._of(run_id).read_reference(run_id, step, sample_id, limit=limit)

    def reference_page(self, run_id: str, step: int, sample_id: int | None, limit: int, after) -> tuple:
        return self._of(run_id).reference_page(run_id, step, sample_id, limit, after)

    def read_words(self, run_id: str, start: int | None = None, end: int | None = None, **kw) -> pd.DataFrame:
        return self._of(run_id).read_words(run_id, start, end, **kw)

    def reference_words(self, run_id: str, step: int, **kw) -> pd.DataFrame:
        return self._of(run_id).reference_words(run_id, step, **kw)

    def run_progress(self, run_id: str) -> tuple[int, int]:
        return self._of(run_id).run_progress(run_id)

    def row_counts(self, run_id: str) -> dict[str, int]:
        reader = self._of(run_id)
        counts = reader.row_counts(run_id)
        if reader is self.local:             # the moved rows count where they live now (as the file said)
            counts["tokens"] += sum(self._moved(run_id).values())
        return counts
