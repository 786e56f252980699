"""One declaration per stored table (torch-free): the DuckDB DDL, the Arrow schemas, the wire
fields and the sinks' known fields are generated from it. Change a column here and every path
(SQL, Arrow inserts, HTTP validation, sinks) follows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import pyarrow as pa
from pydantic import Field

from forksight.base.limits import (
    MAX_KEY_CHARS, MAX_SHORT_CHARS, MAX_STEP, MAX_TEXT_CHARS, MAX_TOKEN_CHARS,
)

_SQL = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.float64(): "DOUBLE",
        pa.float32(): "FLOAT", pa.bool_(): "BOOLEAN"}


@dataclass(frozen=True)
class Column:
    """One column: its stored type and, when producers send it, the wire constraint."""

    name: str
    arrow: pa.DataType
    help: str
    required: bool = False       # every row must carry it
    wire: bool = True            # False: set by the collector (run_id, rank) or a wire shape of its own
    ge: int | float | None = None
    lt: int | None = None
    max_chars: int | None = None
    min_chars: int | None = None
    choices: tuple[str, ...] = ()   # the only values a text column takes (e.g. an alert's severity)
    json: bool = False              # text holding a JSON object; a record built from the table holds the dict

    @property
    def sql(self) -> str:
        return _SQL[self.arrow]

    def wire_type(self) -> Any:
        """The pydantic type of one value on the wire; integers also bounded by their stored width."""
        if pa.types.is_integer(self.arrow):
            bits = self.arrow.bit_width
            low = -(2 ** (bits - 1)) if self.ge is None else max(self.ge, -(2 ** (bits - 1)))
            high = 2 ** (bits - 1) if self.lt is None else min(self.lt, 2 ** (bits - 1))
            return Annotated[int, Field(ge=low, lt=high)]
        if pa.types.is_floating(self.arrow):
            return float if self.ge is None else Annotated[float, Field(ge=self.ge)]
        if pa.types.is_string(self.arrow):
            return Annotated[str, Field(min_length=self.min_chars, max_length=self.max_chars)]
        return bool


@dataclass(frozen=True)
class Table:
    """A stored table: its columns in order and its primary key."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def wire_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.wire)

    def ddl(self) -> str:
        cols = [f"{c.name} {c.sql}" for c in self.columns]
        if self.primary_key:
            cols.append(f"PRIMARY KEY ({', '.join(self.primary_key)})")
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(cols)});"

    def add_missing_columns(self) -> str:
        # files written by an older forksight lack columns added since; adding them keeps old files usable
        return "".join(f"ALTER TABLE {self.name} ADD COLUMN IF NOT EXISTS {c.name} {c.sql};"
                       for c in self.columns if c.name not in self.primary_key)

    def arrow_schema(self, run_id: bool = False) -> pa.Schema:
        """What the writer inserts; run_id is added by the INSERT itself unless asked for."""
        return pa.schema([(c.name, c.arrow) for c in self.columns if run_id or c.name != "run_id"])


def _run_id() -> Column:
    return Column("run_id", pa.string(), "the run's id", required=True, wire=False)


def _step() -> Column:
    return Column("step", pa.int64(), "training step", required=True, ge=0, lt=MAX_STEP)


def _rank() -> Column:
    return Column("rank", pa.int32(), "the producing rank (per batch on the wire)", wire=False)


def _short(name: str, help: str) -> Column:
    return Column(name, pa.string(), help, max_chars=MAX_SHORT_CHARS)


RUNS = Table("runs", (
    Column("run_id", pa.string(), "the run's id: its name unless taken (then name-2, ...)", wire=False),
    _short("name", "the name it was created with"),
    _short("project", "free grouping"),
    Column("created_at", pa.float64(), "unix seconds"),
    Column("status", pa.string(), "live, finished, crashed, failed or stopped"),
    _short("strategy", "token-selection strategy"),
    _short("model", "model name or path"),
    Column("config", pa.string(), "the run's config as JSON"),
    Column("heartbeat", pa.float64(), "unix seconds of the last sign of life"),
    Column("last_step", pa.int64(), "the largest step of the run's scalars, kept by the writer", wire=False),
    Column("first_step", pa.int64(), "the smallest step of the run's scalars, kept by the writer",
           wire=False),
), primary_key=("run_id",))

