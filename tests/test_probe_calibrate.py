"""`forksight probe --calibrate` (issue 50, items 4 and 6): from a run's stored probes, the absolute
threshold and the per-step share whose forks best match its pivotal tokens (F1), with bootstrap
intervals — checked on probes whose pivots are exactly the tokens above a known entropy, and on
ones where they are each step's top share — and `--store` making the best the run's fork_rule, read
back from the store. A run without probes, or --store alone: exit 2, nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest

from forksight.compose.cli import main
from forksight.compose.local import LocalSink
from forksight.hooks.metrics.probe_calibrate import calibrate
from forksight.monitor.collector.store import Store


def _rows(pivotal, n_steps: int = 4, per_step: int = 60, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, n_steps + 1):
        h = rng.uniform(0, 2, per_step) * step          # each step's entropies on another scale
        for i, value in enumerate(h):
            rows.append({"step": step, "sample_id": i // 20, "pos": i % 20, "entropy": float(value), "span": 1,
                         "pivotal": bool(pivotal(value, h, step)), "delta": 0.0, "k": 16})
    return rows


def test_pivots_above_a_fixed_entropy_are_found_by_that_threshold():
    out = calibrate(_rows(lambda v, h, s: v >= 1.5))
    assert out["tau"]["f1"] == 1.0 and 1.4 < out["tau"]["value"] <= 1.5
    assert out["best"].startswith("abs:") and out["tau"]["interval"][0] <= out["tau"]["value"] <= out["tau"]["interval"][1]


def test_pivots_in_each_steps_top_share_are_found_by_that_share():
    out = calibrate(_rows(lambda v, h, s: v >= np.quantile(h, 0.8)))
    assert out["q"]["value"] == 0.2 and out["q"]["f1"] == 1.0 and out["best"] == "top:0.2"
    assert out["tau"]["f1"] < 1.0                            # no one threshold fits entropies on four scales


def test_no_pivot_is_a_clear_error():
    with pytest.raises(ValueError, match="no pivotal token"):
        calibrate(_rows(lambda v, h, s: False))


@pytest.fixture()
def stored(tmp_path):
    db = str(tmp_path / "c.duckdb")
    sink = LocalSink(db, "probed", config={"temperature": 1.0})
    for step in range(1, 5):
        sink.log_probes(step, [{k: v for k, v in r.items() if k != "step"} | {"v_before": 0.5, "v_after": 0.5, "se": 0.1}
                               for r in _rows(lambda v, h, s: v >= np.quantile(h, 0.8)) if r["step"] == step])
    sink.finish()
    LocalSink(db, "bare").finish()
    return db


def test_calibrate_prints_json_and_stores_the_best_rule(stored, capsys):
    assert main(["probe", "--db", stored, "--run", "probed", "--calibrate", "--format", "json", "--store"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"tau", "q", "best"} <= set(out) and out["best"] == "top:0.2" and out["stored"] == "top:0.2"
    with Store(stored, verify=False) as store:
        config = store.reader.run("probed")["config"]
    assert config == {"temperature": 1.0, "fork_rule": "top:0.2"}          # the rest of the config kept


@pytest.mark.parametrize("args, says", [
    (["--run", "bare", "--calibrate"], "has no value probes to calibrate from"),
    (["--run", "probed", "--store"], "--store goes with --calibrate"),
    (["--run", "probed"], "probing needs --step, --model, --reward"),
])
def test_bad_input_exits_2_and_writes_nothing(stored, capsys, args, says):
    with Store(stored, verify=False) as store:
        before = (store.reader.run("probed")["config"], store.reader.row_counts("probed"))
    assert main(["probe", "--db", stored, *args]) == 2
    assert says in capsys.readouterr().err
    with Store(stored, verify=False) as store:
        assert (store.reader.run("probed")["config"], store.reader.row_counts("probed")) == before
