"""Arrow columns as numpy: strings that repeat as integer codes, integers with their nulls, a
column's values at some rows.

Every decode of spans shares these (:mod:`nemo_telemetry.analysis.decode` for whole tables and spans files,
:mod:`model.resources`, :mod:`model.keys`, :mod:`model.walk`): a string column becomes codes into
a small tuple of values, decided once per distinct value and then broadcast by code, and a chunked
column is read chunk by chunk, never concatenated first.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["LOOKUP_ROWS", "column_codes", "codes_into", "code_values", "row_value", "column_rows", "filled",
           "valid_rows", "int_column", "ints_into", "code_mask", "pairs_present", "codes_matching", "distinct_codes"]

LOOKUP_ROWS = 1 << 20  # lookups over every span go a block at a time, so their temporaries stay small
_RANGE_TESTS = 4  # runs of consecutive chosen codes up to which code_mask compares instead of gathering
_MARKED_CODES = 32  # values up to which distinct_codes marks the codes present as bits of one word


def column_codes(spans: pa.Table, column: str) -> tuple[np.ndarray, tuple]:
    """(int32 codes with -1 for null, the distinct values) of a string or dictionary column.

    Chunk by chunk, into one preallocated array (:func:`codes_into`).
    """
    n = spans.num_rows
    if column not in spans.column_names or n == 0:
        return np.full(n, -1, dtype=np.int32), ()
    values: dict = {}
    out = np.empty(n, dtype=np.int32)
    start = 0
    for chunk in spans.column(column).chunks:
        codes_into(chunk, values, out[start:start + len(chunk)])
        start += len(chunk)
    return out, tuple(values)


def codes_into(chunk: pa.Array, values: dict, into: np.ndarray) -> None:
    """One chunk of a string or dictionary column as codes into ``values`` (shared by the chunks, which
    it extends), -1 for null. The chunk's (small) dictionary is mapped onto the shared values once,
    then its indices go through that map; a chunk whose dictionary lists the shared values in their
    order (every chunk of a file after the first, usually) is copied as it is. Read from the
    indices' buffers, nulls by their validity bits (a null's slot may hold anything)."""
    if not pa.types.is_dictionary(chunk.type):
        chunk = pc.dictionary_encode(chunk)
    local = np.array([values.setdefault(v, len(values)) if v is not None else -1
                      for v in chunk.dictionary.to_pylist()] + [-1], dtype=into.dtype)
    indices = chunk.indices
    if indices.null_count == len(indices):  # no index to read (an all-null chunk may have no buffer)
        into[:] = -1
        return
    raw = _values_of(indices)
    if indices.null_count > len(indices) // 2:  # mostly null (a bucket, a category): only the others
        present = np.flatnonzero(_validity(indices))
        into[:] = -1
        into[present] = local[raw[present]]
        return
    if len(local) == 2 and indices.null_count == 0:  # one value (a column held constant): no index read
        into[:] = local[0]
    elif np.array_equal(local[:-1], np.arange(len(local) - 1)):
        into[:] = raw
    else:
        np.take(local, raw, out=into, mode="wrap")  # wrap: whatever a null's slot holds stays in range
    if indices.null_count:
        np.copyto(into, -1, where=~_validity(indices))


def code_values(spans: pa.Table, column: str) -> tuple:
    """The distinct values of a column in the order
    :func:`~nemo_telemetry.analysis.decode.span_arrays` numbers them (its ``runs``,
    ``names``...), from the chunks' dictionaries alone when the column is dictionary-encoded."""
    if column not in spans.column_names or spans.num_rows == 0:
        return ()
    chunks = spans.column(column).chunks
    if not all(pa.types.is_dictionary(chunk.type) for chunk in chunks):
        return column_codes(spans, column)[1]
    values: dict = {}
    for chunk in chunks:
        for value in chunk.dictionary.to_pylist():
            if value is not None:
                values.setdefault(value, len(values))
    return tuple(values)


def row_value(column: pa.ChunkedArray, row: int):
    """One value of a chunked column without concatenating or taking over the chunks."""
    for chunk in column.chunks:
        if row < len(chunk):
            return chunk[row].as_py()
        row -= len(chunk)
    raise IndexError(row)


