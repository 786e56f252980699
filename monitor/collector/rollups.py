"""Multi-resolution rollups, kept by the writer at ingest (tables: forksight.base.tables
SCALAR_ROLLUPS, HISTOGRAM_ROLLUPS): per run, key and width w in WIDTHS, bucket b = step // w
holds the rank-merge sums of its first step (so a downsampled read draws real points, the
stride rule's) and of all its rows (mean, min, max); a histogram bucket holds each bin's count
summed over its steps. A read of D points over a run of S steps takes the widest stored w with
w <= S / D and merges k = ceil(S / D / w) buckets per point: it reads < 4 D rows per key however
long the run (a run shorter than 4 D steps is read raw, as before)."""
from __future__ import annotations

import math

import pyarrow as pa

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
GROUP BY run_id, key, width, step // width, bin_lo, bin_hi"""
_HISTOGRAM_MERGE = ("count = count + EXCLUDED.count, first_step = least(first_step, EXCLUDED.first_step), "
                    "last_step = greatest(last_step, EXCLUDED.last_step)")


def _upsert(table: str, select: str, merge: str) -> str:
    return f"INSERT INTO {table} BY NAME {select} ON CONFLICT DO UPDATE SET {merge}"


def roll_up(cur, table: str, run_id: str, data: pa.Table) -> None:
    """Add one inserted Arrow table of `table` ('scalars' or 'histograms', without run_id) to
    its rollups, on the writer's cursor inside its transaction."""
    cur.register("_forksight_roll", data)
    try:
        src = "(SELECT ?::VARCHAR AS run_id, * FROM _forksight_roll)"
        if table == "scalars":
            sql = _upsert("scalar_rollups", _SCALAR_ROLLUP_SELECT.format(src=src), _SCALAR_MERGE)
            cur.execute(sql, [run_id, list(SCALAR_WIDTHS)])
        else:
            sql = _upsert("histogram_rollups", _HISTOGRAM_ROLLUP_SELECT.format(src=src), _HISTOGRAM_MERGE)
            cur.execute(sql, [run_id, list(HISTOGRAM_WIDTHS)])
    finally:
        cur.unregister("_forksight_roll")


def rebuild_rollups(conn) -> None:
    """Rebuild both rollup tables from every stored row (a file written before they existed,
    or one seeded in bulk)."""
    conn.execute("DELETE FROM scalar_rollups")
    conn.execute(f"INSERT INTO scalar_rollups BY NAME {_SCALAR_ROLLUP_SELECT.format(src='scalars')}",
                 [list(SCALAR_WIDTHS)])
    conn.execute("DELETE FROM histogram_rollups")
    conn.execute(f"INSERT INTO histogram_rollups BY NAME {_HISTOGRAM_ROLLUP_SELECT.format(src='histograms')}",
                 [list(HISTOGRAM_WIDTHS)])


def plan(span: int, points: int, widths: tuple[int, ...]) -> tuple[int, int]:
    """(w, k) for reading at most `points` points (the last step's one included) over `span`
    steps: buckets of w·k steps, w a stored width, so fewer than 4·points stored rows per key
    are read; w = 0: read the raw rows (fewer than 4·points steps per key)."""
    need = math.ceil(max(1, span) / max(1, points - 1))        # steps per point, at least
    stored = [w for w in widths if w <= need]
    if not stored:
        return 0, 1
    w = stored[-1]
    return w, math.ceil(need / w)


def scalar_points_sql(runs: int, keys: int) -> str:
    """Per run and key, one point per k buckets of width w: the first step's rank-merged value
    (params: *run_ids, w, *keys, k); `ranks` > 1 when that step had several rows (ranks)."""
    return f"""
        WITH b AS (
            SELECT run_id, key, min(first_step) AS step, max(last_step) AS last_step,
                   arg_min(first_vw, first_step) AS vw, arg_min(first_w, first_step) AS w,
                   arg_min(first_v, first_step) AS v, arg_min(first_n, first_step) AS n,
                   arg_min(first_wall, first_step) AS wall_time
            FROM scalar_rollups
            WHERE run_id IN ({', '.join('?' * runs)}) AND width = ? AND key IN ({', '.join('?' * keys)})
            GROUP BY run_id, key, bucket // ?)
        SELECT run_id, key, step, CASE WHEN w > 0 THEN vw / w ELSE v / n END AS value, wall_time,
               n AS ranks, last_step FROM b"""


def histogram_columns_sql() -> str:
    """One heatmap column per k buckets of width w, at its last step, each bin's count summed
    (params: k, run_id, key, w)."""
    return """
        WITH g AS (
            SELECT bucket // ? AS g, bin_lo, bin_hi, sum(count) AS count, max(last_step) AS ls
            FROM histogram_rollups WHERE run_id = ? AND key = ? AND width = ?
            GROUP BY 1, 2, 3)
        SELECT max(ls) OVER (PARTITION BY g) AS step, bin_lo, bin_hi, count
        FROM g ORDER BY step, bin_lo"""
