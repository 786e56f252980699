"""Issue 22 in a real headless Chromium against a real `forksight serve`: the alerts view (every
alert, filters, links to a step), health chips on the runs table, run page and compare page,
the run page's full alert list, and the legibility defects (threshold labels apart, heatmap
ticks up to the data, log ticks, pass@k colours, unknown run, warm-up). Its screenshots are
named browser-*.png: the README's come from a fresh demo (docs/screenshots.py)."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright")
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402
from browser_util import browser_context, watched_page  # noqa: E402
from test_browser import shots_dir, wait_graph  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]
RUN, HEALTHY, WARMING = "grpo-collapse", "fork-healthy", "warming-up"
STEPS = 100


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A collapsing run judged by the alert hub (warnings, a forecast, criticals), a healthy
    run and a run with no step yet, behind `forksight serve` with the dashboard."""
    from forksight.dashboard.alerts_view import read_verdicts
    from forksight.monitor.collector.ingest import Ingest
    from forksight.monitor.collector.store import Store
    from synthetic import seed_run

    chromium = require_browser()
    db = tmp_path_factory.mktemp("alerts") / "runs.duckdb"
    with Store(str(db)) as store:
        seed_run(store, RUN, STEPS, strategy="all", collapse=True, seed=1, writer=Ingest(store))
        seed_run(store, HEALTHY, 30, strategy="fork", collapse=False, seed=2)
        store.create_run(WARMING, strategy="ict")
        alerts = store.reader.read_alerts(RUN)
        verdicts = read_verdicts(store.reader)
    assert {"warning", "critical"} <= set(alerts["severity"])     # the fixture has both
    with ServeProcess(db, dashboard=True) as srv:
        yield srv, chromium, alerts, verdicts


@pytest.fixture(scope="module")
def context(served):
    with browser_context(served[1]) as ctx:
        yield ctx


@pytest.fixture()
def page(context):
    with watched_page(context) as pg:
        yield pg
        assert pg.errors == []


def table_rows(page) -> list[dict]:
    return page.evaluate("""() => Array.from(document.querySelectorAll(
        '.alerts-table tbody tr')).map(tr => { const td = tr.querySelectorAll('td');
        return {run: td[1].innerText, step: +td[3].innerText, severity: td[4].innerText,
                detector: td[5].innerText}; })""")


def wait_rows(page, n: int) -> None:
    page.wait_for_function("n => document.querySelectorAll('.alerts-table tbody tr').length "
                           "=== n", arg=n, timeout=20_000)


# ---------------------------------------------------------------- alerts view
def test_alerts_view_lists_every_alert_newest_first_and_filters(served, page, tmp_path):
    srv, _, alerts, _ = served
    page.goto(srv.url + "/alerts")
    wait_rows(page, len(alerts))
    rows = table_rows(page)
    newest = alerts.sort_values(["wall_time", "step"], ascending=False)
    assert [r["step"] for r in rows] == newest["step"].tolist()
    page.screenshot(path=str(shots_dir(tmp_path) / "browser-alerts.png"), full_page=True)
    # untick "warning": only the critical ones stay
    page.click("#alerts-severity input[value=warning]")
    critical = alerts[alerts["severity"] == "critical"]
    wait_rows(page, len(critical))
    assert {r["severity"] for r in table_rows(page)} == {"critical"}
    # the URL's filters: one run and one detector
    page.goto(srv.url + f"/alerts?run={RUN}&detector=entropy_collapse")
    collapse = alerts[alerts["detector"] == "entropy_collapse"]
    wait_rows(page, len(collapse))
    assert {r["detector"] for r in table_rows(page)} == {"entropy_collapse"}


def test_an_alerts_step_link_opens_the_run_and_the_tokens_page_at_that_step(served, page):
    srv, _, alerts, _ = served
    first = alerts.sort_values("step").iloc[0]
    step = int(first["step"])
    page.goto(srv.url + f"/alerts?run={RUN}")
    wait_rows(page, len(alerts))
    page.click(f".alerts-table a.alert-step:text-is('{step}')")
    page.wait_for_url(re.compile(rf"/run\?run={RUN}&step={step}$"))
    wait_graph(page, "run-entropy")
    focus = page.evaluate("""() => document.querySelector('#run-entropy .js-plotly-plot')
        .layout.shapes.filter(s => s.name === 'focus').map(s => s.x0)""")
    assert focus == [step]
    page.goto(srv.url + f"/alerts?run={RUN}")
    wait_rows(page, len(alerts))
    page.locator(".alerts-table a.alert-tokens-link").last.click()   # the oldest alert's row
    page.wait_for_url(re.compile(rf"/tokens\?run={RUN}&step={step}$"))
    page.wait_for_function("s => { const el = document.querySelector('#tok-step-label'); "
                           "return el !== null && el.innerText === 'step ' + s; }", arg=step,
                           timeout=20_000)


