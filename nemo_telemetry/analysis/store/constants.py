"""Columns a spans file holds a single value in, read without decoding them.

A spans file is one process's spans (one run and rank), so the columns that describe the process
(its service, run, rank, span groups), the trace (one per run, as the instrument propagates it),
and the status, kind and flags most spans share usually hold one value through the whole file.
Decoding such a column costs as much as decoding one whose every value differs. The writer
(:func:`declare_constants`) names each of them and its value in the file's key-value metadata; a
reader (:func:`file_constants`) takes a declared value only where the file's own Parquet
statistics agree with it (each row group's min and max equal to it, no null; or every row null),
so a file another tool rewrote with other values, or without statistics, is decoded as any other.
A file without the declaration (one written before it) is decoded whole, as before.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["CONSTANTS_KEY", "CONSTANT_COLUMNS", "declare_constants", "file_constants", "constant_array", "ConstantArrays"]

CONSTANTS_KEY = b"nemo_telemetry.constant_columns"
"""The spans file's key-value metadata entry: a JSON object, column -> its one value (null: every row null)."""

CONSTANT_COLUMNS = (
    "service_name", "run_id", "rank", "span_groups", "span_groups_namespace",  # the process
    "trace_key", "trace_low",  # the trace, where a file holds one
    "status_code", "status_message", "kind", "flags",  # what most spans share
)
"""The columns a writer declares when they hold one value: those the readers read on every row."""

_JSON_TYPES = (str, int, type(None))


def declare_constants(spans: pa.Table) -> pa.Table:
    """``spans`` (one file's) with :data:`CONSTANTS_KEY` in its schema metadata: each of
    :data:`CONSTANT_COLUMNS` it has whose rows hold one value (or are all null)."""
    declared = {}
    for name in CONSTANT_COLUMNS:
        if name in spans.column_names and spans.num_rows:
            found, value = _one_value(spans.column(name))
            if found:
                declared[name] = value
    metadata = dict(spans.schema.metadata or {})
    metadata[CONSTANTS_KEY] = json.dumps(declared, separators=(",", ":")).encode()
    return spans.replace_schema_metadata(metadata)


def _one_value(column: pa.ChunkedArray) -> tuple[bool, Any]:
    """(True, the value) when every row of ``column`` holds the same value (None: every row null)."""
    if column.null_count == len(column):
        return True, None
    if column.null_count:
        return False, None
    array = column.combine_chunks()
    if pa.types.is_dictionary(array.type):
        low, high = (v.as_py() for v in pc.min_max(array.indices).values())
        value = array.dictionary[low].as_py() if low == high else None
        return low == high and isinstance(value, _JSON_TYPES), value
    if not pa.types.is_integer(array.type):
        return False, None
    low, high = (v.as_py() for v in pc.min_max(array).values())
    return low == high, low


def file_constants(metadata, schema: pa.Schema, columns: Iterable[str]) -> dict[str, Any]:
    """Of ``columns``, those the file (its Parquet ``metadata`` and Arrow ``schema``) declares
    constant and whose statistics agree, each with its value."""
    declared_json = (schema.metadata or {}).get(CONSTANTS_KEY)
    if not declared_json or metadata is None:
        return {}
    try:
        declared = json.loads(declared_json)
    except ValueError:
        return {}
    if not isinstance(declared, dict):
        return {}
    wanted = [c for c in columns if c in declared and isinstance(declared[c], _JSON_TYPES)]
    if not wanted:
        return {}
    leaf = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
    out = {}
    for name in wanted:
        if name in leaf and all(_agrees(metadata.row_group(g), leaf[name], declared[name])
                                for g in range(metadata.num_row_groups)):
            out[name] = declared[name]
    return out


def _agrees(row_group, column: int, value: Any) -> bool:
    """Whether a row group's statistics of ``column`` say it holds ``value`` alone (None: every row null)."""
    stats = row_group.column(column).statistics
    if stats is None or not stats.has_null_count:
        return False
    if value is None:
        return stats.null_count == row_group.num_rows
    return (stats.null_count == 0 and stats.has_min_max and type(stats.min) is type(value)
            and stats.min == value and stats.max == value)


def constant_array(field: pa.Field, value: Any, rows: int) -> pa.Array:
    """``rows`` rows of ``value`` as ``field``'s type (a dictionary of one value for a dictionary)."""
    return ConstantArrays().get(field, value, rows)


class ConstantArrays:
    """The arrays of one read's repeated values, each made once (as long as the longest batch
    asked so far) and shared, sliced, by every batch that holds it (arrays are immutable):
    batches cost no new memory, and the dictionary columns share one buffer of zero indices."""

    def __init__(self) -> None:
        self._made: dict[tuple, pa.Array] = {}
        self._zeros: dict[str, pa.Array] = {}

    def get(self, field: pa.Field, value: Any, rows: int) -> pa.Array:
        key = (field.name, str(field.type), value)
        made = self._made.get(key)
        if made is None or len(made) < rows:
            made = self._made[key] = self._make(field.type, value, rows)
        return made if len(made) == rows else made.slice(0, rows)

    def _make(self, type_: pa.DataType, value: Any, rows: int) -> pa.Array:
        if value is None:
            return pa.nulls(rows, type_)
        if pa.types.is_dictionary(type_):
            index = str(type_.index_type)
            zeros = self._zeros.get(index)
            if zeros is None or len(zeros) < rows:
                zeros = self._zeros[index] = pa.array(np.zeros(rows, dtype=type_.index_type.to_pandas_dtype()),
                                                      type_.index_type)
            return pa.DictionaryArray.from_arrays(zeros.slice(0, rows), pa.array([value], type_.value_type))
        return pa.array(np.full(rows, value, dtype=type_.to_pandas_dtype()), type_)
