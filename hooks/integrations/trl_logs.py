"""TRL's logged keys: which evaluation set a log belongs to, and the key a metric of that set is
filed under (used by the TRL callback's on_log and on_evaluate)."""
from __future__ import annotations


def eval_prefix(logs: dict) -> str | None:
    """The evaluation's metric prefix ("eval", or "eval_<name>" per set of a dict eval_dataset)."""
    for key in logs:
        if key.startswith("eval") and key.endswith("_runtime"):
            return key[: -len("_runtime")]
    return None


def eval_key(key: str, prefix: str | None) -> str:
    """TRL adds its own eval metrics as "eval_<metric>" whatever the set: file them under the set."""
    if prefix and prefix != "eval" and key.startswith("eval_") and not key.startswith(prefix + "_"):
        return prefix + key[len("eval"):]
    return key
