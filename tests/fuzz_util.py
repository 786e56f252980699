"""Hypothesis strategies and store oracles for the fuzz tests: JSON batches (valid, or valid
with one surely-invalid field), Arrow IPC bodies (valid, hostile, damaged), hostile headers; and
what the store holds, read with SQL of its own on the writer thread (in order with every write)."""
from __future__ import annotations

import json
import os
import struct

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from forksight.base.limits import (
    MAX_CONFIG_DEPTH, MAX_KEY_CHARS, MAX_RANK, MAX_SHORT_CHARS, MAX_STEP, MAX_TEXT_CHARS, MAX_TOKEN_CHARS,
)
from forksight.base.constants import ARROW_MEDIA_TYPE
from forksight.base.tables import DATA_TABLES

INT32, INT64 = 2**31, 2**63

# ---------------------------------------------------------------------------- budget
# CI: a fixed, derandomized run that fits the suite in well under a minute. Locally,
# FORKSIGHT_FUZZ_SCALE=20 runs 20x the examples with fresh random seeds every time.
SCALE = float(os.environ.get("FORKSIGHT_FUZZ_SCALE", "1"))


def budget(examples: int) -> settings:
    """Hypothesis settings for `examples` examples (times the scale), no deadline, no database."""
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=SCALE == 1,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much, HealthCheck.large_base_example])


# ---------------------------------------------------------------------------- store oracles
_COUNTED = (*DATA_TABLES, "alerts", "batches")
_FINGERPRINT_SQL = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in (*_COUNTED, "runs")) + \
    ", (SELECT md5(coalesce(string_agg(concat_ws('|', run_id, name, project, status, strategy, model, config), " \
    "chr(10) ORDER BY run_id), '')) FROM runs)"
_RUN_ROWS_SQL = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t} WHERE run_id = $1" for t in _COUNTED)


def fingerprint(store) -> tuple:
    """Row counts of every table and a digest of the runs table (what any write would change)."""
    return store.call(lambda cur: cur.execute(_FINGERPRINT_SQL).fetchone())


def run_rows(store, run_id: str) -> dict[str, int]:
    """Rows one run holds per data table (zero counts left out), plus its 'alerts' and 'batches'."""
    rows = store.call(lambda cur: cur.execute(_RUN_ROWS_SQL, [run_id]).fetchall())
    return {t: n for t, n in rows if n}


def data_rows(store, run_id: str) -> dict[str, int]:
    """Rows one run holds per data table (scalars, tokens, samples, histograms), zeros left out."""
    return {t: n for t, n in run_rows(store, run_id).items() if t in DATA_TABLES}


def expected_rows(batch: dict) -> dict[str, int]:
    """Rows a JSON batch stores per table, counted from the body (a histogram: one row per bin)."""
    rows = {"scalars": len(batch.get("scalars") or []), "samples": len(batch.get("samples") or []),
            "histograms": sum(len(h["counts"]) for h in batch.get("histograms") or []),
            "tokens": sum(len(b["sample_id"]) for b in batch.get("tokens") or []),
            "probes": len(batch.get("probes") or [])}
    return {t: n for t, n in rows.items() if n}


# ---------------------------------------------------------------------------- JSON batches
finite = st.floats(allow_nan=False, allow_infinity=False)
finite32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
steps = st.one_of(st.integers(0, 20), st.integers(0, MAX_STEP - 1))
ids64 = st.one_of(st.integers(0, 50), st.integers(0, INT64 - 1))
text = st.text(max_size=30)          # any code point but surrogates, NUL and controls included


def _maybe(strategy):
    return st.one_of(st.none(), strategy)


scalar_rows = st.fixed_dictionaries(
    {"step": steps, "key": st.text(min_size=1, max_size=MAX_KEY_CHARS).filter(bool), "value": finite},
    optional={"weight": _maybe(st.floats(min_value=0, allow_infinity=False)), "wall_time": _maybe(finite)})

sample_rows = st.fixed_dictionaries(
    {"step": steps, "sample_id": ids64},
    optional={"group_id": _maybe(ids64), "prompt": _maybe(text), "completion": _maybe(text),
              "reward": _maybe(finite), "correct": _maybe(st.booleans()),
              "length": _maybe(st.integers(0, INT32 - 1)), "source": _maybe(st.text(max_size=MAX_SHORT_CHARS))})


