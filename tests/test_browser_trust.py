"""Where the trust region binds, in a real headless Chromium against a real `forksight serve`, on a
store written by real `forksight train` runs (the tiny model, each batch trained three times, so the
policy moves away from the one that sampled it): the tokens page's "binary TV" mode paints each
trained token by its stored TV on the run's fixed scale, marks the tokens the ratio clip bound and
greys the untrained ones, with ratio, TV and clip in the hover; the run page shows the trust-region
panel (only for a run that logs trust/*) with the stored values; the compare page plots a trust/* key.

Screenshots (trust-tokens-tv.png, trust-run-panel.png) go to $FORKSIGHT_SCREENSHOTS or the test's tmp dir.
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
from test_browser_probes import api, plot, span_colours  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

MOVED, PLAIN = "moved", "plain"
TRAIN = ["--preset", "tiny-test", "--task", "collapse", "--lr", "0.03", "--max-new-tokens", "6",
         "--token-groups", "8", "--seed", "0"]


def _train(db, run: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "forksight", "train", *TRAIN, "--run", run, "--db", str(db),
                           *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    chromium = require_browser()
    tmp = tmp_path_factory.mktemp("trust-browser")
    db = tmp / "runs.duckdb"
    _train(db, MOVED, "--steps", "6", "--updates-per-batch", "3")
    _train(db, PLAIN, "--steps", "2")
    with ServeProcess(db, dashboard=True) as srv:
        ids = {r["name"]: r["run_id"] for r in api(srv, "")}
        yield srv, chromium, ids


def _clipped_step(srv, run: str) -> tuple[int, int]:
    """(step, sample) of the stored completion with the most clipped tokens."""
    best = None
    for step in api(srv, f"{run}/token_steps"):
        rows = api(srv, f"{run}/tokens", step=step)
        for sample in sorted({r["sample_id"] for r in rows}):
            n = sum(bool(r["clipped"]) for r in rows if r["sample_id"] == sample)
            if best is None or n > best[0]:
                best = (n, step, sample)
    return best[1], best[2]


def open_tv_mode(page, srv, run: str, step: int, sample: int) -> None:
    page.goto(f"{srv.url}/tokens?run={run}&step={step}&sample={sample}")
    page.wait_for_function("""s => { const el = document.querySelector('#tok-step-label');
        return el !== null && el.innerText === 'step ' + s; }""", arg=step, timeout=30_000)
    page.wait_for_selector("#tok-main .tok")
    page.click("#tok-metric input[value=tv]")
    page.wait_for_function("() => (document.querySelector('#tok-legend') || {}).innerText"
                           "?.includes('binary TV')", timeout=30_000)


def test_tokens_binary_tv_mode_paints_marks_and_explains_each_trained_token(served, page, tmp_path):
    srv, _, ids = served
    run = ids[MOVED]
    early = [r["tv"] for s in api(srv, f"{run}/token_steps")[:3] for r in api(srv, f"{run}/tokens", step=s)
             if r["tv"] is not None]
    top = min(max(float(np.quantile(early, 0.95)), 0.15), 1.0)           # the scale by hand
    step, sample = _clipped_step(srv, run)
    tokens = api(srv, f"{run}/tokens", step=step, sample_id=sample)
    assert any(t["clipped"] for t in tokens), "the run has no clipped token to show"
    open_tv_mode(page, srv, run, step, sample)
    assert float(page.get_attribute("#tok-scale", "data-top")) == pytest.approx(top, rel=1e-5)
    colours = span_colours(page)
    classes = page.evaluate("() => Array.from(document.querySelectorAll('#tok-main .tok'), e => e.className)")
    titles = page.evaluate("() => Array.from(document.querySelectorAll('#tok-main .tok'), e => e.title)")
    assert len(colours) == len(tokens)
    for token, (r, g, b, a), cls, title in zip(tokens, colours, classes, titles):
        if token["tv"] is None:                     # not trained: unknown, greyed, not "0"
            assert a == 0 and "nolr" in cls.split() and "binary TV" not in title
            continue
        assert a == pytest.approx(0.85 * min(token["tv"] / top, 1.0), abs=0.006), token
        if a > 0.006:
            assert (r, g, b) == (156, 54, 181), token
        assert ("clip" in cls.split()) == bool(token["clipped"]), token
        assert f"ratio π/π_old {token['ratio']:.4g}   binary TV {token['tv']:.4f}" in title
    assert "δ 0.15" in page.inner_text("#tok-legend") and "ratio clip bound it" in page.inner_text("#tok-legend")
    page.wait_for_selector("#tok-history .main-svg")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.screenshot(path=str(shots_dir(tmp_path) / "trust-tokens-tv.png"), full_page=True)
    assert page.errors == []


def test_a_run_trained_once_per_batch_says_it_has_no_tv(served, page):
    srv, _, ids = served
    open_tv_mode(page, srv, ids[PLAIN], 2, 0)
    assert "no π_old" in page.inner_text("#tok-no-trust")
    assert all(a == 0 for *_, a in span_colours(page))
    assert page.errors == []


def test_run_page_shows_the_trust_region_panel_only_for_a_run_that_logs_it(served, page, tmp_path):
    srv, _, ids = served
    run = ids[MOVED]
    page.goto(f"{srv.url}/run?run={run}")
    page.wait_for_selector("#run-trust .main-svg", timeout=30_000)
    assert page.is_visible("#run-trust-wrap")
    drawn = {t["meta"]["key"]: t for t in plot(page, "run-trust") if t["meta"]}
    for key in ("trust/clip_frac/q4", "trust/tv_outside_frac/q1", "trust/clipped_inside_frac", "trust/clip_frac"):
        stored = api(srv, f"{run}/scalars", keys=key, downsample=100_000)
        assert stored and key in drawn, key
        assert drawn[key]["x"] == [r["step"] for r in stored], key
        assert np.allclose(drawn[key]["y"], [r["value"] for r in stored], rtol=1e-5), key
    assert "Trust region" in page.inner_text("#run-trust")
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.locator("#run-trust-wrap").screenshot(path=str(shots_dir(tmp_path) / "trust-run-panel.png"))
    page.goto(f"{srv.url}/run?run={ids[PLAIN]}")
    page.wait_for_selector("#run-entropy .main-svg", timeout=30_000)
    assert not page.is_visible("#run-trust-wrap")
    assert page.errors == []


def test_compare_page_plots_a_trust_key(served, page):
    srv, _, ids = served
    run = ids[MOVED]
    page.goto(f"{srv.url}/compare?runs={run}")
    page.wait_for_selector("#cmp-figure .main-svg", timeout=30_000)
    page.click("#cmp-panels")
    page.keyboard.type("trust/tv_mea")
    page.locator("[role=option]", has=page.locator("input[value='trust/tv_mean']")).click()
    page.keyboard.press("Escape")
    page.wait_for_function("""() => document.querySelector('#cmp-figure .js-plotly-plot').data
        .some(t => t.meta && t.meta.key === 'trust/tv_mean')""", timeout=30_000)
    drawn = [t for t in plot(page, "cmp-figure") if t["meta"] and t["meta"].get("key") == "trust/tv_mean"]
    stored = api(srv, f"{run}/scalars", keys="trust/tv_mean", downsample=100_000)
    assert drawn[0]["x"] == [r["step"] for r in stored]
    assert page.errors == []
