"""The four trackers writing local files in a test, and their own readers: the environment that points
each at a folder (W&B offline, trackio's SQLite store, MLflow's file store, TensorBoard's event files),
W&B's offline run file read with wandb's DataStore, trackio's store read with its SQLiteStorage (in a
subprocess: trackio reads TRACKIO_DIR when it is imported)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path


def tracker_env(out: Path, **extra: str) -> dict:
    """os.environ with every tracker writing under `out`."""
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(out), "WANDB_SILENT": "true",
            "MLFLOW_TRACKING_URI": (out / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true",
            "TRACKIO_DIR": str(out / "trackio"), "TENSORBOARD_LOGGING_DIR": str(out / "tb"),
            "HF_HUB_OFFLINE": "1", **extra}


def wandb_records(out: Path) -> tuple[list[dict], list[tuple[str, str, str]]]:
    """(each history row as {key: value}, each alert as (title, text, level)) of the offline run."""
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal.datastore import DataStore

    store = DataStore()
    store.open_for_scan(glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))[0])
    rows, alerts = [], []
    while (data := store.scan_data()) is not None:
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
        elif kind == "alert":
            alerts.append((record.alert.title, record.alert.text, record.alert.level))
    return rows, alerts


def wandb_html(out: Path) -> list[str]:
    """The HTML media files of the offline run (forksight's token views)."""
    return glob.glob(str(out / "wandb" / "offline-run-*" / "files" / "media" / "html" / "forksight" / "*.html"))


def trackio_read(out: Path, project: str, run: str) -> dict:
    """{"logs": the run's rows, "alerts": the project's alerts} from trackio's own store."""
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps({'logs': S.get_logs(sys.argv[1], sys.argv[2]), 'alerts': S.get_alerts(sys.argv[1])},"
            " default=str))")
    done = subprocess.run([sys.executable, "-c", code, project, run], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TRACKIO_DIR": str(out / "trackio")})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
