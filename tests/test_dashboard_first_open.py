"""A page's first open: the layout Dash fetches already holds the opened page and its first draw
(no router or page callback before the charts), and the run pickers hold a page of runs, not
every run, searching the rest by name.
"""
from __future__ import annotations

import httpx
import pytest

from collector_util import InProcessCollector
from layout_util import find_props

STEPS = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from forksight.base.records import Records, scalars_table
    from forksight.monitor.collector.store import Store

    db = tmp_path_factory.mktemp("first-open") / "runs.duckdb"
    with Store(str(db)) as store:
        ids = []
        for i in range(3):
            run_id = store.create_run(f"run-{i}", strategy="fork")
            rows = [{"step": s, "key": k, "value": v} for s in range(STEPS)
                    for k, v in (("entropy/mean", 1.0 + i - 0.1 * s), ("pass@1", 0.1 * s))]
            store.write(run_id, Records(scalars=scalars_table(rows))).result()
            ids.append(run_id)
    with InProcessCollector(db, dashboard=True) as srv:
        assert httpx.get(srv.url + "/", timeout=30).status_code == 200
        yield srv, ids


def _layout(srv, referer: str | None) -> dict:
    headers = {"Referer": referer} if referer else {}
    response = httpx.get(srv.url + "/_dash-layout", headers=headers, timeout=30)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def test_the_opened_run_page_and_its_charts_come_with_the_first_layout(served):
    srv, ids = served
    url = f"{srv.url}/run?run={ids[1]}"
    layout = _layout(srv, url)
    # the Location already holds the URL the browser has: it reports no change, the router stays quiet
    location = find_props(layout, "_pages_location")
    assert (location["pathname"], location["search"], location["href"]) == ("/run", f"?run={ids[1]}", url)
    state = find_props(layout, "run-state")["data"]
    assert (state["run_id"], state["last_step"]) == (ids[1], STEPS - 1)
    traces = find_props(layout, "run-entropy")["figure"]["data"]
    assert max(max(t["x"]) for t in traces if t.get("x")) == STEPS - 1
    assert find_props(layout, "run-select")["value"] == ids[1]


def test_compare_and_alerts_pages_come_drawn_with_the_first_layout(served):
    srv, ids = served
    layout = _layout(srv, f"{srv.url}/compare?runs={ids[0]},{ids[2]}")
    lines = [t for t in find_props(layout, "cmp-figure")["figure"]["data"] if t.get("x")]
    assert {t.get("legendgroup") for t in lines} == {ids[0], ids[2]}
    assert max(max(t["x"]) for t in lines) == STEPS - 1
    assert find_props(layout, "cmp-runs")["value"] == [ids[0], ids[2]]
    count = find_props(_layout(srv, f"{srv.url}/alerts"), "alerts-count")
    assert count["children"] == "0 alerts, newest first"


@pytest.mark.parametrize("referer", [None, "http://elsewhere.example/run", "{url}/run#focus"])
def test_without_the_pages_own_url_the_router_fills_the_page_as_dash_does(served, referer):
    srv, _ = served
    layout = _layout(srv, referer.format(url=srv.url) if referer else None)
    assert find_props(layout, "_pages_content").get("children") is None
    assert find_props(layout, "run-entropy") is None


def test_a_run_picker_holds_the_newest_runs_and_the_picked_one_and_searches_every_run(tmp_path):
    from forksight.dashboard.run_options import PICK_RUNS, run_options
    from forksight.monitor.collector.store import Store

    with Store(str(tmp_path / "many.duckdb")) as store:
        ids = [store.create_run(f"run-{i:03d}", strategy="fork") for i in range(PICK_RUNS + 10)]
        reader = store.reader
        newest = [o["value"] for o in run_options(reader)]
        assert newest == ids[::-1][:PICK_RUNS]                   # newest first, one page only
        oldest = [o["value"] for o in run_options(reader, [ids[0], "no-such-run"])]
        assert oldest == ids[::-1][:PICK_RUNS] + [ids[0]]        # the picked run stays choosable
        found = run_options(reader, search="RUN-00")             # any case, anywhere in the name
        assert [o["label"] for o in found] == [f"run-{i:03d} · fork" for i in range(9, -1, -1)]


def test_dashboard_answers_go_gzipped_with_the_same_bytes_and_assets_are_cached(served):
    import gzip
    import re

    srv, ids = served
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        index = http.get("/").text
        scripts = re.findall(r'src="([^"]+\.js[^"]*)"', index)
        style = re.search(r'href="(/assets/style\.css\?m=[^"]+)"', index).group(1)
        for path in [style, *scripts]:
            with http.stream("GET", path, headers={"Accept-Encoding": "gzip"}) as zipped:
                raw = b"".join(zipped.iter_raw())
            plain = http.get(path, headers={"Accept-Encoding": "identity"})
            assert zipped.headers["content-encoding"] == "gzip", path
            assert "content-encoding" not in plain.headers
            assert gzip.decompress(raw) == plain.content and len(raw) < len(plain.content), path
            assert "max-age=31536000" in zipped.headers["cache-control"], path
        # a callback's answer too (the API's are left as they are)
        with http.stream("GET", "/_dash-layout", headers={"Accept-Encoding": "gzip",
                                                          "Referer": f"{srv.url}/run?run={ids[0]}"}) as layout:
            assert layout.headers["content-encoding"] == "gzip"
        assert "content-encoding" not in http.get("/api/runs").headers


@pytest.mark.slow
@pytest.mark.browser
def test_a_first_open_gets_the_layout_once_while_scripts_load_and_calls_back_nothing_first(served):
    from browser_util import browser_context, watched_page
    from conftest import require_browser

    srv, ids = served
    with browser_context(require_browser()) as ctx, watched_page(ctx) as page:
        asked = []
        page.on("request", lambda r: asked.append((r.url.split("?")[0].rsplit("/", 1)[-1], r.post_data or ""))
                if "/_dash-" in r.url else None)
        page.goto(f"{srv.url}/run?run={ids[1]}")
        page.wait_for_function("""(last) => { const gd = document.querySelector('#run-entropy .js-plotly-plot');
            return gd && gd._fullData && gd._fullData.some(t => t.x && Math.max(...t.x) === last); }""",
                               arg=STEPS - 1, timeout=60_000)
        # the index preloads the layout: the renderer's own fetch takes that answer
        assert [name for name, _ in asked].count("_dash-layout") == 1
        assert page.evaluate("""performance.getEntriesByType('resource')
            .filter(e => e.name.endsWith('/_dash-layout')).map(e => e.initiatorType)""") == ["link"]
        # neither Dash's page router nor the page's full draw ran: only the live tick may have
        bodies = [body for name, body in asked if name == "_dash-update-component"]
        assert not [b for b in bodies if "_pages_content" in b or "run-charts.style" in b], bodies
        assert page.errors == []
