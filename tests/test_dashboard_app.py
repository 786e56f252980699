"""The dashboard app as a whole: each app keeps its own reader and caches (two collectors in one
process never show each other's runs), and the runs page reads its runs' sparklines in a few
queries instead of one per run.
"""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from collector_util import InProcessCollector
from layout_util import find_props


def _dash_call(url: str, outputs: list[str], inputs: list[dict]) -> dict:
    """One callback through Dash's own endpoint, as the browser sends it; its response body."""
    specs = [dict(zip(("id", "property"), o.rsplit(".", 1))) for o in outputs]
    body = {"output": outputs[0] if len(outputs) == 1 else ".." + "...".join(outputs) + "..",
            "outputs": specs[0] if len(specs) == 1 else specs, "inputs": inputs, "state": [],
            "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs]}
    response = httpx.post(f"{url}/_dash-update-component", json=body, timeout=30)
    assert response.status_code == 200, response.text[:500]
    return response.json()["response"]


def _seed(db, names: list[str], steps: int = 6) -> None:
    from forksight.base.records import Records, scalars_table
    from forksight.monitor.collector.store import Store

    with Store(str(db)) as store:
        for i, name in enumerate(names):
            run_id = store.create_run(name, strategy="fork")
            rows = [{"step": s, "key": k, "value": v} for s in range(steps)
                    for k, v in (("entropy/mean", 1.0 + i - 0.1 * s), ("pass@1", 0.1 * s))]
            store.write(run_id, Records(scalars=scalars_table(rows))).result()


def test_two_dashboards_in_one_process_each_show_their_own_runs(tmp_path):
    _seed(tmp_path / "a.duckdb", ["alpha-one", "alpha-two"])
    _seed(tmp_path / "b.duckdb", ["beta-one"])
    tick = [{"id": "runs-tick", "property": "n_intervals", "value": 1},
            *({"id": "runs-table", "property": p, "value": v} for p, v in (
                ("page_current", 0), ("page_size", 50), ("sort_by", []), ("filter_query", "")))]
    page = [{"id": "_pages_location", "property": "pathname", "value": "/tokens"},
            {"id": "_pages_location", "property": "search", "value": ""}]
    with InProcessCollector(tmp_path / "a.duckdb", dashboard=True) as a, \
            InProcessCollector(tmp_path / "b.duckdb", dashboard=True) as b:
        for srv in (a, b):          # Dash adds its page router on the first page request
            assert httpx.get(srv.url + "/", timeout=30).status_code == 200
        for _ in range(2):          # interleaved: the app built last must not win the first's
            for srv, want in ((a, {"alpha-one", "alpha-two"}), (b, {"beta-one"})):
                rows = _dash_call(srv.url, ["runs-table.data"], tick)["runs-table"]["data"]
                assert {r["name"] for r in rows} == want
                # a page layout (built per request, from Dash's process-wide page registry)
                layout = _dash_call(srv.url, ["_pages_content.children", "_pages_store.data"],
                                    page)
                assert {o["value"] for o in find_props(layout, "tok-run")["options"]} == want


def counting_reader(store):
    """A real Reader over the store's connection that counts the SQL statements it runs."""
    from forksight.monitor.collector.reader import Reader

    class CountingReader(Reader):
        queries = 0

        def _query(self, sql, params=None):
            CountingReader.queries += 1
            return super()._query(sql, params)

    return CountingReader(store.reader._conn)


def test_runs_page_reads_all_sparklines_in_one_query_with_the_per_run_values(tmp_path):
    from forksight.dashboard.figures import sparkline
    from forksight.dashboard.pages.runs import SPARK_POINTS, runs_rows
    from forksight.base.records import Records, scalars_table
    from forksight.monitor.collector.store import Store

    rng = np.random.default_rng(0)
    with Store(str(tmp_path / "many.duckdb")) as store:
        ids = []
        for i in range(40):
            run_id = store.create_run(f"run-{i}", strategy="all")
            steps = int(rng.integers(1, 90))     # some runs longer than the sparkline
            for rank in range(1 + (i % 3 == 0)):  # every third run has two ranks to merge
                rows = [{"step": s, "key": k, "value": float(rng.random()), "weight": 1.0 + rank}
                        for s in range(steps) for k in ("entropy/mean", "pass@1", "loss")]
                store.write(run_id, Records(scalars=scalars_table(rows, rank=rank))).result()
            ids.append(run_id)
        counting = counting_reader(store)
        rows = {r["id"]: r for r in runs_rows(counting)}
        assert set(rows) == set(ids)                 # one page holds all 40
        # the page, its alerts, the spans and the batched sparklines: no query per run
        assert counting.queries < 10
        for run_id in ids:                       # the same numbers as one read per run gives
            one = store.reader.read_scalars(run_id, ["entropy/mean", "pass@1"],
                                            downsample=SPARK_POINTS)
            ent = one[one.key == "entropy/mean"]["value"].tolist()
            p1 = one[one.key == "pass@1"]["value"].tolist()
            assert rows[run_id]["trend"] == sparkline(ent)
            assert rows[run_id]["entropy"] == pytest.approx(round(ent[-1], 3))
            assert rows[run_id]["pass1"] == pytest.approx(round(p1[-1], 3))


def test_slider_follows_the_newest_step_only_when_the_user_is_on_it():
    from forksight.dashboard.pages.tokens import follows

    span = {"run": "r", "count": 3, "first": 0, "last": 8}
    assert follows(span, 8)                  # on the newest: follow
    assert follows(None, None) and follows({}, 3)   # nothing shown yet: newest
    assert not follows(span, 4)              # picked an earlier step: stays
