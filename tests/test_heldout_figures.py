"""The run page's held-out chart: train pass@1 beside held-out pass@1, held-out pass@k at the
largest k against the base model's value (the first evaluation), the area below that line shaded
as the cost of collapse; drawn only for runs that log eval/pass@k, kept live by the tick."""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from forksight.dashboard import heldout_figures as H

EVAL_STEPS = [0, 10, 20, 30]
EVAL1 = [0.30, 0.35, 0.20, 0.25]
EVAL8 = [0.60, 0.70, 0.40, 0.50]


def frame(rows: dict[str, tuple[list[int], list[float]]]) -> pd.DataFrame:
    return pd.DataFrame([{"key": k, "step": s, "value": v, "wall_time": 1.7e9 + 2.0 * s}
                         for k, (steps, values) in rows.items() for s, v in zip(steps, values)])


def run_frame(eval_steps=EVAL_STEPS, eval1=EVAL1, eval8=EVAL8) -> pd.DataFrame:
    train = list(range(31))
    return frame({"reward/mean": (train, [0.3 + 0.02 * s for s in train]),
                  "pass@1": (train, [0.3 + 0.02 * s for s in train]),
                  "pass@8": (train, [min(1.0, 0.6 + 0.02 * s) for s in train]),
                  "eval/pass@1": (eval_steps, eval1), "eval/pass@8": (eval_steps, eval8)})


def traces(fig: dict, role: str, key: str | None = None) -> list[dict]:
    return [t for t in fig["data"] if (t.get("meta") or {}).get("role") == role
            and (key is None or t["meta"].get("key") == key)]


def test_eval_keys_are_found_in_order_of_k_and_kept_apart_from_train_pass_at_k():
    keys = ["pass@1", "eval/pass@16", "eval/pass@2", "eval/pass@1", "eval/reward", "pass@8"]
    assert H.eval_pass_keys(keys) == ["eval/pass@1", "eval/pass@2", "eval/pass@16"]
    assert H.has_heldout(keys) and not H.has_heldout(["pass@1", "eval/reward"])


def test_the_base_line_is_the_first_evaluations_value_labelled_with_its_step():
    fig = H.heldout_figure(run_frame())
    go.Figure(fig)
    base = {s["name"]: s["y0"] for s in fig["layout"]["shapes"] if s["name"].startswith("base:")}
    assert base == {"base:eval/pass@1": EVAL1[0], "base:eval/pass@8": EVAL8[0]}
    labels = [a["text"] for a in fig["layout"]["annotations"] if a.get("name") == "base:eval/pass@8"]
    assert labels == [f"base model (step 0): {EVAL8[0]:.2f}"]
    # evaluated first at step 10 (no step-0 evaluation): the line says so, not "base model"
    late = H.heldout_figure(run_frame([10, 20, 30], EVAL1[1:], EVAL8[1:]))
    [note] = [a["text"] for a in late["layout"]["annotations"] if a.get("name") == "base:eval/pass@8"]
    assert note == f"first eval (step 10): {EVAL8[1]:.2f}"
    titles = [a["text"] for a in late["layout"]["annotations"] if a.get("yref") == "paper"]
    assert "held-out pass@8 vs its first evaluation" in titles
    assert "held-out pass@8 vs the base model" in [a["text"] for a in fig["layout"]["annotations"]]
    # a NaN first evaluation is not a base
    assert H.base_point(frame({"k": ([0, 5], [float("nan"), 0.4])})) == (5, 0.4)


