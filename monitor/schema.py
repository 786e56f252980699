"""Wire models of the collector's HTTP API and its explicit limits (one place to read them).

Everything a client sends is validated here before anything is stored: strict types, finite
numbers only, bounded strings and row counts. A request that breaks a limit is refused whole
(nothing partial is stored) with a 4xx that names the field.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# ---------------------------------------------------------------------------- limits
MAX_BODY_BYTES = 64 * 1024 * 1024      # one request body (JSON or Arrow IPC); larger -> 413
MAX_TOKEN_ROWS = 2_000_000             # per-token rows in one batch
MAX_SCALAR_ROWS = 100_000              # scalar rows in one batch
MAX_SAMPLE_ROWS = 20_000               # sample rows in one batch
MAX_HISTOGRAMS = 10_000                # histograms in one batch
MAX_BINS = 10_000                      # bins in one histogram
MAX_KEY_CHARS = 200                    # scalar / histogram key
NONFINITE_PREFIX = "nonfinite/"         # sinks send nonfinite/<key> = 0 (NaN), 1 (+inf), -1 (-inf) in place of a non-finite <key>
MAX_TEXT_CHARS = 64 * 1024             # prompt, completion
MAX_TOKEN_CHARS = 1024                 # one decoded token's text
MAX_SHORT_CHARS = 200                  # project, strategy, model, source, detector ...
MAX_CONFIG_CHARS = 256 * 1024          # a run's config, serialised as JSON
MAX_STEP = 2**62
MAX_RANK = 65_535
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"   # also what a run name must look like
BATCH_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
RUN_ID_RE = re.compile(RUN_ID_PATTERN)
BATCH_ID_RE = re.compile(BATCH_ID_PATTERN)

# Per-token columns: name -> (arrow type name, required). Arrow IPC bodies and JSON token
# blocks both follow this; the store's tokens table has the same columns plus run_id.
TOKEN_COLUMNS: dict[str, tuple[str, bool]] = {
    "step": ("int64", True),
    "sample_id": ("int64", True),
    "pos": ("int32", True),
    "token_id": ("int32", False),
    "token": ("string", False),
    "entropy": ("float32", False),
    "renyi2": ("float32", False),
    "js": ("float32", False),
    "logp": ("float32", False),
    "top1": ("float32", False),
    "fork": ("bool", False),
    "selected": ("bool", False),
}

ARROW_MEDIA_TYPE = "application/vnd.apache.arrow.stream"


def slug_run_name(text: str) -> str:
    """The nearest valid run id: runs of other characters become '-' (e.g. an output dir path)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-._")[:128]
    return slug or "run"

Step = Annotated[int, Field(ge=0, lt=MAX_STEP)]
Rank = Annotated[int, Field(ge=0, le=MAX_RANK)]
Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)]
Short = Annotated[str, Field(max_length=MAX_SHORT_CHARS)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class _Strict(BaseModel):
    # strict: "1.5" is not a number; finite only: NaN/inf are refused with the field's name
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


# ---------------------------------------------------------------------------- runs
class RunCreate(_Strict):
    """POST /api/runs: create a run (name unless taken), join a live one, or upsert by id."""

    name: str = Field(pattern=RUN_ID_PATTERN, description="run name; becomes the run id unless taken")
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN,
                               description="exact id: create it, or update it when it exists")
    join: bool = Field(False, description="join the newest live run with this name (ranks > 0); 404 when none")
    project: Short = "default"
    strategy: Short | None = None
    model: Short | None = None
    config: dict[str, Any] | None = Field(None, description="free JSON, at most 256 KiB serialised")

    @field_validator("config")
    @classmethod
    def _config_size(cls, value: dict | None) -> dict | None:
        import json

        if value is not None:
            try:
                text = json.dumps(value, allow_nan=False)
            except ValueError as exc:
                raise ValueError(f"config must be plain JSON with finite numbers ({exc})") from None
            if len(text) > MAX_CONFIG_CHARS:
                raise ValueError(f"config is {len(text)} chars serialised; the limit is {MAX_CONFIG_CHARS}")
        return value