SCALARS = Table("scalars", (
    _run_id(), _step(),
    Column("key", pa.string(), "scalar name, e.g. entropy/mean", required=True, min_chars=1,
           max_chars=MAX_KEY_CHARS),
    Column("value", pa.float64(), "finite value", required=True),
    Column("wall_time", pa.float64(), "unix seconds (default: when logged)"),
    _rank(),
    Column("weight", pa.float64(), "token count, for the rank merge", ge=0),
))

TOKENS = Table("tokens", (
    _run_id(), _step(), _rank(),
    Column("sample_id", pa.int64(), "sequence id (unique across ranks)", required=True, ge=0),
    Column("pos", pa.int32(), "position in the completion", required=True, ge=0),
    Column("token_id", pa.int32(), "vocabulary id"),
    Column("token", pa.string(), "decoded token text", max_chars=MAX_TOKEN_CHARS),
    Column("entropy", pa.float32(), "Shannon entropy H (nats)"),
    Column("renyi2", pa.float32(), "Rényi-2 entropy (nats)"),
    Column("js", pa.float32(), "JS divergence to the group's mean distribution"),
    Column("logp", pa.float32(), "log p of the sampled token"),
    Column("top1", pa.float32(), "largest probability"),
    Column("fork", pa.bool_(), "H >= the fork threshold"),
    Column("selected", pa.bool_(), "the loss trained on this token"),
    Column("env", pa.bool_(), "environment text (a tool response, the next turn's header): shown in "
           "place, never sampled from the policy nor scored"),
    Column("sampler_logp", pa.float32(), "log p of the sampled token under the engine that sampled it "
           "(vLLM, SGLang, a bf16 sampler); null where unknown. logp − sampler_logp is the "
           "training–inference mismatch"),
    Column("ratio", pa.float32(), "π(y_t)/π_old(y_t) at the batch's last update, π_old the policy that sampled "
           "it (several updates per batch); null where not trained or π_old is unknown"),
    Column("tv", pa.float32(), "DPPO's binary TV |π(y_t) − π_old(y_t)| at the batch's last update; null as ratio"),
    Column("clipped", pa.bool_(), "the PPO ratio clip bound this token at that update (outside [1 − ε_low, "
           "1 + ε_high] on the side its advantage pushes); null as ratio"),
))

SAMPLES = Table("samples", (
    _run_id(), _step(), _rank(),
    Column("sample_id", pa.int64(), "sequence id (unique across ranks)", required=True, ge=0),
    Column("group_id", pa.int64(), "prompt group", ge=0),
    Column("prompt", pa.string(), "prompt text", max_chars=MAX_TEXT_CHARS),
    Column("completion", pa.string(), "completion text", max_chars=MAX_TEXT_CHARS),
    Column("reward", pa.float64(), "reward"),
    Column("correct", pa.bool_(), "verified correct"),
    Column("length", pa.int32(), "completion tokens", ge=0),
    _short("source", "where the trajectory came from (sampled, teacher, ...)"),
))