@st.composite
def histogram_rows(draw) -> dict:
    bins = draw(st.integers(1, 6))
    edges = sorted(draw(st.lists(st.floats(-1e6, 1e6), min_size=bins + 1, max_size=bins + 1, unique=True)))
    counts = draw(st.lists(st.floats(0, 1e9), min_size=bins, max_size=bins))
    return {"step": draw(steps), "key": draw(st.text(min_size=1, max_size=20)), "counts": counts, "edges": edges}


_OPTIONAL_TOKEN_VALUES = {
    "token_id": st.integers(-INT32, INT32 - 1), "token": st.text(max_size=12),
    "entropy": finite32, "renyi2": finite32, "js": finite32, "logp": finite32, "top1": finite32,
    "fork": st.booleans(), "selected": st.booleans(),
}


@st.composite
def token_blocks(draw) -> dict:
    n = draw(st.integers(0, 8))
    block = {"step": draw(steps), "sample_id": draw(st.lists(ids64, min_size=n, max_size=n)),
             "pos": draw(st.lists(st.integers(0, INT32 - 1), min_size=n, max_size=n))}
    for name in draw(st.lists(st.sampled_from(sorted(_OPTIONAL_TOKEN_VALUES)), unique=True, max_size=4)):
        block[name] = draw(st.lists(_OPTIONAL_TOKEN_VALUES[name], min_size=n, max_size=n))
    return block


valid_batches = st.fixed_dictionaries(
    {"batch_id": st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)},
    optional={"rank": st.integers(0, MAX_RANK), "scalars": st.lists(scalar_rows, max_size=6),
              "samples": st.lists(sample_rows, max_size=4), "histograms": st.lists(histogram_rows(), max_size=3),
              "tokens": st.lists(token_blocks(), max_size=3)})

# values each field surely refuses (JSON cannot carry NaN/inf: the markers become bare tokens, json_body)
_BAD = {
    "step": [-1, MAX_STEP, INT64, 2**64, 10**40, "1", 1.5, None, True],
    "key": ["", "k" * (MAX_KEY_CHARS + 1), 1, None],
    "value": ["1.5", None, "__NAN__", "__INF__", "__HUGE__", True],
    "weight": [-1.0, "1", "__NAN__"],
    "sample_id": [-1, INT64, 2**100, "3", None],
    "group_id": [-1, INT64],
    "length": [-1, INT32],
    "prompt": ["p" * (MAX_TEXT_CHARS + 1), 7],
    "source": ["s" * (MAX_SHORT_CHARS + 1)],
    "correct": ["yes", 1],
}
_BAD_TOKEN_COLUMN = {
    "sample_id": [[-1], [INT64], ["0"]], "pos": [[-1], [INT32], [None]], "token_id": [[INT32], [-INT32 - 1]],
    "token": [["t" * (MAX_TOKEN_CHARS + 1)]], "entropy": [[1e39], ["__NAN__"], ["x"]], "fork": [[1]],
}
_BAD_BATCH = {"batch_id": ["", "a b", "b" * 65, 1], "rank": [-1, MAX_RANK + 1, "0"], "bogus": [1]}


