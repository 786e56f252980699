"""Multi-resolution rollups, kept by the writer at ingest (tables: forksight.base.tables
SCALAR_ROLLUPS, HISTOGRAM_ROLLUPS): per run, key and width w, bucket b = step // w holds the
rank-merge sums of its first step (so a downsampled read draws real points, as the stride rule
does) and of all its rows (mean, min, max); a histogram bucket holds each non-zero bin's count
summed over its steps. A read of D points over a run of S steps takes the widest stored w ≤ S/D
and every k-th bucket (w·k ≥ S/D): it filters fewer than 4·D rows per key out of the rollups and
aggregates none, however long the run (a run shorter than 4·D steps is read raw, as before); a
heatmap of C columns reads the narrowest width giving ≤ C buckets, one column each."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCALAR_WIDTHS = (4, 16, 64, 256, 1024, 4096, 16384, 65536)
HISTOGRAM_WIDTHS = (16, 64, 256, 1024, 4096, 16384, 65536)

# a source relation of (run_id, key, step, value, wall_time, weight) rows -> one row per
# (run, key, step) with its sums, then one per (run, key, width, bucket): the first step's
# sums come from arg_min over steps
_SCALAR_ROLLUP_SELECT = """
WITH steps AS (
    SELECT run_id, key, step, sum(value * coalesce(weight, 1)) AS vw, sum(coalesce(weight, 1)) AS w,
           sum(value) AS v, count(*)::DOUBLE AS n, max(wall_time) AS wall,
           min(value) AS vmin, max(value) AS vmax
    FROM {src} GROUP BY run_id, key, step)
SELECT run_id, key, width, step // width AS bucket, min(step) AS first_step, max(step) AS last_step,
       arg_min(vw, step) AS first_vw, arg_min(w, step) AS first_w, arg_min(v, step) AS first_v,
       arg_min(n, step) AS first_n, arg_min(wall, step) AS first_wall,
       sum(vw) AS vw, sum(w) AS w, sum(v) AS v, sum(n) AS n, min(vmin) AS vmin, max(vmax) AS vmax
FROM steps, (SELECT unnest(?::BIGINT[]) AS width)
GROUP BY run_id, key, width, step // width"""

# adding a bucket's new rows to a stored one: the earlier first step wins (equal: both count)
_FIRST = "CASE WHEN EXCLUDED.first_step < first_step THEN EXCLUDED.{c} " \
         "WHEN EXCLUDED.first_step = first_step THEN {c} + EXCLUDED.{c} ELSE {c} END"
_SCALAR_MERGE = ", ".join(
    [f"first_{c} = " + _FIRST.format(c=f"first_{c}") for c in ("vw", "w", "v", "n")]
    + ["first_wall = CASE WHEN EXCLUDED.first_step < first_step THEN EXCLUDED.first_wall "
       "WHEN EXCLUDED.first_step = first_step THEN greatest(first_wall, EXCLUDED.first_wall) "
       "ELSE first_wall END"]
    + [f"{c} = {c} + EXCLUDED.{c}" for c in ("vw", "w", "v", "n")]
    + ["vmin = least(vmin, EXCLUDED.vmin)", "vmax = greatest(vmax, EXCLUDED.vmax)",
       "first_step = least(first_step, EXCLUDED.first_step)",
       "last_step = greatest(last_step, EXCLUDED.last_step)"])

_HISTOGRAM_ROLLUP_SELECT = """
SELECT run_id, key, width, step // width AS bucket, bin_lo, bin_hi, min(step) AS first_step,
       max(step) AS last_step, sum(count) AS count
FROM {src}, (SELECT unnest(?::BIGINT[]) AS width)
WHERE count > 0
GROUP BY run_id, key, width, step // width, bin_lo, bin_hi"""
_HISTOGRAM_MERGE = ("count = count + EXCLUDED.count, first_step = least(first_step, EXCLUDED.first_step), "
                    "last_step = greatest(last_step, EXCLUDED.last_step)")


def _upsert(table: str, select: str, merge: str) -> str:
    return f"INSERT INTO {table} BY NAME {select} ON CONFLICT DO UPDATE SET {merge}"


_SUMS = ("vw", "w", "v", "n")


