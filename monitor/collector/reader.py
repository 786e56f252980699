"""The ONE read interface over the store (TensorBoard's DataProvider is the model): routes,
dashboard, alerts and tests read through `Reader`; every read takes a downsample bound and its
own cursor, so reads run concurrently with the writer thread and with each other."""
from __future__ import annotations

import json
import re
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from forksight.base.downsample import keep_sql, max_points_of
from forksight.base.limits import MAX_READ_TOKEN_ROWS, config_problem
from forksight.base.tables import ALERTS, DATA_TABLES, SAMPLES, TOKENS
from forksight.monitor.collector.probe_reads import ProbeReads
from forksight.monitor.collector.reference_reads import ReferenceReads
from forksight.monitor.collector.words import WordReads
from forksight.monitor.collector.runs_page import RunsPageReads
from forksight.monitor.collector.step_reads import TokenStepReads
from forksight.monitor.collector.rollups import (
    HISTOGRAM_WIDTHS, SCALAR_WIDTHS, column_width, histogram_columns_sql, plan, scalar_points_sql,
)

if TYPE_CHECKING:                      # pandas loads with the first read, not in every producer
    import pandas as pd

PERCENTILE_KEY = re.compile(r"^entropy/p(\d{1,2})$")   # recomputed from merged histograms
STALE_AFTER_S = 120.0                                  # a live run silent this long is 'crashed'
# THE rank merge of one (key, step) group: token-weighted mean (weight null = 1); when every
# weight is 0, the plain mean. Every merged read uses it (percentiles: _merge_percentiles).
MERGED_VALUE_SQL = """CASE WHEN sum(coalesce(weight, 1)) > 0
                           THEN sum(value * coalesce(weight, 1)) / sum(coalesce(weight, 1))
                           ELSE avg(value) END"""

KEEP = keep_sql()     # the downsample keep-rule (one `?`: max_points_of(downsample))

def histogram_quantile(lo: np.ndarray, hi: np.ndarray, counts: np.ndarray, q: float) -> float:
    """Quantile q of a histogram, linear inside the bin (how ranks' percentiles are merged)."""
    cum = np.cumsum(counts)
    if not cum.size or cum[-1] <= 0:
        return float("nan")
    target = q * cum[-1]
    i = int(min(np.searchsorted(cum, target, side="left"), cum.size - 1))
    before = cum[i - 1] if i else 0.0
    frac = (target - before) / counts[i] if counts[i] > 0 else 0.0
    return float(lo[i] + frac * (hi[i] - lo[i]))


