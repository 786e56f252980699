"""HTTP bodies -> Records: a JSON batch (validated by the wire models) or an Arrow IPC stream of
token columns (read bounded, message by message), each with the digest that makes a retried
batch id idempotent. 400/422 name what is wrong; nothing here touches the store."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from forksight.base.errors import ApiError, validation_message
from forksight.base.records import (
    RecordError, Records, histograms_table, probes_table, reference_table, samples_table, scalars_table, tokens_table,
)
from forksight.monitor.collector.schema import Batch


def batch_records(batch: Batch) -> Records:
    """A validated JSON batch -> Arrow tables for the store."""
    rank = batch.rank
    tokens = None
    if batch.tokens:
        tokens = pa.concat_tables([
            tokens_table({k: v for k, v in block.model_dump().items() if k != "step" and v is not None},
                         step=block.step, rank=rank) for block in batch.tokens])
    return Records(
        scalars=scalars_table([r.model_dump() for r in batch.scalars], rank) if batch.scalars else None,
        samples=samples_table([r.model_dump() for r in batch.samples], rank) if batch.samples else None,
        histograms=histograms_table([r.model_dump() for r in batch.histograms], rank) if batch.histograms else None,
        tokens=tokens,
        probes=probes_table([r.model_dump() for r in batch.probes], rank) if batch.probes else None,
        reference=reference_table([r.model_dump() for r in batch.reference], rank) if batch.reference else None,
    )


def parse_json_batch(body: bytes) -> Batch:
    """Bytes -> Batch; 400 for malformed JSON, 422 naming the field for anything else."""
    from pydantic import ValidationError

    try:
        return Batch.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if errors and errors[0]["type"] == "json_invalid":
            raise ApiError(400, f"body is not valid JSON ({errors[0]['msg']}); send one JSON object") from None
        raise ApiError(422, validation_message(errors)) from None


def _digest(*parts: bytes) -> str:
    import hashlib

    h = hashlib.sha256()          # hardware-accelerated here: ~2 GB/s, 3x blake2b
    for part in parts:
        h.update(part)
    return h.hexdigest()[:32]


def json_records(body: bytes) -> tuple[Records, str]:
    """A JSON ingest body -> (Records, batch id); 400/422 naming what is wrong."""
    batch = parse_json_batch(body)
    try:
        records = batch_records(batch)
    except RecordError as exc:
        raise ApiError(422, str(exc)) from None
    records.digest = _digest(b"json\0", body)   # a retry resends the same bytes
    return records, batch.batch_id


def parse_arrow_tokens(body: bytes, rank: int) -> Records:
    """An Arrow IPC stream of per-token columns -> Records; 422 naming what is wrong."""
    from forksight.base.limits import MAX_DECODED_BYTES, MAX_TOKEN_ROWS
    from forksight.monitor.collector.ipc import StreamRefused, read_bounded
    from forksight.base.constants import ARROW_MEDIA_TYPE

    try:
        table = read_bounded(body, MAX_TOKEN_ROWS, MAX_DECODED_BYTES)
    except StreamRefused as exc:
        hint = f"; send {ARROW_MEDIA_TYPE}" if exc.status == 400 else ""
        raise ApiError(exc.status, f"{exc}{hint}") from None
    if "rank" in table.column_names:
        # older sinks sent the rank as a column too: accepted only when it says the same
        ranks = table["rank"]
        if not pa.types.is_integer(ranks.type) or ranks.null_count or \
                (table.num_rows and pc.min_max(ranks).as_py() != {"min": rank, "max": rank}):
            raise ApiError(422, f"tokens.rank: a rank column must equal the rank parameter ({rank}) on every "
                           "row; send the rank as ?rank= only")
        table = table.drop_columns(["rank"])
    try:
        return Records(tokens=tokens_table(table, rank=rank), digest=_digest(b"arrow\0%d\0" % rank, body))
    except RecordError as exc:
        raise ApiError(422, str(exc)) from None
