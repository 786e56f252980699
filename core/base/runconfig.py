"""What the rooms read out of a run's stored config (a dict, or its JSON text): the vocabulary
size |V| that bounds entropy by log |V| (the detectors' explosion ceiling, the charts' reference
line). The bundled trainer and the TRL and verl adapters store it as `vocab_size`."""
from __future__ import annotations

import json
import math
from typing import Any


def vocab_size_of(config: Any) -> int | None:
    """|V| from a run config (dict or JSON text), else None: missing, not a number, or ≤ 1
    (log 1 = 0 bounds nothing)."""
    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config)
        except ValueError:
            return None
    value = config.get("vocab_size") if isinstance(config, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 1:
        return None
    return int(value)
