"""The dashboard in a real headless Chromium against a real `forksight serve` on a DuckDB file
seeded through the store's write API: pages load cleanly, charts hold the stored points, a
step ingested over HTTP shows within 2 s, token spans and fork marks match the data, and
model text with script/img payloads is shown as text, never run.

Screenshots go to $FORKSIGHT_SCREENSHOTS (docs/screenshots for the README) or the test's
tmp dir.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("playwright")
from collector_util import ServeProcess  # noqa: E402
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from conftest import require_browser  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUN, OTHER = "grpo-collapse", "fork-20pct"
COLLAPSED, LIVE = "collapsed-at-end", "tokens-live"   # issue 16: fixed colours, live slider
HEALTHY_STEPS, COLLAPSED_H = 6, 5e-5                  # then one step at ~5e-5 nats per token
STEPS, OF_TOTAL = 80, 400             # mid-collapse: the forecast lies ahead of the curve
XSS_STEP = STEPS                      # one extra step whose model text is hostile
PAYLOADS = ('<script>window.__xss=1</script>', '<img src=x onerror="window.__xss=1">')


def _xss_records():
    from forksight.base.records import Records, samples_table, tokens_table

    samples = [{"step": XSS_STEP, "sample_id": i, "group_id": 0, "prompt": f"say {PAYLOADS[1]}",
                "completion": f"{PAYLOADS[i % 2]} done", "reward": float(i % 2),
                "correct": bool(i % 2), "length": 3, "source": "test"} for i in range(4)]
    toks = [PAYLOADS[0], " and ", PAYLOADS[1], "7"]
    tokens = {"sample_id": [0] * 4, "pos": list(range(4)), "token": toks,
              "token_id": [1, 2, 3, 4], "entropy": [1.2, 0.01, 0.9, 0.3],
              "renyi2": [0.9, 0.01, 0.6, 0.2], "js": [0.1, 0.0, 0.05, 0.02],
              "logp": [-1.5, -0.01, -1.0, -0.2], "top1": [0.4, 0.99, 0.5, 0.8],
              "fork": [True, False, True, False], "selected": [True, False, False, False]}
    return Records(samples=samples_table(samples), tokens=tokens_table(tokens, step=XSS_STEP))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A seeded DuckDB file behind `forksight serve` with the dashboard."""
    from forksight.monitor.collector.ingest import Ingest
    from forksight.monitor.collector.store import Store
    from synthetic import seed_run, step_records

    chromium = require_browser()
    db = tmp_path_factory.mktemp("dash") / "runs.duckdb"
    with Store(str(db)) as store:
        seed_run(store, RUN, STEPS, strategy="all", collapse=True, seed=1, steps_total=OF_TOTAL,
                 writer=Ingest(store))            # through the alert hub: the run has alerts
        other = seed_run(store, OTHER, 20, strategy="fork", collapse=False, seed=2)
        store.update_run(other, status="finished")
        store.write(RUN, _xss_records(), batch_id="xss").result()
        # healthy steps, then the state a real --preset collapse run stores at its end
        collapsed = seed_run(store, COLLAPSED, HEALTHY_STEPS, strategy="all", collapse=False,
                             seed=3)
        store.write(collapsed, step_records(np.random.default_rng(3), HEALTHY_STEPS,
                                            HEALTHY_STEPS + 1, token_entropy=COLLAPSED_H)).result()
        seed_run(store, LIVE, 4, strategy="fork", collapse=False, seed=4)
    with ServeProcess(db, dashboard=True) as srv:
        yield srv, chromium


def graph_trace(page, graph_id: str, key: str, role: str = "raw") -> dict:
    """The plotted trace of one scalar, read from the live Plotly graph in the page."""
    return page.evaluate("""([id, key, role]) => {
        const gd = document.querySelector('#' + id + ' .js-plotly-plot');
        const t = gd.data.find(t => t.meta && t.meta.key === key && t.meta.role === role);
        return t ? {x: Array.from(t.x), y: Array.from(t.y)} : null; }""", [graph_id, key, role])


def wait_graph(page, graph_id: str, timeout: float = 20_000) -> None:
    page.wait_for_function("""id => { const gd = document.querySelector('#' + id +
        ' .js-plotly-plot'); return gd && gd.data && gd.data.length > 0; }""", arg=graph_id,
                           timeout=timeout)


def wait_step(page, step: int) -> None:
    """Until the tokens page shows the given step."""
    page.wait_for_function("""s => { const el = document.querySelector('#tok-step-label');
        return el !== null && el.innerText === 'step ' + s; }""", arg=step, timeout=20_000)


def api_scalars(srv, key: str) -> list[dict]:
    import httpx

    return httpx.get(f"{srv.url}/api/runs/{RUN}/scalars",
                     params={"keys": key, "downsample": 100_000}).json()


