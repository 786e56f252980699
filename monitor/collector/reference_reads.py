"""Reads of the `reference` table (a fixed reference set re-scored at steps, hooks/capture/reference.py):
the steps that hold it, one step's rows, and a keyset-paged read for the HTTP route (the tokens
route's pager). A mixin of the Reader (reads via its _fetch and _query)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from forksight.base.tables import REFERENCE
from forksight.monitor.collector.token_pages import read_step_page

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

MAX_READ_REFERENCE_ROWS = 1_000_000     # reference rows one read of a step takes (a set of 32 x 30k tokens)


class ReferenceReads:
    """Reader.reference_steps, read_reference and reference_page (mixed into the Reader)."""

    def reference_steps(self, run_id: str) -> list[int]:
        """Steps that hold a re-scored reference set, ascending; the first is the base."""
        return [int(r[0]) for r in self._fetch("SELECT DISTINCT step FROM reference WHERE run_id = ? ORDER BY step",
                                               [run_id])]

    def read_reference(self, run_id: str, step: int, sample_id: int | None = None,
                       limit: int = MAX_READ_REFERENCE_ROWS) -> pd.DataFrame:
        """Reference rows of one step (optionally one completion), by rank, sample, position (the base
        step's prompt rows first, at negative positions); at most `limit` rows."""
        cols = ", ".join(n for n in REFERENCE.names if n != "run_id")
        sql, params = f"SELECT {cols} FROM reference WHERE run_id = ? AND step = ?", [run_id, int(step)]
        if sample_id is not None:
            sql, params = sql + " AND sample_id = ?", params + [int(sample_id)]
        return self._query(sql + " ORDER BY rank, sample_id, pos LIMIT ?", [*params, max(1, int(limit))])

    def reference_page(self, run_id: str, step: int, sample_id: int | None, limit: int,
                       after: tuple[int, int, int, int] | None) -> tuple[pa.Table, int, str | None]:
        """(rows of this page, rows of the step in all, the next page's cursor or None), as the tokens
        route pages: ordered by (rank, sample_id, pos, rowid), no OFFSET."""
        return read_step_page(self, REFERENCE, run_id, step, sample_id, limit, after)