@st.composite
def invalid_batches(draw) -> dict:
    """A valid batch with rows in it, then one surely-invalid change somewhere in it."""
    batch = draw(valid_batches)
    where = draw(st.sampled_from(["batch", "scalars", "samples", "histograms", "tokens"]))
    if where == "batch":
        name = draw(st.sampled_from(sorted(_BAD_BATCH)))
        batch[name] = draw(st.sampled_from(_BAD_BATCH[name]))
        return batch
    rows = batch.setdefault(where, [])
    rows.append(draw({"scalars": scalar_rows, "samples": sample_rows, "histograms": histogram_rows(),
                      "tokens": token_blocks()}[where]))
    row = draw(st.sampled_from(rows))
    if where == "tokens":
        n = len(row["sample_id"])
        change = draw(st.sampled_from(["column", "length", "unknown"]))
        if change == "column":
            name = draw(st.sampled_from(sorted(_BAD_TOKEN_COLUMN)))
            bad = draw(st.sampled_from(_BAD_TOKEN_COLUMN[name]))
            row.update(sample_id=row["sample_id"] + [0], pos=row["pos"] + [0])
            for other in _OPTIONAL_TOKEN_VALUES:
                row.pop(other, None)
            row[name] = row[name][:n] + bad if name in ("sample_id", "pos") else bad * (n + 1)
        elif change == "length":
            row["pos"] = row["pos"] + [0]
        else:
            row["bogus"] = [1] * n
        return batch
    if where == "histograms":
        change = draw(st.sampled_from(["edges", "counts", "bins", "unknown", "step", "key"]))
        if change == "edges":
            row["edges"] = row["edges"][:-1] + [row["edges"][-2]]     # not strictly increasing
        elif change == "counts":
            row["counts"] = [-1.0] + row["counts"][1:]
        elif change == "bins":
            row["edges"] = row["edges"] + [row["edges"][-1] + 1.0, row["edges"][-1] + 2.0]
        elif change == "unknown":
            row["bogus"] = 1
        else:
            row[change] = draw(st.sampled_from(_BAD[change]))
        return batch
    fields = {"scalars": ["step", "key", "value", "weight", "unknown"],
              "samples": ["step", "sample_id", "group_id", "length", "prompt", "source", "correct", "unknown"]}[where]
    name = draw(st.sampled_from(fields))
    if name == "unknown":
        row["bogus"] = 1
    else:
        row[name] = draw(st.sampled_from(_BAD[name]))
    return batch


def json_body(body: dict) -> bytes:
    """The body as JSON text (lone surrogates escaped); the markers '__NAN__', '__INF__', '__HUGE__'
    become the bare NaN, Infinity, 1e400 no JSON encoder writes."""
    text = json.dumps(body, allow_nan=True)
    return text.replace('"__NAN__"', "NaN").replace('"__INF__"', "Infinity").replace('"__HUGE__"', "1e400").encode()


# ---------------------------------------------------------------------------- runs
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), finite, st.text(max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=12)
configs = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
lone_surrogates = st.characters(categories=["Cs"])     # one: two may pair into a valid character
STATUSES = ["live", "finished", "crashed", "failed", "stopped"]


def nested(depth: int) -> dict:
    """A config `depth` levels deep: {"a": [[...[1]...]]}."""
    value: object = 1
    for _ in range(depth - 1):
        value = [value]
    return {"a": value}


_POISONS = {
    "surrogate value": lambda draw: ("config", {"k": draw(lone_surrogates)}),
    "surrogate key": lambda draw: ("config", {draw(lone_surrogates): 1}),
    "too deep": lambda draw: ("config", nested(draw(st.integers(MAX_CONFIG_DEPTH + 1, 400)))),
    "nan": lambda draw: ("config", {"lr": draw(st.sampled_from(["__NAN__", "__INF__", "__HUGE__"]))}),
    "not an object": lambda draw: ("config", draw(st.sampled_from([[1], "x", 3]))),
    "too long": lambda draw: (draw(st.sampled_from(["strategy", "model"])), "m" * (MAX_SHORT_CHARS + 1)),
    "not text": lambda draw: (draw(st.sampled_from(["strategy", "model"])), draw(st.sampled_from([5, True, ["m"]]))),
    "unknown field": lambda draw: ("bogus", 1),
}


@st.composite
def run_bodies(draw, patch: bool) -> tuple[dict, bool]:
    """A POST /api/runs (or PATCH) body and whether it must be accepted: valid fields, or valid
    fields and one poison (lone surrogate, nesting past the limit, NaN, bad name or status...)."""
    body = {} if patch else {"name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True))}
    fields = {"strategy": st.text(max_size=MAX_SHORT_CHARS), "model": st.text(max_size=40), "config": configs}
    fields |= {"status": st.sampled_from(STATUSES)} if patch else {"project": st.text(max_size=40)}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), unique=True)):
        body[name] = draw(st.one_of(st.none(), fields[name]) if patch and name != "status" else fields[name])
    poisons = sorted(_POISONS) + (["status"] if patch else ["name"])
    poison = draw(st.one_of(st.none(), st.sampled_from(poisons)))
    if poison == "status":
        body["status"] = draw(st.sampled_from(["done", "LIVE", "", "live\n", 1]))
    elif poison == "name":
        body["name"] = draw(st.sampled_from(["-a", "a b", "x" * 129, "run\n", "", "ü", 7]))
    elif poison is not None:
        name, value = _POISONS[poison](draw)
        body[name] = value
    return body, poison is None


