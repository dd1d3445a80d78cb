"""Parent links over a spans table, vectorized (the walk up them is :mod:`model.walk`).

A span's parent is the row with the same ``trace_id`` whose ``span_id`` is its
``parent_span_id`` (a carrier keeps the trace id across threads, actors and HTTP, so this
walks across processes); a parent that is not in the table makes the span an orphan.

Ids are 64-bit random numbers, so rows are keyed on the span id as ``uint64`` and the trace
is checked separately; both conversions read the Arrow string buffer directly.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.schema import ID_KEY_FIELDS

__all__ = ["hex_to_uint64", "with_id_keys", "key_column", "parent_indices", "trace_mix", "mixed_key", "unmixed_key",
           "SPAN_SPREAD"]


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


def _exact_width_hex(arr: pa.Array, width: int) -> np.ndarray | None:
    """Decode straight from the string buffer when every id is exactly ``width`` hex digits."""
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
    """``spans`` with the uint64 ``trace_key`` / ``span_key`` / ``parent_key`` columns added if missing."""
    if all(f.name in spans.column_names for f in ID_KEY_FIELDS):
        return spans
    keys = {
        "trace_key": hex_to_uint64(spans.column("trace_id")),
        "span_key": hex_to_uint64(spans.column("span_id")),
        "parent_key": hex_to_uint64(spans.column("parent_span_id")),
    }
    for field in ID_KEY_FIELDS:
        if field.name not in spans.column_names:
            spans = spans.append_column(field, pa.array(keys[field.name], field.type))
    return spans



def key_column(table: pa.Table, column: str) -> np.ndarray:
    """An id key column (``trace_key``, ``span_key``, ``parent_key``) as uint64, null as 0 (no id)."""
    return pc.fill_null(table.column(column), 0).to_numpy().astype(np.uint64, copy=False)

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
        has_parent = pc.is_valid(spans.column("parent_span_id")).to_numpy(zero_copy_only=False)
    else:
        has_parent = _uint64(spans, "parent_key") != 0
    return _join_parents(_uint64(spans, "span_key"), _uint64(spans, "trace_key"), _uint64(spans, "parent_key"),
                         has_parent)


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
                  has_parent: np.ndarray) -> np.ndarray:
    """Sort-merge join of parent references onto spans of the same trace.

    Each side is keyed on its span id mixed with its trace id, so one comparison checks both.
    ``np.sort`` of plain uint64 is several times faster than ``argsort``, so every key carries
    its row number (and whether it is a span or a reference) in its low bits and both sides
    are sorted together as plain numbers. A reference's candidate is then the span sorted just
    before it; the full keys confirm it, and on a mismatch the span before that is tried while
    the high bits still agree (equal high bits, duplicated ids).
    """
    n = len(span_key)
    bits = max(1, (n - 1).bit_length())
    rows_mask = np.uint64((1 << bits) - 1)
    ref_bit = np.uint64(1 << bits)
    high = ~(rows_mask | ref_bit)
    mixed_trace = trace_mix(trace_key)
    # Spread the span ids too: hand-built traces number spans 1, 2, 3..., which would leave
    # every key of a trace with the same high bits and the walk-back below linear per reference.
    with np.errstate(over="ignore"):
        own = (span_key * SPAN_SPREAD) ^ mixed_trace
        wanted = (parent_key * SPAN_SPREAD) ^ mixed_trace
    del mixed_trace
    children = np.flatnonzero(has_parent).astype(np.uint64)
    merged = np.concatenate([(own & high) | np.arange(n, dtype=np.uint64),
                             (wanted[children] & high) | ref_bit | children])
    del children
    merged.sort()
    is_ref = (merged & ref_bit) != 0
    refs = np.flatnonzero(is_ref)
    ref_values = merged[refs]
    spans_sorted = merged[~is_ref]
    del merged, is_ref
    child = (ref_values & rows_mask).astype(np.int64)
    candidate = refs - np.arange(len(refs)) - 1  # spans sorted before each reference, minus one
    del refs
    out = np.full(n, -1, dtype=np.int64)
    pending = np.arange(len(child))
    while pending.size:
        at = candidate[pending]
        valid = at >= 0
        pending, at = pending[valid], at[valid]
        found = spans_sorted[at]
        same_high = (found & high) == (ref_values[pending] & high)
        pending, found = pending[same_high], found[same_high]
        row = (found & rows_mask).astype(np.int64)
        kid = child[pending]
        hit = (own[row] == wanted[kid]) & (row != kid)
        out[kid[hit]] = row[hit]
        pending = pending[~hit]
        candidate[pending] -= 1
    return out


def _uint64(spans: pa.Table, column: str) -> np.ndarray:
    return pc.fill_null(spans.column(column), 0).to_numpy().astype(np.uint64, copy=False)