# ---------------------------------------------------------------- health chips and links
def test_runs_table_shows_health_and_its_alert_count_opens_the_alerts_view(served, page, tmp_path):
    srv, _, alerts, verdicts = served
    page.goto(srv.url + "/")
    page.wait_for_selector("#runs-table td")
    health = page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll(
        '#runs-table tr')).filter(tr => tr.querySelector('td[data-dash-column=name]')).map(tr =>
        [tr.querySelector('td[data-dash-column=name]').innerText,
         tr.querySelector('td[data-dash-column=health]').innerText]))""")
    assert health == {RUN: verdicts[RUN].label, HEALTHY: "healthy", WARMING: "waiting"}
    assert verdicts[RUN].state == "collapsed"
    page.screenshot(path=str(shots_dir(tmp_path) / "browser-runs.png"))
    crit, warn = (int((alerts["severity"] == s).sum()) for s in ("critical", "warning"))
    link = page.locator("#runs-table td[data-dash-column=alerts] a")
    assert link.inner_text() == f"{crit} critical · {warn} warning"
    link.click()
    page.wait_for_url(re.compile(rf"/alerts\?run={RUN}$"))
    wait_rows(page, len(alerts))


def test_run_page_lists_every_alert_with_the_first_forecast_pinned(served, page):
    srv, _, alerts, verdicts = served
    page.goto(srv.url + f"/run?run={RUN}")
    page.wait_for_selector("#run-banner .alert")
    assert page.inner_text("#run-verdict") == verdicts[RUN].label
    forecasts = alerts[alerts["forecast"].notna()].sort_values("step")
    head = page.inner_text("#run-banner .alert >> nth=0")
    assert head.startswith("FIRST FORECAST") and f"step {int(forecasts['step'].iloc[0])}" in head
    cards = page.locator("#run-banner .alert")
    assert cards.count() == len(alerts)         # every one, the older behind "show all N"
    assert page.inner_text("#run-banner summary").startswith(f"show all {len(alerts)} alerts")
    text = page.inner_text("#run-banner")
    assert text.count("Fix:") == 4 and "Recommendation" not in text   # one fix per shown card


def test_compare_page_names_each_runs_health_and_fades_the_collapsed_one(served, page, tmp_path):
    srv, _, _, verdicts = served
    page.goto(srv.url + f"/compare?runs={RUN},{HEALTHY}")
    wait_graph(page, "cmp-figure")
    page.wait_for_selector("#cmp-verdicts .chip")
    chips = page.locator("#cmp-verdicts .chip").all_inner_texts()
    assert chips == [verdicts[RUN].label, "healthy"]
    traces = page.evaluate("""() => document.querySelector('#cmp-figure .js-plotly-plot').data
        .filter(t => t.meta && t.meta.role === 'compare' && t.showlegend)
        .map(t => [t.name, t.opacity])""")
    assert traces == [[f"{HEALTHY} (fork) · healthy", 1],
                      [f"{RUN} (all) · {verdicts[RUN].label}", 0.45]]
    page.screenshot(path=str(shots_dir(tmp_path) / "browser-compare.png"), full_page=True)


# ---------------------------------------------------------------- legibility in the browser
def svg_texts(page, selector: str) -> list[str]:
    """What SVG text elements print (they have no innerText)."""
    return page.evaluate("s => Array.from(document.querySelectorAll(s)).map(e => e.textContent)",
                         selector)


def _boxes(page, graph_id: str) -> list[dict]:
    return page.evaluate("""id => Array.from(document.querySelectorAll(
        '#' + id + ' .annotation-text')).filter(e => /threshold/.test(e.textContent))
        .map(e => { const r = e.getBoundingClientRect();
                    return {t: e.textContent, l: r.left, r: r.right, y0: r.top, y1: r.bottom}; })""",
                         graph_id)


def test_threshold_labels_do_not_overlap_and_ticks_are_readable(served, page):
    srv = served[0]
    page.goto(srv.url + f"/run?run={RUN}")
    wait_graph(page, "run-signals")
    page.wait_for_timeout(500)
    for graph in ("run-entropy", "run-signals"):
        boxes = _boxes(page, graph)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                apart = a["r"] <= b["l"] or b["r"] <= a["l"] or a["y1"] <= b["y0"] or \
                    b["y1"] <= a["y0"]
                assert apart, (a, b)
    ticks = svg_texts(page, "#run-heatmap .ytick text")
    assert {"1", "2", "3", "4"} <= set(ticks) and "–" in ticks[-1]   # the top bin by its range
    colours = dict(page.evaluate("""() => document.querySelector('#run-passk .js-plotly-plot')
        .data.filter(t => t.meta && /^pass@/.test(t.meta.key))
        .map(t => [t.meta.key, t.line.color])"""))
    assert len(colours) >= 2 and len(set(colours.values())) == len(colours)   # one hue per k
    # the reward chart's legend (reward, pass@1…pass@G, gap, alerts: two rows) stays below its title
    title, legend = (page.evaluate("""s => { const r = document.querySelector(s)
        .getBoundingClientRect(); return [r.top, r.bottom]; }""", f"#run-passk {part}")
        for part in (".gtitle", ".legend"))
    assert title[1] <= legend[0] + 1, (title, legend)
    page.click("#run-logy input")
    page.wait_for_function("""() => document.querySelector('#run-entropy .js-plotly-plot')
        .layout.yaxis.type === 'log'""", timeout=20_000)
    page.wait_for_timeout(500)
    labels = svg_texts(page, "#run-entropy .ytick text, #run-signals .ytick text")
    assert labels and not [t for t in labels if re.search(r"[nµm]$|\.\d{4,}", t)], labels


def test_unknown_run_and_warm_up_say_so_instead_of_empty_axes(served, page):
    srv = served[0]
    page.goto(srv.url + "/run?run=nope")
    page.wait_for_selector("#run-missing")
    assert "no run named 'nope'" in page.inner_text("#run-missing")
    assert not page.locator("#run-charts").is_visible()
    page.goto(srv.url + f"/run?run={WARMING}")
    page.wait_for_selector("#run-verdict")
    assert page.inner_text("#run-verdict") == "waiting"
    assert "waiting for the first step" in page.inner_text("#run-status")
    page.wait_for_function("""() => Array.from(document.querySelectorAll(
        '#run-entropy .annotation-text')).some(e => /waiting for the first step/.test(
        e.textContent))""", timeout=20_000)
    page.goto(srv.url + "/tokens?run=nope")
    page.wait_for_selector("#tok-missing")
    assert "no run named 'nope'" in page.inner_text("#tok-missing")
