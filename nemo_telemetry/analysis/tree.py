"""Parent links and iteration attribution over a spans table, vectorized.

Every analysis that walks the span tree (goodput, findings, waterfalls) starts here, so the
rules live in one place:

- a span's parent is the row with the same ``trace_id`` whose ``span_id`` is its
  ``parent_span_id`` (a carrier keeps the trace id across threads, actors and HTTP, so this
  walks across processes); a parent that is not in the table makes the span an orphan;
- a span's *attributed iteration* is its own ``rl.iteration``, else the nearest ancestor's,
  else null (*unstamped*).

Ids are 64-bit random numbers, so rows are keyed on the span id as ``uint64`` and the trace
is checked separately; both conversions read the Arrow string buffer directly.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.schema import ID_KEY_FIELDS, ITERATION

__all__ = ["hex_to_uint64", "with_id_keys", "parent_indices", "attributed_iterations"]

_MAX_DEPTH_DOUBLINGS = 64  # pointer doubling: 2**64 levels; only a parent cycle gets near it


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


def parent_indices(spans: pa.Table) -> np.ndarray:
    """Row index of each span's parent in ``spans``, or -1 for roots and orphans."""
    n = spans.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    spans = with_id_keys(spans)
    span_key = _uint64(spans, "span_key")
    trace_key = _uint64(spans, "trace_key")
    parent_key = _uint64(spans, "parent_key")
    has_parent = pc.is_valid(spans.column("parent_span_id")).to_numpy(zero_copy_only=False)

    order = np.argsort(span_key, kind="stable")
    sorted_keys = span_key[order]
    pos = np.minimum(np.searchsorted(sorted_keys, parent_key), n - 1)
    found = has_parent & (sorted_keys[pos] == parent_key)
    idx = np.where(found, order[pos], -1)
    same_trace = np.zeros(n, dtype=bool)
    same_trace[found] = trace_key[idx[found]] == trace_key[found]
    return np.where(same_trace & (idx != np.arange(n)), idx, -1).astype(np.int64)


def _uint64(spans: pa.Table, column: str) -> np.ndarray:
    return pc.fill_null(spans.column(column), 0).to_numpy().astype(np.uint64, copy=False)


def attributed_iterations(spans: pa.Table, parents: np.ndarray | None = None) -> pa.Array:
    """Each span's own ``rl.iteration``, else its nearest stamped ancestor's, else null."""
    if parents is None:
        parents = parent_indices(spans)
    own = spans.column(ITERATION).combine_chunks() if spans.num_rows else pa.array([], pa.int64())
    valid = pc.is_valid(own).to_numpy(zero_copy_only=False).copy()
    values = pc.fill_null(own, 0).to_numpy(zero_copy_only=False).astype(np.int64).copy()
    ancestor = parents.copy()
    for _ in range(_MAX_DEPTH_DOUBLINGS):
        pending = np.nonzero(~valid & (ancestor >= 0))[0]
        if pending.size == 0:
            break
        target = ancestor[pending]
        hit = valid[target]
        values[pending[hit]] = values[target[hit]]
        valid[pending[hit]] = True
        miss = pending[~hit]
        # Jump over an unstamped ancestor. Its own ancestor pointer only ever moves past
        # unstamped spans, so the first stamped span reached is still the nearest one.
        ancestor[miss] = ancestor[ancestor[miss]]
    return pa.array(values, pa.int64(), mask=~valid)
