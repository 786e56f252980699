"""The downsample keep-rule has one definition in two forms (SQL for the Reader, numpy for the
figures): both keep the same points, at most max_points, first and last always."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

from forksight.base.downsample import keep_indices, keep_sql, max_points_of


def _sql_kept(n: int, max_points: int) -> list[int]:
    rows = duckdb.sql(f"""
        WITH ranked AS (SELECT i, row_number() OVER (ORDER BY i) AS rn, count(*) OVER () AS n
                        FROM range({n}) t(i))
        SELECT i FROM ranked WHERE {keep_sql()} ORDER BY i""", params=[max_points_of(max_points)]).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 11, 99, 100, 101, 1000, 1001, 4097])
@pytest.mark.parametrize("max_points", [2, 3, 7, 10, 24, 100, 1000])
def test_sql_and_numpy_keep_the_same_points_within_the_bound(n, max_points):
    kept = keep_indices(n, max_points).tolist()
    assert _sql_kept(n, max_points) == kept
    assert len(kept) <= max(max_points, 1) and kept[0] == 0 and kept[-1] == n - 1
    assert kept == sorted(set(kept))


def test_a_short_series_is_kept_whole_and_a_long_one_evenly():
    assert keep_indices(5, 10).tolist() == [0, 1, 2, 3, 4]
    # hand-worked: n=11, max 4 -> stride ceil(10/3)=4 -> 0,4,8 plus the last, 10
    assert keep_indices(11, 4).tolist() == [0, 4, 8, 10]
    gaps = np.diff(keep_indices(100_000, 1000))
    assert gaps[:-1].min() == gaps[:-1].max()      # one stride, the last gap may be shorter
