"""Parent links over a spans table, vectorized (the walk up them is :mod:`model.walk`).

A span's parent is the row with the same ``trace_id`` whose ``span_id`` is its
``parent_span_id`` (a carrier keeps the trace id across threads, actors and HTTP, so this
walks across processes); a parent that is not in the table makes the span an orphan.

A span's identity is its whole 128-bit trace id and 64-bit span id. Rows are keyed on three
uint64 numbers read straight from the Arrow string buffers: ``span_key`` (the span id),
``trace_low`` (the trace id's low half) and ``trace_key``, the high half XOR a bijective mix of the
low half (:func:`trace_key_of`). The key depends on both halves, so trace ids padded from 64 bits
(equal high halves, as Jaeger, Zipkin and B3 write them) or sharing their low half get different
keys; and with ``trace_low`` beside it, it gives the high half back, so (``trace_key``,
``trace_low``, ``span_key``) is the identity, exactly. Joins sort and search one mixed number per
(trace, span id) (:func:`mixed_key`) and confirm every match on those three numbers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.schema import ID_KEY_FIELDS

__all__ = ["hex_to_uint64", "trace_halves", "trace_key_of", "trace_keys", "with_id_keys", "key_column",
           "parent_indices", "trace_mix", "mixed_key", "unmixed_key", "SPAN_SPREAD", "TRACE_LOW", "low_column", "trace_hex"]

TRACE_LOW = "trace_low"
"""The uint64 column of each trace id's low half (its last 16 hex digits): with ``trace_key`` the
whole trace id (:func:`trace_key_of`)."""


def hex_to_uint64(ids: pa.Array | pa.ChunkedArray, *, width: int = 16) -> np.ndarray:
    """The first ``width`` hex digits of each id as uint64; nulls and malformed ids become 0."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    arr = arr.cast(pa.string())
    if len(arr) == 0:
        return np.zeros(0, dtype=np.uint64)
    fast = _exact_width_hex(arr, width)
    if fast is not None:
        return fast
    arr = pc.utf8_lpad(pc.utf8_slice_codeunits(pc.fill_null(arr, ""), 0, width), width, "0")
    arr = pc.if_else(pc.match_substring_regex(arr, f"^[0-9a-fA-F]{{{width}}}$"), arr, "0" * width)
    return _exact_width_hex(pa.array(arr, pa.string()), width)


def trace_halves(ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) uint64 halves of each 128-bit hex trace id. An id shorter than 32 hex digits
    is read as left-padded with zeros (a 64-bit id is the low half, as W3C and OTLP pad it);
    nulls and malformed ids become (0, 0), which no valid trace id is."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    arr = arr.cast(pa.string())
    if len(arr) == 0:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)
    both = _exact_width_hex(arr, 32)
    if both is None:
        arr = pc.utf8_lpad(pc.utf8_slice_codeunits(pc.fill_null(arr, ""), 0, 32), 32, "0")
        arr = pc.if_else(pc.match_substring_regex(arr, "^[0-9a-fA-F]{32}$"), arr, "0" * 32)
        both = _exact_width_hex(pa.array(arr, pa.string()), 32)
    both = both.reshape(-1, 2)
    return np.ascontiguousarray(both[:, 0]), np.ascontiguousarray(both[:, 1])


_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_33 = np.uint64(33)


def trace_key_of(high: np.ndarray, low: np.ndarray) -> np.ndarray:
    """``trace_key`` of trace ids given as halves: ``high`` XOR MurmurHash3's 64-bit finalizer of
    ``low``. The finalizer is a bijection with no fixed structure in its input's bits, so ids equal
    in either half get keys that differ in about half their bits; XOR with ``high`` keeps the key
    a bijection of the high half for a given low half, so (key, low) is the trace id. 0 for the
    null id (0, 0)."""
    mixed = np.array(low, dtype=np.uint64, copy=True)
    with np.errstate(over="ignore"):
        mixed ^= mixed >> _33
        mixed *= _FMIX_1
        mixed ^= mixed >> _33
        mixed *= _FMIX_2
        mixed ^= mixed >> _33
    mixed ^= np.asarray(high, dtype=np.uint64)
    return mixed


