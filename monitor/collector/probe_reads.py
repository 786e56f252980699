"""Reads of the `probes` table (Monte-Carlo value probes, hooks/metrics/value_probe.py): the steps
that hold probes, one step's rows for a page, and a keyset-paged read for the HTTP route (the
tokens route's pager). A mixin of the Reader (reads via its _fetch and _query)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from forksight.base.tables import PROBES
from forksight.monitor.collector.token_pages import read_step_page

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

MAX_READ_PROBE_ROWS = 100_000     # probe rows one dashboard read of a step takes


class ProbeReads:
    """Reader.probe_steps, read_probes and probe_page (mixed into the Reader)."""

    def probe_steps(self, run_id: str) -> list[int]:
        """Steps that hold probe rows, ascending (probes are a few hundred rows a probed step:
        a DISTINCT over them is cheap)."""
        return [int(r[0]) for r in self._fetch("SELECT DISTINCT step FROM probes WHERE run_id = ? ORDER BY step",
                                               [run_id])]

    def read_probes(self, run_id: str, step: int, sample_id: int | None = None,
                    limit: int = MAX_READ_PROBE_ROWS) -> pd.DataFrame:
        """Probe rows of one step (optionally one sample), ordered by rank, sample, position; at
        most `limit` rows. `alternatives` is JSON text (a list of {token_id, token, value, k})."""
        cols = ", ".join(n for n in PROBES.names if n != "run_id")
        sql, params = f"SELECT {cols} FROM probes WHERE run_id = ? AND step = ?", [run_id, int(step)]
        if sample_id is not None:
            sql, params = sql + " AND sample_id = ?", params + [int(sample_id)]
        return self._query(sql + " ORDER BY rank, sample_id, pos LIMIT ?", [*params, max(1, int(limit))])

    def probe_page(self, run_id: str, step: int, sample_id: int | None, limit: int,
                   after: tuple[int, int, int, int] | None) -> tuple[pa.Table, int, str | None]:
        """(rows of this page, rows of the step in all, the next page's cursor or None), as the
        tokens route pages: ordered by (rank, sample_id, pos, rowid), no OFFSET."""
        return read_step_page(self, PROBES, run_id, step, sample_id, limit, after)
