"""An alert's evidence is data: Alert's fields are the alerts table's columns (one declaration),
the stored row carries signal and a JSON evidence object, the numbers in it are what a float64
refit of the same steps gives, and a file written before those columns existed migrates on open."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

from forksight.base.records import Records, scalars_table
from forksight.base.tables import ALERTS
from forksight.compose.alerts_cli import replay_rows, write_rows
from forksight.monitor.alerts.detector_base import Alert
from forksight.monitor.alerts.hub import AlertMonitor, alert_row, evidence_of
from forksight.monitor.collector.store import Store

RUNS = json.loads((Path(__file__).parent / "data" / "alerts_real_runs.json").read_text())


def replay(name: str) -> list[dict]:
    run = RUNS[name]
    monitor = AlertMonitor(vocab_size=run["vocab_size"])
    out = []
    for i, step in enumerate(run["steps"]):
        row = {k: v[i] for k, v in run["columns"].items() if v[i] is not None}
        out += [alert_row("r", a, 0.0) for a in monitor.observe(step, row)]
    return out


def test_alert_fields_are_the_alerts_tables_columns():
    assert tuple(Alert.model_fields) == tuple(n for n in ALERTS.names if n not in ("run_id", "wall_time"))
    for column in ALERTS.columns:
        if column.name in Alert.model_fields:
            assert Alert.model_fields[column.name].description == column.help
            assert Alert.model_fields[column.name].is_required() == column.required
    with pytest.raises(ValueError):
        Alert(detector="x", severity="fatal", step=1, message="m", action="a")   # choices hold
    row = alert_row("r", Alert(detector="x", severity="warning", step=1, message="m", action="a"), 1.0)
    assert set(row) == set(ALERTS.names)


def test_stagnation_evidence_is_the_float64_refit_of_its_window():
    name = "nosignal-warm-s0"
    run = RUNS[name]
    [stag, *_] = [r for r in replay(name) if r["detector"] == "stagnation"]
    evidence = json.loads(stag["evidence"])
    steps = np.array(run["steps"])
    reward = np.array(run["columns"]["reward/mean"], dtype=np.float64)
    last = np.flatnonzero(steps == stag["step"])[0]
    x, y = steps[last - evidence["window"] + 1:last + 1], reward[last - evidence["window"] + 1:last + 1]
    slope, intercept = np.polyfit(x, y, 1)
    assert evidence["slope"] == pytest.approx(slope, rel=1e-4)
    assert evidence["fitted"] == pytest.approx(intercept + slope * x[-1], rel=1e-4)
    assert evidence["span"] == x[-1] - x[0] and stag["signal"] == "reward/mean"
    assert stag["value"] == pytest.approx(slope * (x[-1] - x[0]), rel=1e-4)


def test_collapse_forecast_evidence_names_its_fit():
    rows = [r for r in replay("collapse-cold-lr0.001-s0") if r["forecast"] is not None]
    assert rows
    for r in rows:
        evidence = json.loads(r["evidence"])
        assert evidence["fit"] in ("exponential", "accelerating") and 0 < evidence["r2"] <= 1
        assert evidence["window"] >= 6 and evidence["floor"] == pytest.approx(r["threshold"], rel=1e-5)
        assert r["signal"] == "entropy/mean"


def test_stored_rows_keep_signal_and_evidence(tmp_path):
    path = str(tmp_path / "a.duckdb")
    with Store(path) as store:
        run_id = store.create_run("r")
        run = RUNS["nosignal-warm-s0"]
        for i, step in enumerate(run["steps"]):
            store.write(run_id, Records(scalars=scalars_table([{"step": step, "key": k, "value": v[i]}
                                                               for k, v in run["columns"].items()
                                                               if v[i] is not None])))
        store.flush()
        rows, _ = replay_rows(store.reader, run_id, None, run["vocab_size"])
        write_rows(store, run_id, rows)
        stored = store.reader.read_alerts(run_id)
    assert len(stored) == len(rows) > 0
    assert list(stored["signal"]) == [r["signal"] for r in rows]
    assert [evidence_of(r) for r in stored.to_dict("records")] == [evidence_of(r) for r in rows]


def test_a_file_from_before_the_evidence_columns_migrates_on_open(tmp_path):
    path = str(tmp_path / "old.duckdb")
    old_columns = [c for c in ALERTS.columns if c.name not in ("signal", "evidence")]
    conn = duckdb.connect(path)
    conn.execute(f"CREATE TABLE alerts ({', '.join(f'{c.name} {c.sql}' for c in old_columns)})")
    stagnation = ("Stagnation: `reward/mean` gained +0.0040 (at most +0.0100 at 1.64 standard errors) over the "
                  "last 100 steps (now ≈0.312; plateau below +0.02) while pass@1 is 0.300 < target 0.9. "
                  "[signal `reward/mean` = 0.004, threshold 0.02] Fix: check the reward function.")
    collapse = "Entropy collapsed. [signal `entropy/mean` = 0.01, threshold 0.05] Fix: x."
    conn.execute("INSERT INTO alerts (run_id, step, detector, severity, message, value, threshold, action) VALUES "
                 "('r', 180, 'stagnation', 'warning', ?, 0.004, 0.02, 'a'), "
                 "('r', 50, 'entropy_collapse', 'critical', ?, 0.01, 0.05, 'a'), "
                 "('r', 60, 'custom', 'warning', 'no evidence here', NULL, NULL, 'a')", [stagnation, collapse])
    conn.close()
    with Store(path) as store:
        stored = store.reader.read_alerts("r").set_index("step")
    assert stored.loc[180, "signal"] == "reward/mean" and stored.loc[50, "signal"] == "entropy/mean"
    assert json.loads(stored.loc[180, "evidence"]) == {"window": 100, "fitted": 0.312}
    assert pd.isna(stored.loc[50, "evidence"]) and pd.isna(stored.loc[60, "signal"])
