"""Figures on the wire (dashboard/wire.py): what Dash's serialiser sends for a wired figure holds
the same chart as the exact one, to the digits the hover shows, in short numbers; and a run-page
redraw leaves out the heatmap when only controls it does not read changed."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from dash import html
from plotly.io.json import to_json_plotly

from forksight.dashboard import figures as F
from forksight.dashboard import run_figures as R
from forksight.dashboard.wire import Y_DIGITS, Z_DECIMALS, round_significant, wire_figure


def test_round_significant_keeps_six_digits_and_prints_short():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(-1, 1, 500) * 10.0 ** rng.integers(-12, 12, 500),
                             [0.0, 1.0, -2.5, 123456789.0, 0.1 + 0.2]])
    out = round_significant(values, 6)
    for v, r in zip(values, out):
        if v == 0:
            assert r == 0
            continue
        # within half a unit of the 6th significant digit (plus float dust)
        unit = 10.0 ** (math.floor(math.log10(abs(v))) - 5)
        assert abs(r - v) <= 0.5 * unit * (1 + 1e-9)
        digits = repr(float(r)).lstrip("-").split("e")[0].replace(".", "").strip("0")
        assert len(digits) <= 6, (v, r)                  # JSON prints it short
    assert round_significant([0.1 + 0.2], 6).tolist() == [0.3]
    kept = round_significant([math.nan, math.inf, -math.inf], 6)
    assert math.isnan(kept[0]) and kept[1] == math.inf and kept[2] == -math.inf


def _sent(figure: dict) -> dict:
    """The figure as a browser receives it: through plotly's serialiser (Dash's), beside a Dash
    component as a callback's answer has (which sends the serialiser down its slow path)."""
    return json.loads(to_json_plotly({"figure": figure, "chip": html.Span("ok")}))["figure"]


def test_a_wired_run_figure_arrives_as_the_exact_one_to_the_hover_digits():
    rng = np.random.default_rng(1)
    rows = [{"key": k, "step": s, "value": float(rng.gamma(2.0, 0.3)) if s != 7 else math.nan,
             "wall_time": 1.7e9 + s} for k in ("entropy/mean", "entropy/p20", "entropy/p80",
                                                "renyi2/mean", "js/mean") for s in range(50)]
    exact = R.entropy_figure(F.by_key(pd.DataFrame(rows)), smoothing=0.6)
    sent, plain = _sent(wire_figure(exact)), json.loads(json.dumps(exact))
    assert sent["layout"] == plain["layout"]
    for got, want in zip(sent["data"], plain["data"]):
        assert got["x"] == want["x"] and all(isinstance(x, int) for x in got["x"])   # steps
        assert [y is None for y in got["y"]] == [y is None for y in want["y"]]      # gaps kept
        ys = [(g, w) for g, w in zip(got["y"], want["y"]) if w is not None]
        assert ys and all(g == pytest.approx(w, rel=0.5 * 10.0 ** (1 - Y_DIGITS)) for g, w in ys)
        assert {k: v for k, v in got.items() if k not in "xy"} == \
            {k: v for k, v in want.items() if k not in "xy"}


def test_a_wired_heatmap_keeps_its_labels_and_its_shares_to_five_decimals():
    rng = np.random.default_rng(2)
    hist = pd.DataFrame([{"step": s, "bin_lo": lo, "bin_hi": hi, "count": float(rng.integers(0, 50))}
                         for s in range(20) for lo, hi in ((0.0, 0.1), (0.1, 0.5), (0.5, 1.0))])
    exact = R.entropy_heatmap(hist)
    sent = _sent(wire_figure(exact))
    heat, median = sent["data"]
    assert heat["y"] == exact["data"][0]["y"] and median["y"] == exact["data"][1]["y"]  # labels
    assert np.abs(np.array(heat["z"]) - np.array(exact["data"][0]["z"])).max() \
        <= 0.5 * 10.0 ** -Z_DECIMALS + 1e-15
    assert heat["x"] == list(range(20))


def test_wall_time_axes_and_empty_figures_pass_unchanged():
    walls = {"type": "scatter", "x": ["2026-12-03 10:00:00.000000"], "y": [1.0]}
    assert wire_figure({"data": [walls], "layout": {}})["data"][0]["x"] == walls["x"]
    empty = F.empty_figure("nothing yet")
    assert wire_figure(empty) == empty


def _draw_call(client, dep, values: dict) -> dict:
    """The run page's draw callback through Dash's endpoint (Flask test client): its outputs."""
    fill = (lambda specs: [{**x, "value": values.get(f"{x['id']}.{x['property']}")} for x in specs])
    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1)))
               for o in dep["output"].strip(".").split("...")]
    changed = [k for k in values if k != "run-state.data"]
    response = client.post("/_dash-update-component", json={
        "output": dep["output"], "outputs": outputs, "changedPropIds": changed[-1:],
        "inputs": fill(dep["inputs"]), "state": fill(dep["state"])})
    assert response.status_code == 200, response.data[:500]
    return response.get_json()["response"]


def test_a_redraw_for_the_smoothing_leaves_out_a_current_heatmap_only(tmp_path):
    from forksight.dashboard.app import create_dash
    from forksight.monitor.collector.store import Store
    from synthetic import seed_run, write_steps

    with Store(str(tmp_path / "r.duckdb")) as store:
        run_id = seed_run(store, "r", 12, steps_total=40, seed=3)
        client = create_dash(store.reader).server.test_client()
        client.get("/")
        dep = next(d for d in client.get("/_dash-dependencies").get_json()
                   if "run-heatmap.figure" in d["output"] and d["inputs"][0]["id"] == "run-select")
        values = {"run-select.value": run_id, "run-smoothing.value": 0.6, "run-xaxis.value": "step",
                  "run-logy.value": [], "run-points.value": 1000, "run-custom-keys.value": []}
        first = _draw_call(client, dep, values)
        assert first["run-heatmap"]["figure"]["data"][0]["x"] == list(range(12))
        s1 = first["run-state"]["data"]
        for changed in ({"run-smoothing.value": 0.3}, {"run-logy.value": ["log"]},
                        {"run-custom-keys.value": ["loss"]}):
            kept = _draw_call(client, dep, {**values, **changed, "run-state.data": s1})
            assert "run-heatmap" not in kept and "run-entropy" in kept       # left as drawn
            assert kept["run-state"]["data"]["plans"]["heatmap"] == s1["plans"]["heatmap"]
        # steps stored since the page's last tick: the heatmap is sent again, all of it
        write_steps(store, run_id, range(12, 15), 40, np.random.default_rng(4))
        grown = _draw_call(client, dep, {**values, "run-smoothing.value": 0.3, "run-state.data": s1})
        assert grown["run-heatmap"]["figure"]["data"][0]["x"] == list(range(15))
        s2 = grown["run-state"]["data"]
        for changed in ({"run-xaxis.value": "wall"}, {"run-points.value": 500},
                        {"run-select.value": seed_run(store, "other", 5, seed=5)}):
            assert "run-heatmap" in _draw_call(client, dep, {**values, **changed, "run-state.data": s2})
        # the page's state comes from the browser: any other shape is a full redraw, never a 500
        for junk in ([1, 2], {**s2, "plans": [1]}, {**s2, "controls": 7}, {**s2, "plans": {}}):
            assert "run-heatmap" in _draw_call(client, dep, {**values, "run-state.data": junk})
