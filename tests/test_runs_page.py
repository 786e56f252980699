"""The runs table is paged, filtered and sorted in SQL (Reader.runs_page, dashboard/runs_table.py):
each answer equals the same filter, sort and slice done in Python over every run."""
from __future__ import annotations

import numpy as np
import pytest

from forksight.base.records import Records, scalars_table
from forksight.dashboard.runs_table import parse_filter, parse_sort, runs_table
from forksight.monitor.collector.store import Store

STRATEGIES = ("fork", "random", "all_tokens", "Fork_50%")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(0)
    with Store(tmp_path_factory.mktemp("runs") / "r.duckdb") as store:
        for i in range(33):
            rid = store.create_run(f"run-{i:02d}", strategy=STRATEGIES[i % 4],
                                   model=None if i % 5 == 0 else f"m{i % 3}")
            if i % 6:         # every sixth run has no step yet (last_step null)
                steps = int(rng.integers(1, 40))
                store.write(rid, Records(scalars=scalars_table(
                    [{"step": s, "key": "entropy/mean", "value": 1.0} for s in range(steps)]))).result()
            if i % 4 == 1:
                store.update_run(rid, status="finished")
        store.call(lambda cur: cur.execute("""
            INSERT INTO alerts (run_id, step, detector, severity, message, action)
            SELECT 'run-' || lpad((i % 33)::VARCHAR, 2, '0'), i, 'entropy_collapse',
                   CASE WHEN i % 3 = 0 THEN 'critical' ELSE 'warning' END, 'm', 'a'
            FROM range(0, 60, 7) t(i)"""))
        yield store


def _python(store, where=lambda r: True, key=None, descending=False):
    """Every run as runs_page returns them, filtered and sorted in Python."""
    runs = store.reader.list_runs().to_dict("records")
    alerts = store.reader.read_alerts()
    for r in runs:
        mine = alerts[alerts.run_id == r["run_id"]]
        r["critical"] = int((mine.severity == "critical").sum())
        r["warning"] = int((mine.severity == "warning").sum())
    runs = [r for r in runs if where(r)]      # list_runs: newest first, then run_id
    if key is not None:                       # a stable sort keeps that order among ties
        present = [r for r in runs if key(r) is not None]
        missing = [r for r in runs if key(r) is None]
        runs = sorted(present, key=key, reverse=descending) + missing
    return [r["run_id"] for r in runs]


def _last_step(r):
    return None if r["last_step"] != r["last_step"] or r["last_step"] is None else int(r["last_step"])


@pytest.mark.parametrize("descending", [False, True])
def test_a_page_sorted_by_last_step_is_the_python_sort_sliced(store, descending):
    expect = _python(store, key=_last_step, descending=descending)
    # ties keep list_runs' order (newest first): sorted() is stable and so is the SQL's tie-break
    for offset in (0, 7, 28, 40):
        rows, total = store.reader.runs_page(order=[("last_step", descending)], limit=7, offset=offset)
        assert total == 33
        assert rows.run_id.tolist() == expect[offset:offset + 7]


def test_filters_and_a_two_key_sort_match_python(store):
    rows, total = store.reader.runs_page(
        where=[("strategy", "contains", "FORK"), ("last_step", ">=", 10)],
        order=[("status", False), ("name", True)], limit=100)
    expect = _python(store, where=lambda r: "fork" in (r["strategy"] or "").lower()
                     and _last_step(r) is not None and _last_step(r) >= 10,
                     key=lambda r: (r["status"], [-ord(c) for c in r["name"]]))
    assert rows.run_id.tolist() == expect and total == len(expect) > 0


def test_contains_takes_percent_and_underscore_literally(store):
    rows, total = store.reader.runs_page(where=[("strategy", "contains", "_50%")])
    assert set(rows.strategy) == {"Fork_50%"} and total == len(_python(
        store, where=lambda r: r["strategy"] == "Fork_50%"))
    assert store.reader.runs_page(where=[("strategy", "contains", "k_5")])[1] == total
    assert store.reader.runs_page(where=[("strategy", "contains", "%")])[1] == total


def test_alert_counts_and_sorting_by_them(store):
    rows, _ = store.reader.runs_page(order=[("alerts", True)], limit=100)
    expect = _python(store, key=lambda r: (r["critical"], r["warning"]), descending=True)
    assert rows.run_id.tolist() == expect
    by_id = rows.set_index("run_id")
    alerts = store.reader.read_alerts()
    for rid, mine in alerts.groupby("run_id"):
        assert by_id.loc[rid, "critical"] == (mine.severity == "critical").sum()
        assert by_id.loc[rid, "warning"] == (mine.severity == "warning").sum()


def test_past_the_last_page_still_counts_and_bad_columns_are_refused(store):
    rows, total = store.reader.runs_page(where=[("status", "=", "finished")], limit=5, offset=500)
    assert rows.empty and total == len(_python(store, where=lambda r: r["status"] == "finished"))
    with pytest.raises(ValueError, match="cannot filter runs by 'config'"):
        store.reader.runs_page(where=[("config", "=", "x")])
    with pytest.raises(ValueError, match="cannot sort runs by"):
        store.reader.runs_page(order=[("1; DROP TABLE runs", False)])
    with pytest.raises(ValueError, match="compares with a number"):
        store.reader.runs_page(where=[("last_step", ">", "abc")])


def test_datatable_filter_and_sort_strings_parse():
    assert parse_filter('{strategy} icontains fork && {last_step} > 10 && {model} s= "m 1"') == [
        ("strategy", "contains", "fork"), ("last_step", ">", 10.0), ("model", "=", "m 1")]
    assert parse_filter("{entropy} > 1 && {health} contains x && garbage") == []   # not in SQL
    assert parse_filter("{last_step} contains 12") == [("last_step", "contains", "12")]
    assert parse_filter("{last_step} = abc") == [("last_step", "contains", "abc")]
    assert parse_sort([{"column_id": "last_step", "direction": "desc"}, {"column_id": "trend"},
                       "x"]) == [("last_step", True)]


def test_the_table_pages_through_every_run_once(store):
    seen = []
    for page in range(4):
        rows, total = runs_table(store.reader, page=page, page_size=10,
                                 sort_by=[{"column_id": "name", "direction": "asc"}])
        seen += [r["id"] for r in rows]
    assert seen == sorted(_python(store)) and total == 33
