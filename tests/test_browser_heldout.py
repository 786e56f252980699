"""The cost of collapse in a real headless Chromium against a real `forksight serve` fed through
the real HTTP sink: the compare page grouped by strategy draws one mean and one band per strategy
over three seeds (and the "runs" view still one line per run); the run page of a run that logs
held-out eval/pass@k draws it with the base model's line at the first evaluation's value and the
area below it shaded; a run without evaluations has no such chart.

Screenshots (compare-seeds.png, run-heldout.png) go to $FORKSIGHT_SCREENSHOTS
(docs/screenshots for the README) or the test's tmp dir.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("playwright")
from browser_util import context, page, shots_dir  # noqa: E402,F401 (fixtures)
from collector_util import ServeProcess  # noqa: E402
from conftest import require_browser  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.browser]

STEPS, EVAL_EVERY = 60, 10
STRATEGIES = {"all": 0.10, "fork": 0.05}         # how fast each one's entropy falls
HELDOUT, PLAIN = "grpo-heldout", "grpo-no-eval"


def seeded_scalars(rate: float, seed: int, step: int) -> dict[str, float]:
    """A run's step: entropy falling at `rate` (seed noise), reward and pass@k rising."""
    rng = np.random.default_rng(1000 * seed + step)
    entropy = 0.7 * np.exp(-rate * step) + 0.03 + 0.02 * rng.standard_normal()
    reward = min(1.0, 0.3 + (0.9 - entropy) * 0.8 + 0.05 * rng.standard_normal())
    return {"entropy/mean": float(entropy), "reward/mean": float(reward),
            "pass@1": float(np.clip(reward, 0, 1)),
            "pass@8": float(np.clip(reward + 0.3 * entropy / 0.7, 0, 1))}


def heldout_eval(step: int) -> dict[str, float]:
    """Held-out pass@1 and pass@8: up a little, then below where the run started."""
    t = step / STEPS
    return {"eval/pass@1": 0.30 + 0.10 * t - 0.25 * t * t,
            "eval/pass@8": 0.62 + 0.15 * t - 0.45 * t * t}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from forksight.monitor.sinks.http import HttpSink

    chromium = require_browser()
    tmp = tmp_path_factory.mktemp("heldout-browser")
    with ServeProcess(tmp / "runs.duckdb", dashboard=True) as srv:
        ids = []
        for strategy, rate in STRATEGIES.items():
            for seed in range(3):
                sink = HttpSink(srv.url, f"{strategy}-seed{seed}", strategy=strategy,
                                config={"seed": seed, "lr": 5e-4}, spool_dir=tmp / f"s{len(ids)}",
                                flush_interval=0.05)
                for step in range(STEPS):
                    sink.log_scalars(step, seeded_scalars(rate, seed, step))
                assert sink.flush(30.0)
                sink.finish()
                ids.append(sink.run_id)
        for name, evals in ((HELDOUT, True), (PLAIN, False)):
            sink = HttpSink(srv.url, name, strategy="all", spool_dir=tmp / name,
                            flush_interval=0.05)
            for step in range(STEPS + 1):
                sink.log_scalars(step, seeded_scalars(0.08, 7, step))
                if evals and step % EVAL_EVERY == 0:
                    sink.log_scalars(step, heldout_eval(step))
            assert sink.flush(30.0)
            sink.finish()
        yield srv, chromium, ids