def trace_hex(trace_key: np.ndarray, trace_low: np.ndarray) -> list[str]:
    """The 32 hex digits of each trace id given as (``trace_key``, ``trace_low``): the inverse of
    :func:`trace_keys` (the key XOR the low half's mix is the high half)."""
    high = np.asarray(trace_key, np.uint64) ^ trace_key_of(np.zeros(len(trace_low), np.uint64), trace_low)
    return [f"{h:016x}{lo:016x}" for h, lo in zip(high.tolist(), np.asarray(trace_low, np.uint64).tolist())]


def trace_keys(ids: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(``trace_key``, ``trace_low``) of each hex trace id (:func:`trace_halves`, :func:`trace_key_of`)."""
    high, low = trace_halves(ids)
    return trace_key_of(high, low), low


def _exact_width_hex(arr: pa.Array, width: int) -> np.ndarray | None:
    """Decode straight from the string buffer when every id is exactly ``width`` hex digits: one
    uint64 per 16 digits, in order."""
    if arr.null_count:
        return None
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    if not np.all(np.diff(offsets) == width):
        return None
    data = memoryview(arr.buffers()[2])[offsets[0] : offsets[-1]]
    try:
        raw = bytes.fromhex(bytes(data).decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)


def with_id_keys(spans: pa.Table) -> pa.Table:
    """``spans`` with the uint64 ``trace_key`` / ``span_key`` / ``parent_key`` / ``trace_low``
    columns added if missing (a table holding some of them but not ``trace_low`` gets ``trace_key``
    anew as well: the two are one trace id)."""
    if all(f.name in spans.column_names for f in ID_KEY_FIELDS):
        return spans
    names = set(spans.column_names)
    if TRACE_LOW not in names and "trace_id" in names:
        if "trace_key" in names:
            spans = spans.drop_columns(["trace_key"])
        trace_key, trace_low = trace_keys(spans.column("trace_id"))
        spans = spans.append_column("trace_key", pa.array(trace_key, pa.uint64()))
        spans = spans.append_column(TRACE_LOW, pa.array(trace_low, pa.uint64()))
    for field in ID_KEY_FIELDS:
        if field.name not in spans.column_names:
            source = {"span_key": "span_id", "parent_key": "parent_span_id"}.get(field.name)
            if source is None:  # trace keys of a table without trace ids: the whole key is in trace_key
                values = np.zeros(spans.num_rows, np.uint64)
            else:
                values = hex_to_uint64(spans.column(source))
            spans = spans.append_column(field, pa.array(values, field.type))
    return spans


def key_column(table: pa.Table, column: str) -> np.ndarray:
    """An id key column (``trace_key``, ``span_key``, ``parent_key``) as uint64, null as 0 (no id)."""
    return pc.fill_null(table.column(column), 0).to_numpy().astype(np.uint64, copy=False)

def low_column(table: pa.Table) -> np.ndarray:
    """The ``trace_low`` column as uint64, or zeros where ``table`` has none (a projection of
    keys whose trace is its ``trace_key`` alone)."""
    if TRACE_LOW in table.column_names:
        return key_column(table, TRACE_LOW)
    return np.zeros(table.num_rows, np.uint64)


def parent_indices(spans: pa.Table) -> np.ndarray:
    """Row index of each span's parent in ``spans``, or -1 for roots and orphans.

    Without a ``parent_span_id`` column (a projection that kept only the id keys), a span has
    a parent when its ``parent_key`` is not 0.
    """
    n = spans.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    spans = with_id_keys(spans)
    if "parent_span_id" in spans.column_names:
        has_parent = valid_rows(spans.column("parent_span_id"))
    else:
        has_parent = _uint64(spans, "parent_key") != 0
    return _join_parents(_uint64(spans, "span_key"), _uint64(spans, "trace_key"), _uint64(spans, "parent_key"),
                         has_parent, _uint64(spans, TRACE_LOW))


_TRACE_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it permutes uint64
SPAN_SPREAD = np.uint64(0xBF58476D1CE4E5B9)
"""Odd as well: span ids are multiplied by it before the trace is mixed in, since hand-built traces
number spans 1, 2, 3..., which would leave every key of a trace with the same high bits."""


def trace_mix(trace_key: np.ndarray) -> np.ndarray:
    """A span key XOR this is one number for (span id, trace id): joins match both at once."""
    with np.errstate(over="ignore"):
        return trace_key * _TRACE_MIX


def mixed_key(trace_key: np.ndarray, key: np.ndarray) -> np.ndarray:
    """One uint64 per (trace, span id or parent reference): the number every key join matches on,
    so the same id in another trace (a hand-built id, a made-up parent) is another key."""
    with np.errstate(over="ignore"):
        return (np.asarray(key, np.uint64) * SPAN_SPREAD) ^ trace_mix(np.asarray(trace_key, np.uint64))


_SPREAD_INVERSE = np.uint64(pow(int(SPAN_SPREAD), -1, 1 << 64))  # SPAN_SPREAD * this = 1 (mod 2**64)


def unmixed_key(trace_key: np.ndarray, mixed: np.ndarray) -> np.ndarray:
    """The span id (or parent reference) of :func:`mixed_key`'s number, given its trace: what a
    holder of only the mixed keys recovers the ids from."""
    with np.errstate(over="ignore"):
        return (np.asarray(mixed, np.uint64) ^ trace_mix(np.asarray(trace_key, np.uint64))) * _SPREAD_INVERSE


def _join_parents(span_key: np.ndarray, trace_key: np.ndarray, parent_key: np.ndarray,
                  has_parent: np.ndarray, trace_low: np.ndarray) -> np.ndarray:
    """Sort-merge join of parent references onto spans of the same trace.

    Each side is keyed on its span id mixed with its trace key; a match is confirmed on the mixed
    key and the trace (key and low half), which with the mixed key is the span id too.
    ``np.sort`` of plain uint64 is several times faster than ``argsort``, so every key carries
    its row number (and whether it is a span or a reference) in its low bits and both sides
    are sorted together as plain numbers, a reference before the spans of its high bits. A
    reference's candidate is then the span sorted just after it; the identity confirms it, and on
    a mismatch the span after that is tried while the high bits still agree (equal high bits,
    duplicated ids, another identity of one mixed key): among copies of a span id, rows ascend, so
    the parent found is the lowest other row that holds it, as every decode strategy finds it.
    """
    n = len(span_key)
    bits = max(1, (n - 1).bit_length())
    rows_mask = np.uint64((1 << bits) - 1)
    ref_bit = np.uint64(1 << bits)
    high = ~(rows_mask | ref_bit)
    mixed_trace = trace_mix(trace_key)
    # Spread the span ids too: hand-built traces number spans 1, 2, 3..., which would leave
    # every key of a trace with the same high bits and the walk below linear per reference.
    with np.errstate(over="ignore"):
        own = (span_key * SPAN_SPREAD) ^ mixed_trace
        wanted = (parent_key * SPAN_SPREAD) ^ mixed_trace
    del mixed_trace
    children = np.flatnonzero(has_parent).astype(np.uint64)
    merged = np.concatenate([(own & high) | ref_bit | np.arange(n, dtype=np.uint64),
                             (wanted[children] & high) | children])
    del children
    merged.sort()
    is_ref = (merged & ref_bit) == 0
    refs = np.flatnonzero(is_ref)
    ref_values = merged[refs]
    spans_sorted = merged[~is_ref]
    del merged, is_ref
    child = (ref_values & rows_mask).astype(np.int64)
    candidate = refs - np.arange(len(refs))  # spans sorted before each reference: the next one's position
    del refs
    out = np.full(n, -1, dtype=np.int64)
    pending = np.arange(len(child))
    while pending.size:
        at = candidate[pending]
        valid = at < len(spans_sorted)
        pending, at = pending[valid], at[valid]
        found = spans_sorted[at]
        same_high = (found & high) == (ref_values[pending] & high)
        pending, found = pending[same_high], found[same_high]
        row = (found & rows_mask).astype(np.int64)
        kid = child[pending]
        hit = (own[row] == wanted[kid]) & (row != kid) & (trace_key[row] == trace_key[kid]) & \
            (trace_low[row] == trace_low[kid])
        out[kid[hit]] = row[hit]
        pending = pending[~hit]
        candidate[pending] += 1
    return out


def _uint64(spans: pa.Table, column: str) -> np.ndarray:
    return pc.fill_null(spans.column(column), 0).to_numpy().astype(np.uint64, copy=False)
