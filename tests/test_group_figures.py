"""The compare page's grouped view: runs grouped by strategy or a config key, each group drawn as
its mean with a band (min–max, or the 95% interval of the mean) over its runs at each step; the
read stays one bounded query; the "runs" view is unchanged."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from forksight.dashboard import group_figures as G

T_975_2DF = 4.302652729911275        # Student's t, 97.5% quantile, 2 degrees of freedom (table)
STEPS = [0, 1, 2, 3]
# three seeds per strategy, by hand
FORK = [[0.10, 0.20, 0.30, 0.40], [0.20, 0.40, 0.60, 0.80], [0.30, 0.30, 0.30, 0.30]]
ALL = [[0.50, 0.50, 0.50, 0.50], [0.70, 0.60, 0.50, 0.40], [0.90, 0.70, 0.50, 0.30]]


def run(rid: str, strategy: str, values: list[float], config: dict | None = None,
        steps: list[int] = STEPS) -> dict:
    scal = pd.DataFrame({"key": "reward/mean", "step": steps, "value": values,
                         "wall_time": [1.7e9 + s for s in steps]})
    return {"run_id": rid, "label": rid, "strategy": strategy, "config": config, "scalars": scal}


def seeds() -> list[dict]:
    return [run(f"fork-{i}", "fork", v, {"lr": 1e-3, "seed": i}) for i, v in enumerate(FORK)] + \
        [run(f"all-{i}", "all", v, {"lr": 2e-3, "seed": i}) for i, v in enumerate(ALL)]


def of_role(fig: dict, role: str, group: str | None = None) -> list[dict]:
    return [t for t in fig["data"] if t["meta"]["role"] == role
            and (group is None or t["meta"]["group"] == group)]


def test_three_seeds_read_as_one_mean_with_a_min_max_band_per_strategy():
    fig = G.grouped_figure(seeds(), panels=["reward/mean"])
    go.Figure(fig)
    assert len(of_role(fig, "group-mean")) == 2 and len(of_role(fig, "group-band")) == 2
    for group, runs in (("fork", FORK), ("all", ALL)):
        [mean], [lo], [hi] = (of_role(fig, r, group) for r in ("group-mean", "group-band-lo",
                                                                  "group-band"))
        for j, step in enumerate(STEPS):
            at = [r[j] for r in runs]
            assert mean["x"][j] == step
            assert mean["y"][j] == pytest.approx(sum(at) / 3)
            assert (lo["y"][j], hi["y"][j]) == pytest.approx((min(at), max(at)))
        assert mean["meta"]["runs"] == [f"{group}-{i}" for i in range(3)]
        assert "mean of 3 runs" in mean["name"] and "band: min–max over runs" in mean["name"]
        assert "min–max over runs" in mean["hovertemplate"]
    # the band is filled between its own two edges, in the strategy's colour
    trace_list = fig["data"]
    for band in of_role(fig, "group-band"):
        below = trace_list[trace_list.index(band) - 1]
        assert band["fill"] == "tonexty" and below["meta"]["role"] == "group-band-lo"
        assert below["meta"]["group"] == band["meta"]["group"]


def test_the_95_percent_band_is_the_t_interval_of_the_mean_over_runs():
    fig = G.grouped_figure(seeds(), panels=["reward/mean"], band="ci95")
    [mean], [lo], [hi] = (of_role(fig, r, "fork") for r in ("group-mean", "group-band-lo",
                                                              "group-band"))
    for j in range(len(STEPS)):
        at = [r[j] for r in FORK]
        m = sum(at) / 3
        sd = math.sqrt(sum((v - m) ** 2 for v in at) / 2)
        half = T_975_2DF * sd / math.sqrt(3)
        assert (lo["y"][j], mean["y"][j], hi["y"][j]) == pytest.approx((m - half, m, m + half))
    assert "95% interval of the mean" in mean["name"]


def test_runs_of_different_lengths_meet_on_the_union_of_their_steps():
    a = run("a", "x", [0.0, 2.0, 4.0], steps=[0, 2, 4])
    b = run("b", "x", [1.0, 1.0, 1.0, 1.0], steps=[0, 1, 2, 3])
    steps, values = G.aligned([a["scalars"], b["scalars"]])
    assert steps.tolist() == [0, 1, 2, 3, 4]
    # a interpolated at step 1 (between 0 and 2); b ends at step 3: no value at 4
    assert np.allclose(values[0], [0, 1, 2, 3, 4])
    assert np.allclose(values[1, :4], 1.0) and np.isnan(values[1, 4])
    s = G.band_stats(values, "ci95")
    assert s["n"].tolist() == [2, 2, 2, 2, 1]
    assert s["mean"][-1] == 4.0 and s["lo"][-1] == s["hi"][-1] == 4.0   # one run: no interval
    with pytest.raises(ValueError, match="band must be one of"):
        G.band_stats(values, "sd")


def test_grouped_by_a_config_key_and_the_keys_that_vary_listed_first():
    runs = seeds()
    fig = G.grouped_figure(runs, group_by="seed", panels=["reward/mean"])
    means = of_role(fig, "group-mean")
    assert [m["meta"]["group"] for m in means] == ["0", "1", "2"]
    [zero] = [m for m in means if m["meta"]["group"] == "0"]
    assert zero["y"] == pytest.approx([(f + a) / 2 for f, a in zip(FORK[0], ALL[0])])
    assert zero["name"].startswith("seed = 0 · mean of 2 runs")
    assert G.group_keys(runs) == ["strategy", "lr", "seed"]
    nested = {**runs[0], "config": {"sampler": {"dtype": "bf16"}, "tags": ["a"]}}
    assert G.group_value(nested, "sampler.dtype") == "bf16"
    assert G.group_value(nested, "lr") == "–"


def test_smoothing_each_run_first_gives_the_ema_of_the_mean():
    # the EMA is linear: smoothing runs that share their steps and then averaging equals
    # averaging and then smoothing
    fig = G.grouped_figure(seeds(), panels=["reward/mean"], smoothing=0.6)
    from forksight.dashboard.figures import ema_debiased

    [mean] = of_role(fig, "group-mean", "fork")
    assert mean["y"] == pytest.approx(ema_debiased(np.mean(FORK, axis=0), 0.6)[0].tolist())


def test_grouped_compare_reads_every_run_once_bounded_and_the_runs_view_is_unchanged(tmp_path):
    from forksight.compose.local import LocalSink
    from forksight.dashboard.pages.compare import compare_runs, group_options, grouped_runs, overlay

    first = None
    sinks = []
    for strategy, table in (("fork", FORK), ("all", ALL)):
        for seed, values in enumerate(table):
            sink = LocalSink(str(tmp_path / "g.duckdb") if first is None else "",
                             f"{strategy}-s{seed}", strategy=strategy, alerts=False,
                             store=None if first is None else first.store,
                             config={"seed": seed, "lr": 1e-3})
            first = first or sink
            for step in range(40):        # 40 steps: the value of step s is values[s % 4]
                sink.log_scalars(step, {"reward/mean": values[step % 4]})
            sink.flush()
            sinks.append(sink)
    reader = first.store.reader
    ids = [s.run_id for s in sinks]
    fig = grouped_runs(reader, ids, panels=["reward/mean"], max_points=5)
    means = of_role(fig, "group-mean")
    assert sorted(m["meta"]["group"] for m in means) == ["all", "fork"]
    for m in means:
        table = FORK if m["meta"]["group"] == "fork" else ALL
        assert len(m["x"]) <= 5                                       # the read's bound
        assert m["y"] == pytest.approx([np.mean([r[s % 4] for r in table]) for s in m["x"]])
    assert [o["value"] for o in group_options(reader, ids)] == ["strategy", "seed", "lr"]
    runs_view, _ = overlay(reader, ids[:3], 0.0, ["reward/mean"], [], "step", "runs")
    before = compare_runs(reader, ids[:3], 0.0, panels=["reward/mean"])
    assert [t["meta"] for t in runs_view["data"]] == [t["meta"] for t in before["data"]]
    for sink in sinks:
        sink.finish()


def test_the_t_quantile_without_scipy_matches_scipys():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 29, 30, 31, 35, 60, 500):
        assert G.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-6)
    with pytest.raises(ValueError, match="degrees of freedom"):
        G.t975(0)