class RunUpdate(_Strict):
    """PATCH /api/runs/{id}: change status or metadata."""

    status: str | None = Field(None, pattern=r"^(live|finished|crashed|failed|stopped)$")
    strategy: Short | None = None
    model: Short | None = None
    config: dict[str, Any] | None = None


# ---------------------------------------------------------------------------- records
class ScalarRow(_Strict):
    step: Step
    key: Key
    value: float
    weight: float | None = Field(None, ge=0, description="token count, for the rank merge")
    wall_time: float | None = None


class SampleRow(_Strict):
    step: Step
    sample_id: int = Field(ge=0)
    group_id: int | None = Field(None, ge=0)
    prompt: Text | None = None
    completion: Text | None = None
    reward: float | None = None
    correct: bool | None = None
    length: int | None = Field(None, ge=0)
    source: Short | None = None


class HistogramRow(_Strict):
    step: Step
    key: Key
    counts: list[Annotated[float, Field(ge=0)]] = Field(min_length=1, max_length=MAX_BINS)
    edges: list[float] = Field(min_length=2, max_length=MAX_BINS + 1)

    @model_validator(mode="after")
    def _edges_fit(self) -> "HistogramRow":
        if len(self.edges) != len(self.counts) + 1:
            raise ValueError(f"edges must have len(counts)+1 = {len(self.counts) + 1} values, got {len(self.edges)}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError("edges must be strictly increasing")
        return self


class TokenBlock(_Strict):
    """Per-token rows of one step as equal-length columns (JSON; Python clients send Arrow)."""

    step: Step
    sample_id: list[Annotated[int, Field(ge=0)]]
    pos: list[Annotated[int, Field(ge=0)]]
    token_id: list[int] | None = None
    token: list[Annotated[str, Field(max_length=MAX_TOKEN_CHARS)]] | None = None
    entropy: list[float] | None = None
    renyi2: list[float] | None = None
    js: list[float] | None = None
    logp: list[float] | None = None
    top1: list[float] | None = None
    fork: list[bool] | None = None
    selected: list[bool] | None = None

    @model_validator(mode="after")
    def _equal_lengths(self) -> "TokenBlock":
        n = len(self.sample_id)
        for name in TOKEN_COLUMNS:
            col = getattr(self, name)
            if name != "step" and col is not None and len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} values, sample_id has {n}: columns must be equal length")
        return self


class Batch(_Strict):
    """POST /api/runs/{id}/ingest: one idempotent batch; the same batch_id is stored once."""

    batch_id: str = Field(pattern=BATCH_ID_PATTERN)
    rank: Rank = 0
    scalars: list[ScalarRow] = Field(default_factory=list, max_length=MAX_SCALAR_ROWS)
    samples: list[SampleRow] = Field(default_factory=list, max_length=MAX_SAMPLE_ROWS)
    histograms: list[HistogramRow] = Field(default_factory=list, max_length=MAX_HISTOGRAMS)
    tokens: list[TokenBlock] = Field(default_factory=list, max_length=MAX_HISTOGRAMS)

    @model_validator(mode="after")
    def _token_rows(self) -> "Batch":
        n = sum(len(b.sample_id) for b in self.tokens)
        if n > MAX_TOKEN_ROWS:
            raise ValueError(f"{n} token rows in one batch; the limit is {MAX_TOKEN_ROWS}: split the batch")
        return self


def limits() -> dict[str, Any]:
    """The limits above as a dict (served by GET /api/health for clients to size batches)."""
    return {
        "max_body_bytes": MAX_BODY_BYTES, "max_token_rows": MAX_TOKEN_ROWS,
        "max_scalar_rows": MAX_SCALAR_ROWS, "max_sample_rows": MAX_SAMPLE_ROWS,
        "max_histograms": MAX_HISTOGRAMS, "max_bins": MAX_BINS, "max_key_chars": MAX_KEY_CHARS,
        "max_text_chars": MAX_TEXT_CHARS, "max_token_chars": MAX_TOKEN_CHARS,
        "run_id_pattern": RUN_ID_PATTERN, "batch_id_pattern": BATCH_ID_PATTERN,
    }
