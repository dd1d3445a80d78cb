"""Resource attributes of spans as the findings read them: per row (codes into the distinct
values) and as the distinct (group, value) pairs of some rows, from the ``resource_attributes``
map and from the columns promoted out of it (``span_groups``), without a Python object per span.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import code_mask, distinct_codes, filled, pairs_present
from nemo_telemetry.analysis.model.schema import PROMOTED_RESOURCE_ATTRIBUTES

__all__ = ["resource_values", "resource_pairs"]

_FEW_VALUES = 8  # resource attribute values in a chunk's dictionary up to which each is tested by a comparison


def resource_values(spans: pa.Table, key: str, rows: np.ndarray) -> tuple[np.ndarray, tuple]:
    """(int codes, distinct values) of one resource attribute for each of ``rows`` (-1: absent).

    Works on the map column as read, with plain or dictionary-encoded keys and values, one
    chunk at a time, without building a Python object per span.
    """
    n = spans.num_rows
    codes = np.full(n, -1, dtype=np.int64)
    values: dict[str, int] = {}
    for start, chunk, is_key, item_codes, local in _resource_chunks(spans, key, values):
        match = np.flatnonzero(is_key)
        owner = np.searchsorted(chunk.offsets.to_numpy(), match + int(chunk.offsets[0].as_py()), side="right") - 1
        codes[owner + start] = local[item_codes[match]]
    return codes[rows], tuple(values)


def resource_pairs(spans: pa.Table, key: str, group: np.ndarray, keep: np.ndarray) -> set[tuple[int, str]]:
    """The distinct (group code, value) pairs of one resource attribute over the ``keep`` rows,
    values as the map writes them (strings; ints in decimal).

    A promoted attribute is read from its column (:data:`PROMOTED_RESOURCE_ATTRIBUTES`) and from
    the map, each where the table has it: a row holds its value in one of them (ingest puts it in
    the column; a hand-built table may put it in the map). A process's
    resource is the same on every one of its spans, so a chunk whose kept rows all share one
    group (ingest writes one run per file) only needs the distinct values in it.
    """
    column = PROMOTED_RESOURCE_ATTRIBUTES.get(key)
    pairs = _column_pairs(spans, column, group, keep) if column in spans.column_names else set()
    return pairs | _map_pairs(spans, key, group, keep)


def _column_pairs(spans: pa.Table, column: str, group: np.ndarray, keep: np.ndarray) -> set[tuple[int, str]]:
    """:func:`resource_pairs` of a promoted column, chunk by chunk on its dictionary codes (a
    file's dictionary may hold values no row of it has: only the rows' codes count)."""
    pairs: set[tuple[int, str]] = set()
    start = 0
    for chunk in spans.column(column).chunks:
        here, kept = group[start:start + len(chunk)], keep[start:start + len(chunk)]
        start += len(chunk)
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        values = chunk.dictionary.to_pylist()
        codes = filled(chunk.indices, -1)
        if kept.all() and here.size and here.min() == here.max():
            if here[0] >= 0:
                pairs.update((int(here[0]), str(values[v])) for v in distinct_codes(codes, len(values)))
            continue
        sel = kept & (codes >= 0)
        pairs.update((g, str(values[v])) for g, v in pairs_present(here[sel], codes[sel], len(values)))
    return pairs


def _map_pairs(spans: pa.Table, key: str, group: np.ndarray, keep: np.ndarray) -> set[tuple[int, str]]:
    """:func:`resource_pairs` of the ``resource_attributes`` map."""
    pairs: set[tuple[int, str]] = set()
    values: dict[str, int] = {}
    for start, chunk, is_key, item_codes, local in _resource_chunks(spans, key, values):
        here, kept = group[start:start + len(chunk)], keep[start:start + len(chunk)]
        if kept.all() and here.size and here.min() == here.max():
            present = np.zeros(len(local), dtype=bool)  # the last slot is where null values (-1) land
            if len(local) <= _FEW_VALUES:  # one comparison pass per value beats gathering every entry
                for code in range(len(local) - 1):
                    present[code] = (is_key & (item_codes == code)).any()
            else:
                present[item_codes[is_key]] = True
            pairs.update((int(here[0]), int(v)) for v in local[np.flatnonzero(present)] if v >= 0 and here[0] >= 0)
            continue
        match = np.flatnonzero(is_key)
        found = local[item_codes[match]]
        owner = np.searchsorted(chunk.offsets.to_numpy(), match + int(chunk.offsets[0].as_py()), side="right") - 1
        sel = kept[owner] & (found >= 0)
        for g, v in pairs_present(here[owner][sel], found[sel], len(values)):
            pairs.add((g, v))
    names = {code: value for value, code in values.items()}
    return {(g, names[v]) for g, v in pairs}


def _resource_chunks(spans: pa.Table, key: str, values: dict):
    """Per chunk of ``resource_attributes``: (first row, chunk, which entries have key ``key``,
    value code of every entry, map from those codes to codes shared across chunks in ``values``)."""
    if "resource_attributes" not in spans.column_names or spans.num_rows == 0:
        return
    start = 0
    for chunk in spans.column("resource_attributes").chunks:
        offsets = chunk.offsets.to_numpy()
        first, count = int(offsets[0]), int(offsets[-1] - offsets[0])
        keys, items = chunk.keys.slice(first, count), chunk.items.slice(first, count)
        is_key = _equals(keys, key)
        item_codes, item_values = _dictionary(items)
        local = np.array([values.setdefault(v, len(values)) if v is not None else -1 for v in item_values] + [-1],
                         dtype=np.int64)
        yield start, chunk, is_key, item_codes, local
        start += len(chunk)


def _dictionary(arr: pa.Array) -> tuple[np.ndarray, list]:
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    return filled(arr.indices, -1), arr.dictionary.to_pylist()


def _equals(arr: pa.Array, value: str) -> np.ndarray:
    codes, values = _dictionary(arr)
    return code_mask(codes, [i for i, v in enumerate(values) if v == value], len(values))
