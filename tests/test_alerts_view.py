"""The alerts view's reads and rows: every run's alerts newest first, filtered and paged in SQL,
each row linking to the run page and the tokens page at its step."""
from __future__ import annotations

import itertools

import pytest

from forksight.dashboard.alerts_view import alert_rows, split_fix
from forksight.monitor.collector.store import Store

DETECTORS = ("entropy_collapse", "stagnation", "lost_diversity")


@pytest.fixture()
def store(tmp_path):
    with Store(str(tmp_path / "a.duckdb")) as s:
        yield s


def seed_alerts(store) -> list[dict]:
    """Two runs, 12 alerts with distinct wall times (the order the view must show)."""
    ids = [store.create_run(name, strategy="all") for name in ("run-a", "run-b")]
    rows = []
    for i, (rid, det) in enumerate(zip(itertools.cycle(ids), itertools.cycle(DETECTORS))):
        if i == 12:
            break
        rows.append({"run_id": rid, "step": 3 * i, "wall_time": 1000.0 + i, "detector": det,
                     "severity": "critical" if i % 4 == 0 else "warning",
                     "message": f"alert {i} [signal `entropy/mean` = 0.1, threshold 0.09] "
                                f"Fix: do thing {i}.", "value": 0.1, "threshold": 0.09,
                     "forecast": None, "action": "long recommendation"})

    def insert(cur):
        for r in rows:
            cur.execute("INSERT INTO alerts (run_id, step, wall_time, detector, severity, message,"
                        " value, threshold, forecast, action) VALUES (?,?,?,?,?,?,?,?,?,?)",
                        [r[k] for k in ("run_id", "step", "wall_time", "detector", "severity",
                                        "message", "value", "threshold", "forecast", "action")])
    store.call(insert)
    return rows


def test_all_alerts_newest_first_filtered_and_paged_in_sql(store):
    rows = seed_alerts(store)
    page, total = store.reader.read_alerts_page(limit=5)
    newest = sorted(rows, key=lambda r: -r["wall_time"])
    assert total == 12 and page["step"].tolist() == [r["step"] for r in newest[:5]]
    page2, _ = store.reader.read_alerts_page(limit=5, offset=5)
    assert page2["step"].tolist() == [r["step"] for r in newest[5:10]]
    run_a = rows[0]["run_id"]
    crit_a = [r for r in newest if r["run_id"] == run_a and r["severity"] == "critical"]
    got, total = store.reader.read_alerts_page(run_ids=[run_a], severities=["critical"])
    assert total == len(crit_a) and got["step"].tolist() == [r["step"] for r in crit_a]
    assert set(got["run_name"]) == {"run-a"}
    stag, total = store.reader.read_alerts_page(detectors=["stagnation"])
    assert total == sum(r["detector"] == "stagnation" for r in rows) == len(stag)
    assert store.reader.alert_detectors() == sorted(DETECTORS)


def test_each_row_links_to_the_run_and_the_tokens_page_at_its_step(store):
    seed_alerts(store)
    page, _ = store.reader.read_alerts_page(limit=3)
    out = alert_rows(page, prefix="/")
    first = page.iloc[0]
    assert out[0]["run_link"] == f"/run?run={first['run_id']}&step={int(first['step'])}"
    assert out[0]["tokens_link"] == f"/tokens?run={first['run_id']}&step={int(first['step'])}"
    assert out[0]["fix"] == "do thing 11." and "Fix:" not in out[0]["message"]


def test_split_fix_keeps_one_fix_line():
    assert split_fix("Entropy low [signal `x` = 1] Fix: lower the lr.", "long") == \
        ("Entropy low [signal `x` = 1]", "lower the lr.")
    assert split_fix("no fix in text", "the action") == ("no fix in text", "the action")
    assert split_fix(None, None) == ("", "")


def test_runs_table_alert_cell_links_to_the_alerts_view_of_its_run(store):
    from forksight.dashboard.pages.runs import runs_rows

    rows = seed_alerts(store)
    by_id = {r["id"]: r for r in runs_rows(store.reader, prefix="/dash/")}
    for rid in {r["run_id"] for r in rows}:
        mine = [r for r in rows if r["run_id"] == rid]
        crit = sum(r["severity"] == "critical" for r in mine)
        warn = len(mine) - crit
        text = " · ".join(t for t in (f"{crit} critical" if crit else "",
                                      f"{warn} warning" if warn else "") if t)
        assert by_id[rid]["alerts"] == f"[{text}](/dash/alerts?run={rid})"
        assert by_id[rid]["health"] == "waiting"          # no step logged yet
