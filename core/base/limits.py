"""Every limit the collector enforces, in one torch-free place (served by GET /api/health). A
request that breaks one is refused whole with a 4xx naming the field; producers size their
batches from the same numbers."""
from __future__ import annotations

import json
import re
from typing import Any

MAX_BODY_BYTES = 64 * 1024 * 1024      # one request body (JSON or Arrow IPC); larger -> 413
MAX_DECODED_BYTES = 256 * 1024 * 1024  # one Arrow body once decompressed, dictionaries expanded
MAX_TOKEN_ROWS = 2_000_000             # per-token rows in one batch
MAX_TOKEN_BLOCKS = 10_000              # per-step token blocks in one JSON batch
MAX_READ_TOKEN_ROWS = 200_000          # token rows one dashboard read of a step takes (~40 MB)
MAX_SCALAR_ROWS = 100_000              # scalar rows in one batch
MAX_SAMPLE_ROWS = 20_000               # sample rows in one batch
MAX_HISTOGRAMS = 10_000                # histograms in one batch
MAX_REFERENCE_ROWS = 100_000           # reference rows in one batch (a set of 32 x 3,000 tokens)
MAX_BINS = 10_000                      # bins in one histogram
MAX_KEY_CHARS = 200                    # scalar / histogram key
MAX_TEXT_CHARS = 64 * 1024             # prompt, completion
MAX_TOKEN_CHARS = 1024                 # one decoded token's text
MAX_SHORT_CHARS = 200                  # project, strategy, model, source, detector ...
MAX_CONFIG_CHARS = 256 * 1024          # a run's config, serialised as JSON
MAX_CONFIG_DEPTH = 64                  # nesting of a run's config (deeper cannot be served back as JSON)
MAX_STEP = 2**62
MAX_RANK = 65_535
# sinks send nonfinite/<key> = 0 (NaN), 1 (+inf), -1 (-inf) in place of a non-finite <key>
NONFINITE_PREFIX = "nonfinite/"

# Wire form (pydantic, JSON schema): there '$' ends the text. Python's '$' also matches before a
# trailing newline ("run\n" would pass), so the compiled forms end in \Z.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"   # also what a run name must look like
BATCH_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
RUN_ID_RE = re.compile(RUN_ID_PATTERN[:-1] + r"\Z")
BATCH_ID_RE = re.compile(BATCH_ID_PATTERN[:-1] + r"\Z")


def slug_run_name(text: str) -> str:
    """The nearest valid run id: runs of other characters become '-' (e.g. an output dir path)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-._")[:128]
    return slug or "run"


def config_problem(value: Any) -> str | None:
    """What keeps `value` from being a run config the API can store and serve back, or None:
    plain JSON with finite numbers, valid Unicode text (a lone surrogate cannot be sent back),
    bounded size and nesting. The write rule, and the read side's test for configs stored
    before the rule existed."""
    try:
        text = json.dumps(value, allow_nan=False)
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:       # UnicodeEncodeError is a ValueError
        return f"config must be plain JSON with finite numbers and valid Unicode text ({exc})"
    if len(text) > MAX_CONFIG_CHARS:
        return f"config is {len(text)} chars serialised; the limit is {MAX_CONFIG_CHARS}"
    if (depth := _depth(value)) > MAX_CONFIG_DEPTH:
        return f"config nests {depth} levels deep; the limit is {MAX_CONFIG_DEPTH}"
    return None


def _depth(value: Any) -> int:
    """Levels of nested objects and arrays (a flat object is 1), counted without recursion."""
    depth, level = 0, [value]
    while level := [node for node in level if isinstance(node, (dict, list))]:
        depth += 1
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)]
    return depth


def limits() -> dict[str, Any]:
    """The limits above as a dict (served by GET /api/health for clients to size batches)."""
    return {
        "max_body_bytes": MAX_BODY_BYTES, "max_decoded_bytes": MAX_DECODED_BYTES,
        "max_token_rows": MAX_TOKEN_ROWS, "max_token_blocks": MAX_TOKEN_BLOCKS,
        "max_scalar_rows": MAX_SCALAR_ROWS, "max_sample_rows": MAX_SAMPLE_ROWS,
        "max_histograms": MAX_HISTOGRAMS, "max_reference_rows": MAX_REFERENCE_ROWS, "max_bins": MAX_BINS, "max_key_chars": MAX_KEY_CHARS,
        "max_text_chars": MAX_TEXT_CHARS, "max_token_chars": MAX_TOKEN_CHARS,
        "max_config_chars": MAX_CONFIG_CHARS, "max_config_depth": MAX_CONFIG_DEPTH,
        "max_step": MAX_STEP, "max_rank": MAX_RANK,
        "run_id_pattern": RUN_ID_PATTERN, "batch_id_pattern": BATCH_ID_PATTERN,
    }