def test_train_and_held_out_values_are_drawn_as_stored():
    data = run_frame()
    fig = H.heldout_figure(data, smoothing=0.0)
    for key in ("pass@1", "eval/pass@1", "eval/pass@8", "reward/mean", "pass@8"):
        [trace] = traces(fig, "raw", key)
        rows = data[data.key == key]
        assert trace["x"] == rows.step.tolist() and trace["y"] == pytest.approx(rows.value.tolist())
    # train pass@1 beside held-out pass@1 on the left panel; held-out pass@8 on the right
    assert traces(fig, "raw", "pass@1")[0]["xaxis"] == traces(fig, "raw", "eval/pass@1")[0]["xaxis"]
    assert traces(fig, "raw", "eval/pass@8")[0]["xaxis"] != traces(fig, "raw", "eval/pass@1")[0]["xaxis"]


def test_the_cost_of_collapse_is_the_area_below_the_base_line_from_its_crossing():
    fig = H.heldout_figure(run_frame())
    edge, area = traces(fig, "cost", "eval/pass@8")
    assert area["fill"] == "tonexty" and edge["y"] == [EVAL8[0]] * len(edge["x"])
    # by hand: 0.70 at step 10 -> 0.40 at step 20 crosses 0.60 a third of the way, at 13 1/3
    assert area["x"] == pytest.approx([0, 10, 10 + 10 / 3, 20, 30])
    assert area["y"] == pytest.approx([0.6, 0.6, 0.6, 0.4, 0.5])
    # the shaded area: a triangle (6 2/3 x 0.2 / 2) and a trapezoid ((0.2 + 0.1) / 2 x 10)
    x, y = np.asarray(area["x"]), np.asarray(area["y"])
    shaded = float(np.sum(np.diff(x) * ((0.6 - y[1:]) + (0.6 - y[:-1])) / 2))
    assert shaded == pytest.approx(10 / 3 * 2 * 0.2 / 2 + 1.5)
    [note] = [a for a in fig["layout"]["annotations"] if a.get("name") == "cost"]
    assert note["x"] == 20 and note["y"] == pytest.approx(0.4)
    assert "-0.20 vs base at step 20" in note["text"]


def test_no_shading_when_held_out_pass_at_k_never_falls_below_its_base():
    fig = H.heldout_figure(run_frame(eval8=[0.6, 0.7, 0.8, 0.6]))
    assert traces(fig, "cost") == []
    assert not any(a.get("name") == "cost" for a in fig["layout"]["annotations"])


def test_below_base_inserts_every_crossing_and_clips_at_the_line():
    x = np.array([0.0, 1.0, 2.0, 3.0])
    xs, ys = H.below_base(x, np.array([1.0, -1.0, 1.0, 0.5]), 0.0)
    assert xs.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0]
    assert ys.tolist() == [0.0, 0.0, -1.0, 0.0, 0.0, 0.0]


def test_wall_time_axis_and_a_run_without_evaluations():
    fig = H.heldout_figure(run_frame(), x_axis="wall")
    go.Figure(fig)
    [area] = [t for t in traces(fig, "cost") if t.get("fill") == "tonexty"]
    assert all(isinstance(x, str) for x in area["x"])
    empty = H.heldout_figure(frame({"pass@1": ([0, 1], [0.1, 0.2])}))
    assert empty["data"] == [] and "not logged" in empty["layout"]["annotations"][0]["text"]