# ---------------------------------------------------------------- pages
def test_every_page_loads_without_console_errors(served, page):
    srv, _ = served
    for path, ready in (("/", "#runs-table td"), (f"/run?run={RUN}", "#run-entropy .main-svg"),
                        (f"/tokens?run={RUN}", "#tok-main .tok"),
                        (f"/compare?runs={RUN},{OTHER}", "#cmp-figure .main-svg")):
        page.goto(srv.url + path)
        page.wait_for_selector(ready, timeout=20_000)
        page.wait_for_load_state("networkidle")
        assert page.errors == [], f"{path}: {page.errors}"
    page.goto(srv.url + "/")
    page.wait_for_selector("#runs-table td")
    table = page.inner_text("#runs-table")
    assert RUN in table and OTHER in table and "finished" in table


def test_runs_page_lists_runs_and_opens_one(served, page, tmp_path):
    srv, _ = served
    page.goto(srv.url + "/")
    page.wait_for_selector("#runs-table td")
    rows = page.inner_text("#runs-table")
    assert "critical" in rows or "warning" in rows          # the collapse run's alerts
    page.screenshot(path=str(shots_dir(tmp_path) / "runs.png"))
    page.click(f"#runs-table td[data-dash-column=name] >> text={RUN}")
    page.wait_for_url(f"**/run?run={RUN}", timeout=10_000)
    wait_graph(page, "run-entropy")


def test_run_page_charts_hold_the_stored_points(served, page, tmp_path):
    srv, _ = served
    page.goto(f"{srv.url}/run?run={RUN}")
    wait_graph(page, "run-entropy")
    stored = api_scalars(srv, "entropy/mean")
    plotted = graph_trace(page, "run-entropy", "entropy/mean")
    assert plotted["x"] == [r["step"] for r in stored]
    assert np.allclose(plotted["y"], [r["value"] for r in stored])
    wait_graph(page, "run-passk")
    p1 = graph_trace(page, "run-passk", "pass@1")
    assert np.allclose(p1["y"], [r["value"] for r in api_scalars(srv, "pass@1")])
    import httpx

    alerts = httpx.get(f"{srv.url}/api/alerts", params={"run_id": RUN}).json()
    for graph in ("run-passk", "run-signals"):
        wait_graph(page, graph)
    # every alert is a marker on the chart of its signal (collapse: entropy, covariance: signals)
    marked = page.evaluate("""() => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .flatMap(gd => gd.data.filter(t => t.meta && t.meta.role === 'alerts'))
        .flatMap(t => Array.from(t.x))""")
    assert alerts and sorted(marked) == sorted(a["step"] for a in alerts)
    page.wait_for_selector("#run-banner .alert")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)                         # let plotly finish its last paint
    page.screenshot(path=str(shots_dir(tmp_path) / "run.png"), full_page=True)


def test_collapse_alert_shows_its_threshold_and_forecast_on_the_entropy_chart(served, page):
    import httpx

    srv, _ = served
    alerts = httpx.get(f"{srv.url}/api/alerts", params={"run_id": RUN}).json()
    [collapse] = [a for a in alerts if a["detector"] == "entropy_collapse"][-1:]
    page.goto(f"{srv.url}/run?run={RUN}")
    wait_graph(page, "run-entropy")
    shapes = page.evaluate("""() => document.querySelector('#run-entropy .js-plotly-plot')
        ._fullLayout.shapes.map(s => ({x0: s.x0, x1: s.x1, y0: s.y0, y1: s.y1,
                                       xref: s.xref, yref: s.yref, dash: s.line.dash}))""")
    threshold = [s for s in shapes if s["yref"] == "y" and s["y0"] == s["y1"] and
                 s["dash"] == "dash" and s["y0"] == pytest.approx(collapse["threshold"])]
    assert threshold, shapes
    assert any(s["x0"] == s["x1"] == collapse["forecast"] for s in shapes)
    labels = page.evaluate("document.querySelector('#run-entropy').textContent")
    assert f"entropy_collapse {collapse['severity']}: threshold" in labels