# Monte-Carlo value probes (hooks/metrics/value_probe.py): V(x, y<t) and V(x, y<=t) of one token of a
# stored completion, each the mean reward of k continuations sampled from the policy
PROBES = Table("probes", (
    _run_id(), _step(), _rank(),
    Column("sample_id", pa.int64(), "sequence id (as in tokens and samples)", required=True, ge=0),
    Column("pos", pa.int32(), "position of the probed token in the completion", required=True, ge=0),
    Column("split", pa.string(), "which completions: train (or null, rows before it existed) or eval "
           "(held-out completions, sample_id from 1e9 + their index)", choices=("train", "eval")),
    Column("span", pa.int32(), "tokens the row's values span: 1 (or null, rows before it existed) for one "
           "token, V before and after it; n > 1 for a bisection segment (positions=search) of n tokens from "
           "pos whose end values differ by less than the pivotal delta, not searched inside", ge=1),
    Column("token_id", pa.int32(), "vocabulary id of the probed token"),
    Column("token", pa.string(), "decoded token text", max_chars=MAX_TOKEN_CHARS),
    Column("fork", pa.bool_(), "the token was a fork (H >= the fork threshold)"),
    Column("entropy", pa.float64(), "Shannon entropy H of the token's distribution (nats)"),
    Column("v_before", pa.float64(), "V(x, y<t): mean reward of k continuations from before the token"),
    Column("v_after", pa.float64(), "V(x, y<=t): mean reward of k continuations from after the token"),
    Column("delta", pa.float64(), "v_after - v_before: the token's effect on the expected reward"),
    Column("se", pa.float64(), "standard error of delta: sqrt(se_before^2 + se_after^2)", ge=0),
    Column("se_before", pa.float64(), "standard error of v_before (sample; binomial for 0/1 rewards)", ge=0),
    Column("se_after", pa.float64(), "standard error of v_after", ge=0),
    Column("k", pa.int32(), "continuations per value", ge=1),
    Column("pivotal", pa.bool_(), "|delta| >= the pivot threshold and > 2 SE (the thresholds of the probe)"),
    Column("alternatives", pa.string(), "JSON list of {token_id, token, value, k}: the branch value "
           "V(x, y<t + a) of the top alternative tokens a at a fork", max_chars=16 * 1024),
))

# a fixed reference set re-scored, teacher-forced, by the policy of each step (hooks/capture/reference.py):
# the same text at every step, so a change is the policy's, not a change of what was sampled. The set's
# first step (the base) also holds its prompts' tokens, at negative positions (-len .. -1)
REFERENCE = Table("reference", (
    _run_id(), _step(), _rank(),
    Column("sample_id", pa.int64(), "reference completion id (0 .. set size - 1)", required=True, ge=0),
    Column("pos", pa.int32(), "position in the completion; negative: the prompt's tokens (the base step "
           "only)", required=True),
    Column("token_id", pa.int32(), "vocabulary id", required=True, ge=0),
    Column("token", pa.string(), "decoded token text", max_chars=MAX_TOKEN_CHARS),
    Column("entropy", pa.float32(), "Shannon entropy H of the policy at this step, at the position (nats)"),
    Column("renyi2", pa.float32(), "Rényi-2 entropy (nats)"),
    Column("logp", pa.float32(), "log p of the reference token under the policy at this step"),
    Column("fork", pa.bool_(), "H >= the run's fork threshold at this step (its fork rule over the set)"),
))

HISTOGRAMS = Table("histograms", (
    _run_id(), _step(), _rank(),
    Column("key", pa.string(), "histogram name, e.g. entropy", required=True, min_chars=1,
           max_chars=MAX_KEY_CHARS),
    Column("bin_lo", pa.float64(), "bin's lower edge", wire=False),
    Column("bin_hi", pa.float64(), "bin's upper edge", wire=False),
    Column("count", pa.float64(), "values in the bin", wire=False),
))