# ---------------------------------------------------------------- the run page, on a real store
def test_the_run_page_draws_held_out_only_for_a_run_that_logs_it_and_redraws_on_a_late_eval(
        tmp_path):
    from forksight.compose.local import LocalSink
    from forksight.dashboard.run_view import Controls, draw_run, other_keys, tick_run

    sink = LocalSink(str(tmp_path / "h.duckdb"), "heldout", strategy="all")
    plain = LocalSink("", "plain", store=sink.store, strategy="all")
    for step in range(21):
        sink.log_scalars(step, {"reward/mean": 0.5, "pass@1": 0.5, "entropy/mean": 0.4})
        plain.log_scalars(step, {"reward/mean": 0.5, "entropy/mean": 0.4})
        if step % 10 == 0:
            sink.log_scalars(step, {"eval/pass@1": 0.3 - 0.01 * step, "eval/pass@4": 0.6 - 0.01 * step})
    sink.flush()
    plain.flush()
    reader = sink.store.reader
    out = draw_run(reader, sink.run_id, Controls(smoothing=0.0))
    assert out["heldout"] and out["state"]["last_eval_step"] == 20
    [trace] = traces(out["figures"]["heldout"], "raw", "eval/pass@4")
    stored = reader.read_scalars(sink.run_id, ["eval/pass@4"])
    assert trace["x"] == stored.step.tolist() and trace["y"] == pytest.approx(stored.value.tolist())
    assert "eval/pass@1" not in out["other_keys"] and other_keys(["eval/pass@2", "lr"]) == ["lr"]
    assert not draw_run(reader, plain.run_id, Controls())["heldout"]
    # step 21's rows, then its evaluation after the tick has moved past it: the next tick redraws
    sink.log_scalars(21, {"reward/mean": 0.5, "pass@1": 0.5, "entropy/mean": 0.4})
    sink.flush()
    ticked = tick_run(reader, out["state"], Controls(smoothing=0.0))
    assert not ticked["redraw"] and ticked["state"]["last_step"] == 21
    sink.log_scalars(21, {"eval/pass@1": 0.05, "eval/pass@4": 0.2})
    sink.flush()
    assert tick_run(reader, ticked["state"], Controls(smoothing=0.0))["redraw"]
    plain.finish()
    sink.finish()


@pytest.mark.slow
def test_a_real_bundled_trainer_run_gets_the_held_out_chart(tmp_path):
    """The keys the trainer really logs (eval/pass@k of the base model at step 0, then every
    eval_every steps) are the ones the chart draws, its line at the base model's stored value."""
    from forksight.dashboard.run_view import Controls, draw_run
    from forksight.monitor.collector.store import Store
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import train

    result = train(load_config(preset="tiny-test", overrides=dict(
        strategy="all", db=str(tmp_path / "t.duckdb"), out_dir=str(tmp_path / "runs"), steps=3,
        eval_every=2, run="real-heldout")))
    with Store(str(tmp_path / "t.duckdb")) as store:
        keys = H.eval_pass_keys(store.reader.scalar_keys(result.run_id))
        assert keys == sorted(result.eval, key=lambda k: int(k.split("@")[1]))
        out = draw_run(store.reader, result.run_id, Controls())
        assert out["heldout"]
        top = store.reader.read_scalars(result.run_id, [keys[-1]]).sort_values("step")
        assert top.step.tolist() == [0, 2, 3]          # the base model, every 2 steps, after the last one
        [line] = [s for s in out["figures"]["heldout"]["layout"]["shapes"]
                  if s.get("name") == f"base:{keys[-1]}"]
        assert line["y0"] == pytest.approx(float(top.value.iloc[0]))
        notes = [a["text"] for a in out["figures"]["heldout"]["layout"]["annotations"]]
        assert any(n.startswith("base model (step 0)") and f"{top.value.iloc[0]:.2f}" in n for n in notes), notes


def test_a_long_run_draws_its_train_curves_with_webgl_and_its_evaluations_as_svg():
    from forksight.dashboard.figures import SCATTERGL_AFTER

    n = SCATTERGL_AFTER // 2 + 1                       # reward + pass@1 + pass@8 past the bound
    steps = list(range(n))
    data = frame({"reward/mean": (steps, [0.5] * n), "pass@1": (steps, [0.5] * n),
                  "pass@8": (steps, [0.7] * n), "eval/pass@8": ([0, n - 1], [0.6, 0.4])})
    fig = H.heldout_figure(data)
    go.Figure(fig)
    assert traces(fig, "raw", "pass@1")[0]["type"] == "scattergl"
    assert traces(fig, "raw", "eval/pass@8")[0]["type"] == "scatter"
    assert H.heldout_figure(run_frame())["data"][0]["type"] == "scatter"
