"""Bounded reading of an Arrow IPC stream: rows and decoded bytes are counted from each message's
header, message by message, BEFORE anything is decompressed (a small zstd body can declare
hundreds of millions of rows); dictionary columns are refused by their expanded size.
"""
from __future__ import annotations

import struct
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc


class StreamRefused(ValueError):
    """The stream breaks a limit or is malformed; `status` is the HTTP answer (400, 413 or 422)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------- flatbuffer header
# Just enough of Arrow's Message.fbs: Message{version, header_type, header, bodyLength};
# RecordBatch{length, nodes, buffers, compression}; DictionaryBatch{id, data, isDelta}.
_SCHEMA, _DICTIONARY, _RECORD_BATCH = 1, 2, 3


def _table(buf: bytes, pos: int) -> tuple[int, int, int]:
    vtable = pos - struct.unpack_from("<i", buf, pos)[0]
    vt_size = struct.unpack_from("<H", buf, vtable)[0]
    return pos, vtable, vt_size


def _field(buf: bytes, table: tuple[int, int, int], slot: int) -> int | None:
    pos, vtable, vt_size = table
    at = 4 + 2 * slot
    if at >= vt_size:
        return None
    off = struct.unpack_from("<H", buf, vtable + at)[0]
    return pos + off if off else None


def _deref(buf: bytes, at: int) -> int:
    return at + struct.unpack_from("<I", buf, at)[0]


def _header(metadata: bytes) -> tuple[int, int, list[tuple[int, int]], bool]:
    """(header type, rows, [(offset, length) of each body buffer], compressed) of one message."""
    root = _table(metadata, _deref(metadata, 0))
    kind_at = _field(metadata, root, 1)
    kind = metadata[kind_at] if kind_at is not None else 0
    header_at = _field(metadata, root, 2)
    if kind not in (_DICTIONARY, _RECORD_BATCH) or header_at is None:
        return kind, 0, [], False
    batch = _table(metadata, _deref(metadata, header_at))
    if kind == _DICTIONARY:
        data_at = _field(metadata, batch, 1)
        if data_at is None:
            return kind, 0, [], False
        batch = _table(metadata, _deref(metadata, data_at))
    length_at = _field(metadata, batch, 0)
    rows = struct.unpack_from("<q", metadata, length_at)[0] if length_at is not None else 0
    buffers = []
    buffers_at = _field(metadata, batch, 2)
    if buffers_at is not None:
        vec = _deref(metadata, buffers_at)
        count = struct.unpack_from("<I", metadata, vec)[0]
        if vec + 4 + 16 * count > len(metadata):    # a forged count must not cost a long loop
            raise StreamRefused(400, "a message header lists more buffers than it holds: the stream is damaged")
        buffers = [struct.unpack_from("<qq", metadata, vec + 4 + 16 * i) for i in range(count)]
    return kind, rows, buffers, _field(metadata, batch, 3) is not None


def _decoded_size(body: pa.Buffer | None, buffers: list[tuple[int, int]], compressed: bool) -> int:
    """Bytes the message's buffers take once decompressed (from their 8-byte length prefixes)."""
    if not compressed:
        return sum(length for _, length in buffers)
    view = memoryview(body) if body is not None else memoryview(b"")
    total = 0
    for offset, length in buffers:
        if length < 8:
            continue                           # an empty buffer carries no prefix
        if offset < 0 or offset + 8 > len(view):
            raise StreamRefused(400, "a buffer lies outside the message body: the stream is damaged")
        declared = struct.unpack_from("<q", view, offset)[0]
        if declared < -1:
            raise StreamRefused(400, "a compressed buffer declares a negative length: the stream is damaged")
        total += length - 8 if declared == -1 else declared
    return total


# ---------------------------------------------------------------------------- the schema, first
MAX_COLUMNS = 64                  # a token body has ~15 known columns; wider is refused from its schema
MAX_SCHEMA_BYTES = 64 * 1024      # the schema message of MAX_COLUMNS columns with long names fits easily


def _schema_columns(metadata: bytes) -> int:
    """Fields declared by a Schema message's header (a vector length: no field is parsed)."""
    root = _table(metadata, _deref(metadata, 0))
    kind_at, header_at = _field(metadata, root, 1), _field(metadata, root, 2)
    if kind_at is None or metadata[kind_at] != _SCHEMA or header_at is None:
        raise StreamRefused(400, "the stream does not start with a schema message")
    fields_at = _field(metadata, _table(metadata, _deref(metadata, header_at)), 1)
    return 0 if fields_at is None else struct.unpack_from("<I", metadata, _deref(metadata, fields_at))[0]


