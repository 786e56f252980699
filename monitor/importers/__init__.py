"""Runs logged elsewhere, read as forksight steps (torch-free): TRL's trainer_state.json or a
checkpoint directory, a TensorBoard log directory, a W&B offline run, verl's file-logger JSONL, any
JSONL or CSV of step dicts; TRL's completions log as samples, prime-rl's token export as tokens.
Framework keys are mapped to forksight's (aliases.py); unknown keys keep their names."""
from forksight.monitor.importers.aliases import canonical
from forksight.monitor.importers.readers import ImportedRun, SourceError, read_source

__all__ = ["ImportedRun", "SourceError", "canonical", "read_source"]
