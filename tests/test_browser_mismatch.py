"""The training–inference mismatch view in a real headless Chromium against a real `forksight
serve`, fed by a real StepReporter through the real HTTP sink (tests/mismatch_util.py: a perturbed
copy of the policy sampled the tokens): the tokens page's mismatch colour mode paints each token by
its log ratio on the run's fixed ± scale with p_train and p_sampler on hover, model text stays
text, a run without sampler log p says so; the run page shows the mismatch charts and the ratio
histogram only for a run that logs them; the compare page draws a mismatch key.

Screenshots (mismatch-tokens.png, mismatch-run.png) go to $FORKSIGHT_SCREENSHOTS
(docs/screenshots for the README) or the test's tmp dir.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

pytest.importorskip("playwright")
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

RUN, PLAIN, STEPS, SHOWN = "bf16-sampler", "no-sampler", 24, 12


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from forksight.monitor.sinks.http import HttpSink
    from mismatch_util import report_steps

    chromium = require_browser()
    tmp = tmp_path_factory.mktemp("mismatch-browser")
    with ServeProcess(tmp / "runs.duckdb", dashboard=True) as srv:
        for name, with_sampler, steps in ((PLAIN, False, 4), (RUN, True, STEPS)):
            sink = HttpSink(srv.url, name, strategy="all", spool_dir=tmp / f"spool-{name}",
                            flush_interval=0.05)
            report_steps(sink, steps, seed=3, with_sampler=with_sampler)
            assert sink.flush(30.0)
            sink.finish()
        yield srv, chromium


def api(srv, path: str, **params):
    import httpx

    response = httpx.get(f"{srv.url}/api/runs/{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def span_colours(page) -> list[list[float]]:
    """[r, g, b, a] of every token span of the main completion, as Chromium paints it."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#tok-main .tok'), el => {
        const m = getComputedStyle(el).backgroundColor.match(/rgba?\\(([^)]*)\\)/);
        const p = m ? m[1].split(',').map(Number) : [0, 0, 0, 0];
        return p.length === 4 ? p : [...p, 1]; })""")


def open_mismatch_mode(page, srv, run: str, step: int, sample: int) -> None:
    page.goto(f"{srv.url}/tokens?run={run}&step={step}&sample={sample}")
    page.wait_for_function("""s => { const el = document.querySelector('#tok-step-label');
        return el !== null && el.innerText === 'step ' + s; }""", arg=step, timeout=20_000)
    page.wait_for_selector("#tok-main .tok")
    page.click("#tok-metric input[value=mismatch]")
    page.wait_for_function("() => (document.querySelector('#tok-legend') || {}).innerText"
                           "?.includes('mismatch log r')", timeout=20_000)


def test_tokens_mismatch_mode_paints_each_token_by_its_log_ratio(served, page, tmp_path):
    srv, _ = served
    # the scale by hand: ± the 95% quantile of |log r| over the run's first three token steps
    early = [r for s in api(srv, f"{RUN}/token_steps")[:3] for r in api(srv, f"{RUN}/tokens", step=s)]
    lr = np.abs([r["logp"] - r["sampler_logp"] for r in early if r["sampler_logp"] is not None])
    top = min(max(float(np.quantile(lr, 0.95)), math.log(2)), 4.0)
    open_mismatch_mode(page, srv, RUN, SHOWN, 0)
    assert float(page.get_attribute("#tok-scale", "data-top")) == pytest.approx(top, rel=1e-5)
    rows = api(srv, f"{RUN}/tokens", step=SHOWN, sample_id=0)
    colours = span_colours(page)
    assert len(colours) == len(rows)
    for row, (r, g, b, a) in zip(rows, colours):
        log_r = row["logp"] - row["sampler_logp"]
        want = (178, 24, 43) if log_r >= 0 else (33, 102, 172)
        assert a == pytest.approx(0.85 * min(abs(log_r) / top, 1.0), abs=0.006), row
        if a > 0.006:
            assert (r, g, b) == want, row
    # the hover: both probabilities and their ratio
    title = page.get_attribute("#tok-main .tok >> nth=1", "title")
    row = rows[1]
    assert f"p_train {math.exp(row['logp']):.4f}" in title
    assert f"p_sampler {math.exp(row['sampler_logp']):.4f}" in title
    assert f"ratio p_train/p_sampler {math.exp(row['logp'] - row['sampler_logp']):.4g}" in title
    # model text is text: the markup token shows as written, no element made from it
    assert page.evaluate("document.querySelectorAll('#tok-main b, #tok-group b').length") == 0
    markup = [r for r in rows if r["token"] == " <b>x</b>"]
    shown = [s.inner_text() for s in page.query_selector_all("#tok-main .tok")]
    assert shown == [r["token"] for r in rows] and (not markup or " <b>x</b>" in shown)
    page.wait_for_selector("#tok-history .main-svg")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.screenshot(path=str(shots_dir(tmp_path) / "mismatch-tokens.png"), full_page=True)
    assert page.errors == []


def test_tokens_without_sampler_log_p_stay_uncoloured_and_the_legend_says_why(served, page):
    from mismatch_util import UNKNOWN_SAMPLE

    srv, _ = served
    open_mismatch_mode(page, srv, RUN, SHOWN, UNKNOWN_SAMPLE)      # a rollout the sampler left out
    assert all(a == 0 for *_, a in span_colours(page))
    assert len(page.query_selector_all("#tok-main .tok.nolr")) == \
        len(api(srv, f"{RUN}/tokens", step=SHOWN, sample_id=UNKNOWN_SAMPLE))
    open_mismatch_mode(page, srv, PLAIN, 2, 0)                       # a run without any
    assert "no sampler log p" in page.inner_text("#tok-no-sampler")
    assert all(a == 0 for *_, a in span_colours(page))
    assert page.errors == []


def plot(page, graph: str) -> dict:
    return page.evaluate("""id => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
        return {data: gd.data.map(t => ({meta: t.meta, x: Array.from(t.x || []),
                                          y: Array.from(t.y || []), name: t.name})),
                shapes: (gd.layout.shapes || []).map(s => ({x0: s.x0, type: s.type}))}; }""", graph)


def test_run_page_shows_mismatch_charts_and_the_ratio_histogram(served, page, tmp_path):
    srv, _ = served
    page.goto(f"{srv.url}/run?run={RUN}")
    page.wait_for_selector("#run-mismatch .main-svg", timeout=20_000)
    page.wait_for_selector("#run-ratios .main-svg", timeout=20_000)
    assert page.is_visible("#run-mismatch-wrap")
    over = plot(page, "run-mismatch")
    for key in ("mismatch/kl_k3", "mismatch/kl_k3/fork", "mismatch/frac_outside_2x"):
        stored = api(srv, f"{RUN}/scalars", keys=key, downsample=100_000)
        drawn = [t for t in over["data"] if t["meta"] and t["meta"].get("key") == key
                 and t["meta"].get("role") == "raw"]
        assert drawn and drawn[0]["x"] == [r["step"] for r in stored], key
        assert np.allclose(drawn[0]["y"], [r["value"] for r in stored], rtol=1e-5), key
    hist = plot(page, "run-ratios")
    assert hist["data"][0]["name"] == f"step {STEPS - 1}"
    assert any(t["name"] == "step 0 (the run's first)" for t in hist["data"])
    lines = sorted(s["x0"] for s in hist["shapes"] if s["type"] == "line")
    assert np.allclose(lines, [-math.log(5), -math.log(2), math.log(2), math.log(5)])
    # the share of tokens in the histogram's bins adds up to the stored token count
    counts = [h for h in api(srv, f"{RUN}/histograms", key="mismatch_log_ratio", downsample=100_000)
              if h["step"] == STEPS - 1]
    tokens = api(srv, f"{RUN}/scalars", keys="mismatch/tokens", downsample=100_000)[-1]["value"]
    assert sum(h["count"] for h in counts) == tokens
    text = page.inner_text("#run-ratios")
    assert f"step {STEPS - 1} · {int(tokens)} tokens · outside 2×" in text
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.locator("#run-mismatch-wrap").screenshot(path=str(shots_dir(tmp_path) / "mismatch-run.png"))
    # a run without sampler log p: no mismatch section at all
    page.goto(f"{srv.url}/run?run={PLAIN}")
    page.wait_for_selector("#run-entropy .main-svg", timeout=20_000)
    assert not page.is_visible("#run-mismatch-wrap")
    assert page.errors == []


def test_compare_page_draws_a_mismatch_key(served, page):
    srv, _ = served
    page.goto(f"{srv.url}/compare?runs={RUN}")
    page.wait_for_selector("#cmp-figure .main-svg", timeout=20_000)
    page.click("#cmp-panels")                     # the picker lists every key of the run
    page.locator("[role=option]", has=page.locator("input[value='mismatch/kl_k3/fork']")).click()
    page.keyboard.press("Escape")
    page.wait_for_function("""() => document.querySelector('#cmp-figure .js-plotly-plot').data
        .some(t => t.meta && t.meta.key === 'mismatch/kl_k3/fork')""", timeout=20_000)
    drawn = [t for t in plot(page, "cmp-figure")["data"]
             if t["meta"] and t["meta"].get("key") == "mismatch/kl_k3/fork"]
    stored = api(srv, f"{RUN}/scalars", keys="mismatch/kl_k3/fork", downsample=100_000)
    assert drawn[0]["x"] == [r["step"] for r in stored]
    assert page.errors == []