# ---------------------------------------------------------------------------- Arrow bodies
def ipc(table: pa.Table, compression: str | None = None, chunk: int | None = None) -> bytes:
    """The table as an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return sink.getvalue().to_pybytes()


_INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
_FLOAT_TYPES = [pa.float16(), pa.float32(), pa.float64()]


def _valid_values(name: str, n: int):
    """(strategy of n python values, Arrow types that hold them) for one token column, valid."""
    if name in ("step", "sample_id", "pos"):         # small enough for every integer width
        return st.lists(st.integers(0, 127), min_size=n, max_size=n), _INT_TYPES
    nullable = lambda s: st.lists(st.one_of(st.none(), s), min_size=n, max_size=n)  # noqa: E731
    if name == "token_id":
        return nullable(st.integers(-128, 127)), [pa.int8(), pa.int16(), pa.int32()]
    if name == "token":
        return nullable(st.text(max_size=12)), [pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())]
    if name in ("fork", "selected"):
        return nullable(st.booleans()), [pa.bool_()]
    return nullable(st.floats(-60000, 60000, width=16)), [pa.float32(), pa.float64()]


@st.composite
def valid_arrow(draw) -> tuple[pa.Table, bytes]:
    """A table the tokens route must accept (right kinds, any widths, nulls where allowed) and its IPC body."""
    n = draw(st.integers(0, 40))
    names = ["step", "sample_id", "pos", *draw(st.lists(st.sampled_from(sorted(_OPTIONAL_TOKEN_VALUES)),
                                                        unique=True, max_size=5))]
    columns = {}
    for name in draw(st.permutations(names)):
        values, types = _valid_values(name, n)
        kind = draw(st.sampled_from(types))
        data = draw(values)
        columns[name] = (pa.array(data, pa.string()).dictionary_encode() if pa.types.is_dictionary(kind)
                         else pa.array(data, kind))
    table = pa.table(columns)
    body = ipc(table, draw(st.sampled_from([None, "zstd", "lz4"])), draw(st.sampled_from([None, 1, 7])))
    return table, body


_ANY_TYPES = [*_INT_TYPES, *_FLOAT_TYPES, pa.bool_(), pa.string(), pa.large_string(), pa.binary(), pa.null(),
              pa.timestamp("s"), pa.date32(), pa.decimal128(10, 2), pa.list_(pa.int64()),
              pa.struct([("a", pa.int32())]), pa.dictionary(pa.int8(), pa.string()),
              pa.dictionary(pa.int16(), pa.int64())]
_EDGE_INTS = [0, 1, -1, 2**7, 2**15, INT32 - 1, INT32, 2**53, INT64 - 1, MAX_STEP, MAX_STEP - 1]


def _any_array(draw, kind: pa.DataType, n: int) -> pa.Array:
    """n values of `kind`: edge values, NaN/inf, overlong text; nulls in some columns."""
    elements = lambda values: st.lists(st.one_of(st.none(), values) if nullable else values,  # noqa: E731
                                       min_size=n, max_size=n)
    nullable = draw(st.booleans())
    if pa.types.is_null(kind):
        return pa.nulls(n)
    if pa.types.is_dictionary(kind):
        inner = _any_array(draw, kind.value_type, draw(st.integers(1, 3)))
        indices = draw(elements(st.integers(0, len(inner) + 1)))         # sometimes past the dictionary
        return pa.DictionaryArray.from_arrays(pa.array(indices, kind.index_type), inner, safe=False)
    if pa.types.is_integer(kind):
        low, high = (0, 2**kind.bit_width - 1) if pa.types.is_unsigned_integer(kind) else \
            (-(2 ** (kind.bit_width - 1)), 2 ** (kind.bit_width - 1) - 1)
        edges = [v for v in _EDGE_INTS if low <= v <= high]
        return pa.array(draw(elements(st.one_of(st.integers(0, 9), st.sampled_from(edges),
                                                st.integers(low, high)))), kind)
    if pa.types.is_floating(kind):
        values = draw(elements(st.floats(width=kind.bit_width)))          # NaN and inf included
        if kind == pa.float16():
            mask = np.array([v is None for v in values], bool)
            return pa.array(np.array([0 if v is None else v for v in values], np.float16), kind, mask=mask)
        return pa.array(values, kind)
    if pa.types.is_boolean(kind):
        return pa.array(draw(elements(st.booleans())), kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        odd = st.sampled_from(["", "x" * (MAX_TOKEN_CHARS + 1), "\x00", "1", "1.5", "true"])
        return pa.array(draw(elements(st.one_of(st.text(max_size=8), odd))), kind)
    if pa.types.is_binary(kind):
        return pa.array(draw(elements(st.binary(max_size=8))), kind)
    return pa.array([None] * n, kind)         # timestamp, date, decimal, list, struct: nulls of that type


_INTEGER_COLUMNS = ("step", "sample_id", "pos", "token_id", "rank")
_RIGHT_KIND = {name: _INT_TYPES for name in _INTEGER_COLUMNS} | \
    {name: _FLOAT_TYPES for name in ("entropy", "renyi2", "js", "logp", "top1")} | \
    {"token": [pa.string(), pa.large_string(), pa.dictionary(pa.int8(), pa.string())],
     "fork": [pa.bool_()], "selected": [pa.bool_()]}


@st.composite
def hostile_arrow(draw) -> tuple[pa.Table | None, bytes]:
    """A random table (mostly the token columns, each of its kind or of any type; sometimes any
    names, repeated), with edge values, nulls, NaN; then maybe damaged on the wire.
    Returns (the table, or None when the bytes were damaged; the body)."""
    n = draw(st.integers(0, 12))
    if draw(st.integers(0, 3)):
        optional = draw(st.lists(st.sampled_from([*sorted(_OPTIONAL_TOKEN_VALUES), "rank"]), unique=True, max_size=4))
        names = draw(st.permutations(["step", "sample_id", "pos", *optional]))
    else:
        pool = ["step", "sample_id", "pos", "rank", *sorted(_OPTIONAL_TOKEN_VALUES), "bogus", ""]
        names = draw(st.lists(st.sampled_from(pool), max_size=7))
    kinds = [draw(st.one_of(st.sampled_from(_RIGHT_KIND.get(name, _ANY_TYPES)), st.sampled_from(_ANY_TYPES)))
             for name in names]
    arrays = [_any_array(draw, kind, n) for kind in kinds]
    table = pa.Table.from_arrays(arrays, names=names) if names else pa.table({})
    body = ipc(table, draw(st.sampled_from([None, "zstd", "lz4"])), draw(st.sampled_from([None, 1, 5])))
    damage = draw(st.sampled_from(["none", "none", "truncate", "int64", "byte", "data", "append", "random"]))
    if damage == "none":
        return table, body
    if damage == "random":
        return None, draw(st.binary(max_size=200))
    if damage == "append":
        return None, body + draw(st.binary(min_size=1, max_size=40))
    at = draw(st.integers(0, max(0, len(body) - 1)))
    if damage == "truncate":
        return None, body[:at]
    if damage == "byte":
        return None, body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1:]
    if damage == "data":             # a byte of the last message's buffers: text turns invalid UTF-8, ...
        at = draw(st.integers(len(body) * 2 // 3, max(0, len(body) - 9)))
        return None, body[:at] + b"\xff" + body[at + 1:]
    value = draw(st.one_of(st.sampled_from([-1, 0, 2**31, 2**62, INT64 - 1, -INT64, 300_000_000]),
                           st.integers(-INT64, INT64 - 1)))
    at = min(at, max(0, len(body) - 8))
    return None, body[:at] + struct.pack("<q", value) + body[at + 8:]   # e.g. a declared length


# ---------------------------------------------------------------------------- headers
TOKEN = "fuzz-token-7f3a"
GOOD_HOSTS = ["127.0.0.1:8050", "localhost:8050", "[::1]:8050", "LOCALHOST:8050"]   # the bound port: 8050
BAD_HOSTS = ["evil.example", "evil.example:8050", "127.0.0.1.nip.io", "10.0.0.1:8050", "", "127.0.0.1:notaport",
             "a@127.0.0.1", "127.0.0.1/x", "127.0.0.1 evil", "[::1", "127.0.0.1", "localhost", "localhost:8051",
             "evil.localhost:8050", "127.0.0.2:8050", "127.1.2.3:8050", "localhost.:8050", "[::2]:8050"]
CONTENT_TYPES = [None, "application/json", "application/json; charset=utf-8", "APPLICATION/JSON", "text/plain",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ARROW_MEDIA_TYPE, "", ";"]
_latin1 = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40)
garbage_cookies = _latin1.filter(lambda c: "forksight_token" not in c)
COOKIES_WITH_TOKEN = [f"forksight_token={TOKEN}", f"a=b; forksight_token={TOKEN}", f'forksight_token="{TOKEN}"',
                      f"=;;==; forksight_token={TOKEN}"]
COOKIES_WITHOUT = ["forksight_token=wrong", "forksight_token=", "forksight_token", "a=b"]
AUTH_RIGHT = [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER  {TOKEN} "]
AUTH_WRONG = ["Bearer wrong", "Bearer ", f"Basic {TOKEN}", TOKEN, f"Bearer{TOKEN}"]


@st.composite
def header_sets(draw) -> dict:
    """Host, Origin, Content-Type, Cookie, Authorization: known-good, known-bad or random values,
    with what the guard must make of them ('host_ok', 'origin_ok', 'authorized': True/False/None)."""
    out: dict = {"headers": {}}
    host_kind = draw(st.sampled_from(["good", "good", "bad", "random"]))
    host = {"good": st.sampled_from(GOOD_HOSTS), "bad": st.sampled_from(BAD_HOSTS), "random": _latin1}[host_kind]
    out["headers"]["host"] = draw(host)
    out["host_ok"] = {"good": True, "bad": False, "random": None}[host_kind]
    origin_kind = draw(st.sampled_from(["none", "none", "same", "foreign", "random"]))
    if origin_kind == "same":
        origin = "http://" + out["headers"]["host"]
    else:
        origin = {"none": None, "foreign": draw(st.sampled_from(["https://evil.example", "null", "http://127.0.0.1:1",
                                                                   "file://", "http://evil.example:8050"])),
                  "random": draw(_latin1)}[origin_kind]
    if origin is not None:
        out["headers"]["origin"] = origin
    out["origin_ok"] = {"none": True, "same": None, "foreign": False, "random": None}[origin_kind]
    content_type = draw(st.one_of(st.sampled_from(CONTENT_TYPES), _latin1))
    if content_type is not None:
        out["headers"]["content-type"] = content_type
    cookie_kind = draw(st.sampled_from(["none", "garbage", "with", "without", "garbage+with"]))
    cookie = {"none": None, "garbage": draw(garbage_cookies), "with": draw(st.sampled_from(COOKIES_WITH_TOKEN)),
              "without": draw(st.sampled_from(COOKIES_WITHOUT)),
              "garbage+with": draw(garbage_cookies) + "; " + COOKIES_WITH_TOKEN[0]}[cookie_kind]
    if cookie is not None:
        out["headers"]["cookie"] = cookie
    auth_kind = draw(st.sampled_from(["none", "right", "wrong"]))
    if auth_kind != "none":
        out["headers"]["authorization"] = draw(st.sampled_from(AUTH_RIGHT if auth_kind == "right" else AUTH_WRONG))
    # the guard reads a bearer token first, then the cookie: "Bearer wrong" + a right cookie is refused
    bearer = auth_kind != "none" and out["headers"]["authorization"].lower().startswith("bearer ")
    out["authorized"] = auth_kind == "right" or (not bearer and cookie_kind in ("with", "garbage+with"))
    return out


# ---------------------------------------------------------------------------- dashboard callbacks
def dash_call(dep: dict, value_of, changed: str | None = None) -> dict:
    """The body Dash's renderer posts to call the callback `dep` (from /_dash-dependencies), each
    input and state taking value_of('id.property'); `changed` names the trigger (default: the first input)."""
    def spec(text: str) -> dict:
        component, prop = text.split(".", 1)
        return {"id": component, "property": prop}
    multi = dep["output"].startswith("..")
    outputs = [spec(p) for p in dep["output"].strip(".").split("...")] if multi else spec(dep["output"])
    first = dep["inputs"][0]
    return {"output": dep["output"], "outputs": outputs,
            "changedPropIds": [changed or f"{first['id']}.{first['property']}"],
            "inputs": [{**i, "value": value_of(f"{i['id']}.{i['property']}")} for i in dep["inputs"]],
            "state": [{**s, "value": value_of(f"{s['id']}.{s['property']}")} for s in dep["state"]]}
