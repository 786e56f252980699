"""Value probes in a real headless Chromium against a real `forksight serve`, on a store written by
a real `forksight train --probe-every` run (the healthy preset's warm-started model, so some tokens
do decide the reward): the tokens page's "value Δ" mode paints each probed token by its Δ on the
run's fixed ± scale, marks the pivotal ones and shows V before/after ± SE and the alternatives on
hover; the run page shows the pivotal-tokens panel (only for a probed run) with the stored
probe/* values; the compare page plots a probe/* key.

Screenshots (probes-tokens-delta.png, probes-run-panel.png) go to $FORKSIGHT_SCREENSHOTS or the
test's tmp dir.
"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("playwright")
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PROBED, PLAIN = "probed", "plain"
TRAIN = ["--preset", "healthy", "--strategy", "fork", "--seed", "0"]


def _train(db, run: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "forksight", "train", *TRAIN, "--run", run, "--db", str(db),
                           *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium = require_browser()
    tmp = tmp_path_factory.mktemp("probes-browser")
    db = tmp / "runs.duckdb"
    _train(db, PROBED, "--steps", "8", "--probe-every", "2", "--probe-samples", "4", "--probe-k", "8",
           "--probe-positions", "all", "--probe-budget", "100")
    _train(db, PLAIN, "--steps", "2")
    with ServeProcess(db, dashboard=True) as srv:
        ids = {r["name"]: r["run_id"] for r in api(srv, "")}
        yield srv, chromium, ids


def api(srv, path: str, **params):
    import httpx

    response = httpx.get(f"{srv.url}/api/runs" + (f"/{path}" if path else ""), params=params, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def span_colours(page) -> list[list[float]]:
    return page.evaluate("""() => Array.from(document.querySelectorAll('#tok-main .tok'), el => {
        const m = getComputedStyle(el).backgroundColor.match(/rgba?\\(([^)]*)\\)/);
        const p = m ? m[1].split(',').map(Number) : [0, 0, 0, 0];
        return p.length === 4 ? p : [...p, 1]; })""")


def open_delta_mode(page, srv, run: str, step: int, sample: int, by_url: bool = True) -> None:
    """The tokens page at this step and sample in value Δ mode: asked in the URL (?metric=delta: a
    completion only the probes hold is among the samples from the first draw), or clicked."""
    page.goto(f"{srv.url}/tokens?run={run}&step={step}&sample={sample}" + ("&metric=delta" if by_url else ""))
    page.wait_for_function("""s => { const el = document.querySelector('#tok-step-label');
        return el !== null && el.innerText === 'step ' + s; }""", arg=step, timeout=30_000)
    page.wait_for_selector("#tok-main .tok")
    if not by_url:
        page.click("#tok-metric input[value=delta]")
    page.wait_for_function("() => (document.querySelector('#tok-legend') || {}).innerText"
                           "?.includes('value Δ')", timeout=30_000)


def _most_pivotal(srv, run: str) -> tuple[int, int, list[dict]]:
    """(step, sample, its probe rows) of the probed completion with the most pivotal tokens."""
    best = None
    for step in api(srv, f"{run}/probe_steps"):
        rows = [r for r in api(srv, f"{run}/probes", step=step) if r.get("split") != "eval"]   # held-out: no token rows
        for sample in sorted({r["sample_id"] for r in rows}):
            mine = [r for r in rows if r["sample_id"] == sample]
            score = (sum(r["pivotal"] for r in mine), sum(bool(r["alternatives"] not in (None, "[]")) for r in mine))
            if best is None or score > best[0]:
                best = (score, step, sample, mine)
    return best[1], best[2], best[3]


def test_tokens_value_delta_mode_paints_marks_and_explains_each_probed_token(served, page, tmp_path):
    srv, _, ids = served
    run = ids[PROBED]
    early = [r["delta"] for s in api(srv, f"{run}/probe_steps")[:3] for r in api(srv, f"{run}/probes", step=s)]
    top = max(float(np.quantile(np.abs(early), 0.95)), 0.2)       # the scale by hand
    step, sample, rows = _most_pivotal(srv, run)
    assert any(r["pivotal"] for r in rows), "the trained run has no pivotal token to show"
    open_delta_mode(page, srv, run, step, sample)
    assert float(page.get_attribute("#tok-scale", "data-top")) == pytest.approx(top, rel=1e-5)
    # the completion's stored token rows, else (the trainer stores token rows for some samples
    # and probes others) the probe's full sweep of it, which the page shows in their place
    tokens = api(srv, f"{run}/tokens", step=step, sample_id=sample) or sorted(rows, key=lambda r: r["pos"])
    probed = {r["pos"]: r for r in rows}
    colours = span_colours(page)
    classes = page.evaluate("() => Array.from(document.querySelectorAll('#tok-main .tok'), e => e.className)")
    titles = page.evaluate("() => Array.from(document.querySelectorAll('#tok-main .tok'), e => e.title)")
    assert len(colours) == len(tokens)
    for token, (r, g, b, a), cls, title in zip(tokens, colours, classes, titles):
        probe = probed.get(token["pos"])
        if probe is None:
            assert a == 0 and "nolr" in cls.split() and "value Δ" not in title
            continue
        assert a == pytest.approx(0.85 * min(abs(probe["delta"]) / top, 1.0), abs=0.006), probe
        if a > 0.006:
            assert (r, g, b) == ((43, 138, 62) if probe["delta"] > 0 else (201, 42, 42)), probe
        assert ("pivot" in cls.split()) == bool(probe["pivotal"]), probe
        assert f"value Δ {probe['delta']:+.3f} ± {probe['se']:.3f}" in title
        assert f"V before {probe['v_before']:.2f} ± {probe['se_before']:.2f}" in title
        assert f"V after {probe['v_after']:.2f} ± {probe['se_after']:.2f}" in title
        if probe["alternatives"] not in (None, "[]"):
            assert "alternatives here:" in title
    # model text is text: the shown tokens are the stored strings, no markup made from them
    assert [s.inner_text() for s in page.query_selector_all("#tok-main .tok")] == \
        [t["token"] if t["token"] else "∅" for t in tokens]
    page.wait_for_selector("#tok-history .main-svg")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.screenshot(path=str(shots_dir(tmp_path) / "probes-tokens-delta.png"), full_page=True)
    assert page.errors == []


def test_a_run_without_probes_says_so_in_value_delta_mode(served, page):
    srv, _, ids = served
    open_delta_mode(page, srv, ids[PLAIN], 2, 0, by_url=False)
    assert "no value probes" in page.inner_text("#tok-no-probes")
    assert all(a == 0 for *_, a in span_colours(page))
    assert page.errors == []


def plot(page, graph: str) -> list[dict]:
    return page.evaluate("""id => document.querySelector('#' + id + ' .js-plotly-plot').data
        .map(t => ({meta: t.meta, x: Array.from(t.x || []), y: Array.from(t.y || []), name: t.name}))""", graph)


def test_run_page_shows_the_pivotal_tokens_panel_only_for_a_probed_run(served, page, tmp_path):
    srv, _, ids = served
    run = ids[PROBED]
    page.goto(f"{srv.url}/run?run={run}")
    page.wait_for_selector("#run-probes .main-svg", timeout=30_000)
    assert page.is_visible("#run-probes-wrap")
    drawn = {t["meta"]["key"]: t for t in plot(page, "run-probes") if t["meta"]}
    for key in ("probe/fork_precision", "probe/pivot_fork_share", "probe/recall/fork", "probe/recall/random"):
        stored = api(srv, f"{run}/scalars", keys=key, downsample=100_000)
        assert stored and key in drawn, key
        assert drawn[key]["x"] == [r["step"] for r in stored], key
        assert np.allclose(drawn[key]["y"], [r["value"] for r in stored], rtol=1e-5), key
    assert "Pivotal tokens" in page.inner_text("#run-probes")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.locator("#run-probes-wrap").screenshot(path=str(shots_dir(tmp_path) / "probes-run-panel.png"))
    page.goto(f"{srv.url}/run?run={ids[PLAIN]}")
    page.wait_for_selector("#run-entropy .main-svg", timeout=30_000)
    assert not page.is_visible("#run-probes-wrap")
    assert page.errors == []


def test_compare_page_plots_a_probe_key(served, page):
    srv, _, ids = served
    run = ids[PROBED]
    page.goto(f"{srv.url}/compare?runs={run}")
    page.wait_for_selector("#cmp-figure .main-svg", timeout=30_000)
    page.click("#cmp-panels")
    page.keyboard.type("probe/recall/f")          # the run logs ~100 keys: search the picker
    page.locator("[role=option]", has=page.locator("input[value='probe/recall/fork']")).click()
    page.keyboard.press("Escape")
    page.wait_for_function("""() => document.querySelector('#cmp-figure .js-plotly-plot').data
        .some(t => t.meta && t.meta.key === 'probe/recall/fork')""", timeout=30_000)
    drawn = [t for t in plot(page, "cmp-figure") if t["meta"] and t["meta"].get("key") == "probe/recall/fork"]
    stored = api(srv, f"{run}/scalars", keys="probe/recall/fork", downsample=100_000)
    assert drawn[0]["x"] == [r["step"] for r in stored]
    assert page.errors == []
