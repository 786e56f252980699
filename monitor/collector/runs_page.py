"""The runs table's read: one page of runs, filtered and sorted in SQL (the runs page never
ships every run to the browser). A mixin of the Reader: it reads through the Reader's _query."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import pandas as pd

# the columns a page may be filtered and sorted by -> their SQL (over runs r, alert counts a)
STATUS_SQL = "CASE WHEN r.status = 'live' AND r.heartbeat < ? THEN 'crashed' ELSE r.status END"
RUN_COLUMNS = {"name": "coalesce(r.name, r.run_id)", "status": STATUS_SQL, "strategy": "r.strategy",
               "model": "r.model", "project": "r.project", "last_step": "r.last_step",
               "created_at": "r.created_at", "alerts": "coalesce(a.critical, 0) * 1000000000 "
                                                      "+ coalesce(a.warning, 0)"}
NUMERIC = {"last_step", "created_at", "alerts"}
OPERATORS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "contains": "ILIKE"}


def _column(name: str) -> tuple[str, int]:
    """(SQL, how many stale-time parameters it takes) of a filter/sort column; KeyError if none."""
    sql = RUN_COLUMNS[name]
    return sql, sql.count("?")


def _like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its own % _ \\ taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class RunsPageReads:
    """Reader.runs_page (mixed into the Reader)."""

    stale_after: float

    def runs_page(self, *, where: Sequence[tuple[str, str, object]] = (),
                  order: Sequence[tuple[str, bool]] = (), limit: int = 50, offset: int = 0
                  ) -> tuple["pd.DataFrame", int]:
        """One page of runs: (rows, how many runs match in all). where: (column, operator,
        value) triples ANDed, column in RUN_COLUMNS, operator in OPERATORS ('contains' ignores
        case); order: (column, descending) pairs, then newest first. Rows: the run's columns
        (status derived from heartbeat age, as list_runs) plus `critical` and `warning` alert
        counts. ValueError names a column or operator it does not know."""
        stale = time.time() - self.stale_after
        conds, params = ["true"], []
        for column, op, value in where:
            if column not in RUN_COLUMNS or op not in OPERATORS:
                raise ValueError(f"cannot filter runs by {column!r} {op!r}: columns are "
                                 f"{sorted(RUN_COLUMNS)}, operators {sorted(OPERATORS)}")
            sql, stales = _column(column)
            if op == "contains":
                conds.append(f"CAST({sql} AS VARCHAR) ILIKE ? ESCAPE '\\'")
                params += [stale] * stales + [_like(str(value))]
            elif column in NUMERIC:
                try:
                    number = float(value)
                except (TypeError, ValueError):
                    raise ValueError(f"{column} compares with a number, got {value!r}") from None
                conds.append(f"{sql} {OPERATORS[op]} ?")
                params += [stale] * stales + [number]
            else:
                conds.append(f"{sql} {OPERATORS[op]} ?")
                params += [stale] * stales + [str(value)]
        keys, key_params = [], []
        for column, descending in order:
            if column not in RUN_COLUMNS:
                raise ValueError(f"cannot sort runs by {column!r}: columns are {sorted(RUN_COLUMNS)}")
            sql, stales = _column(column)
            keys.append(f"{sql} {'DESC' if descending else 'ASC'} NULLS LAST")
            key_params += [stale] * stales
        keys += ["r.created_at DESC", "r.run_id"]
        rows = self._query(f"""
            SELECT r.run_id, r.name, r.project, r.strategy, r.model, {STATUS_SQL} AS status,
                   r.created_at, r.heartbeat, r.last_step, r.config,
                   coalesce(a.critical, 0) AS critical, coalesce(a.warning, 0) AS warning,
                   count(*) OVER () AS total
            FROM runs r LEFT JOIN (
                SELECT run_id, count(*) FILTER (WHERE severity = 'critical') AS critical,
                       count(*) FILTER (WHERE severity <> 'critical') AS warning
                FROM alerts GROUP BY run_id) a USING (run_id)
            WHERE {' AND '.join(conds)}
            ORDER BY {', '.join(keys)}
            LIMIT ? OFFSET ?""", [stale, *params, *key_params, max(0, int(limit)), max(0, int(offset))])
        if len(rows):
            total = int(rows["total"].iloc[0])
        else:         # past the last page: still say how many match
            total = int(self._query(f"""
                SELECT count(*) AS n FROM runs r LEFT JOIN (
                    SELECT run_id, count(*) FILTER (WHERE severity = 'critical') AS critical,
                           count(*) FILTER (WHERE severity <> 'critical') AS warning
                    FROM alerts GROUP BY run_id) a USING (run_id)
                WHERE {' AND '.join(conds)}""", params)["n"].iloc[0])
        text = ["name", "project", "strategy", "model", "status", "config"]
        rows[text] = rows[text].astype(object).where(rows[text].notna(), None)
        return rows.drop(columns="total").reset_index(drop=True), total
