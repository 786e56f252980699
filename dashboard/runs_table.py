"""The runs table's work, as plain functions: DataTable's custom filter and sort (its
filter_query and sort_by) turned into the Reader's runs_page arguments, and one page of rows
(sparklines, health and alert counts for that page's runs only). The page adapts them."""
from __future__ import annotations

import math
import re
from urllib.parse import quote

import pandas as pd

from forksight.base.interfaces import Reader
from forksight.dashboard.figures import sparkline
from forksight.dashboard.text import visible
from forksight.dashboard.verdict import verdicts_of_runs

PAGE_SIZE = 50
SPARK_POINTS = 24
# the table's columns the Reader filters and sorts in SQL; health, entropy, trend and pass@1 are
# drawn per page (health and the latest values are not stored per run), so they are not
SQL_COLUMNS = {"name", "status", "strategy", "model", "last_step", "alerts"}
_OPS = {"=": "=", "eq": "=", "!=": "!=", "ne": "!=", "<": "<", "lt": "<", "<=": "<=", "le": "<=",
        ">": ">", "gt": ">", ">=": ">=", "ge": ">=", "contains": "contains"}
# one part of DataTable's filter_query: {column} operator value (operators may carry the
# case prefix i/s; the value may be quoted)
_PART = re.compile(r"^\{(?P<col>[^}]+)\}\s+(?:[is](?=contains|=|eq|!=|ne|<|lt|>|gt|le|ge))?"
                   r"(?P<op>contains|!=|<=|>=|=|<|>|eq|ne|le|lt|ge|gt)\s+(?P<val>.+)$")


def _num(value, digits: int = 3):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) \
        else round(float(value), digits)


def parse_filter(filter_query: str | None) -> list[tuple[str, str, object]]:
    """DataTable's filter_query ('{name} contains fork && {last_step} > 10') as (column,
    operator, value) triples for Reader.runs_page; parts on other columns or in other forms
    are left out (the table shows what it can filter)."""
    out = []
    for part in (filter_query or "").split(" && "):
        found = _PART.match(part.strip())
        if not found or found["col"] not in SQL_COLUMNS:
            continue
        value = found["val"].strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
            value = value[1:-1]
        op = _OPS[found["op"]]
        if found["col"] in ("last_step", "alerts") and op != "contains":
            try:
                value = float(value)
            except ValueError:
                op = "contains"          # a number column typed with text: match it as text
        out.append((found["col"], op, value))
    return out


def parse_sort(sort_by: list[dict] | None) -> list[tuple[str, bool]]:
    """DataTable's sort_by ([{'column_id': 'last_step', 'direction': 'desc'}]) as (column,
    descending) pairs; columns not sorted in SQL are left out."""
    return [(s["column_id"], s.get("direction") == "desc") for s in sort_by or []
            if isinstance(s, dict) and s.get("column_id") in SQL_COLUMNS]


def runs_table(reader: Reader, prefix: str = "/", page: int = 0, page_size: int = PAGE_SIZE,
               sort_by: list[dict] | None = None, filter_query: str | None = None
               ) -> tuple[list[dict], int]:
    """(one page of table rows, how many runs match): the page read in SQL, then the page's
    sparklines and alerts (a few queries however many runs there are). Plain values: DataTable
    renders them as text; the alerts cell is a markdown link to the alerts view filtered to
    the run, built from numbers and a quoted id."""
    size = max(1, int(page_size or PAGE_SIZE))
    runs, total = reader.runs_page(where=parse_filter(filter_query), order=parse_sort(sort_by),
                                   limit=size, offset=max(0, int(page or 0)) * size)
    ids = runs["run_id"].tolist()
    if not ids:
        return [], total
    alerts, _ = reader.read_alerts_page(run_ids=ids, limit=1_000_000)
    alerts = alerts.sort_values(["run_id", "step", "wall_time"], kind="stable")
    trends = reader.read_scalars_of_runs(["entropy/mean", "pass@1"], downsample=SPARK_POINTS,
                                         run_ids=ids)
    values = trends.groupby(["run_id", "key"], sort=False)["value"].agg(list).to_dict() \
        if not trends.empty else {}
    steps = {r["run_id"]: None if pd.isna(r["last_step"]) else int(r["last_step"])
             for r in runs.to_dict("records")}
    latest = {rid: {"entropy/mean": ent[-1]} for (rid, key), ent in values.items()
              if key == "entropy/mean" and ent}
    health = verdicts_of_runs(alerts, latest, steps)
    rows = []
    for run in runs.to_dict("records"):
        rid = run["run_id"]
        ent, p1 = values.get((rid, "entropy/mean"), []), values.get((rid, "pass@1"), [])
        crit, warn = int(run["critical"]), int(run["warning"])
        counts_text = " · ".join(t for t in (f"{crit} critical" if crit else "",
                                             f"{warn} warning" if warn else "") if t)
        rows.append({
            "id": rid, "name": visible(run.get("name") or rid), "health": health[rid].label,
            "health_why": health[rid].why, "status": run.get("status") or "?",
            "strategy": visible(run.get("strategy")), "model": visible(run.get("model")),
            "last_step": steps[rid], "entropy": _num(ent[-1]) if ent else None,
            "trend": sparkline(ent), "pass1": _num(p1[-1]) if p1 else None,
            "alerts": f"[{counts_text}]({prefix}alerts?run={quote(rid, safe='')})"
            if counts_text else "",
        })
    return rows, total


def runs_rows(reader: Reader, prefix: str = "/") -> list[dict]:
    """The first page of rows, newest run first (runs_table with no filter or sort)."""
    return runs_table(reader, prefix)[0]