# forksight.monitor.alerts' Alert record is built from these columns (all but run_id and wall_time):
# one declaration for the record a detector returns and the row the store keeps
ALERTS = Table("alerts", (
    _run_id(),
    Column("step", pa.int64(), "training step whose statistics raised the alert", required=True),
    Column("wall_time", pa.float64(), "unix seconds"),
    Column("detector", pa.string(), "what fired, e.g. 'entropy_collapse'", required=True),
    Column("severity", pa.string(), "'warning' (act soon) or 'critical' (the run is being lost)",
           required=True, choices=("warning", "critical")),
    Column("message", pa.string(), "what was seen, with the numbers", required=True),
    Column("value", pa.float64(), "the (smoothed) statistic that crossed the threshold"),
    Column("threshold", pa.float64(), "the threshold it crossed"),
    Column("forecast", pa.int64(), "predicted step of the crossing, for forecasts"),
    Column("action", pa.string(), "the recommended fix", required=True),
    Column("signal", pa.string(), "the scalar key `value` belongs to: the chart the alert is drawn on"),
    Column("evidence", pa.string(), "what else the detector measured, as a JSON object: window (steps "
           "fitted), baseline, fitted parameters (slope, r2, fitted level), the conditions that held",
           json=True),
))
# files written before signal/evidence were columns kept the signal only in the message's evidence
# ("[signal `key` = ...") and stagnation's window and fitted level only in its prose: read once, here
ALERTS_BACKFILL = r"""
UPDATE alerts SET signal = regexp_extract(message, '\[signal `([^`]+)` = ', 1)
 WHERE signal IS NULL AND message LIKE '%[signal `%';
UPDATE alerts SET evidence = json_object(
    'window', TRY_CAST(regexp_extract(message, 'over the last (\d+) steps', 1) AS INTEGER),
    'fitted', TRY_CAST(regexp_extract(message, 'now ≈\s*(-?[0-9.]+(?:e[-+]?[0-9]+)?)', 1) AS DOUBLE))
 WHERE evidence IS NULL AND detector = 'stagnation' AND message LIKE '%over the last % steps%';
"""

BATCHES = Table("batches", (
    _run_id(),
    Column("batch_id", pa.string(), "the producer's idempotency key"),
    Column("received_at", pa.float64(), "unix seconds"),
    Column("digest", pa.string(), "hash of the batch's content: a reused id with other content is refused"),
), primary_key=("run_id", "batch_id"))

# the steps that hold token rows, one row each, kept by the writer: the tokens page's step list
# reads this index instead of a DISTINCT over every token row
TOKEN_STEPS = Table("token_steps", (_run_id(), _step()), primary_key=("run_id", "step"))
# the scalar keys of each run, one row each, kept by the writer: the run page's key list reads
# this instead of a DISTINCT over every scalar row of the run
SCALAR_KEYS = Table("scalar_keys", (_run_id(), Column("key", pa.string(), "scalar name", wire=False)),
                    primary_key=("run_id", "key"))
# tokens by what they are (monitor/collector/words.py): per run, step and decoded token string, kept by the
# writer from the stored token rows of each batch — only the batch's top strings by count and by fork share,
# so the table stays bounded whatever the run's length
WORDS = Table("words", (
    _run_id(), _step(),
    Column("token", pa.string(), "decoded token text ('#<id>' where none was stored)", wire=False),
    Column("count", pa.int64(), "stored occurrences at the step", wire=False),
    Column("forks", pa.int64(), "of those, forks (the stored fork flag)", wire=False),
    Column("h_count", pa.int64(), "of those, with an entropy", wire=False),
    Column("entropy_sum", pa.float64(), "sum of their entropies (nats)", wire=False),
), primary_key=("run_id", "step", "token"))


def _sum(name: str, help: str, arrow: pa.DataType = pa.float64()) -> Column:
    return Column(name, arrow, help, wire=False)


