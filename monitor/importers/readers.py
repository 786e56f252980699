"""One reader per format, each returning the run as steps of {forksight key: value}. What each
format is, from its writer: TRL's Trainer saves TrainerState.log_history (a list of the dicts it
logged, each with "step") as trainer_state.json in every checkpoint-N directory; TensorBoard's
SummaryWriter writes events.out.tfevents.* files (read with tensorboard's EventAccumulator);
verl's Tracking "file" backend (FileLogger) writes one {"step": N, "data": {...}} per line."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from forksight.monitor.importers.prime_rl import export_files, read_token_export
from forksight.monitor.importers.run import STEP_KEYS, ImportedRun, SourceError, Builder, step_of
from forksight.monitor.importers.trl_completions import completion_files, read_completions
from forksight.monitor.importers.wandb_run import read_wandb, wandb_files

EXPECTED = ("a forksight DuckDB file (with --run), a TRL trainer_state.json or checkpoint/output directory, "
            "a TensorBoard log directory (events.out.tfevents.*), a W&B offline run directory (run-*.wandb), "
            "verl's file-logger JSONL "
            '({"step": N, "data": {...}} per line), a JSONL/CSV of step dicts with a "step" column, TRL\'s '
            "completions/ parquet log (log_completions=True) or prime-rl's token_exports/ directory")


# ---------------------------------------------------------------------------- TRL
def read_trainer_state(path: Path) -> ImportedRun:
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"{path} is not readable JSON ({exc}); expected TRL's trainer_state.json") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise SourceError(f"{path} has no log_history list; expected TRL's trainer_state.json "
                          "(Trainer saves it in each checkpoint-N directory)")
    out = Builder(path.parent.name if path.name == "trainer_state.json" and path.parent.name else path.stem, "trl")
    for entry in history:
        if not isinstance(entry, dict) or "train_runtime" in entry:   # the end-of-training summary
            continue
        step = step_of(entry)
        if step is not None:
            out.add_row(step, {k: v for k, v in entry.items() if k != "epoch"})
    run = out.done()
    run.config = {k: state[k] for k in ("max_steps", "num_train_epochs", "train_batch_size", "logging_steps")
                  if k in state}
    if path.parent.name.startswith("checkpoint-"):
        run.name = path.parent.parent.name or run.name
    return run


def _trainer_state_in(directory: Path) -> Path | None:
    if (directory / "trainer_state.json").is_file():
        return directory / "trainer_state.json"
    checkpoints = [(int(m.group(1)), p) for p in directory.glob("checkpoint-*")
                   if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / "trainer_state.json").is_file()]
    return max(checkpoints)[1] / "trainer_state.json" if checkpoints else None   # the latest holds the most


# ---------------------------------------------------------------------------- TensorBoard
def _event_dirs(directory: Path) -> list[Path]:
    return sorted({p.parent for p in directory.rglob("events.out.tfevents.*") if p.is_file()})


def read_tensorboard(directory: Path) -> ImportedRun:
    try:
        from tensorboard.backend.event_processing import event_accumulator as ea
        from tensorboard.util import tensor_util
    except ImportError:
        raise SourceError(f"{directory} holds TensorBoard event files; reading them needs the `tensorboard` "
                          "package (pip install 'forksight[dev]' or pip install tensorboard)") from None
    dirs = _event_dirs(directory)
    if len(dirs) > 1:
        listed = ", ".join(str(d.relative_to(directory)) or "." for d in dirs[:10])
        raise SourceError(f"{directory} holds {len(dirs)} TensorBoard runs ({listed}); pass one of them")
    acc = ea.EventAccumulator(str(dirs[0]), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    try:
        acc.Reload()
    except Exception as exc:   # a damaged events file: tensorboard raises its own errors
        raise SourceError(f"could not read the TensorBoard events in {dirs[0]}: {exc}") from None
    name = dirs[0].name if dirs[0] != directory else directory.name
    out = Builder(name, "tensorboard")
    tags = acc.Tags()
    for tag in tags.get("scalars", []):           # SummaryWriter.add_scalar (torch, TRL, verl)
        for event in acc.Scalars(tag):
            out.add(int(event.step), tag, float(event.value))
    for tag in tags.get("tensors", []):           # tf.summary.scalar in TF2 writes rank-0 tensors
        for event in acc.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            if value.size == 1 and value.dtype.kind in "fiu":
                out.add(int(event.step), tag, float(value.reshape(())))
    return out.done()


# ---------------------------------------------------------------------------- JSONL / CSV
def read_jsonl(path: Path) -> ImportedRun:
    out, kind, bad = Builder(path.stem, "jsonl"), None, 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                bad += 1
                if number == 1:
                    raise SourceError(f"{path} line 1 is not JSON; expected {EXPECTED}") from None
                continue        # a line cut short by a crash: keep the rest
            if not isinstance(entry, dict):
                continue
            data = entry.get("data")
            if isinstance(data, dict) and "step" in entry:        # verl's FileLogger
                kind = "verl"
                step = step_of(entry)
            else:
                data, step = entry, step_of(entry)
            if step is not None:
                out.add_row(step, data)
    out.run.kind = kind or "jsonl"
    run = out.done()
    if not run.steps:
        raise SourceError(f"{path} has no line with a step ({', '.join(STEP_KEYS[:3])}); expected {EXPECTED}")
    return run


def read_csv(path: Path) -> ImportedRun:
    out = Builder(path.stem, "csv")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        if not any(k in header for k in STEP_KEYS):
            raise SourceError(f"{path} has no step column (one of {', '.join(STEP_KEYS[:4])}); header: "
                              f"{', '.join(header[:10]) or '(empty)'}")
        for row in reader:
            parsed = {}
            for k, v in row.items():
                try:
                    parsed[k] = float(v) if v not in (None, "") else None
                except ValueError:
                    pass
            step = step_of(parsed)
            if step is not None:
                out.add_row(step, {k: v for k, v in parsed.items() if v is not None})
    return out.done()


# ---------------------------------------------------------------------------- dispatch
def read_source(source: str | Path, fork_rule=None) -> ImportedRun:
    """Read a logged run from a file or directory, whichever format it is; SourceError says what
    was expected when it is none of them. A TRL output directory's completions log comes along
    as samples; prime-rl's token export as tokens (with per-step means as steps)."""
    path = Path(source)
    if path.exists() and export_files(path):
        return read_token_export(path, fork_rule)      # per-token entropies: forks under the rule
    completions = completion_files(path) if path.exists() else []
    if completions and (path.is_file() or path.name == "completions"):
        run = ImportedRun(path.parent.name if path.name == "completions" else path.stem, "trl-completions")
    elif completions and _trainer_state_in(path) is None:
        run = ImportedRun(path.name, "trl-completions")
    else:
        run = _read(path)
    if completions:
        run.samples, reward_columns = read_completions(path)
        run.config.setdefault("reward_functions", reward_columns)
    return run


def _read(path: Path) -> ImportedRun:
    if not path.exists():
        raise SourceError(f"{path} does not exist; expected {EXPECTED}")
    if path.is_dir():
        state = _trainer_state_in(path)
        if state is not None:
            return read_trainer_state(state)
        if _event_dirs(path):
            return read_tensorboard(path)
        if wandb_files(path):
            return read_wandb(path)
        logs = sorted(path.glob("*.jsonl"))
        if len(logs) == 1:
            return read_jsonl(logs[0])
        raise SourceError(f"{path} holds no trainer_state.json, checkpoint-N/, TensorBoard events or single "
                          f"JSONL log; expected {EXPECTED}")
    if path.name == "trainer_state.json" or path.suffix == ".json":
        return read_trainer_state(path)
    if path.suffix in (".jsonl", ".ndjson"):
        return read_jsonl(path)
    if path.suffix in (".csv", ".tsv"):
        return read_csv(path)
    if path.suffix == ".wandb":
        return read_wandb(path)
    if path.name.startswith("events.out.tfevents"):
        return read_tensorboard(path.parent)
    raise SourceError(f"{path}: unknown kind of file; expected {EXPECTED}")