def column_rows(column: pa.ChunkedArray, rows: np.ndarray, fill: int) -> np.ndarray:
    """``column``'s values at ``rows`` (any order) as numpy, nulls as ``fill``: gathered chunk by
    chunk, since Arrow's take over a chunked column concatenates it first (a copy of the whole
    column, however few rows are taken)."""
    rows = np.asarray(rows, dtype=np.int64)
    chunks = column.chunks
    if len(chunks) == 1:
        return filled(chunks[0], fill)[rows]
    bounds = np.cumsum([0] + [len(c) for c in chunks])
    ascending = len(rows) < 2 or bool((rows[1:] >= rows[:-1]).all())
    order = None if ascending else np.argsort(rows, kind="stable")
    ordered = rows if order is None else rows[order]
    cuts = np.searchsorted(ordered, bounds)  # each chunk's rows, a slice of the ordered rows
    out = np.empty(len(rows), dtype=column.type.to_pandas_dtype())
    for i in np.flatnonzero(cuts[1:] > cuts[:-1]):
        here = slice(cuts[i], cuts[i + 1])
        values = filled(chunks[i], fill)[ordered[here] - bounds[i]]
        if order is None:
            out[here] = values
        else:
            out[order[here]] = values
    return out


def filled(column: pa.Array | pa.ChunkedArray, fill: int) -> np.ndarray:
    """A numeric Arrow column as numpy, nulls replaced by ``fill`` (no copy through Arrow when none)."""
    if column.null_count:
        column = pc.fill_null(column, fill)
    return column.to_numpy() if isinstance(column, pa.ChunkedArray) else column.to_numpy(zero_copy_only=False)