# multi-resolution rollups kept by the writer (monitor/collector/rollups.py): per run, key, width
# (4, 16, ... steps) and bucket (step // width), the rank-merge sums of the bucket's first step
# (a downsampled read draws real points) and of the whole bucket (mean, min, max): a first open
# reads O(points drawn) rows, not O(steps)
SCALAR_ROLLUPS = Table("scalar_rollups", (
    _run_id(), Column("key", pa.string(), "scalar name", wire=False),
    _sum("width", "steps per bucket", pa.int64()), _sum("bucket", "step // width", pa.int64()),
    _sum("first_step", "the bucket's first step", pa.int64()),
    _sum("last_step", "the bucket's last step", pa.int64()),
    *(_sum(f"first_{n}", f"{h}, first step's rows") for n, h in (
        ("vw", "sum of value x weight"), ("w", "sum of weight"), ("v", "sum of value"),
        ("n", "rows"), ("wall", "largest wall time"))),
    *(_sum(n, f"{h}, the bucket's rows") for n, h in (
        ("vw", "sum of value x weight"), ("w", "sum of weight"), ("v", "sum of value"),
        ("n", "rows"), ("vmin", "smallest value"), ("vmax", "largest value"))),
), primary_key=("run_id", "key", "width", "bucket"))
# the entropy heatmap's rollup: each bin's count summed over the bucket's steps and ranks
HISTOGRAM_ROLLUPS = Table("histogram_rollups", (
    _run_id(), Column("key", pa.string(), "histogram name", wire=False),
    _sum("width", "steps per bucket", pa.int64()), _sum("bucket", "step // width", pa.int64()),
    _sum("bin_lo", "bin's lower edge"), _sum("bin_hi", "bin's upper edge"),
    _sum("first_step", "the bucket's first step", pa.int64()),
    _sum("last_step", "the bucket's last step", pa.int64()),
    _sum("count", "values in the bin over the bucket"),
), primary_key=("run_id", "key", "width", "bucket", "bin_lo", "bin_hi"))

DATA_TABLES = ("scalars", "tokens", "samples", "histograms", "probes", "reference")   # what a batch carries
TABLES = {t.name: t for t in (RUNS, SCALARS, TOKENS, SAMPLES, HISTOGRAMS, PROBES, REFERENCE, ALERTS, BATCHES, TOKEN_STEPS,
                              SCALAR_KEYS, WORDS, SCALAR_ROLLUPS, HISTOGRAM_ROLLUPS)}

# the per-token columns producers send (Arrow IPC bodies and JSON token blocks)
TOKEN_COLUMNS = {c.name: c for c in TOKENS.wire_columns()}
# the fields of a sample row a sink keeps (step comes from the call)
SAMPLE_FIELDS = tuple(c.name for c in SAMPLES.wire_columns() if c.name != "step")
# the fields of a probe row a sink keeps (step comes from the call)
PROBE_FIELDS = tuple(c.name for c in PROBES.wire_columns() if c.name != "step")
# JSON tables of a batch whose rows a sink keeps as given (step comes from the call)
KEYED_TABLES = {"probes": PROBES, "reference": REFERENCE}


# files written before runs.last_step was kept at ingest: computed once from their scalars
RUNS_BACKFILL = """
UPDATE runs SET last_step = (SELECT max(s.step) FROM scalars s WHERE s.run_id = runs.run_id)
 WHERE last_step IS NULL;
"""


def schema_sql() -> str:
    """The DDL of every table, plus the columns older files lack."""
    return "\n".join(t.ddl() + t.add_missing_columns() for t in TABLES.values())


# One-time fills of what older files lack: (table, column, SQL), run on open only when that
# column (None: that table) was missing from an existing file, so opening a current file scans
# nothing (a scan on every open read every block, which `serve --skip-verify` exists to avoid).
BACKFILLS = (
    ("alerts", "signal", ALERTS_BACKFILL),
    ("runs", "last_step", RUNS_BACKFILL),
    ("runs", "first_step", "UPDATE runs SET first_step = (SELECT min(s.step) FROM scalars s "
                           "WHERE s.run_id = runs.run_id) WHERE first_step IS NULL;"),
    ("token_steps", None, "INSERT INTO token_steps SELECT DISTINCT run_id, step FROM tokens;"),
    ("scalar_keys", None, "INSERT INTO scalar_keys SELECT DISTINCT run_id, key FROM scalars;"),
)
