"""The learning rate each strategy trains at when strategies are compared (`forksight demo`):
the lr `bench/strategies.py` chose for it by one rule for all (docs/strategies.json), written to
fair_settings.json beside this file by `bench/strategies_table.py --fair`, never by hand."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SETTINGS = Path(__file__).with_name("fair_settings.json")


@lru_cache(maxsize=1)
def fair_settings() -> dict:
    """The file's content ({"presets": {preset: {strategy: {"lr": ...}}}, ...}); {} when absent."""
    if not SETTINGS.exists():
        return {}
    return json.loads(SETTINGS.read_text())


def fair_lr(preset: str, strategy: str) -> float | None:
    """The lr the sweep chose for `strategy` on `preset`'s task, or None (not measured there)."""
    found = fair_settings().get("presets", {}).get(preset, {}).get(strategy)
    return None if found is None else float(found["lr"])
