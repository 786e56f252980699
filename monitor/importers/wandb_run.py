"""A W&B offline run directory (wandb/offline-run-*/run-<id>.wandb), read with wandb's own reader.

What the file is, from its writer: wandb-core appends every Record (wandb/proto/wandb_internal.proto)
to run-<id>.wandb in W&B's LevelDB-style log; each `wandb.log` is a `history` record whose items
carry the key (`key`, or `nested_key` parts joined by "/") and the value as JSON (`value_json`,
NaN and Infinity spelled as Python's json writes them), with `_step` among them. The `run` record
holds the run's name and config. wandb.sdk.internal.datastore.DataStore reads the log (wandb up to
0.29 ships it; 0.30 left only the Go core's reader), wandb_internal_pb2.Record each entry."""
from __future__ import annotations

import json
from pathlib import Path

from forksight.monitor.importers.run import ImportedRun, SourceError, Builder, step_of

EXPECTED = "a W&B offline run directory (wandb/offline-run-*/ holding one run-<id>.wandb file)"
_HIDDEN = ("_timestamp", "_runtime", "_step", "_wandb")


def wandb_files(path: Path) -> list[Path]:
    """The .wandb log files a path names: the file, a run directory, or a wandb/ directory above runs."""
    if path.is_file():
        return [path] if path.suffix == ".wandb" else []
    found = sorted(path.glob("run-*.wandb"))
    if found:
        return found
    for runs in (path.glob("offline-run-*"), path.glob("run-*"), path.glob("wandb/offline-run-*")):
        found = sorted(f for d in runs if d.is_dir() for f in d.glob("run-*.wandb"))
        if found:
            return found
    return []


def _value(text: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None


def _config(update) -> dict:
    out = {}
    for item in update:
        key = item.key or "/".join(item.nested_key)
        if key and not key.startswith("_"):
            out[key] = _value(item.value_json)
    return out


def _trainer_step(entry: dict) -> int | None:
    # HF Trainer's WandbCallback logs train/global_step beside W&B's own _step counter: the trainer's
    # step comes first, so the run lines up with its trainer_state.json and completions log
    for key in ("train/global_step", "trainer/global_step", "global_step", "step"):
        found = step_of({"step": entry.get(key)})
        if found is not None:
            return found
    return step_of(entry)


def read_wandb(path: Path) -> ImportedRun:
    files = wandb_files(path)
    if not files:
        raise SourceError(f"{path} holds no run-*.wandb file; expected {EXPECTED}")
    if len(files) > 1:
        listed = ", ".join(str(f.parent.name) for f in files[:10])
        raise SourceError(f"{path} holds {len(files)} W&B runs ({listed}); pass one offline-run-* directory")
    try:
        from wandb.proto import wandb_internal_pb2 as pb
        from wandb.sdk.internal.datastore import DataStore
    except ImportError:
        raise SourceError(f"{files[0]} is a W&B run log; reading it needs wandb < 0.30 (the releases whose "
                          "Python package ships the .wandb reader): pip install 'wandb<0.30' or "
                          "pip install 'forksight[dev]'") from None
    store = DataStore()
    try:
        store.open_for_scan(str(files[0]))
    except Exception as exc:   # wandb raises AssertionError / its own errors on a bad header
        raise SourceError(f"{files[0]} is not a W&B run log ({exc}); expected {EXPECTED}") from None
    out, name, config, damaged = Builder(files[0].parent.name, "wandb"), None, {}, None
    while True:
        try:
            data = store.scan_data()
        except Exception as exc:   # a log cut short by a crash: keep what came before
            damaged = str(exc)
            break
        if data is None:
            break
        record = pb.Record()
        try:
            record.ParseFromString(data)
        except Exception:
            continue
        kind = record.WhichOneof("record_type")
        if kind == "run":
            name = record.run.display_name or record.run.run_id or None
            config.update(_config(record.run.config.update))
        elif kind == "config":
            config.update(_config(record.config.update))
        elif kind == "history":
            entry = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if key:
                    entry[key] = _value(item.value_json)
            step = _trainer_step(entry)
            if step is None and record.history.HasField("step"):
                step = int(record.history.step.num)
            if step is not None:
                out.add_row(step, {k: v for k, v in entry.items() if k not in _HIDDEN})
    run = out.done()
    run.name = name or run.name
    run.config = {k: v for k, v in config.items() if isinstance(v, (int, float, str, bool))}
    if damaged:
        run.config["import_note"] = f"log ended early: {damaged}"
    if not run.steps:
        raise SourceError(f"{files[0]} holds no logged step (no wandb.log history); expected {EXPECTED}")
    return run
