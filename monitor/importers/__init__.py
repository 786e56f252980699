"""Runs logged elsewhere, read as forksight steps (torch-free): TRL's trainer_state.json or a
checkpoint directory, a TensorBoard log directory, verl's file-logger JSONL, any JSONL or CSV of
step dicts. Framework keys are mapped to forksight's (aliases.py); unknown keys keep their names."""
from forksight.monitor.importers.aliases import canonical
from forksight.monitor.importers.readers import ImportedRun, SourceError, read_source

__all__ = ["ImportedRun", "SourceError", "canonical", "read_source"]
