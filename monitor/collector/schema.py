"""Wire models of the collector's HTTP API; row fields come from the table specs (forksight.base.tables)
and limits from forksight.base.limits: strict types, finite numbers, bounded strings and counts. A
request that breaks one is refused whole with a 4xx naming the field."""
from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from forksight.base.limits import (
    BATCH_ID_PATTERN, MAX_BINS, MAX_HISTOGRAMS, MAX_RANK, MAX_REFERENCE_ROWS, MAX_SAMPLE_ROWS,
    MAX_SCALAR_ROWS, MAX_SHORT_CHARS, MAX_TOKEN_BLOCKS, MAX_TOKEN_ROWS, RUN_ID_PATTERN,
)
from forksight.base.runspec import RunConfig
from forksight.base.tables import HISTOGRAMS, PROBES, REFERENCE, SAMPLES, SCALARS, TOKEN_COLUMNS, Table

Rank = Annotated[int, Field(ge=0, le=MAX_RANK)]
Short = Annotated[str, Field(max_length=MAX_SHORT_CHARS)]


class _Strict(BaseModel):
    # strict: "1.5" is not a number; finite only: NaN/inf are refused with the field's name
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


def _field(column, wire_type: Any) -> tuple[Any, Any]:
    if column.required:
        return wire_type, Field(description=column.help)
    return Optional[wire_type], Field(None, description=column.help)


def _row_model(name: str, table: Table, doc: str) -> type[_Strict]:
    """A strict model with one field per wire column of `table`."""
    fields = {c.name: _field(c, c.wire_type()) for c in table.wire_columns()}
    return create_model(name, __base__=_Strict, __doc__=doc, **fields)


# ---------------------------------------------------------------------------- runs
class _RunMeta(_Strict):
    strategy: Short | None = None
    model: Short | None = None
    config: RunConfig = None      # one rule for POST and PATCH, as for a RunSpec


class RunCreate(_RunMeta):
    """POST /api/runs: create a run (name unless taken), join a live one, or upsert by id."""

    name: str = Field(pattern=RUN_ID_PATTERN, description="run name; becomes the run id unless taken")
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN,
                               description="exact id: create it, or update it when it exists")
    join: bool = Field(False, description="join the newest live run with this name (ranks > 0); 404 when none")
    project: Short = "default"


class RunUpdate(_RunMeta):
    """PATCH /api/runs/{id}: change status or metadata."""

    status: str | None = Field(None, pattern=r"^(live|finished|crashed|failed|stopped)$")


# ---------------------------------------------------------------------------- records
ScalarRow = _row_model("ScalarRow", SCALARS, "One per-step number.")
SampleRow = _row_model("SampleRow", SAMPLES, "One trajectory with its verification result.")
ProbeRow = _row_model("ProbeRow", PROBES, "One probed token: Monte-Carlo values before and after it.")
ReferenceRow = _row_model("ReferenceRow", REFERENCE, "One token of the reference set, re-scored at a step.")


class _HistogramBase(_Strict):
    counts: list[Annotated[float, Field(ge=0)]] = Field(min_length=1, max_length=MAX_BINS)
    edges: list[float] = Field(min_length=2, max_length=MAX_BINS + 1)

    @model_validator(mode="after")
    def _edges_fit(self):
        if len(self.edges) != len(self.counts) + 1:
            raise ValueError(f"edges must have len(counts)+1 = {len(self.counts) + 1} values, got {len(self.edges)}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError("edges must be strictly increasing")
        return self


HistogramRow = create_model(
    "HistogramRow", __base__=_HistogramBase, __doc__="One histogram: counts over edges.",
    **{c.name: _field(c, c.wire_type()) for c in HISTOGRAMS.wire_columns()})


class _TokenBlockBase(_Strict):
    @model_validator(mode="after")
    def _equal_lengths(self):
        n = len(self.sample_id)
        for name in TOKEN_COLUMNS:
            col = getattr(self, name)
            if name != "step" and col is not None and len(col) != n:
                raise ValueError(f"column {name!r} has {len(col)} values, sample_id has {n}: columns must be equal length")
        return self


TokenBlock = create_model(
    "TokenBlock", __base__=_TokenBlockBase,
    __doc__="Per-token rows of one step as equal-length columns (JSON; Python clients send Arrow).",
    **{name: _field(c, c.wire_type() if name == "step" else list[c.wire_type()])
       for name, c in TOKEN_COLUMNS.items()})


def inline_json_schema(model: type[BaseModel]) -> dict:
    """`model`'s JSON schema with its `$defs` inlined, for an OpenAPI request body: there a
    '#/$defs/...' reference resolves against the whole document, which has none."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            return inline(defs[ref.rsplit("/", 1)[-1]]) if ref.startswith("#/$defs/") else \
                {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node
    return inline(schema)


class Batch(_Strict):
    """POST /api/runs/{id}/ingest: one idempotent batch; the same batch_id is stored once."""

    batch_id: str = Field(pattern=BATCH_ID_PATTERN)
    rank: Rank = 0
    scalars: list[ScalarRow] = Field(default_factory=list, max_length=MAX_SCALAR_ROWS)
    samples: list[SampleRow] = Field(default_factory=list, max_length=MAX_SAMPLE_ROWS)
    histograms: list[HistogramRow] = Field(default_factory=list, max_length=MAX_HISTOGRAMS)
    tokens: list[TokenBlock] = Field(default_factory=list, max_length=MAX_TOKEN_BLOCKS)
    probes: list[ProbeRow] = Field(default_factory=list, max_length=MAX_SAMPLE_ROWS)
    reference: list[ReferenceRow] = Field(default_factory=list, max_length=MAX_REFERENCE_ROWS)

    @model_validator(mode="after")
    def _token_rows(self) -> "Batch":
        n = sum(len(b.sample_id) for b in self.tokens)
        if n > MAX_TOKEN_ROWS:
            raise ValueError(f"{n} token rows in one batch; the limit is {MAX_TOKEN_ROWS}: split the batch")
        return self
