"""forksight inside the trackers a TRL run reports to (issue 47, items 1, 4, 5): a real GRPOTrainer
run with report_to=["wandb", "trackio", "mlflow", "tensorboard"] (W&B offline, the others writing
local files) and forksight attached, an alert firing from step 2. Read back by each tracker's own
reader — W&B's offline run file (wandb's DataStore), trackio's local store (its SQLiteStorage),
MLflow's client, TensorBoard's event reader — the `forksight/` keys equal, step for step, what
forksight stored for the run, the alert is there as the tracker's own alert (W&B, trackio) or
as a text record (TensorBoard's text, an MLflow artifact), and every 2nd step a token view of the
stored completions (entropy-coloured HTML; TensorBoard: each token with its H). mirror="none" adds nothing; a tracker
that is named but not installed is said in one line naming its package, and training goes on."""
from __future__ import annotations

import glob
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tracker_util import tracker_env, trackio_read, wandb_html, wandb_records

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
STEPS = [1, 2, 3, 4]


def _run(model: str, out: Path, mirror: str = "auto") -> None:
    done = subprocess.run([sys.executable, str(REPO / "tests" / "trackers_run.py"), model, str(out), mirror],
                          capture_output=True, text=True, timeout=600, env=tracker_env(out), cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def mirrored(tiny_model_path, tmp_path_factory):
    from forksight.monitor.collector.store import Store

    out = tmp_path_factory.mktemp("trackers")
    _run(str(tiny_model_path), out)
    with Store(str(out / "runs.duckdb"), verify=False) as store:
        scalars = store.reader.read_scalars("mirrored", keys=["entropy/mean", "fork/frac", "pass@1"])
        alerts = store.reader.read_alerts("mirrored")
    stored = {(k, int(s)): float(v) for k, s, v in zip(scalars.key, scalars.step, scalars.value)}
    assert len(alerts) and "entropy_collapse" in set(alerts.detector)
    return out, stored


def _check(stored: dict, found: dict) -> None:
    """found: (forksight key, step) -> the tracker's value."""
    for key in ("entropy/mean", "fork/frac", "pass@1"):
        for step in STEPS:
            assert found[(key, step)] == pytest.approx(stored[(key, step)], rel=1e-9), (key, step)


def test_wandb_offline_run_holds_the_keys_and_the_alert(mirrored):
    out, stored = mirrored
    rows, alerts = wandb_records(out)
    found = {(name[len("train/forksight/"):], int(row["train/global_step"])): value for row in rows
             for name, value in row.items() if name.startswith("train/forksight/")}
    _check(stored, found)
    assert any("entropy_collapse" in title and "Fix:" in text and level == "ERROR" for title, text, level in alerts)
    views = wandb_html(out)
    assert len(views) == 2 and all("class='tok" in Path(v).read_text() for v in views)     # steps 2 and 4


def test_trackio_store_holds_the_keys_and_the_alert(mirrored):
    out, stored = mirrored
    read = trackio_read(out, "forksight-test", "mirrored")
    # rows keyed by the trainer's step, as transformers' callback files it (trackio's own counter also
    # counts TRL's profiling rows)
    found = {(k[len("train/forksight/"):], int(row["train/global_step"])): v for row in read["logs"]
             for k, v in row.items() if k.startswith("train/forksight/")}
    _check(stored, found)
    assert any("entropy_collapse" in a["title"] and a["level"] == "error" for a in read["alerts"])
    assert sorted(int(row["train/global_step"]) for row in read["logs"] if "forksight/tokens" in row) == [2, 4]
    views = glob.glob(str(out / "trackio" / "media" / "forksight-test" / "mirrored" / "*" / "*.html"))
    assert len(views) == 2 and all("class='tok" in Path(v).read_text() for v in views)


def test_mlflow_run_holds_the_keys_and_the_alert_as_text(mirrored):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    out, stored = mirrored
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    run = client.search_runs(["0"])[0]
    found = {}
    for key, name in (("entropy/mean", "forksight/entropy/mean"), ("fork/frac", "forksight/fork/frac"),
                      ("pass@1", "forksight/pass_1")):          # MLflow's callback writes @ as _
        for metric in client.get_metric_history(run.info.run_id, name):
            found[(key, metric.step)] = metric.value
    _check(stored, found)
    texts = [a.path for a in client.list_artifacts(run.info.run_id, "forksight/alerts")]
    assert any("entropy_collapse" in p for p in texts)
    body = Path(client.download_artifacts(run.info.run_id, texts[0], str(out))).read_text()
    assert "Entropy collapsed" in body and "Fix:" in body
    views = [a.path for a in client.list_artifacts(run.info.run_id, "forksight/tokens")]
    assert views == ["forksight/tokens/step-0000002.html", "forksight/tokens/step-0000004.html"]


def test_tensorboard_events_hold_the_keys_and_the_alert_as_text(mirrored):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, stored = mirrored
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    found = {}
    for key in ("entropy/mean", "fork/frac", "pass@1"):
        for event in events.Scalars(f"train/forksight/{key}"):
            found[(key, event.step)] = event.value
    for key in ("entropy/mean", "fork/frac", "pass@1"):      # TensorBoard keeps float32
        for step in STEPS:
            assert found[(key, step)] == pytest.approx(stored[(key, step)], rel=1e-6)
    text = b"".join(t.tensor_proto.string_val[0] for t in events.Tensors("forksight/alerts/text_summary"))
    assert b"entropy_collapse" in text and b"Fix:" in text
    views = events.Tensors("forksight/tokens/text_summary")
    assert [v.step for v in views] == [2, 4] and all(b"**sample" in v.tensor_proto.string_val[0] for v in views)


def test_mirror_none_adds_no_key(tiny_model_path, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _run(str(tiny_model_path), tmp_path, mirror="none")
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert "train/entropy" in events.Tags()["scalars"]                   # TRL's own keys still there
    assert not [t for t in events.Tags()["scalars"] if "forksight" in t]
    assert "forksight/alerts/text_summary" not in events.Tags()["tensors"]


def test_a_tracker_named_but_not_installed_is_said_once_and_left_out(monkeypatch, caplog):
    from forksight.hooks.capture import trackers as trl_mirror

    real = trl_mirror.importlib.util.find_spec
    monkeypatch.setattr(trl_mirror.importlib.util, "find_spec",       # this machine has all four installed
                        lambda name, *a: None if name == "trackio" else real(name, *a))
    with caplog.at_level(logging.WARNING, logger="forksight.trackers"):
        assert trl_mirror.resolve(["wandb", "trackio"], []) == ["wandb"]
        assert trl_mirror.resolve("auto", ["trackio", "tensorboard"]) == ["tensorboard"]
    said = [r.getMessage() for r in caplog.records if "trackio" in r.getMessage()]
    assert said and "pip install trackio" in said[0] and "training goes on" in said[0]
    with pytest.raises(ValueError, match=r"mirror: unknown tracker\(s\) \['comet'\]"):
        trl_mirror.check(["comet"])
    assert trl_mirror.resolve("none", ["wandb"]) == [] and trl_mirror.resolve(None, ["none"]) == []


def test_the_mirrored_set_is_bounded_and_finite():
    from forksight.hooks.capture.trackers import MAX_MIRRORED, mirrored

    scalars = {"entropy/mean": 1.0, "loss": 2.0, "probe/recall/fork": 0.5, "fork/frac": float("nan"),
               **{f"pass@{k}": 0.1 for k in range(1, 200)}}
    out = mirrored(scalars)
    assert out["forksight/entropy/mean"] == 1.0 and out["forksight/probe/recall/fork"] == 0.5
    assert "forksight/loss" not in out and "forksight/fork/frac" not in out
    assert sorted(int(k.split("@")[1]) for k in out if "pass@" in k) == [1, 2, 4, 8, 16, 32, 64, 128, 199]
    nested = mirrored({"mismatch/frac_outside_2x": 0.1, "mismatch/frac_outside_2x/fork": 0.2, "fork/frac": 0.3})
    assert nested == {"forksight/mismatch/frac_outside_2x/all": 0.1, "forksight/mismatch/frac_outside_2x/fork": 0.2,
                      "forksight/fork/frac": 0.3}                    # no key is also another's folder
    many = mirrored({**scalars, **{f"mismatch/x{i}": 0.0 for i in range(100)}})
    assert len(many) == MAX_MIRRORED and "forksight/entropy/mean" in many      # the named keys first