def scalar_rollup_rows(data: pa.Table) -> pa.Table:
    """The rollup rows of one Arrow table of scalars (key, step, value, wall_time, weight), every
    width, in numpy: per (key, step) its sums, then per (key, bucket) its first step's sums and
    its own (a batch is usually one step: no SQL aggregate per batch)."""
    n = len(data)
    value = pc.cast(data["value"], pa.float64()).to_numpy(zero_copy_only=False)
    weight = np.ones(n) if "weight" not in data.column_names else \
        pc.fill_null(pc.cast(data["weight"], pa.float64()), 1.0).to_numpy(zero_copy_only=False)
    wall = np.full(n, np.nan) if "wall_time" not in data.column_names else \
        pc.fill_null(pc.cast(data["wall_time"], pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    keys = pc.dictionary_encode(data["key"]).combine_chunks()
    code, step = keys.indices.to_numpy(zero_copy_only=False), data["step"].to_numpy()
    order = np.lexsort((step, code))
    code, step, value, weight, wall = code[order], step[order], value[order], weight[order], wall[order]

    def groups(*cols):            # start of each run of equal (cols) in the sorted rows
        change = np.zeros(len(cols[0]), bool)
        change[0] = True
        for c in cols:
            change[1:] |= c[1:] != c[:-1]
        return np.flatnonzero(change)

    at = groups(code, step)       # per (key, step)
    per = {"vw": np.add.reduceat(value * weight, at), "w": np.add.reduceat(weight, at),
           "v": np.add.reduceat(value, at), "n": np.diff(np.append(at, len(code))).astype(np.float64),
           "wall": np.fmax.reduceat(wall, at), "vmin": np.minimum.reduceat(value, at),
           "vmax": np.maximum.reduceat(value, at)}
    code, step = code[at], step[at]
    parts = []
    for width in SCALAR_WIDTHS:
        bucket = step // width
        b = groups(code, bucket)
        cols = {"key": keys.dictionary.take(pa.array(code[b])), "width": np.full(len(b), width, np.int64),
                "bucket": bucket[b], "first_step": step[b],
                "last_step": np.maximum.reduceat(step, b),
                **{f"first_{c}": per[c][b] for c in (*_SUMS, "wall")},
                **{c: np.add.reduceat(per[c], b) for c in _SUMS},
                "vmin": np.minimum.reduceat(per["vmin"], b), "vmax": np.maximum.reduceat(per["vmax"], b)}
        parts.append(pa.table(cols))
    return pa.concat_tables(parts)


def roll_up(cur, table: str, run_id: str, data: pa.Table) -> None:
    """Add one inserted Arrow table of `table` ('scalars' or 'histograms', without run_id) to
    its rollups, on the writer's cursor inside its transaction."""
    if table == "scalars":
        rows, sql = scalar_rollup_rows(data), _upsert("scalar_rollups", "SELECT ?::VARCHAR AS run_id, * FROM _forksight_roll",
                                                      _SCALAR_MERGE)
        params = [run_id]
    else:
        rows, sql = data, _upsert("histogram_rollups", _HISTOGRAM_ROLLUP_SELECT.format(
            src="(SELECT ?::VARCHAR AS run_id, * FROM _forksight_roll)"), _HISTOGRAM_MERGE)
        params = [run_id, list(HISTOGRAM_WIDTHS)]
    cur.register("_forksight_roll", rows)
    try:
        cur.execute(sql, params)
    finally:
        cur.unregister("_forksight_roll")


# a coarser level from the stored level below it (widths grow 4x): rebuilds read the raw rows once
_SCALAR_UP = """
SELECT run_id, key, ? AS width, bucket // 4 AS bucket, min(first_step) AS first_step,
       max(last_step) AS last_step, arg_min(first_vw, first_step) AS first_vw,
       arg_min(first_w, first_step) AS first_w, arg_min(first_v, first_step) AS first_v,
       arg_min(first_n, first_step) AS first_n, arg_min(first_wall, first_step) AS first_wall,
       sum(vw) AS vw, sum(w) AS w, sum(v) AS v, sum(n) AS n, min(vmin) AS vmin, max(vmax) AS vmax
FROM scalar_rollups WHERE width = ?{only} GROUP BY run_id, key, bucket // 4"""
_HISTOGRAM_UP = """
SELECT run_id, key, ? AS width, bucket // 4 AS bucket, bin_lo, bin_hi, min(first_step) AS first_step,
       max(last_step) AS last_step, sum(count) AS count
FROM histogram_rollups WHERE width = ?{only} GROUP BY run_id, key, bucket // 4, bin_lo, bin_hi"""


def rebuild_rollups(conn, run_ids: list[str] | None = None,
                    tables: tuple[str, ...] = ("scalars", "histograms")) -> None:
    """Rebuild the rollup tables of `tables` from the stored rows, of every run or of run_ids (a
    file written before they existed, rows seeded in bulk, a lake run): the finest level from the
    raw rows, each coarser one from the level below."""
    only = "" if run_ids is None else " AND run_id IN (SELECT unnest(?::VARCHAR[]))"
    runs = [] if run_ids is None else [list(run_ids)]
    for table, rollup, select, up, widths in (
            ("scalars", "scalar_rollups", _SCALAR_ROLLUP_SELECT, _SCALAR_UP, SCALAR_WIDTHS),
            ("histograms", "histogram_rollups", _HISTOGRAM_ROLLUP_SELECT, _HISTOGRAM_UP, HISTOGRAM_WIDTHS)):
        if table not in tables:
            continue
        assert all(b == 4 * a for a, b in zip(widths, widths[1:]))
        conn.execute(f"DELETE FROM {rollup} WHERE true{only}", runs)
        src = f"(SELECT * FROM {table} WHERE true{only})"
        conn.execute(f"INSERT INTO {rollup} BY NAME {select.format(src=src)}", [*runs, [widths[0]]])
        for below, width in zip(widths, widths[1:]):
            conn.execute(f"INSERT INTO {rollup} BY NAME {up.format(only=only)}", [width, below, *runs])


def plan(span: int, points: int, widths: tuple[int, ...]) -> tuple[int, int]:
    """(w, k) for reading at most `points` points (the last step's one included) over `span`
    steps: the first step of every k-th bucket of width w (a stored width), so fewer than
    4·points stored rows per key are read; w = 0: read the raw rows (fewer than 4·points steps)."""
    need = math.ceil(max(1, span) / max(1, points - 1))        # steps per point, at least
    stored = [w for w in widths if w <= need]
    if not stored:
        return 0, 1
    w = stored[-1]
    return w, math.ceil(need / w)


def column_width(span: int, columns: int, widths: tuple[int, ...]) -> int:
    """The narrowest stored width giving at most `columns` heatmap columns over `span` steps
    (between columns/4 and columns of them); 0: read raw (the span fits in `columns`)."""
    need = math.ceil(max(1, span) / max(1, columns))
    if need <= 1:
        return 0
    return next((w for w in widths if w >= need), widths[-1])


def scalar_points_sql(runs: int, keys: int) -> str:
    """Per run and key, the first step of every k-th bucket of width w with its rank-merged
    value, and the run's last bucket (keep false unless also a k-th: it tells the series' last
    step) (params: w, k, *run_ids, *keys); `ranks` > 1 when that step had several rows."""
    return f"""
        SELECT s.run_id, s.key, s.first_step AS step,
               CASE WHEN s.first_w > 0 THEN s.first_vw / s.first_w ELSE s.first_v / s.first_n END AS value,
               s.first_wall AS wall_time, s.first_n AS ranks, s.last_step,
               s.bucket % ? = 0 AS keep
        FROM scalar_rollups s JOIN runs r USING (run_id)
        WHERE s.width = ? AND (s.bucket % ? = 0 OR s.bucket = r.last_step // s.width)
          AND s.run_id IN ({', '.join('?' * runs)}) AND s.key IN ({', '.join('?' * keys)})"""


def histogram_columns_sql() -> str:
    """One heatmap column per bucket of width w at its last step, each bin's count summed over
    the bucket's steps and ranks (params: run_id, key, w)."""
    return """
        SELECT max(last_step) OVER (PARTITION BY bucket) AS step, bin_lo, bin_hi, count
        FROM histogram_rollups WHERE run_id = ? AND key = ? AND width = ?
        ORDER BY step, bin_lo"""