def valid_rows(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Which rows of ``column`` are not null, as numpy booleans: from each chunk's validity bits
    (a dictionary's, its indices'), without a boolean array through Arrow and its conversion."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = np.empty(len(column), dtype=bool)
    at = 0
    for chunk in chunks:
        here, at = out[at:at + len(chunk)], at + len(chunk)
        if pa.types.is_dictionary(chunk.type):
            chunk = chunk.indices
        if chunk.null_count == 0:
            here[:] = True
        elif chunk.null_count == len(chunk):  # a null-typed or all-null chunk may have no bits
            here[:] = False
        else:
            here[:] = _validity(chunk)
    return out


def int_column(spans: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with nulls as 0, validity) of an integer column (absent: all null).

    Chunk by chunk into preallocated arrays, so a column with nulls is not copied whole twice.
    """
    n = spans.num_rows
    if column not in spans.column_names or n == 0:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    values = np.empty(n, dtype=np.int64)
    valid = np.empty(n, dtype=bool)
    start = 0
    for chunk in spans.column(column).chunks:
        ints_into(chunk, values[start:start + len(chunk)], valid[start:start + len(chunk)])
        start += len(chunk)
    return values, valid


def ints_into(chunk: pa.Array, values: np.ndarray, valid: np.ndarray | None) -> None:
    """One chunk of an integer column into ``values`` (nulls as 0) and, unless None, ``valid``.

    Read from the chunk's buffers: its values, times its validity bits (a null's slot may hold
    anything), in one pass, without the copies a fill through Arrow makes. ``values`` may be
    narrower than the chunk's type when the caller knows its values fit.
    """
    if not pa.types.is_integer(chunk.type):
        chunk = chunk.cast(pa.int64())
    if chunk.null_count == len(chunk):  # no values buffer to read (an all-null chunk may have none)
        values[:] = 0
        if valid is not None:
            valid[:] = False
        return
    raw = _values_of(chunk)
    if chunk.null_count == 0:
        values[:] = raw
        if valid is not None:
            valid[:] = True
        return
    bits = _validity(chunk)
    if chunk.null_count > len(chunk) // 2:  # mostly null (rl.iteration off the step spans): only the others
        present = np.flatnonzero(bits)
        values[:] = 0
        values[present] = raw[present]
    else:
        np.multiply(raw, bits, out=values, casting="unsafe")
    if valid is not None:
        valid[:] = bits


def _values_of(chunk: pa.Array) -> np.ndarray:
    """A fixed-width chunk's values as numpy, straight from its buffer (a null's slot as stored)."""
    return np.frombuffer(chunk.buffers()[1], dtype=chunk.type.to_pandas_dtype(),
                         count=chunk.offset + len(chunk))[chunk.offset:]


def _validity(chunk: pa.Array) -> np.ndarray:
    """A chunk with nulls: its validity bits as booleans."""
    return np.unpackbits(np.frombuffer(chunk.buffers()[0], dtype=np.uint8), count=chunk.offset + len(chunk),
                         bitorder="little")[chunk.offset:].view(bool)


def code_mask(codes: np.ndarray, chosen, size: int) -> np.ndarray:
    """``np.isin(codes, chosen)`` for small-integer codes (-1 never chosen), by one table lookup;
    one comparison when a single code or every code is chosen (no index array the size of
    ``codes``)."""
    chosen = np.asarray(chosen, dtype=np.int64)
    chosen = np.unique(chosen[(chosen >= 0) & (chosen < size)])
    if len(chosen) == 1:
        return codes == int(chosen[0])  # a Python int: compared in the codes' own dtype
    if len(chosen) == size:
        return codes >= 0
    starts = np.flatnonzero(np.diff(chosen, prepend=-2) != 1)  # runs of consecutive codes
    if 0 < len(starts) <= _RANGE_TESTS and codes.dtype.kind == "i":
        # each run lo..hi by one comparison: code - lo, read unsigned, is at most hi - lo only
        # inside the run (-1 and the codes below lo wrap past it); a gather costs several of these
        unsigned = np.dtype(f"u{codes.dtype.itemsize}")
        out = None
        for lo, hi in zip(chosen[starts], np.append(chosen[starts[1:] - 1], chosen[-1])):
            shifted = codes if lo == 0 else np.subtract(codes, codes.dtype.type(lo))  # from 0: as they are
            hit = shifted.view(unsigned) <= unsigned.type(hi - lo)
            out = hit if out is None else np.logical_or(out, hit, out=out)
        return out
    table = np.zeros(size + 1, dtype=bool)  # the extra last slot is where code -1 lands: never chosen
    table[chosen] = True
    return table[codes]


def pairs_present(first: np.ndarray, second: np.ndarray, second_size: int) -> list[tuple[int, int]]:
    """The distinct (first, second) pairs of two code arrays, by marking; pairs with a -1 are left out."""
    if first.size == 0:
        return []
    width = second_size + 1  # codes shifted by one, so -1 (null) has a slot of its own
    seen = np.zeros((int(first.max()) + 2) * width, dtype=bool)
    for lo in range(0, len(first), LOOKUP_ROWS):  # a block at a time: the keys stay in cache
        key = first[lo:lo + LOOKUP_ROWS].astype(np.int64)
        key += 1
        key *= width
        key += second[lo:lo + LOOKUP_ROWS]
        key += 1
        seen[key] = True
    pairs = (divmod(int(k), width) for k in np.flatnonzero(seen))
    return [(a - 1, b - 1) for a, b in pairs if a > 0 and b > 0]


def distinct_codes(codes: np.ndarray, size: int) -> list[int]:
    """The distinct codes (-1, null, left out) among integer ``codes`` into ``size`` values, ascending.

    Where there are few values, each code is a bit of one word (``1 << code``, or-reduced: two
    vector passes; a shift by -1 read unsigned is past the word, 0); a scatter into a table of
    flags costs tens of times more. Else a count of each code."""
    if codes.size == 0 or size == 0:
        return []
    if size <= _MARKED_CODES:
        width = 4 if size > 16 or codes.dtype.itemsize == 4 else 2
        if codes.dtype != np.dtype(f"i{width}"):
            codes = codes.astype(f"i{width}")  # codes below size and -1 fit
        unsigned = np.dtype(f"u{width}")
        bits = int(np.bitwise_or.reduce(np.left_shift(unsigned.type(1), codes.view(unsigned))))
        return [i for i in range(size) if bits >> i & 1]
    return np.flatnonzero(np.bincount(codes[codes >= 0], minlength=size)).tolist()


def codes_matching(values: tuple, regex: str) -> np.ndarray:
    """Codes of the distinct values that match ``regex`` (decided once per value)."""
    pattern = re.compile(regex)
    return np.array([i for i, v in enumerate(values) if v is not None and pattern.search(v)], dtype=np.int32)