def test_step_ingested_while_open_is_appended_live(served, page):
    import httpx

    srv, _ = served
    page.goto(f"{srv.url}/run?run={RUN}")
    wait_graph(page, "run-entropy")
    page.evaluate("window.__same_page = 1")
    before = graph_trace(page, "run-entropy", "entropy/mean")
    step, value = max(before["x"]) + 1, 0.123456
    batch = {"batch_id": "live-1", "scalars": [
        {"step": step, "key": "entropy/mean", "value": value},
        {"step": step, "key": "pass@1", "value": 0.5}]}
    response = httpx.post(f"{srv.url}/api/runs/{RUN}/ingest", json=batch)
    assert response.status_code == 200, response.text
    # the page's one-second tick appends it (an event-based wait; bench/dashboard.py measures the latency)
    page.wait_for_function("""([step]) => {
        const gd = document.querySelector('#run-entropy .js-plotly-plot');
        const t = gd.data.find(t => t.meta && t.meta.key === 'entropy/mean'
                                    && t.meta.role === 'raw');
        return Array.from(t.x).includes(step); }""", arg=[step], timeout=30_000, polling=50)
    after = graph_trace(page, "run-entropy", "entropy/mean")
    assert after["x"][-1] == step and after["y"][-1] == pytest.approx(value)
    assert after["x"][:-1] == before["x"]               # appended, not replaced
    assert page.evaluate("window.__same_page") == 1     # no reload
    # paused: a new step stays out until the user resumes
    page.click("#run-pause")
    page.wait_for_function("document.querySelector('#run-pause').innerText.includes('Resume')")
    batch = {"batch_id": "live-2", "scalars": [
        {"step": step + 1, "key": "entropy/mean", "value": 0.2}]}
    assert httpx.post(f"{srv.url}/api/runs/{RUN}/ingest", json=batch).status_code == 200
    time.sleep(2.0)
    assert step + 1 not in graph_trace(page, "run-entropy", "entropy/mean")["x"]
    page.click("#run-pause")
    page.wait_for_function("""([step]) => {
        const gd = document.querySelector('#run-entropy .js-plotly-plot');
        const t = gd.data.find(t => t.meta && t.meta.key === 'entropy/mean'
                                    && t.meta.role === 'raw');
        return Array.from(t.x).includes(step); }""", arg=[step + 1], timeout=5_000)


def test_tokens_view_shows_one_span_per_token_with_fork_marks(served, page, tmp_path):
    import httpx

    srv, _ = served
    steps = httpx.get(f"{srv.url}/api/runs/{RUN}/token_steps").json()
    step = steps[len(steps) // 3]
    rows = httpx.get(f"{srv.url}/api/runs/{RUN}/tokens",
                     params={"step": step, "sample_id": 0}).json()
    page.goto(f"{srv.url}/tokens?run={RUN}&step={step}&sample=0")
    wait_step(page, step)
    page.wait_for_selector("#tok-main .tok")
    spans = page.query_selector_all("#tok-main .tok")
    assert len(spans) == len(rows)
    assert [s.inner_text() for s in spans] == [r["token"] for r in rows]
    assert len(page.query_selector_all("#tok-main .tok.fork")) == sum(r["fork"] for r in rows)
    assert len(page.query_selector_all("#tok-main .tok.sel")) == sum(r["selected"] for r in rows)
    title = spans[0].get_attribute("title")
    assert f"{rows[0]['entropy']:.4f}" in title and f"{rows[0]['logp']:.4f}" in title
    page.wait_for_selector("#tok-history .main-svg")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.screenshot(path=str(shots_dir(tmp_path) / "tokens.png"), full_page=True)
    assert page.errors == []


def test_xss_payload_in_model_text_is_shown_not_run(served, page):
    srv, _ = served
    page.goto(f"{srv.url}/tokens?run={RUN}&step={XSS_STEP}&sample=0")
    wait_step(page, XSS_STEP)
    page.wait_for_selector("#tok-group .rollout")
    page.wait_for_load_state("networkidle")
    time.sleep(0.3)
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.evaluate("document.querySelectorAll('img[src=\"x\"]').length") == 0
    assert page.evaluate("document.querySelectorAll('#tok-main script, #tok-group script,"
                         " .prompt script').length") == 0
    main = [s.inner_text() for s in page.query_selector_all("#tok-main .tok")]
    assert main == [PAYLOADS[0], " and ", PAYLOADS[1], "7"]
    assert len(page.query_selector_all("#tok-main .tok.fork")) == 2
    text = page.inner_text("body")
    assert PAYLOADS[0] in text and PAYLOADS[1] in text     # the prompt and other rollouts too


# ---------------------------------------------------------------- tokens: issue 16
def span_alphas(page) -> list[float]:
    """The background opacity of every token span of the main completion, as Chromium paints it."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#tok-main .tok'), el => {
        const m = getComputedStyle(el).backgroundColor.match(/rgba?\\(([^)]*)\\)/);
        const parts = m ? m[1].split(',').map(Number) : [];
        return parts.length === 4 ? parts[3] : (parts.length === 3 ? 1 : 0); })""")


