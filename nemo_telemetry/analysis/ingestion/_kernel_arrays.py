"""The arrays compiled decoders fill, and the Arrow string arrays over what they wrote.

Shared by the protobuf walk and the JSON scan (and the promotion over their output); apart from
:mod:`~nemo_telemetry.analysis.ingestion._columns` so that promotion can use them without
importing the tables it feeds.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

__all__ = ["scratch_matrix", "grown_records", "string_array", "string_offsets", "special_rows", "value_types",
           "TypeTags", "zeros_array", "uint32_column", "empty_strings"]

_SCRATCH = threading.local()
_ZEROS = np.zeros(0, dtype=np.uint8)
_ZEROS_LOCK = threading.Lock()


def _zero_buffer(nbytes: int) -> pa.Buffer:
    """``nbytes`` zero bytes, read-only, shared by every array that needs zeros: the OTLP fields
    a request leaves at their default (flags, dropped counts, empty scope maps, no schema URL)
    are all zeros in most batches, and a column of them then costs no page of its own."""
    global _ZEROS
    zeros = _ZEROS
    if zeros.size < nbytes:
        with _ZEROS_LOCK:
            if _ZEROS.size < nbytes:
                grown = np.zeros(max(nbytes, 2 * _ZEROS.size), dtype=np.uint8)  # never written
                grown.flags.writeable = False
                _ZEROS = grown
            zeros = _ZEROS
    return pa.py_buffer(zeros[:nbytes])


def zeros_array(n: int, kind: pa.DataType, null: bool = False) -> pa.Array:
    """``n`` zeros of a fixed-width ``kind`` (all null when ``null``) over the shared zero buffer."""
    width = kind.bit_width // 8
    validity = _zero_buffer((n + 7) // 8) if null else None
    return pa.Array.from_buffers(kind, n, [validity, _zero_buffer(n * width)], null_count=n if null else 0)


def empty_strings(n: int, null: bool = False, kind: pa.DataType = pa.string()) -> pa.Array:
    """``n`` empty strings (all null when ``null``) of ``kind`` (string or large_string) over the
    shared zero buffer: a string field no span of a batch sets (trace state, status message)
    costs no offsets of its own."""
    validity = _zero_buffer((n + 7) // 8) if null else None
    width = 8 if pa.types.is_large_string(kind) else 4
    return pa.Array.from_buffers(kind, n, [validity, _zero_buffer(width * (n + 1)), _zero_buffer(0)],
                                 null_count=n if null else 0)


def uint32_column(values: np.ndarray) -> pa.Array:
    """A uint32 column of ``values`` (already checked to fit), shared zeros when all are 0."""
    if not values.any():
        return zeros_array(values.size, pa.uint32())
    return pa.array(values.astype(np.uint32))


def scratch_matrix(name: str, rows: int, columns: int) -> np.ndarray:
    """A C-contiguous (rows, columns) int64 matrix for a kernel to fill, reused by this thread
    from batch to batch: fresh pages cost a page fault each, a fifth of a decode's time. Its
    old contents are garbage; the kernels set every field of each record they write, and no
    table keeps a view of it (columns taken from it are copied).

    It grows to twice the size asked for: batches differ in size (by a request, or a block
    read short), and a new matrix for each batch a little bigger than any before would be
    fresh pages again; the room never written costs nothing (zeroed pages are mapped on first
    touch)."""
    size = rows * columns
    flat = getattr(_SCRATCH, name, None)
    if flat is None or flat.size < size:
        flat = np.zeros(2 * size, dtype=np.int64)
        setattr(_SCRATCH, name, flat)
    return flat[:size].reshape(rows, columns)


def grown_records(array: np.ndarray, used: int, axis: int) -> np.ndarray:
    """``array`` with twice the room along its record ``axis``, the ``used`` records copied (a
    kernel that ran out of room is run again on the bigger arrays)."""
    shape = list(array.shape)
    shape[axis] = 2 * shape[axis] + 16
    bigger = np.zeros(shape, dtype=array.dtype)
    index = (slice(None), slice(0, used)) if axis == 1 else (slice(0, used),)
    bigger[index] = array[index]
    return bigger


def string_array(
    offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None = None, *, utf8_checked: bool = False
) -> pa.Array:
    """A string array over a kernel's (offsets, bytes) output: ``string`` for int32 offsets,
    ``large_string`` for int64. UTF-8 is checked (``pa.ArrowInvalid`` otherwise) unless the
    bytes were cut from already checked strings (``utf8_checked``); ``valid`` False rows are null."""
    n = offsets.size - 1
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    kind = pa.string() if offsets.dtype == np.int32 else pa.large_string()
    strings = pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])
    strings.validate(full=not utf8_checked)
    return strings


def string_offsets(count: int, total_bytes: int) -> np.ndarray:
    """Room for the offsets of ``count`` strings: int32 (Arrow ``string``, the table's type, so
    no cast copies them later) unless the bytes need int64."""
    return np.empty(count + 1, dtype=np.int32 if total_bytes < 2**31 - 1 else np.int64)


def special_rows(kind: np.ndarray, rows: np.ndarray, strings: list) -> tuple[list[bytes], np.ndarray]:
    """The encoded strings of ``rows`` and each row's index among them (-1: not special);
    a None string makes its row null (its ``kind`` is cleared)."""
    special = np.full(kind.size, -1, dtype=np.int64)
    null = [text is None for text in strings]
    if any(null):
        kind[rows[null]] = -1
        rows = rows[[not n for n in null]]
        strings = [text for text in strings if text is not None]
    special[rows] = np.arange(rows.size)
    return [text.encode() for text in strings], special


@dataclass(frozen=True)
class TypeTags:
    """Each flat attribute's type tag as ``dictionary[codes[i]]``; code -1: no tag (a string,
    or no value). The compiled promote passes read the codes; :meth:`array` is the same tags as
    the Arrow column :func:`type_map` reads."""

    codes: np.ndarray  # int32, one per attribute
    dictionary: tuple[str, ...]

    @classmethod
    def of(cls, tags: TypeTags | pa.Array | pa.ChunkedArray) -> TypeTags:
        """The codes of a string (or dictionary) array of tags, null for none."""
        if isinstance(tags, TypeTags):
            return tags
        if isinstance(tags, pa.ChunkedArray):
            tags = tags.combine_chunks()
        if not pa.types.is_dictionary(tags.type):
            tags = tags.cast(pa.string()).dictionary_encode()
        codes = tags.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        return cls(codes, tuple(tags.dictionary.cast(pa.string()).to_pylist()))

    def array(self) -> pa.DictionaryArray:
        codes = self.codes.astype(np.int32, copy=False)
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(self.dictionary, pa.string()))


def value_types(kind: np.ndarray, by_kind: dict[int, str], rows: np.ndarray, row_tags: list) -> TypeTags:
    """Each attribute's type tag (null for strings and absent values) from the kinds a compiled
    pass gave it: the tag ``by_kind[kind]`` (ints, bools, and whatever else the kind tells),
    and for ``rows`` (values a parser read: arrays, lists, or any kind the pass did not tell)
    their ``row_tags``."""
    dictionary = list(dict.fromkeys(by_kind.values()))
    table = np.full(max(by_kind) + 2, -1, dtype=np.int32)  # the last entry: every kind past the others
    for value, tag in by_kind.items():
        table[value] = dictionary.index(tag)
    codes = np.take(table, kind, mode="clip")  # one pass; kinds below 0 read table[0] (no tag)
    if rows.size:
        extra = [t for t in dict.fromkeys(row_tags) if t is not None and t not in dictionary]
        dictionary += extra
        index = {tag: i for i, tag in enumerate(dictionary)}
        codes[rows] = [index[tag] if tag is not None else -1 for tag in row_tags]
    return TypeTags(codes, tuple(dictionary))
