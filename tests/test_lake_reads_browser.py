"""Tiered reads in a real headless Chromium against a real `forksight serve --lake-catalog` (collector
box-a): the runs page lists its own run and the runs collector box-b wrote to the same lake (SQLite
catalog); the run, tokens, alerts and compare pages of box-b's run (only in the lake) draw what box-b's
own file holds. Screenshot lake-runs.png goes to $FORKSIGHT_SCREENSHOTS (docs/screenshots) or tmp."""
from __future__ import annotations


import httpx
import pytest

pytest.importorskip("pyiceberg", reason="the lake needs the `lake` extra: pip install -e '.[lake]'")
pytest.importorskip("playwright")
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402
from lake_util import batch, create_run, post, wait_drained  # noqa: E402
from test_lake_reads import add_alerts, write_run  # noqa: E402

from forksight.monitor.collector.store import Store  # noqa: E402
from forksight.monitor.lake.catalog import open_catalog  # noqa: E402
from forksight.monitor.lake.service import start_lake  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]
THEIRS = "b@box-b"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium = require_browser()
    tmp = tmp_path_factory.mktemp("lake-browser")
    uri, wh = f"sqlite:///{tmp}/catalog.db", str(tmp / "wh")
    b = Store(str(tmp / "b.duckdb"))
    lake_b = start_lake(b, open_catalog(uri, wh), uri=uri, warehouse=wh, collector_id="box-b", commit_seconds=0.2)
    write_run(b, "b", 60)
    add_alerts(b, "b", [21, 40])
    lake_b.stop()
    args = ("--lake-catalog", uri, "--lake-warehouse", wh, "--collector-id", "box-a", "--lake-commit-seconds", "0.3")
    try:
        with ServeProcess(tmp / "a.duckdb", dashboard=True, args=args) as srv:
            run = create_run(srv.url, "a")
            for step in range(30):
                post(srv.url, run, batch(step, tokens=20, tag="a"))
            wait_drained(srv.url)
            yield srv, chromium, b
    finally:
        b.close()


def test_runs_page_lists_the_runs_of_both_collectors(served, page, tmp_path):
    srv = served[0]
    page.goto(srv.url + "/")
    page.wait_for_function("t => document.querySelector('#runs-table') && "
                           "document.querySelector('#runs-table').innerText.includes(t)", arg=THEIRS, timeout=30_000)
    names = page.eval_on_selector_all("#runs-table td[data-dash-column=name]", "els => els.map(e => e.innerText)")
    assert sorted(n.strip() for n in names) == ["a", THEIRS]
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(shots_dir(tmp_path) / "lake-runs.png"))
    assert page.errors == []


def test_every_page_of_a_lake_only_run_draws_its_rows(served, page):
    srv, _, b = served
    for path, ready in ((f"/run?run={THEIRS}", "#run-entropy .main-svg"),
                        (f"/tokens?run={THEIRS}&step=40&sample=1", "#tok-main .tok"),
                        (f"/compare?runs=a,{THEIRS}", "#cmp-figure .main-svg"),
                        (f"/alerts?run={THEIRS}", ".alerts-table tbody tr")):
        page.goto(srv.url + path)
        page.wait_for_selector(ready, timeout=30_000)
        page.wait_for_load_state("networkidle")
        assert page.errors == [], f"{path}: {page.errors}"
    # the tokens page drew box-b's step 40, sample 1, token by token as box-b's own file holds it
    page.goto(srv.url + f"/tokens?run={THEIRS}&step=40&sample=1")
    page.wait_for_function("() => { const el = document.querySelector('#tok-step-label');"
                           " return el !== null && el.innerText === 'step 40'; }", timeout=30_000)
    page.wait_for_selector("#tok-main .tok")
    own = b.reader.read_tokens("b", 40, sample_id=1)
    assert [s.inner_text() for s in page.query_selector_all("#tok-main .tok")] == list(own["token"])
    # the run page's entropy chart holds box-b's stored points
    page.goto(srv.url + f"/run?run={THEIRS}")
    page.wait_for_selector("#run-entropy .main-svg", timeout=30_000)
    want = b.reader.read_scalars("b", ["entropy/mean"])
    page.wait_for_function("""n => { const gd = document.querySelector('#run-entropy .js-plotly-plot');
        const t = gd && gd.data.find(t => t.meta && t.meta.key === 'entropy/mean' && t.meta.role === 'raw');
        return t && t.x.length === n; }""", arg=len(want), timeout=20_000)
    got = page.evaluate("""() => { const gd = document.querySelector('#run-entropy .js-plotly-plot');
        const t = gd.data.find(t => t.meta && t.meta.key === 'entropy/mean' && t.meta.role === 'raw');
        return {x: Array.from(t.x), y: Array.from(t.y)}; }""")
    assert got["x"] == list(want["step"]) and got["y"] == pytest.approx(list(want["value"]), rel=1e-5)   # figures carry 6 digits
    # the alerts page lists box-b's two alerts under the shown id
    page.goto(srv.url + f"/alerts?run={THEIRS}")
    page.wait_for_function("() => document.querySelectorAll('.alerts-table tbody tr').length === 2",
                           timeout=20_000)
    assert page.errors == []


def test_the_read_routes_serve_a_lake_only_run_as_its_own_collector_stores_it(served):
    srv, _, b = served
    assert {r["run_id"] for r in httpx.get(srv.url + "/api/runs").json()} == {"a", THEIRS}
    got = httpx.get(f"{srv.url}/api/runs/{THEIRS}/scalars", params={"keys": "reward/mean"}).json()
    assert [(r["step"], r["value"]) for r in got] == [(s, s * 0.25) for s in range(60)]    # as sent
    # one step's token rows paged by the keyset cursor (7 a page) equal box-b's rows, in order
    rows, cursor = [], None
    while True:
        r = httpx.get(f"{srv.url}/api/runs/{THEIRS}/tokens", params={"step": 40, "limit": 7,
                                                                    **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200 and r.headers["X-Total-Count"] == "30", r.text
        rows += r.json()
        cursor = r.headers.get("X-Next-Cursor")
        if cursor is None:
            break
    own = b.reader.read_tokens("b", 40)
    assert [(t["sample_id"], t["pos"], t["token"], t["logp"]) for t in rows] == \
        list(zip(own["sample_id"], own["pos"], own["token"], own["logp"].astype(float)))
    assert httpx.get(f"{srv.url}/api/runs/zz@box-b/scalars").status_code == 404