def test_collapsed_step_is_pale_and_healthy_step_strong_on_one_scale(served, page, tmp_path):
    import httpx

    srv, _ = served
    shots = shots_dir(tmp_path)
    legends = {}
    for step, name in ((0, "tokens-healthy.png"), (HEALTHY_STEPS, "tokens-collapsed.png")):
        page.goto(f"{srv.url}/tokens?run={COLLAPSED}&step={step}&sample=0")
        wait_step(page, step)
        page.wait_for_selector("#tok-main .tok")
        rows = httpx.get(f"{srv.url}/api/runs/{COLLAPSED}/tokens",
                         params={"step": step, "sample_id": 0}).json()
        alphas = span_alphas(page)
        assert len(alphas) == len(rows)
        legends[step] = page.inner_text("#tok-legend")
        top = float(page.get_attribute("#tok-scale", "data-top"))
        # every span's opacity is its entropy on the run's one scale (0.85 at the top)
        want = [0.85 * min(r["entropy"] / top, 1.0) for r in rows]
        assert np.allclose(alphas, want, atol=0.01)
        if step == 0:
            assert max(alphas) >= 0.6 and np.mean(alphas) >= 0.15, alphas   # strongly coloured
        else:
            assert all(r["entropy"] < 1e-3 for r in rows)
            assert max(alphas) < 0.01, alphas                                  # near-transparent
        page.wait_for_selector("#tok-history .main-svg")
        page.wait_for_load_state("networkidle")
        time.sleep(0.5)
        page.screenshot(path=str(shots / name), full_page=True)
    # the same stated scale at both steps: its numbers and the fork threshold are on the legend
    assert legends[0] == legends[HEALTHY_STEPS]
    assert "0.672" in legends[0] and "fork" in legends[0]
    assert page.errors == []


def _step_json(step: int, batch_id: str) -> dict:
    """A synthetic step as the JSON ingest body a producer sends over HTTP."""
    from synthetic import step_records

    rec = step_records(np.random.default_rng(step), step, step + 10, collapse=False)
    # a JSON producer leaves out the columns it has no values for (here: env)
    tokens = {k: v for k, v in rec.tokens.to_pydict().items()
              if k not in ("rank", "step") and any(x is not None for x in v)}
    samples = [{k: v for k, v in r.items() if k != "rank"} for r in rec.samples.to_pylist()]
    scalars = [{k: r[k] for k in ("step", "key", "value")} for r in rec.scalars.to_pylist()]
    return {"batch_id": batch_id, "scalars": scalars, "samples": samples,
            "tokens": [{"step": step, **tokens}]}


def slider_max(page) -> int:
    return int(page.get_attribute("#tok-step [role=slider]", "aria-valuemax"))


def test_step_slider_follows_new_steps_live_keeping_the_users_pick(served, page):
    import httpx

    srv, _ = served
    page.goto(f"{srv.url}/tokens?run={LIVE}&sample=5")          # newest step, sample #5
    wait_step(page, 3)
    page.wait_for_selector("#tok-main .tok")
    page.evaluate("window.__same_page = 1")
    assert slider_max(page) == 3
    response = httpx.post(f"{srv.url}/api/runs/{LIVE}/ingest", json=_step_json(4, "live-tok-4"))
    assert response.status_code == 200, response.text
    wait = """s => { const el = document.querySelector('#tok-step-label');
        return el !== null && el.innerText === 'step ' + s; }"""
    page.wait_for_function(wait, arg=4, timeout=30_000, polling=50)     # the live tick moves it
    assert slider_max(page) == 4 and page.evaluate("window.__same_page") == 1
    rows = httpx.get(f"{srv.url}/api/runs/{LIVE}/tokens", params={"step": 4, "sample_id": 5}).json()
    assert [s.inner_text() for s in page.query_selector_all("#tok-main .tok")] == \
        [r["token"] for r in rows]                              # still sample #5, of step 4
    assert page.inner_text("#tok-main-wrap .rollout-head").startswith("#5 ")
    # a user who went back to an earlier step stays there while the run moves on
    page.goto(f"{srv.url}/tokens?run={LIVE}&step=1&sample=5")
    wait_step(page, 1)
    page.wait_for_selector("#tok-main .tok")
    assert page.inner_text("#tok-main-wrap .rollout-head").startswith("#5 ")
    response = httpx.post(f"{srv.url}/api/runs/{LIVE}/ingest", json=_step_json(5, "live-tok-5"))
    assert response.status_code == 200, response.text
    page.wait_for_function("() => document.querySelector('#tok-step [role=slider]')"
                           ".getAttribute('aria-valuemax') === '5'", timeout=5_000, polling=50)
    time.sleep(0.3)
    assert page.inner_text("#tok-step-label") == "step 1"
    assert page.inner_text("#tok-main-wrap .rollout-head").startswith("#5 ")
    assert page.errors == []