def api(srv, path: str, **params):
    import httpx

    response = httpx.get(f"{srv.url}/api/runs/{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def plot(page, graph: str) -> dict:
    return page.evaluate("""id => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
        return {data: gd.data.map(t => ({meta: t.meta, x: Array.from(t.x || []),
                                          y: Array.from(t.y || []), name: t.name,
                                          xaxis: t.xaxis, fill: t.fill})),
                shapes: (gd.layout.shapes || []).map(s => ({name: s.name, y0: s.y0})),
                notes: (gd.layout.annotations || []).map(a => a.text)}; }""", graph)


def test_compare_grouped_by_strategy_draws_a_mean_and_a_band_per_strategy(served, page, tmp_path):
    from forksight.dashboard.figures import ema_debiased
    from forksight.dashboard.pages.compare import START_SMOOTHING

    srv, _, ids = served
    page.goto(f"{srv.url}/compare?runs={','.join(ids)}&view=grouped")
    page.wait_for_function("""() => { const gd = document.querySelector('#cmp-figure .js-plotly-plot');
        return gd && gd.data.some(t => t.meta && t.meta.role === 'group-mean'); }""",
                           timeout=20_000)
    fig = plot(page, "cmp-figure")
    first = [t for t in fig["data"] if (t["xaxis"] or "x") == "x"]       # the entropy panel
    means = [t for t in first if t["meta"]["role"] == "group-mean"]
    bands = [t for t in first if t["meta"]["role"] == "group-band"]
    assert sorted(t["meta"]["group"] for t in means) == ["all", "fork"]
    assert sorted(t["meta"]["group"] for t in bands) == ["all", "fork"]
    assert all(t["fill"] == "tonexty" for t in bands)
    # each mean is the mean of its three seeds' stored values, step by step
    for mean in means:
        stored = [api(srv, f"{rid}/scalars", keys="entropy/mean", downsample=100_000)
                  for rid in mean["meta"]["runs"]]
        assert len(stored) == 3
        by_step = np.mean([[r["value"] for r in rows] for rows in stored], axis=0)
        assert mean["x"] == [r["step"] for r in stored[0]]
        # the page opens smoothed (EMA 0.6 per run): the EMA is linear, so the mean of the
        # runs' EMAs is the EMA of their mean
        assert np.allclose(mean["y"], ema_debiased(by_step, START_SMOOTHING)[0], rtol=1e-5)
        assert "mean of 3 runs" in mean["name"] and "min–max" in mean["name"]
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.locator("#cmp-figure").screenshot(path=str(shots_dir(tmp_path) / "compare-seeds.png"))
    # back to "runs": one line per run, as before
    page.click("#cmp-view input[value=runs]")
    page.wait_for_function("""() => document.querySelector('#cmp-figure .js-plotly-plot').data
        .some(t => t.meta && t.meta.role === 'compare')""", timeout=20_000)
    lines = [t for t in plot(page, "cmp-figure")["data"]
             if t["meta"]["role"] == "compare" and (t["xaxis"] or "x") == "x"]
    assert sorted(t["meta"]["run"] for t in lines) == sorted(ids)
    assert not page.is_visible("#cmp-group-wrap")
    assert page.errors == []


def test_run_page_shows_held_out_pass_at_k_against_the_base_model_line(served, page, tmp_path):
    srv, _, _ = served
    page.goto(f"{srv.url}/run?run={HELDOUT}")
    page.wait_for_selector("#run-heldout .main-svg", timeout=20_000)
    assert page.is_visible("#run-heldout-wrap")
    fig = plot(page, "run-heldout")
    stored = api(srv, f"{HELDOUT}/scalars", keys="eval/pass@8", downsample=100_000)
    assert [r["step"] for r in stored] == list(range(0, STEPS + 1, EVAL_EVERY))
    [base] = [s for s in fig["shapes"] if s["name"] == "base:eval/pass@8"]
    assert base["y0"] == pytest.approx(stored[0]["value"], rel=1e-6)
    assert any(n.startswith("base model (step 0)") for n in fig["notes"])
    [drawn] = [t for t in fig["data"] if t["meta"] and t["meta"].get("key") == "eval/pass@8"
               and t["meta"].get("role") == "raw"]
    assert drawn["x"] == [r["step"] for r in stored]
    assert np.allclose(drawn["y"], [r["value"] for r in stored], rtol=1e-5)
    shaded = [t for t in fig["data"] if t["meta"] and t["meta"].get("role") == "cost"
              and t["fill"] == "tonexty"]
    assert shaded and min(shaded[0]["y"]) == pytest.approx(min(r["value"] for r in stored),
                                                           rel=1e-5)
    assert any("cost of collapse" in n for n in fig["notes"])
    page.wait_for_load_state("networkidle")
    time.sleep(0.5)
    page.locator("#run-heldout-wrap").screenshot(path=str(shots_dir(tmp_path) / "run-heldout.png"))
    page.goto(f"{srv.url}/run?run={PLAIN}")
    page.wait_for_selector("#run-entropy .main-svg", timeout=20_000)
    assert not page.is_visible("#run-heldout-wrap")
    assert page.errors == []
