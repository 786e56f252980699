"""`forksight train --report-to wandb,trackio,mlflow,tensorboard` (issue 47, item 1): the bundled trainer
opens each tracker's run itself and writes, at its own step, forksight's scalars under `forksight/`
(equal, step for step, to what forksight stored), every alert (an alert configured to fire from step
2) and a token view every 2nd step — each read back by the tracker's own reader from local files (W&B
offline, trackio's SQLite store, MLflow's client, TensorBoard's event reader). A tracker name forksight
does not write into is refused before the run starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tracker_util import tracker_env, trackio_read, wandb_html, wandb_records

pytestmark = pytest.mark.slow
STEPS = [1, 2, 3, 4]
KEYS = ("entropy/mean", "fork/frac", "reward/mean")


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    from forksight.monitor.collector.store import Store

    out = tmp_path_factory.mktemp("trainer-trackers")
    (out / "alerts.json").write_text(json.dumps({"collapse": {"floor": 50.0, "warmup_steps": 2,
                                                              "baseline_steps": 1, "persist": 1}}))
    env = tracker_env(out, FORKSIGHT_ALERTS_CONFIG=str(out / "alerts.json"))
    done = subprocess.run([sys.executable, "-m", "forksight", "train", "--preset", "tiny-test", "--task", "collapse",
                           "--lr", "0.03", "--max-new-tokens", "6", "--steps", "4", "--run", "own", "--project",
                           "fs-test", "--db", str(out / "runs.duckdb"), "--report-to",
                           "wandb,trackio,mlflow,tensorboard", "--report-tokens-every", "2", "--token-groups", "2"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]
    with Store(str(out / "runs.duckdb"), verify=False) as store:
        scalars = store.reader.read_scalars("own", keys=list(KEYS))
        alerts = store.reader.read_alerts("own")
    assert len(alerts) and "entropy_collapse" in set(alerts.detector)
    return out, {(k, int(s)): float(v) for k, s, v in zip(scalars.key, scalars.step, scalars.value)}


def _check(stored: dict, found: dict, rel: float = 1e-9) -> None:
    for key in KEYS:
        for step in STEPS:
            assert found[(key, step)] == pytest.approx(stored[(key, step)], rel=rel), (key, step)


def test_wandb(reported):
    out, stored = reported
    rows, alerts = wandb_records(out)
    found = {(name[len("forksight/"):], int(row["_step"])): value for row in rows for name, value in row.items()
             if name.startswith("forksight/") and isinstance(value, (int, float))}
    _check(stored, found)
    assert any("entropy_collapse" in title for title, _, _ in alerts)
    assert len(wandb_html(out)) == 2


def test_trackio(reported):
    out, stored = reported
    read = trackio_read(out, "fs-test", "own")
    found = {(k[len("forksight/"):], int(row["step"])): v for row in read["logs"] for k, v in row.items()
             if k.startswith("forksight/") and isinstance(v, (int, float))}
    _check(stored, found)
    assert any("entropy_collapse" in a["title"] for a in read["alerts"])
    assert sorted(int(row["step"]) for row in read["logs"] if "forksight/tokens" in row) == [2, 4]


def test_mlflow(reported):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    out, stored = reported
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    run = client.search_runs([client.get_experiment_by_name("fs-test").experiment_id])[0]
    assert run.info.run_name == "own" and run.data.params["lr"] == "0.03"
    found = {(key, m.step): m.value for key in KEYS for m in client.get_metric_history(run.info.run_id, f"forksight/{key}")}
    _check(stored, found)
    assert any("entropy_collapse" in a.path for a in client.list_artifacts(run.info.run_id, "forksight/alerts"))
    assert [a.path for a in client.list_artifacts(run.info.run_id, "forksight/tokens")] == \
        ["forksight/tokens/step-0000002.html", "forksight/tokens/step-0000004.html"]


def test_tensorboard(reported):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, stored = reported
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    found = {(key, e.step): e.value for key in KEYS for e in events.Scalars(f"forksight/{key}")}
    _check(stored, found, rel=1e-6)                                     # TensorBoard keeps float32
    assert b"entropy_collapse" in b"".join(t.tensor_proto.string_val[0]
                                           for t in events.Tensors("forksight/alerts/text_summary"))
    assert [v.step for v in events.Tensors("forksight/tokens/text_summary")] == [2, 4]


def test_an_unknown_tracker_is_refused_before_the_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "forksight", "train", "--preset", "tiny-test", "--db",
                           str(tmp_path / "x.duckdb"), "--report-to", "wandb,comet"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode != 0 and "report_to names ['comet']" in done.stderr
    assert not (tmp_path / "x.duckdb").exists()