class Reader(RunsPageReads, TokenStepReads, ProbeReads, ReferenceReads, WordReads):
    """The one read interface (TensorBoard's DataProvider is the model). Thread-safe."""

    def __init__(self, conn, stale_after: float = STALE_AFTER_S, *, private: bool = False,
                 before_rollups: Callable[[str], None] | None = None):
        """private: `conn` serves one thread only; queries run on it directly and so also see the
        Arrow tables registered on it (the ingest's buffer of steps not judged yet). before_rollups:
        called with "scalars" or "histograms" before a read uses that table's rollups (a lake run
        builds them then, only for a run long enough to read them)."""
        self._conn = conn
        self._lock = threading.Lock()
        self.stale_after = stale_after
        self._private = private
        self._before_rollups = before_rollups

    def _query(self, sql: str, params: Sequence | None = None) -> pd.DataFrame:
        return self._run(sql, params, lambda result: result.df())

    def _fetch(self, sql: str, params: Sequence | None = None) -> list[tuple]:
        """Rows as tuples, no pandas (see steps_scalars)."""
        return self._run(sql, params, lambda result: result.fetchall())

    def _run(self, sql: str, params: Sequence | None, take):
        if self._private:
            return take(self._conn.execute(sql, params or []))
        with self._lock:
            cur = self._conn.cursor()     # own connection per call: concurrent reads are safe
        try:
            return take(cur.execute(sql, params or []))
        finally:
            cur.close()

    def list_runs(self) -> pd.DataFrame:
        """All runs, newest first, with status derived from heartbeat age; a missing text
        (strategy, model, config) is None, never pandas' NaN (which reads as a float)."""
        runs = self._query(*self._runs_sql("", []))
        text = ["name", "project", "strategy", "model", "status", "config"]
        runs[text] = runs[text].astype(object).where(runs[text].notna(), None)
        return runs

    def _runs_sql(self, where: str, params: list) -> tuple[str, list]:
        # the one definition of a run's row: list_runs and run both read it
        return f"""
            SELECT r.run_id, r.name, r.project, r.strategy, r.model,
                   CASE WHEN r.status = 'live' AND r.heartbeat < ? THEN 'crashed' ELSE r.status END AS status,
                   r.created_at, r.heartbeat,
                   r.last_step,
                   r.config
            FROM runs r {where} ORDER BY r.created_at DESC, r.run_id""", [time.time() - self.stale_after, *params]

    def run(self, run_id: str) -> dict | None:
        """One run's row as a dict (config parsed; a missing value None), or None: plain tuples,
        no DataFrame (a page asks for it on every draw; pandas took 6 of its 10 ms)."""
        rows = self._run(*self._runs_sql("WHERE r.run_id = ?", [run_id]),
                         lambda result: (result.fetchall(), [d[0] for d in result.description]))
        if not rows[0]:
            return None
        out = dict(zip(rows[1], rows[0][0]))
        config = out.get("config")
        out["config"] = json.loads(config) if config else None
        if out["config"] is not None and (problem := config_problem(out["config"])):
            # stored before the write rule existed: serve the stored (ASCII) JSON text instead
            out.update(config=None, config_error=f"{problem}; the stored text is in config_text",
                       config_text=config)
        return out

    def has_run(self, run_id: str) -> bool:
        return bool(len(self._query("SELECT 1 FROM runs WHERE run_id = ?", [run_id])))

    def scalar_keys(self, run_id: str) -> list[str]:
        # the writer's index of them, not a DISTINCT over every scalar row of the run
        df = self._query("SELECT key FROM scalar_keys WHERE run_id = ? ORDER BY key", [run_id])
        return df["key"].tolist()

    def read_scalars(self, run_id: str, keys: Sequence[str] | None = None, downsample: int = 1000,
                     since_step: int | None = None) -> pd.DataFrame:
        """(key, step, value, wall_time) with ranks merged by weighted mean; ≤ downsample points
        per key, the first and the last step always among them. A long run is read from its
        rollups (monitor/collector/rollups.py): the first step of every w·k steps, so the rows
        read grow with `downsample`, not with the run."""
        if since_step is None:
            keys = self.scalar_keys(run_id) if keys is None else keys
            return self._downsampled([run_id], keys, downsample).drop(columns="run_id")
        where, params = self._scalar_filter(run_id, keys, since_step)
        df = self._query(f"""
            SELECT key, step, {MERGED_VALUE_SQL} AS value,
                   max(wall_time) AS wall_time, count(DISTINCT rank) AS ranks
            FROM scalars WHERE {where}
            GROUP BY key, step
            ORDER BY key, step""", params)
        df = self._merge_percentiles(run_id, df)
        return df.drop(columns="ranks").reset_index(drop=True)

    def _downsampled(self, run_ids: Sequence[str], keys: Sequence[str], downsample: int) -> pd.DataFrame:
        """(run_id, key, step, value, wall_time) of several runs, ≤ downsample points per run and
        key: short runs by the stride rule over their raw rows (one query), long ones from their
        rollups (one query per read plan), every series' last step read raw."""
        import pandas as pd

        keys, points = list(keys) or [""], max_points_of(downsample)
        spans = self._fetch(f"""SELECT run_id, last_step - coalesce(first_step, 0) + 1 FROM runs
                                WHERE run_id IN ({', '.join('?' * len(run_ids))})""", list(run_ids)) \
            if run_ids else []
        plans: dict[tuple[int, int], list[str]] = {}
        for rid, span in spans:
            plans.setdefault(plan(int(span or 0), points, SCALAR_WIDTHS), []).append(rid)
        marks = ", ".join("?" * len(keys))
        parts = []
        if self._before_rollups is not None and any(w for w, _ in plans):
            self._before_rollups("scalars")
        for (w, k), rids in plans.items():
            runs = ", ".join("?" * len(rids))
            if not w:     # pick the kept (key, step) pairs first, then merge ranks for those only
                parts.append(self._query(f"""
                    WITH ks AS (SELECT DISTINCT run_id, key, step FROM scalars
                                WHERE run_id IN ({runs}) AND key IN ({marks})),
                    ranked AS (SELECT run_id, key, step,
                                      row_number() OVER (PARTITION BY run_id, key ORDER BY step) AS rn,
                                      count(*) OVER (PARTITION BY run_id, key) AS n FROM ks),
                    keep AS (SELECT run_id, key, step FROM ranked WHERE {KEEP})
                    SELECT run_id, key, step, {MERGED_VALUE_SQL} AS value, max(wall_time) AS wall_time,
                           count(DISTINCT rank) AS ranks
                    FROM scalars SEMI JOIN keep USING (run_id, key, step)
                    WHERE run_id IN ({runs}) AND key IN ({marks})
                    GROUP BY run_id, key, step""", [*rids, *keys, points, *rids, *keys]))
                continue
            rolled = self._query(scalar_points_sql(len(rids), len(keys)), [k, w, k, *rids, *keys])
            kept = rolled[rolled["keep"]]
            parts.append(kept.drop(columns=["last_step", "keep"]))
            ends = rolled.groupby(["run_id", "key"])["last_step"].max().to_frame("last") \
                .join(kept.groupby(["run_id", "key"])["step"].max().rename("shown")).fillna(-1)
            ends = ends[ends["last"] > ends["shown"]]
            if len(ends):     # each series' last step, read raw (its bucket shows its first step)
                pairs = " OR ".join(["(run_id = ? AND key = ? AND step = ?)"] * len(ends))
                parts.append(self._query(f"""
                    SELECT run_id, key, step, {MERGED_VALUE_SQL} AS value, max(wall_time) AS wall_time,
                           count(DISTINCT rank) AS ranks
                    FROM scalars WHERE step >= ? AND ({pairs}) GROUP BY run_id, key, step""",
                    [int(ends["last"].min()), *[v for (rid, key), last in ends["last"].items()
                                                for v in (rid, key, int(last))]]))
        parts = [p for p in parts if len(p)]
        if not parts:
            return pd.DataFrame({"run_id": pd.Series(dtype=object), "key": pd.Series(dtype=object),
                                 "step": pd.Series(dtype="int64"), "value": pd.Series(dtype="float64"),
                                 "wall_time": pd.Series(dtype="float64")})
        df = pd.concat(parts, ignore_index=True).sort_values(["run_id", "key", "step"], kind="stable")
        multi = df.ranks > 1
        if multi.any():     # percentiles of multi-rank steps: re-merged from histograms, per run
            merged = [self._merge_percentiles(rid, rows)
                      for rid, rows in df[multi].groupby("run_id", sort=False)]
            df = pd.concat([df[~multi], *merged]).sort_values(["run_id", "key", "step"], kind="stable")
        return df.drop(columns="ranks").reset_index(drop=True)

    def _span(self, run_id: str) -> int:
        """Steps between the run's first and last scalar (0: none or no such run)."""
        row = self._fetch("SELECT last_step - coalesce(first_step, 0) + 1 FROM runs WHERE run_id = ?", [run_id])
        return int(row[0][0] or 0) if row else 0

    @staticmethod
    def _scalar_filter(run_id, keys, since_step) -> tuple[str, list]:
        where, params = ["run_id = ?"], [run_id]
        if keys is not None:
            keys = list(keys)
            if not keys:
                keys = [""]           # empty selection -> empty result, not everything
            where.append(f"key IN ({', '.join('?' * len(keys))})")
            params.extend(keys)
        if since_step is not None:
            where.append("step >= ?")
            params.append(int(since_step))
        return " AND ".join(where), params

    def _merge_percentiles(self, run_id: str, df: pd.DataFrame) -> pd.DataFrame:
        # a percentile is not a mean: with >1 rank, recompute it from the summed histograms
        if not (df.ranks > 1).any():
            return df
        multi = df[(df.ranks > 1) & df.key.str.match(PERCENTILE_KEY)]
        if multi.empty:
            return df
        steps = sorted(multi.step.unique().tolist())
        hist = self._query(f"""
            SELECT step, bin_lo, bin_hi, sum(count) AS count FROM histograms
            WHERE run_id = ? AND key = 'entropy' AND step IN ({', '.join('?' * len(steps))})
            GROUP BY step, bin_lo, bin_hi ORDER BY step, bin_lo""", [run_id, *steps])
        df = df.copy()
        for step, h in hist.groupby("step"):
            lo, hi, counts = (h[c].to_numpy(np.float64) for c in ("bin_lo", "bin_hi", "count"))
            for idx in multi.index[multi.step == step]:
                q = int(PERCENTILE_KEY.match(df.at[idx, "key"]).group(1)) / 100.0
                df.at[idx, "value"] = histogram_quantile(lo, hi, counts, q)
        return df

    def steps_scalars(self, run_id: str, steps: Sequence[int]) -> dict[int, dict[str, float]]:
        """Scalars of several steps in one query, ranks merged: step -> {key: value}. Plain rows,
        no pandas: the ingest calls this on every step, inside the training process when the
        store is in-process, and pandas' dtype checks enter warnings.catch_warnings, which resets
        every module's warning registry, so the training script's own once-only warnings (TRL's
        deprecations) would print again at every step."""
        steps = [int(s) for s in steps]
        if not steps:
            return {}
        rows = self._fetch(f"""
            SELECT key, step, {MERGED_VALUE_SQL} AS value, count(DISTINCT rank) AS ranks
            FROM scalars WHERE run_id = ? AND step BETWEEN ? AND ? AND step IN ({', '.join('?' * len(steps))})
            GROUP BY key, step""", [run_id, min(steps), max(steps), *steps])   # BETWEEN: zone maps skip old row groups
        out: dict[int, dict[str, float]] = {}
        multi: dict[int, list[str]] = {}
        for key, step, value, ranks in rows:
            out.setdefault(int(step), {})[key] = float("nan") if value is None else float(value)
            if ranks > 1 and PERCENTILE_KEY.match(key):
                multi.setdefault(int(step), []).append(key)
        if multi:   # a percentile is not a mean: with >1 rank, recompute it from the summed histograms
            hist = self._fetch(f"""
                SELECT step, bin_lo, bin_hi, sum(count) AS count FROM histograms
                WHERE run_id = ? AND key = 'entropy' AND step IN ({', '.join('?' * len(multi))})
                GROUP BY step, bin_lo, bin_hi ORDER BY step, bin_lo""", [run_id, *multi])
            bins: dict[int, list[tuple]] = {}
            for step, lo, hi, count in hist:
                bins.setdefault(int(step), []).append((lo, hi, count))
            for step, found in bins.items():
                lo, hi, counts = np.asarray(found, dtype=np.float64).T
                for key in multi[step]:
                    q = int(PERCENTILE_KEY.match(key).group(1)) / 100.0
                    out[step][key] = histogram_quantile(lo, hi, counts, q)
        return out

    def read_histograms(self, run_id: str, key: str = "entropy", downsample: int = 1000,
                        since_step: int | None = None) -> pd.DataFrame:
        """(step, bin_lo, bin_hi, count) summed over ranks; ≤ downsample steps. A long run is
        read from its rollups: one column per w·k steps at its last step, each bin summed."""
        if since_step is None:
            w = column_width(self._span(run_id), max_points_of(downsample), HISTOGRAM_WIDTHS)
            if w:
                if self._before_rollups is not None:
                    self._before_rollups("histograms")
                return self._query(histogram_columns_sql(), [run_id, key, w])
        params: list = [run_id, key]
        since = ""
        if since_step is not None:
            since, params = " AND step >= ?", params + [int(since_step)]
        # pick the kept steps first (a scan of one column), then sum only their bins: summing
        # every bin of a long run before downsampling cost ~15x more on 10k steps
        return self._query(f"""
            WITH steps AS (SELECT DISTINCT step FROM histograms WHERE run_id = ? AND key = ?{since}),
            ranked AS (SELECT step, row_number() OVER (ORDER BY step) AS rn, count(*) OVER () AS n
                       FROM steps),
            keep AS (SELECT step FROM ranked
                     WHERE {KEEP})
            SELECT h.step, h.bin_lo, h.bin_hi, sum(h.count) AS count
            FROM histograms h SEMI JOIN keep USING (step)
            WHERE h.run_id = ? AND h.key = ?{since}
            GROUP BY h.step, h.bin_lo, h.bin_hi
            ORDER BY h.step, h.bin_lo""", [*params, max_points_of(downsample), *params])

    def token_steps(self, run_id: str, since_step: int | None = None) -> list[int]:
        """Steps with token rows, ascending (since_step: only those ≥ it), from the writer's index
        of them (token_steps), not a DISTINCT over every token row."""
        since, params = ("", [run_id]) if since_step is None else (" AND step >= ?", [run_id, int(since_step)])
        df = self._query(f"SELECT step FROM token_steps WHERE run_id = ?{since} ORDER BY step", params)
        return [int(s) for s in df["step"]]

    def read_tokens(self, run_id: str, step: int, sample_id: int | None = None,
                    limit: int = MAX_READ_TOKEN_ROWS) -> pd.DataFrame:
        """Per-token rows of one step (optionally one sample), ordered by rank, sample, position;
        at most `limit` rows (a step may hold millions: the caller sees len == limit and says so;
        the HTTP route pages through all of them)."""
        cols = ", ".join(n for n in TOKENS.names if n != "run_id")
        sql, params = f"SELECT {cols} FROM tokens WHERE run_id = ? AND step = ?", [run_id, int(step)]
        if sample_id is not None:
            sql, params = sql + " AND sample_id = ?", params + [int(sample_id)]
        return self._query(sql + " ORDER BY rank, sample_id, pos LIMIT ?", [*params, max(1, int(limit))])

    def read_samples(self, run_id: str, step: int | None = None, group_id: int | None = None,
                     limit: int = 10_000) -> pd.DataFrame:
        """Samples (newest steps first when unfiltered), at most `limit` rows."""
        cols = ", ".join(n for n in SAMPLES.names if n != "run_id")
        sql, params = f"SELECT {cols} FROM samples WHERE run_id = ?", [run_id]
        if step is not None:
            sql, params = sql + " AND step = ?", params + [int(step)]
        if group_id is not None:
            sql, params = sql + " AND group_id = ?", params + [int(group_id)]
        return self._query(sql + " ORDER BY step DESC, rank, sample_id LIMIT ?", [*params, int(limit)]) \
            .sort_values(["step", "rank", "sample_id"], kind="stable").reset_index(drop=True)

    def read_alerts(self, run_id: str | None = None, since_step: int | None = None) -> pd.DataFrame:
        sql, params = f"SELECT {', '.join(ALERTS.names)} FROM alerts WHERE true", []
        if run_id is not None:
            sql, params = sql + " AND run_id = ?", params + [run_id]
        if since_step is not None:
            sql, params = sql + " AND step >= ?", params + [int(since_step)]
        return self._query(sql + " ORDER BY run_id, step, wall_time", params)

    def run_progress(self, run_id: str) -> tuple[int, int]:
        """(last scalar step, alert count) of a run, (-1, 0) before its first: what a live page
        compares with what it drew, in one small statement, before reading anything else."""
        rows = self._fetch("SELECT coalesce((SELECT last_step FROM runs WHERE run_id = ?), -1), "
                           "(SELECT count(*) FROM alerts WHERE run_id = ?)", [run_id, run_id])
        return int(rows[0][0]), int(rows[0][1])

    def read_alerts_page(self, *, run_ids: Sequence[str] = (), severities: Sequence[str] = (),
                         detectors: Sequence[str] = (), limit: int = 100, offset: int = 0
                         ) -> tuple[pd.DataFrame, int]:
        """Alerts of every run (or of run_ids), newest first (wall time, then step), filtered by
        severity and detector in SQL, one page of at most `limit` rows from `offset`; returns
        (rows with the run's name, how many match in all)."""
        where, params = ["true"], []
        for column, values in (("a.run_id", run_ids), ("a.severity", severities),
                               ("a.detector", detectors)):
            values = [str(v) for v in values]
            if values:
                where.append(f"{column} IN ({', '.join('?' * len(values))})")
                params.extend(values)
        cond = " AND ".join(where)
        total = self._query(f"SELECT count(*) AS n FROM alerts a WHERE {cond}", params)
        cols = ", ".join(f"a.{n}" for n in ALERTS.names)
        rows = self._query(f"""
            SELECT {cols}, coalesce(r.name, a.run_id) AS run_name
            FROM alerts a LEFT JOIN runs r USING (run_id) WHERE {cond}
            ORDER BY a.wall_time DESC NULLS LAST, a.step DESC, a.run_id, a.detector
            LIMIT ? OFFSET ?""", [*params, max(0, int(limit)), max(0, int(offset))])
        return rows, int(total["n"].iloc[0])

    def alert_detectors(self) -> list[str]:
        """Every detector that has fired in any run (the alerts view's filter choices)."""
        return self._query("SELECT DISTINCT detector FROM alerts ORDER BY detector")["detector"] \
            .dropna().tolist()

    def row_counts(self, run_id: str) -> dict[str, int]:
        """Rows per data table for one run (health checks, tests, export)."""
        parts = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t} WHERE run_id = ?"
                                   for t in (*DATA_TABLES, "alerts"))
        df = self._query(parts, [run_id] * (len(DATA_TABLES) + 1))
        return {t: int(n) for t, n in zip(df.t, df.n)}

    def read_scalars_of_runs(self, keys: Sequence[str], downsample: int = 24,
                             run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """(run_id, key, step, value) of every run (or of run_ids), as read_scalars reads each:
        ≤ downsample points per run and key, ranks merged; a handful of queries, not one per
        run (the runs page's sparklines)."""
        if run_ids is None:
            run_ids = [r[0] for r in self._fetch("SELECT run_id FROM runs")]
        return self._downsampled(list(run_ids), keys, downsample).drop(columns="wall_time")
