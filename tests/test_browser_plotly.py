"""The dashboard's own plotly.js bundle (dashboard/assets/plotly-forksight.min.js, built by
dashboard/plotly_bundle): it registers every trace type the figures draw, a run page uses it and
never fetches Dash's full plotly.js, and the figures draw no other type."""
from __future__ import annotations

import numpy as np
import pytest

from collector_util import InProcessCollector

STEPS = 3_200            # 5 entropy series x 3,200 points: past the scattergl threshold


def _seed(db) -> str:
    from forksight.base.constants import ENTROPY_EDGES
    from forksight.base.records import Records, histograms_table, scalars_table
    from forksight.dashboard.run_view import RUN_KEYS_CORE
    from forksight.monitor.collector.store import Store

    rng = np.random.default_rng(0)
    rows = [{"step": s, "key": k, "value": float(v)} for k in RUN_KEYS_CORE
            for s, v in enumerate(rng.random(STEPS))]
    counts = rng.integers(0, 50, len(ENTROPY_EDGES) - 1)
    hist = [{"step": s, "key": "entropy", "counts": counts.tolist(), "edges": ENTROPY_EDGES.tolist()}
            for s in range(0, STEPS, 400)]
    with Store(str(db)) as store:
        run_id = store.create_run("gl", strategy="fork")
        store.write(run_id, Records(scalars=scalars_table(rows),
                                    histograms=histograms_table(hist))).result()
    return run_id


def test_the_figures_draw_only_trace_types_the_bundle_registers(tmp_path):
    from forksight.dashboard.app import PLOTLY_TRACES
    from forksight.dashboard.run_view import Controls, draw_run
    from forksight.monitor.collector.store import Store

    run_id = _seed(tmp_path / "gl.duckdb")
    with Store(str(tmp_path / "gl.duckdb")) as store:
        out = draw_run(store.reader, run_id, Controls.from_inputs(0.6, "step", [], "all", []))
    types = {t.get("type", "scatter") for fig in out["figures"].values() for t in fig["data"]}
    assert {"scattergl", "heatmap"} <= types <= set(PLOTLY_TRACES)


@pytest.mark.slow
@pytest.mark.browser
def test_the_run_page_draws_with_the_small_bundle_which_registers_every_type(tmp_path):
    from browser_util import browser_context, watched_page
    from conftest import require_browser
    from forksight.dashboard.app import PLOTLY_TRACES

    chromium = require_browser()
    run_id = _seed(tmp_path / "gl.duckdb")
    with InProcessCollector(tmp_path / "gl.duckdb", dashboard=True) as srv, \
            browser_context(chromium) as ctx, watched_page(ctx) as page:
        scripts = []
        page.on("request", lambda r: scripts.append(r.url) if ".js" in r.url else None)
        page.goto(f"{srv.url}/run?run={run_id}")
        page.wait_for_function("""() => { const gd = document.querySelector('#run-entropy .js-plotly-plot');
            return gd && gd._fullData && gd._fullData.length > 0; }""", timeout=60_000)
        # every type the figures draw is registered: a trace of an unknown type is made invisible
        drawn = page.evaluate("""(types) => { const div = document.createElement('div');
            document.body.appendChild(div);
            return Plotly.newPlot(div, types.map(t => t === 'heatmap' ? {type: t, z: [[1, 2], [3, 4]]}
                                                                      : {type: t, x: [0, 1], y: [1, 0]}))
                .then(gd => gd._fullData.map(t => [t.type, t.visible])); }""", list(PLOTLY_TRACES))
        assert drawn == [[t, True] for t in PLOTLY_TRACES]
        assert any("plotly-forksight.min.js" in u for u in scripts)
        assert not any("package_data/plotly.min.js" in u for u in scripts), scripts
        assert page.errors == []