def check_schema(prefix: bytes, max_columns: int = MAX_COLUMNS) -> bool:
    """Check the columns an IPC stream declares from its first bytes: False while more bytes are
    needed, True once the schema is within the cap; StreamRefused (422/400) otherwise."""
    at = 4 if prefix[:4] == b"\xff\xff\xff\xff" else 0       # the continuation marker (or legacy format)
    if len(prefix) < at + 4:
        return False
    length = struct.unpack_from("<i", prefix, at)[0]
    if length <= 0:
        raise StreamRefused(400, "the stream does not start with a schema message")
    if length > MAX_SCHEMA_BYTES and not at:      # no continuation marker either: not Arrow at all
        raise StreamRefused(400, "body is not a valid Arrow IPC stream (it does not start with a schema "
                            "message)")
    if length > MAX_SCHEMA_BYTES:
        raise StreamRefused(422, f"tokens: the schema message is {length} bytes (over {MAX_SCHEMA_BYTES}): a "
                            f"token body has at most {max_columns} columns; send the known columns only")
    if len(prefix) < at + 4 + length:
        return False
    try:
        columns = _schema_columns(prefix[at + 4:at + 4 + length])
    except (struct.error, IndexError):
        raise StreamRefused(400, "body is not a valid Arrow IPC stream (its schema is damaged)") from None
    if columns > max_columns:
        raise StreamRefused(422, f"tokens: the stream declares {columns} columns; the limit is {max_columns}: "
                            "send the known columns only")
    return True


def duplicate_problem(names: list[str], shown: int = 5) -> str | None:
    """Columns named more than once, in a short message (linear: a Counter, at most `shown` names)."""
    repeated = [n for n, k in Counter(names).items() if k > 1]
    if not repeated:
        return None
    more = f" and {len(repeated) - shown} more" if len(repeated) > shown else ""
    return (f"tokens: column(s) {sorted(repeated)[:shown]}{more} appear more than once; "
            "send each column once")


# ---------------------------------------------------------------------------- the reader
def read_bounded(body: bytes, max_rows: int, max_bytes: int) -> pa.Table:
    """Decode an IPC stream once its declared rows and decoded bytes are within the limits."""
    source = pa.py_buffer(body)
    if not check_schema(bytes(body[:8 + MAX_SCHEMA_BYTES])):
        raise StreamRefused(400, "body is not a valid Arrow IPC stream (it ends inside its schema)")
    try:
        messages = pa.ipc.MessageReader.open_stream(source)
        rows = size = 0
        while True:
            try:
                message = messages.read_next_message()
            except StopIteration:
                break
            if message is None:
                break
            kind, n, buffers, compressed = _header(message.metadata.to_pybytes())
            if n < 0 or any(o < 0 or ln < 0 for o, ln in buffers):
                raise StreamRefused(400, "a message declares negative sizes: the stream is damaged")
            rows += n if kind == _RECORD_BATCH else 0
            size += _decoded_size(message.body, buffers, compressed)
            if rows > max_rows:
                raise StreamRefused(422, f"tokens: the stream declares over {max_rows} rows (counted "
                                    f"{rows} so far); the limit is {max_rows} per batch: split it")
            if size > max_bytes:
                raise StreamRefused(413, f"the stream decodes to over {max_bytes} bytes (counted {size} "
                                    f"so far); send smaller batches")
        table = pa.ipc.open_stream(source).read_all()
        # offsets, dictionary indices, UTF-8 in names and text: Arrow reads them unchecked, and
        # they failed later as 500s (DuckDB mid-insert, a column name that is not text)
        names = table.column_names
        table.validate(full=True)
    except StreamRefused:
        raise
    except (pa.ArrowException, OSError, struct.error, IndexError, UnicodeDecodeError) as exc:
        raise StreamRefused(400, f"body is not a valid Arrow IPC stream ({exc})") from None
    problem = duplicate_problem(names)
    if problem:
        raise StreamRefused(422, problem)
    return _expand_dictionaries(table, max_bytes - size)


def _expand_dictionaries(table: pa.Table, room: int) -> pa.Table:
    # a dictionary of one 1,000-character token indexed 2M times decodes to 2 GB: measure first
    for i, field in enumerate(table.schema):
        if not pa.types.is_dictionary(field.type):
            continue
        expanded = 0
        for chunk in table.column(i).chunks:
            values = chunk.dictionary
            lengths = pc.binary_length(values) if pa.types.is_string(values.type) or \
                pa.types.is_binary(values.type) else None
            if lengths is None:
                continue                      # a numeric dictionary decodes to index-sized data
            expanded += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
        if expanded > room:
            raise StreamRefused(413, f"tokens.{field.name}: the dictionary column expands to {expanded} bytes; "
                                f"the limit left is {room}: send plain columns or smaller batches")
        table = table.set_column(i, field.name, pc.cast(table.column(i), field.type.value_type))
        room -= expanded
    return table
