"""The spans table as the numpy arrays goodput and the findings compute on, built once per call.

Strings that repeat (names, buckets, runs, services) become integer codes into a small tuple
of values, so every rule over names is decided once per distinct name and then broadcast by
code. The walk up the tree starts only from the rows that need it (the bucketed spans), one
level per numpy step, so a 10-million-span table costs a handful of gathers on small arrays.
"""

from __future__ import annotations

import ctypes
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from nemo_telemetry.analysis.store.commits import committed_files
from nemo_telemetry.analysis.store.sources import single_dataset
from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION, PROMOTED_RESOURCE_ATTRIBUTES
from nemo_telemetry.analysis.model.tree import (
    SPAN_SPREAD, mixed_key, parent_indices, trace_mix, unmixed_key, with_id_keys,
)
from nemo_telemetry.analysis.model.walk import climb
from nemo_telemetry.errors import IngestError

__all__ = ["BUCKETS", "SpanArrays", "span_arrays", "code_values", "column_rows", "codes_matching", "code_mask", "pairs_present", "READ_COLUMNS",
           "isin_sorted", "SortedSet", "HeldRows", "key_index", "sort_index", "index_parents", "index_orphans", "distinct_parents", "orphan_mask",
           "GOODPUT_COLUMNS", "STEP_GOODPUT_COLUMNS", "read_for_analysis", "read_span_files", "scan_span_files",
           "span_source_files", "reading_errors", "has_id_keys",
           "decode_span_files", "walk_rows", "resource_values", "resource_pairs"]

BUCKETS = ("productive", "overhead", "idle", "wasted")
UNKNOWN_BUCKET = -2
NO_BUCKET = -1

# What check reads from a dataset: span and parent ids come from the uint64 keys (hex strings
# cost more to read than everything else together); trace ids are read as dictionaries, since
# their values repeat on every span of a process. The enabled span groups come from their own
# column, not the resource attribute map (200 MB in memory at 10M spans); a file written before
# that column adds the map to the read (:func:`read_span_files`). No finding reads service_name
# or rank (goodput's by="rank" does: GOODPUT_COLUMNS has them).
READ_COLUMNS = (
    "trace_id", "name", "start_ns", "end_ns", "run_id", BUCKET, ITERATION,
    EFFICIENCY_CATEGORY, "span_groups", "trace_key", "span_key", "parent_key",
)
# Promoted resource columns that files written before them lack: such a file holds the
# attribute in the resource map, which a read of the column then adds (resource_pairs reads both).
_PROMOTED_LATER = ("span_groups",)
# Row-group-sized batches (ingest writes pyarrow's default row groups, 2**20 rows): a few large chunks decode
# with less overhead per batch than the scanner's default 2**17, and every per-chunk loop
# over the columns runs a few times instead of a hundred.
_READ_BATCH_ROWS = 1 << 20
_SCAN_BATCH_ROWS = 1 << 17  # scan_span_files: small enough that the pool reuses each batch's pages for the next
_SCAN_READAHEAD = 4  # batches decoded ahead per file: both cores busy, a few batches' memory in flight
_SEARCH_STRETCH = 1024  # sorted queries searched together within one slice of the sorted values
_LOOKUP_ROWS = 1 << 20  # lookups over every span go a block at a time, so their temporaries stay small
_FEW_VALUES = 8  # resource attribute values in a chunk's dictionary up to which each is tested by a comparison
_DICTIONARY_READS = ("trace_id", "resource_attributes.key_value.key", "resource_attributes.key_value.value")


GOODPUT_COLUMNS = ("name", "start_ns", "end_ns", "service_name", "run_id", "rank", BUCKET, ITERATION,
                   "trace_key", "span_key", "parent_key")
# goodput by step reads no service_name or rank (only by="rank" does): two columns fewer to read.
STEP_GOODPUT_COLUMNS = tuple(c for c in GOODPUT_COLUMNS if c not in ("service_name", "rank"))


def read_for_analysis(source, *, columns: tuple[str, ...] = READ_COLUMNS) -> pa.Table:
    """The spans columns goodput and check need, from a dataset directory or raw dump files.

    A dataset is projected onto ``columns`` (:data:`READ_COLUMNS`: what check reads;
    :data:`GOODPUT_COLUMNS`: what goodput reads); raw files are ingested whole in memory.
    """
    root, files = span_source_files(source)
    if not files:
        # The decoders (and the OpenTelemetry SDK they import) only for raw files: 0.1 s of start-up
        # a command over a dataset does not pay.
        from nemo_telemetry.analysis.ingestion.ingest import read_spans  # noqa: PLC0415

        return read_spans(source)
    with reading_errors(root):
        table = read_span_files(files, columns=columns)
    _trim_malloc()
    return table


def span_source_files(source) -> tuple[Path | None, list[str]]:
    """(dataset root, its committed spans files) of ``source``; no files when it is raw dump files."""
    root = single_dataset(source)
    return root, ([str(p) for p in committed_files(root, "spans")] if root is not None else [])


@contextmanager
def reading_errors(root: Path | None):
    """A spans file Arrow cannot read, as the error a user can act on."""
    try:
        yield
    except (pa.ArrowInvalid, OSError) as exc:
        raise IngestError(f"{root}: cannot read the spans table ({exc}); re-run nemo-telemetry ingest") from None


def read_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS) -> pa.Table:
    """``columns`` of the spans Parquet ``files``, the one projection every engine reads: the string
    columns that repeat as dictionaries, the hex ids where a file was written before the id keys,
    and the resource map where one was written before the span groups column."""
    dataset, columns = _span_projection(files, columns)
    # Into the system allocator's pool rather than Arrow's default (mimalloc): on a loaded 2-core
    # machine 10M spans read in 2-3 s against 6-10 s there, and check's peak RSS is 0.1-0.2 GB lower.
    table = dataset.to_table(columns=columns, batch_size=_READ_BATCH_ROWS, memory_pool=pa.system_memory_pool())
    pa.default_memory_pool().release_unused()  # the reader's own scratch (0.15 GB at 10M spans), back to the OS
    return table


def scan_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS,
                    batch_rows: int | None = None) -> Iterator[pa.RecordBatch]:
    """:func:`read_span_files`' projection as record batches in dataset order, for a caller that keeps
    only part of each batch (goodput keeps its few rows and the walk's columns).

    Small batches in a pool that reuses what the previous batches freed (jemalloc, where this
    pyarrow has it): the columns a caller lets go cost no new pages, and page faults are most of
    a read's system time on these VMs (10M spans: goodput's read faults in 0.44 GB instead of 0.78).
    """
    dataset, columns = _span_projection(files, columns)
    yield from _scan(dataset, columns, batch_rows)


def _scan(dataset: ds.Dataset, columns: list[str], batch_rows: int | None) -> Iterator[pa.RecordBatch]:
    return dataset.to_batches(columns=columns, batch_size=batch_rows or _SCAN_BATCH_ROWS,
                              batch_readahead=_SCAN_READAHEAD, memory_pool=_reusing_pool())


def _span_projection(files: list[str], columns: tuple[str, ...]) -> tuple[ds.Dataset, list[str]]:
    fmt = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=list(_DICTIONARY_READS)))
    dataset, columns = _promoted_later(ds.dataset(files, format=fmt), columns)
    names = dataset.schema.names
    columns = [c for c in columns if c in names]
    if not has_id_keys(dataset.schema):
        columns += [c for c in ("trace_id", "span_id", "parent_span_id") if c in names and c not in columns]
    return dataset, columns


def _promoted_later(dataset: ds.Dataset, columns) -> tuple[ds.Dataset, tuple]:
    """The dataset and columns to read for ``columns`` when they name a :data:`_PROMOTED_LATER`
    column: the resource map too where a file lacks the column (its values are there), and the
    column in the schema where the first file lacks it and another has it (``ds.dataset`` takes
    its schema from the first file only; the files without it read as nulls)."""
    later = [c for c in _PROMOTED_LATER if c in columns]
    if not later:
        return dataset, tuple(columns)
    schemas = [fragment.physical_schema for fragment in dataset.get_fragments()]  # each file's footer
    fields = {c: [schema.field(c) for schema in schemas if c in schema.names] for c in later}
    if any(len(found) < len(schemas) for found in fields.values()) and "resource_attributes" not in columns:
        columns = (*columns, "resource_attributes")
    added = [found[0] for c, found in fields.items() if found and c not in dataset.schema.names]
    schema = dataset.schema
    for field in added:
        schema = schema.append(field)
    # the same fragments, whose footers are read now: the scan does not read them again
    return dataset.replace_schema(schema) if added else dataset, tuple(columns)


def has_id_keys(schema: pa.Schema) -> bool:
    """Whether a spans table (or dataset) has the uint64 id key columns ingest writes."""
    return all(key in schema.names for key in ("trace_key", "span_key", "parent_key"))


@cache
def _reusing_pool() -> pa.MemoryPool:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return pa.system_memory_pool()


def _trim_malloc() -> None:
    """Hand the decoders' freed scratch in the system allocator back to the OS (glibc only).

    The reader's threads free 0.2-0.3 GB per 10M spans into glibc's per-thread arenas, which keep
    it; ``check`` then peaks that much lower (under 2 GB at 10M spans). Arrow's system pool does
    not trim on ``release_unused``, so ``malloc_trim`` is called directly where glibc has it.
    Once per whole-table read: the partitioned engines' per-file reads reuse that scratch.
    """
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


@cache
def _libc():
    try:
        return ctypes.CDLL(None)
    except OSError:  # no C library to load symbols from (a static or exotic build): nothing to trim
        return None


def _codes(spans: pa.Table, column: str) -> tuple[np.ndarray, tuple]:
    """(int32 codes with -1 for null, the distinct values) of a string or dictionary column.

    Chunk by chunk, into one preallocated array (:func:`_codes_into`).
    """
    n = spans.num_rows
    if column not in spans.column_names or n == 0:
        return np.full(n, -1, dtype=np.int32), ()
    values: dict = {}
    out = np.empty(n, dtype=np.int32)
    start = 0
    for chunk in spans.column(column).chunks:
        _codes_into(chunk, values, out[start:start + len(chunk)])
        start += len(chunk)
    return out, tuple(values)


def _codes_into(chunk: pa.Array, values: dict, into: np.ndarray) -> None:
    """One chunk of a string or dictionary column as codes into ``values`` (shared by the chunks, which
    it extends), -1 for null. The chunk's (small) dictionary is mapped onto the shared values once,
    then its indices go through that map; a chunk whose dictionary lists the shared values in their
    order (every chunk of a file after the first, usually) is copied as it is."""
    if not pa.types.is_dictionary(chunk.type):
        chunk = pc.dictionary_encode(chunk)
    local = np.array([values.setdefault(v, len(values)) if v is not None else -1
                      for v in chunk.dictionary.to_pylist()] + [-1], dtype=np.int32)
    indices = _filled(chunk.indices, -1)
    if np.array_equal(local[:-1], np.arange(len(local) - 1)):
        into[:] = indices
    else:
        np.take(local, indices, out=into, mode="wrap")  # wrap: a null's -1 lands on the last slot, -1


def code_values(spans: pa.Table, column: str) -> tuple:
    """The distinct values of a column in the order :func:`span_arrays` numbers them (its ``runs``,
    ``names``...), from the chunks' dictionaries alone when the column is dictionary-encoded."""
    if column not in spans.column_names or spans.num_rows == 0:
        return ()
    chunks = spans.column(column).chunks
    if not all(pa.types.is_dictionary(chunk.type) for chunk in chunks):
        return _codes(spans, column)[1]
    values: dict = {}
    for chunk in chunks:
        for value in chunk.dictionary.to_pylist():
            if value is not None:
                values.setdefault(value, len(values))
    return tuple(values)


def _row_value(column: pa.ChunkedArray, row: int):
    """One value of a chunked column without concatenating or taking over the chunks."""
    for chunk in column.chunks:
        if row < len(chunk):
            return chunk[row].as_py()
        row -= len(chunk)
    raise IndexError(row)


def column_rows(column: pa.ChunkedArray, rows: np.ndarray, fill: int) -> np.ndarray:
    """``column``'s values at ``rows`` (any order) as numpy, nulls as ``fill``: gathered chunk by
    chunk, since Arrow's take over a chunked column concatenates it first (12 ms and 80 MB for a
    10M-row uint64 column, however few rows are taken)."""
    rows = np.asarray(rows, dtype=np.int64)
    chunks = column.chunks
    if len(chunks) == 1:
        return _filled(chunks[0], fill)[rows]
    bounds = np.cumsum([0] + [len(c) for c in chunks])
    which = np.searchsorted(bounds, rows, side="right") - 1
    out = np.empty(len(rows), dtype=column.type.to_pandas_dtype())
    for i in np.unique(which):
        here = which == i
        out[here] = _filled(chunks[i], fill)[rows[here] - bounds[i]]
    return out


def _filled(column: pa.Array | pa.ChunkedArray, fill: int) -> np.ndarray:
    """A numeric Arrow column as numpy, nulls replaced by ``fill`` (no copy through Arrow when none)."""
    if column.null_count:
        column = pc.fill_null(column, fill)
    return column.to_numpy() if isinstance(column, pa.ChunkedArray) else column.to_numpy(zero_copy_only=False)


def _int_column(spans: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
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
        _ints_into(chunk, values[start:start + len(chunk)], valid[start:start + len(chunk)])
        start += len(chunk)
    return values, valid


def _ints_into(chunk: pa.Array, values: np.ndarray, valid: np.ndarray | None) -> None:
    """One chunk of an integer column into ``values`` (nulls as 0) and, unless None, ``valid``."""
    if valid is not None and chunk.null_count:
        valid[:] = pc.is_valid(chunk).to_numpy(zero_copy_only=False)
    elif valid is not None:
        valid[:] = True
    values[:] = _filled(chunk, 0)


def code_mask(codes: np.ndarray, chosen, size: int) -> np.ndarray:
    """``np.isin(codes, chosen)`` for small-integer codes (-1 never chosen), by one table lookup;
    one comparison when a single code or every code is chosen (no index array the size of
    ``codes``: 3x faster)."""
    chosen = np.asarray(chosen, dtype=np.int64)
    chosen = np.unique(chosen[(chosen >= 0) & (chosen < size)])
    if len(chosen) == 1:
        return codes == int(chosen[0])  # a Python int: compared in the codes' own dtype
    if len(chosen) == size:
        return codes >= 0
    table = np.zeros(size + 1, dtype=bool)  # the extra last slot is where code -1 lands: never chosen
    table[chosen] = True
    return table[codes]


def pairs_present(first: np.ndarray, second: np.ndarray, second_size: int) -> list[tuple[int, int]]:
    """The distinct (first, second) pairs of two code arrays, by marking; pairs with a -1 are left out."""
    if first.size == 0:
        return []
    width = second_size + 1  # codes shifted by one, so -1 (null) has a slot of its own
    seen = np.zeros((int(first.max()) + 2) * width, dtype=bool)
    for lo in range(0, len(first), _LOOKUP_ROWS):  # a block at a time: the keys stay in cache
        key = first[lo:lo + _LOOKUP_ROWS].astype(np.int64)
        key += 1
        key *= width
        key += second[lo:lo + _LOOKUP_ROWS]
        key += 1
        seen[key] = True
    pairs = (divmod(int(k), width) for k in np.flatnonzero(seen))
    return [(a - 1, b - 1) for a, b in pairs if a > 0 and b > 0]


def isin_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``np.isin(values, sorted_set)`` for uint64 keys and a small sorted set (:class:`SortedSet`)."""
    out = np.zeros(len(values), dtype=bool)
    if sorted_set.size == 0 or len(values) == 0:
        return out
    members = SortedSet(sorted_set)
    for lo in range(0, len(values), _LOOKUP_ROWS):  # a block at a time: no temporary as large as ``values``
        members.contains(values[lo:lo + _LOOKUP_ROWS], out=out[lo:lo + _LOOKUP_ROWS])
    return out


class SortedSet:
    """Membership in a small sorted set of uint64 keys, tested block by block.

    A 65,536-slot table indexed by the top 16 bits holds the set's only member with those
    bits, so one cache-resident lookup and a comparison decide almost every value, whether
    it is in the set or not; only values whose slot holds several members are binary-searched.
    """

    _SLOT_BITS = np.uint64(48)

    def __init__(self, sorted_set: np.ndarray) -> None:
        self.values = sorted_set
        prefix = (sorted_set >> self._SLOT_BITS).astype(np.intp)
        members = np.bincount(prefix, minlength=1 << 16)
        # An empty (or crowded) slot holds a number from the neighbouring slot: no value of its own slot equals it.
        self.only = (np.arange(1 << 16, dtype=np.uint64) ^ np.uint64(1)) << self._SLOT_BITS
        single = members[prefix] == 1
        self.only[prefix[single]] = sorted_set[single]
        self.crowded = members > 1
        self.some_crowded = bool(self.crowded.any())

    def contains(self, block: np.ndarray, *, out: np.ndarray) -> np.ndarray:
        """Into ``out``: whether each of ``block`` is in the set."""
        if self.values.size == 0:
            out[:] = False
            return out
        slot = (block >> self._SLOT_BITS).astype(np.intp)
        np.equal(self.only[slot], block, out=out)
        if self.some_crowded:
            maybe = np.flatnonzero(self.crowded[slot])
            at = np.minimum(np.searchsorted(self.values, block[maybe]), self.values.size - 1)
            out[maybe] = self.values[at] == block[maybe]
        return out


def codes_matching(values: tuple, regex: str) -> np.ndarray:
    """Codes of the distinct values that match ``regex`` (decided once per value)."""
    pattern = re.compile(regex)
    return np.array([i for i, v in enumerate(values) if v is not None and pattern.search(v)], dtype=np.int32)


class HeldRows:
    """An int64 column kept at some rows only (``rows``, ascending): indexed by row numbers as the
    whole column would be, for the rows a rule reads it at. Any other row is an error, never a
    made-up value."""

    def __init__(self, n: int, rows: np.ndarray, values: np.ndarray) -> None:
        self.n, self.rows, self.values = n, rows, values

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, rows) -> np.ndarray:
        rows = np.asarray(rows)
        if rows.dtype == bool or rows.ndim > 1:
            raise TypeError("HeldRows is indexed by an array of row numbers")
        flat = rows.reshape(-1).astype(np.int64, copy=False)
        at = np.minimum(np.searchsorted(self.rows, flat), max(len(self.rows) - 1, 0))
        if len(flat) and (len(self.rows) == 0 or not np.array_equal(self.rows[at], flat)):
            raise IndexError("a row whose value this decode did not keep was asked for")
        return (self.values[at] if len(flat) else self.values[:0]).reshape(rows.shape)


@dataclass(frozen=True, eq=False)
class SpanArrays:
    """Columns of one spans table as numpy arrays; ``table`` is kept to read ids for messages."""

    table: pa.Table
    name: np.ndarray
    names: tuple
    run: np.ndarray
    runs: tuple
    start: np.ndarray | HeldRows
    end: np.ndarray | HeldRows
    bucket: np.ndarray  # index into BUCKETS, NO_BUCKET, or UNKNOWN_BUCKET
    bucket_raw: np.ndarray  # code into bucket_values
    bucket_values: tuple
    iteration: np.ndarray
    has_iteration: np.ndarray

    # Decoded on first use only: goodput by step never reads them.
    @cached_property
    def _service(self) -> tuple[np.ndarray, tuple]:
        return _codes(self.table, "service_name")

    @property
    def service(self) -> np.ndarray:
        return self._service[0]

    @property
    def services(self) -> tuple:
        return self._service[1]

    @cached_property
    def _category(self) -> tuple[np.ndarray, tuple]:
        return _codes(self.table, EFFICIENCY_CATEGORY)

    @property
    def category(self) -> np.ndarray:
        return self._category[0]

    @property
    def categories(self) -> tuple:
        held = self.__dict__.get("_bucketed_category")
        return held[2] if held is not None else self._category[1]

    def bucketed_category(self, rows: np.ndarray) -> np.ndarray:
        """Efficiency category codes (-1: none) of ``rows``, rows with an ``rl.bucket``: the only
        rows whose category a rule reads, and all a decode of spans files keeps
        (:func:`decode_span_files`)."""
        held = self.__dict__.get("_bucketed_category")
        if held is None:
            return self.category[rows]
        with_bucket, codes, _ = held
        rows = np.asarray(rows, dtype=np.int64)
        at = np.minimum(np.searchsorted(with_bucket, rows), max(len(with_bucket) - 1, 0))
        if len(rows) and (len(with_bucket) == 0 or not np.array_equal(with_bucket[at], rows)):
            raise ValueError("bucketed_category: a row without an rl.bucket was asked for")
        return codes[at] if len(rows) else np.zeros(0, np.int32)

    @cached_property
    def _rank(self) -> tuple[np.ndarray, np.ndarray]:
        return _int_column(self.table, "rank")

    @property
    def rank(self) -> np.ndarray:
        return self._rank[0]

    @property
    def has_rank(self) -> np.ndarray:
        return self._rank[1]

    def __len__(self) -> int:
        return len(self.start)

    @cached_property
    def parents(self) -> np.ndarray:
        """Parent row of every span (-1: root or orphan); the full join, for the findings."""
        return parent_indices(self.table)

    @cached_property
    def has_parent(self) -> np.ndarray:
        return _has_parent(self.table, lambda: self._keys)

    @cached_property
    def orphan(self) -> np.ndarray:
        """Spans that name a parent which is not in the table (same trace)."""
        return orphan_mask(self.has_parent, self._mixed, self._sorted_spans)

    @cached_property
    def _keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _id_keys(self.table)

    @cached_property
    def _index(self) -> dict:
        if "_keys" in self.__dict__:  # ids handed over as arrays (the partitioned check): one block
            return sort_index(_build_index([self._keys], len(self), self.has_parent))
        return key_index(self.table)

    @cached_property
    def _mixed(self) -> tuple[np.ndarray, np.ndarray]:
        """(span key, parent key) of every row, each mixed with its trace: one number per (id, trace)."""
        return self._index["_mixed"]

    @cached_property
    def _sorted_spans(self) -> tuple[np.ndarray, np.ndarray, int]:
        """Span keys mixed with their trace, row number packed in the low bits, sorted (for lookups)."""
        return self._index["_sorted_spans"]

    def adopt_index(self, index: dict) -> None:
        """Take the key index :func:`key_index` built (in another thread) instead of building it here."""
        self.__dict__.update(index)

    def parent_of(self, rows: np.ndarray) -> np.ndarray:
        """Parent row of each of ``rows`` (-1: root or orphan), without joining the whole table."""
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64)
        if "parents" in self.__dict__:
            return self.parents[rows]
        own, packed, bits = self._sorted_spans
        low = np.uint64((1 << bits) - 1)
        wanted = self._mixed[1][rows]
        pos = np.searchsorted(packed, wanted & ~low)
        out = np.full(len(rows), -1, dtype=np.int64)
        pending = np.flatnonzero(self.has_parent[rows])
        while pending.size:  # a second round only for equal high bits or duplicated ids
            at = pos[pending]
            pending, at = pending[at < len(packed)], at[at < len(packed)]
            found = packed[at]
            same_high = (found & ~low) == (wanted[pending] & ~low)
            pending, found = pending[same_high], found[same_high]
            row = (found & low).astype(np.int64)
            hit = (own[row] == wanted[pending]) & (row != rows[pending])
            out[pending[hit]] = row[hit]
            pending = pending[~hit]
            pos[pending] += 1
        return out

    @cached_property
    def valid_interval(self) -> np.ndarray:
        return self.end >= self.start  # a decode that keeps times at some rows only sets this itself

    def rows_of_names(self, regex: str) -> np.ndarray:
        """Boolean mask of the rows whose name matches ``regex``."""
        return code_mask(self.name, codes_matching(self.names, regex), len(self.names))

    def resource_values(self, key: str, rows: np.ndarray) -> tuple[np.ndarray, tuple]:
        """(codes, values) of resource attribute ``key`` for ``rows`` (code -1: absent)."""
        return resource_values(self.table, key, rows)

    def span_id(self, rows) -> list[str]:
        return self._ids("span_id", "span_key", rows)

    def trace_id(self, rows) -> list[str]:
        return self._ids("trace_id", "trace_key", rows)

    def _ids(self, column: str, key: str, rows) -> list[str]:
        """Hex ids of ``rows``: the id column when read, else the uint64 key (span ids are exact)."""
        rows = np.asarray(rows, dtype=np.int64)
        if column in self.table.column_names:
            return [str(_row_value(self.table.column(column), r)) for r in rows]
        if "_keys" in self.__dict__:
            keys = self._keys[0 if key == "span_key" else 1][rows]
        elif key in self.table.column_names:
            keys = column_rows(self.table.column(key), rows, 0)
        else:  # a span key the decode let go: recovered from its mixed key and trace
            keys = unmixed_key(column_rows(self.table.column("trace_key"), rows, 0), self._mixed[0][rows])
        return [f"{int(k):016x}" for k in keys]

    def walk_up(self, rows: np.ndarray, *, ancestors: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``rows``: (attributed iteration, whether one was found, nearest bucketed ancestor or -1).

        The iteration is the row's own ``rl.iteration``, else the nearest stamped ancestor's
        (parent links join across processes through carriers); a walk stops at a root or orphan.
        Only rows still missing something climb, so stamped spans cost nothing unless
        ``ancestors`` asks for every bucketed ancestor (the nested-bucket finding).
        """
        own = self.has_iteration[rows]
        need = np.arange(len(rows)) if ancestors else np.flatnonzero(~own)
        walked = climb(self.parent_of(rows[need]), self.parent_of, self.has_iteration, self.iteration,
                       bucketed=(self.bucket != NO_BUCKET) if ancestors else None, stamped=own[need])
        iteration, found = self.iteration[rows].copy(), own.copy()
        take = walked.stamped & ~own[need]
        iteration[need[take]], found[need[take]] = walked.iteration[take], True
        bucketed_ancestor = np.full(len(rows), -1, dtype=np.int64)
        bucketed_ancestor[need] = walked.ancestor
        return iteration, found, bucketed_ancestor


def _id_keys(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(_filled(table.column(c), 0).astype(np.uint64, copy=False)
                 for c in ("span_key", "trace_key", "parent_key"))


_BLOCK_ROWS = 1 << 16  # the index is built this many rows at a time, so its temporaries stay in cache


def _mix_into(span_key: np.ndarray, trace_key: np.ndarray, parent_key: np.ndarray,
              own: np.ndarray, wanted: np.ndarray) -> None:
    """:func:`~nemo_telemetry.analysis.model.tree.mixed_key` of each span and of its parent, into
    ``own`` and ``wanted`` (written in place, a block at a time, with one trace mix for both).

    Spread span ids keep hand-built traces (spans 1, 2, 3...) from sharing their high bits,
    which would turn every lookup in the sorted index into a linear walk.
    """
    mix = trace_mix(trace_key)
    with np.errstate(over="ignore"):
        np.multiply(span_key, SPAN_SPREAD, out=own)
        np.multiply(parent_key, SPAN_SPREAD, out=wanted)
    own ^= mix
    wanted ^= mix


def walk_rows(table: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(attributed iteration, whether one was found) of ``rows``, as ``span_arrays(table).walk_up(rows)``
    gives them, for a table of which only these few rows climb (goodput's unstamped bucketed spans).

    No sorted index of every span: each level of the climb finds the parents it asks for by one
    pass over the spans' mixed keys (:class:`_KeyScan`), and reads ``rl.iteration`` only at the
    rows it visits. At 10M spans and 64k walks one level up, 0.1 s against the index's 0.7 s.
    """
    table = with_id_keys(table)
    rows = np.asarray(rows, dtype=np.int64)
    if ITERATION in table.column_names:
        has_iteration = pc.is_valid(table.column(ITERATION)).to_numpy(zero_copy_only=False)
        iteration = _RowsOf(table.column(ITERATION))
    else:
        has_iteration, iteration = np.zeros(table.num_rows, dtype=bool), np.zeros(table.num_rows, dtype=np.int64)
    own = has_iteration[rows]
    need = np.flatnonzero(~own)
    scan = _KeyScan(table)
    walked = climb(scan.parent_of(rows[need]), scan.parent_of, has_iteration, iteration, stamped=own[need])
    out, found = iteration[rows], own.copy()  # nulls read as 0, as walk_up has them
    take = walked.stamped & ~own[need]
    out[need[take]], found[need[take]] = walked.iteration[take], True
    return out, found


class _RowsOf:
    """An int64 column read at the rows indexed (nulls as 0), for a walk that visits a few of them."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self.column = column

    def __getitem__(self, rows) -> np.ndarray:
        return column_rows(self.column, np.asarray(rows, dtype=np.int64), 0).astype(np.int64, copy=False)


class _KeyScan:
    """Parent rows as :meth:`SpanArrays.parent_of` finds them (the lowest other row whose span id
    and trace mix to the reference's number), by one pass over the span keys per lookup: each
    block's spread span ids are tested against the references' (:class:`SortedSet`), and only the
    spans that pass are mixed with their trace and compared whole."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.by_id = "parent_span_id" in table.column_names  # as _has_parent: the id when read, else the key
        self.named = pc.is_valid(table.column("parent_span_id")).to_numpy(zero_copy_only=False) if self.by_id else None

    def parent_of(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(len(rows), -1, dtype=np.int64)
        trace, parent = (column_rows(self.table.column(c), rows, 0).astype(np.uint64, copy=False)
                         for c in ("trace_key", "parent_key"))
        ask = np.flatnonzero(self.named[rows] if self.by_id else parent != 0)
        if ask.size == 0:
            return out
        wanted = mixed_key(trace[ask], parent[ask])
        with np.errstate(over="ignore"):
            held, keys = self._rows_with(np.unique(parent[ask] * SPAN_SPREAD))
        order = np.argsort(keys, kind="stable")  # by mixed key, then row
        keys, held = keys[order], held[order]
        pos = np.searchsorted(keys, wanted)
        for _ in range(2):  # the lowest row with that key, else (it is the span itself) the next one
            hit = pos < len(keys)
            hit[hit] = keys[pos[hit]] == wanted[hit]
            itself = hit.copy()
            itself[hit] = held[pos[hit]] == rows[ask[hit]]
            found = hit & ~itself
            out[ask[found]] = held[pos[found]]
            ask, wanted, pos = ask[itself], wanted[itself], pos[itself] + 1
            if ask.size == 0:
                break
        return out

    def _rows_with(self, spread: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, their mixed keys) of the spans whose spread span id is one of ``spread`` (sorted).

        A block of rows at a time small enough that its temporaries are reused from one block to
        the next instead of faulted in afresh."""
        members = SortedSet(spread)
        spread_block, hit_block = np.empty(_BLOCK_ROWS, np.uint64), np.empty(_BLOCK_ROWS, bool)
        rows, keys = [], []
        at = 0
        for batch in self.table.select(["span_key", "trace_key"]).to_batches(max_chunksize=_BLOCK_ROWS):
            n = batch.num_rows
            span = _filled(batch.column(0), 0).astype(np.uint64, copy=False)
            with np.errstate(over="ignore"):
                np.multiply(span, SPAN_SPREAD, out=spread_block[:n])
            hit = np.flatnonzero(members.contains(spread_block[:n], out=hit_block[:n]))
            if hit.size:
                trace = _filled(batch.column(1), 0).astype(np.uint64, copy=False)[hit]
                rows.append(hit + at)
                keys.append(mixed_key(trace, span[hit]))
            at += n
        return (np.concatenate(rows), np.concatenate(keys)) if rows else (np.zeros(0, np.int64), np.zeros(0, np.uint64))


def _has_parent(table: pa.Table, keys) -> np.ndarray:
    """Whether each span names a parent: ``parent_span_id`` is set, else (a key-only read) ``parent_key`` != 0."""
    if "parent_span_id" in table.column_names:
        return pc.is_valid(table.column("parent_span_id")).to_numpy(zero_copy_only=False)
    return keys()[2] != 0


def distinct_parents(has_parent: np.ndarray, wanted: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
    """The distinct parent references (mixed keys) left to look up, sorted: many children share a parent.

    With ``own`` (the rows' own mixed keys), a reference that the row just before or after it
    holds is found already and left out, and a reference equal to the one before it is taken
    once, before the sort: spans are stored as their process exported them, as they ended, so a
    parent often sits next to its last child and siblings next to each other (10M spans of the
    benchmark's run: 4M distinct references to look up become 16k, and 10M sort as 6M).
    """
    if own is None or len(wanted) < 2:
        ordered = wanted[has_parent]
    else:
        n = len(wanted)
        left, previous = [], None  # per block: its references left to look up; the last one kept
        for lo in range(0, n, _LOOKUP_ROWS):  # a block at a time: small temporaries, reused
            hi = min(lo + _LOOKUP_ROWS, n)
            ask = has_parent[lo:hi].copy()
            if lo:  # the row before the block's first
                ask &= wanted[lo:hi] != own[lo - 1:hi - 1]
            else:
                ask[1:] &= wanted[1:hi] != own[:hi - 1]
            last = min(hi, n - 1)  # the row after each, up to the table's last row
            ask[:last - lo] &= wanted[lo:last] != own[lo + 1:last + 1]
            block = wanted[lo:hi][ask]
            if block.size:
                fresh = np.empty(len(block), dtype=bool)
                fresh[0] = previous is None or block[0] != previous
                np.not_equal(block[1:], block[:-1], out=fresh[1:])
                previous = block[-1]
                left.append(block[fresh])
        ordered = np.concatenate(left) if left else wanted[:0].copy()
    ordered.sort()
    if ordered.size:
        distinct = np.empty(len(ordered), dtype=bool)
        distinct[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=distinct[1:])
        ordered = ordered[distinct]
    return ordered


def orphan_mask(has_parent: np.ndarray, mixed: tuple[np.ndarray, np.ndarray],
                sorted_spans: tuple[np.ndarray, np.ndarray, int], ordered: np.ndarray | None = None) -> np.ndarray:
    """Spans that name a parent which is not in the table (same trace), from the key index.

    Each distinct parent reference (``ordered``: :func:`distinct_parents`, which a caller may
    have sorted in another thread meanwhile) is looked up once, in sorted order, in the sorted
    span index the walks use; the full mixed key confirms what the high bits propose. Only
    references whose first candidate shares its high bits without being it (duplicated ids,
    equal high bits) take further rounds.
    """
    own, packed, bits = sorted_spans
    out = np.zeros(len(has_parent), dtype=bool)
    if len(packed) == 0:
        return out
    high = ~np.uint64((1 << bits) - 1)
    ordered = distinct_parents(has_parent, mixed[1], mixed[0]) if ordered is None else ordered
    # A block of references at a time: the positions and candidates of every reference at once
    # would double the test's memory at its peak. Every other block in a second thread: the
    # searches and gathers release the GIL (4M references into 10M spans: 0.16 s against 0.27 s).
    blocks = [ordered[lo:lo + _LOOKUP_ROWS] for lo in range(0, len(ordered), _LOOKUP_ROWS)]
    missing = _in_two_threads(lambda block: _missing_parents(block, own, packed, high), blocks)
    missing = np.concatenate(missing) if missing else ordered[:0]
    if missing.size:  # rare: back from the distinct parents to the spans that name them
        out = has_parent & isin_sorted(mixed[1], missing)
    return out


def _in_two_threads(work, items: list) -> list:
    """``[work(item) for item in items]``, every other item in a second thread."""
    if len(items) < 2:
        return [work(item) for item in items]
    out: list = [None] * len(items)

    def run(indices) -> None:
        for i in indices:
            out[i] = work(items[i])

    with ThreadPoolExecutor(max_workers=1) as helper:
        odd = helper.submit(run, range(1, len(items), 2))
        run(range(0, len(items), 2))
        odd.result()
    return out


def _missing_parents(ordered: np.ndarray, own: np.ndarray, packed: np.ndarray, high: np.uint64) -> np.ndarray:
    """The references of ``ordered`` (sorted mixed parent keys) that no span of the index holds."""
    ordered_high = ordered & high
    pos = _search_sorted(packed, ordered_high)
    np.minimum(pos, len(packed) - 1, out=pos)
    candidate = packed[pos]
    same_high = (candidate & high) == ordered_high
    del ordered_high
    found = same_high & (own[(candidate & ~high).astype(np.intp)] == ordered)
    pending = np.flatnonzero(same_high & ~found)
    del candidate, same_high
    while pending.size:  # further rounds only for equal high bits or duplicated ids
        pos[pending] += 1
        pending = pending[pos[pending] < len(packed)]
        candidate = packed[pos[pending]]
        same_high = (candidate & high) == (ordered[pending] & high)
        pending, candidate = pending[same_high], candidate[same_high]
        hit = own[(candidate & ~high).astype(np.intp)] == ordered[pending]
        found[pending[hit]] = True
        pending = pending[~hit]
    return ordered[~found]



def _search_sorted(values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``np.searchsorted(values, queries)`` for sorted ``queries``, a stretch of them at a time.

    Each stretch's binary searches run within the slice of ``values`` its first and the next
    stretch's first query bound, which stays in the cache; over the whole array every search
    starts with misses (4M references into 10M spans: 0.19 s against 0.26-0.37 s).
    """
    n = len(queries)
    if n < 4 * _SEARCH_STRETCH:
        return np.searchsorted(values, queries)
    cuts = np.arange(0, n, _SEARCH_STRETCH)
    lo = np.searchsorted(values, queries[cuts])
    hi = np.append(lo[1:], len(values))
    out = np.empty(n, dtype=np.intp)
    for first, start, stop in zip(cuts, lo, hi):
        last = min(first + _SEARCH_STRETCH, n)
        np.add(np.searchsorted(values[start:stop], queries[first:last]), start, out=out[first:last])
    return out


def key_index(table: pa.Table, *, sort: bool = True) -> dict:
    """The mixed id keys, the sorted span index and which spans name a parent,
    of a table that already has its key columns (for :meth:`SpanArrays.adopt_index`).

    Independent of the other columns, so a caller can build it in a second thread while
    :func:`span_arrays` decodes the rest (numpy sorts without the GIL). Built a block of rows
    at a time straight from the Arrow key columns: the three key columns are never copied
    whole, and no temporary is larger than a block. ``sort=False`` leaves the span index
    unsorted, for :func:`sort_index` to finish while another thread uses the mixed keys.
    """
    keys = table.select(["span_key", "trace_key", "parent_key"])
    blocks = ([_filled(column, 0).astype(np.uint64, copy=False) for column in batch.columns]
              for batch in keys.to_batches(max_chunksize=_BLOCK_ROWS))
    has_parent = (pc.is_valid(table.column("parent_span_id")).to_numpy(zero_copy_only=False)
                  if "parent_span_id" in table.column_names else None)
    index = _build_index(blocks, table.num_rows, has_parent)
    return sort_index(index) if sort else index


def sort_index(index: dict) -> dict:
    """Sort the span index of a ``key_index(..., sort=False)`` in place; the index, for chaining.

    A large index is split at its median first (a linear partition in place), and the two halves
    sort in two threads (numpy sorts without the GIL): 10M keys in 0.1 s of wall instead of 0.18.
    """
    packed = index["_sorted_spans"][1]
    if len(packed) < _LOOKUP_ROWS:
        packed.sort()
        return index
    middle = len(packed) // 2
    packed.partition(middle)
    _in_two_threads(np.ndarray.sort, [packed[:middle], packed[middle:]])
    return index


def _build_index(blocks, n: int, has_parent: np.ndarray | None) -> dict:
    """:func:`key_index` from (span, trace, parent) key blocks in row order; ``has_parent``
    None: a span has a parent when its parent key is not 0."""
    own, wanted = np.empty(n, np.uint64), np.empty(n, np.uint64)
    packed = np.empty(n, np.uint64)
    named = np.empty(n, dtype=bool) if has_parent is None else has_parent
    bits = max(1, (n - 1).bit_length())
    high = ~np.uint64((1 << bits) - 1)
    start = 0
    for span_key, trace_key, parent_key in blocks:
        for lo in range(0, len(span_key), _BLOCK_ROWS):
            at = slice(start + lo, start + min(lo + _BLOCK_ROWS, len(span_key)))
            block = slice(lo, lo + _BLOCK_ROWS)
            _mix_into(span_key[block], trace_key[block], parent_key[block], own[at], wanted[at])
            if has_parent is None:
                np.not_equal(parent_key[block], 0, out=named[at])
            np.bitwise_and(own[at], high, out=packed[at])  # row number in the low bits
            packed[at] |= np.arange(at.start, at.stop, dtype=np.uint64)
        start += len(span_key)
    return {"_mixed": (own, wanted), "_sorted_spans": (own, packed, bits), "has_parent": named}


def index_parents(index: dict) -> np.ndarray:
    """:func:`distinct_parents` of a :func:`key_index` (sorted or not)."""
    own, wanted = index["_mixed"]
    return distinct_parents(index["has_parent"], wanted, own)


def index_orphans(index: dict, parents: np.ndarray | None = None) -> dict:
    """The orphan test over a sorted :func:`key_index` (for :meth:`SpanArrays.adopt_index`, like the
    index); ``parents`` from :func:`index_parents`, when another thread has sorted them already.

    The costliest step of ``check``, and it needs nothing but the index: a caller runs it in
    other threads while the rest is decoded and analysed.
    """
    return {"orphan": orphan_mask(index["has_parent"], index["_mixed"], index["_sorted_spans"], parents)}


def span_arrays(spans: pa.Table) -> SpanArrays:
    """Decode the columns goodput and the findings use (ids stay in ``table`` until a message needs them)."""
    spans = with_id_keys(spans)
    decoder = _SpanDecoder(spans.num_rows)
    for batch in spans.to_batches():
        decoder.add(batch)
    return decoder.arrays(spans)


def decode_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS, batch_rows: int | None = None,
                      timed_names: str | None = None) -> tuple[SpanArrays, dict] | None:
    """:func:`span_arrays` of the spans ``files`` and their :func:`key_index` (unsorted: see
    :func:`sort_index`), decoded batch by batch as :func:`scan_span_files` reads them.

    Each batch's decoded columns (names, runs, buckets, times, iterations; efficiency categories
    only where a span has a bucket, the only rows a rule reads them at) are let go once copied, and the key index is built from its id keys on the way, so the read
    and the decode touch each value's memory once; ``table`` keeps the other columns (trace ids and
    keys, span groups). The span and parent keys are let go too (160 MB at 10M spans): the index's
    mixed keys hold them, and the span ids a report names are recovered from those
    (:func:`~nemo_telemetry.analysis.model.tree.unmixed_key`). With ``timed_names`` (a regex), the
    start and end times are kept only at the rows with an ``rl.bucket`` or a name it matches
    (:class:`HeldRows`; ``valid_interval`` still covers every row): the rows whose times ``check``
    reads, a few percent of a run's spans (160 MB less at 10M spans). None when the files have no id
    key columns (a dataset written before them).
    """
    dataset, columns = _span_projection(files, columns)
    if not has_id_keys(dataset.schema):
        return None
    n = dataset.count_rows()
    decoder = _SpanDecoder(n, bucketed_codes=(EFFICIENCY_CATEGORY,), timed_names=timed_names)
    decoded = set(decoder.columns)
    kept_columns = [c for c in columns if c not in decoded and c not in ("span_key", "parent_key")]
    kept: list[pa.RecordBatch] = []

    def key_blocks():
        for batch in _scan(dataset, columns, batch_rows):
            decoder.add(batch)
            kept.append(batch.select(kept_columns))
            yield [_filled(batch.column(c), 0).astype(np.uint64, copy=False)
                   for c in ("span_key", "trace_key", "parent_key")]

    index = _build_index(key_blocks(), n, None)
    table = pa.Table.from_batches(kept, schema=pa.schema([dataset.schema.field(c) for c in kept_columns]))
    arrays = decoder.arrays(table)
    arrays.__dict__["_bucketed_category"] = decoder.bucketed_codes_of(EFFICIENCY_CATEGORY)  # no column left to read
    arrays.__dict__["_mixed"] = index["_mixed"]  # the span keys' only holder (the sort leaves them as they are)
    return arrays, index


class _SpanDecoder:
    """:func:`span_arrays`' columns a batch at a time, into arrays as long as the whole table: one
    decode for a table in memory and for spans files read batch by batch."""

    CODES = ("name", "run_id", BUCKET)
    INTS = ("start_ns", "end_ns", ITERATION)

    def __init__(self, n: int, codes: tuple[str, ...] = CODES, bucketed_codes: tuple[str, ...] = (),
                 timed_names: str | None = None) -> None:
        self.n, self.at = n, 0
        self._codes = {c: (np.empty(n, np.int32), {}) for c in codes}
        # only rl.iteration's nulls mean something (no iteration); times are never null by the schema
        ints = (ITERATION,) if timed_names else self.INTS
        self._ints = {c: (np.empty(n, np.int64), np.empty(n, bool) if c == ITERATION else None) for c in ints}
        # columns decoded at the rows with an rl.bucket only: (those rows, their codes) per batch, and the values
        self._bucketed = {c: ([], [], {}) for c in bucketed_codes}
        # times kept at the rows with an rl.bucket or a name matching ``timed_names`` only: (rows, start, end)
        # per batch, and every row whose end is before its start
        self._timed = re.compile(timed_names) if timed_names else None
        self._timed_name = np.zeros(0, dtype=bool)  # per name code: whether its rows keep their times
        self._times: tuple[list, list, list] = ([], [], [])
        self._invalid: list[np.ndarray] = []

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self._codes, *self._ints, *self._bucketed, *(("start_ns", "end_ns") if self._timed else ()))

    def add(self, batch: pa.RecordBatch) -> None:
        rows = slice(self.at, self.at + batch.num_rows)
        if rows.stop > self.n:
            raise IngestError(f"the spans files hold more rows than the {self.n} their metadata counts; "
                              "re-run nemo-telemetry ingest")
        names = batch.schema.names
        for column, (out, values) in self._codes.items():
            if column in names:
                _codes_into(batch.column(column), values, out[rows])
            else:
                out[rows] = -1
        for column, (out, valid) in self._ints.items():
            if column in names:
                _ints_into(batch.column(column), out[rows], None if valid is None else valid[rows])
            else:
                out[rows] = 0
                if valid is not None:
                    valid[rows] = False
        if self._timed is not None:
            self._keep_times(batch, rows)
        if self._bucketed:
            with_bucket = np.flatnonzero(self._codes[BUCKET][0][rows] >= 0)
            for column, (held, codes, values) in self._bucketed.items():
                out = np.full(len(with_bucket), -1, np.int32)
                if column in names and len(with_bucket):
                    _codes_into(batch.column(column).take(pa.array(with_bucket)), values, out)
                held.append(with_bucket + rows.start)
                codes.append(out)
        self.at = rows.stop

    def _keep_times(self, batch: pa.RecordBatch, rows: slice) -> None:
        """The batch's invalid intervals, and its times at the rows that keep them (read in place
        from the batch: the other rows' times are never copied)."""
        names = self._codes["name"][1]
        if len(names) > len(self._timed_name):  # names first seen in this batch
            more = [v is not None and self._timed.search(v) is not None for v in list(names)[len(self._timed_name):]]
            self._timed_name = np.concatenate([self._timed_name, np.array(more, dtype=bool)])
        start, end = (_filled(batch.column(c), 0) if c in batch.schema.names else np.zeros(batch.num_rows, np.int64)
                      for c in ("start_ns", "end_ns"))
        self._invalid.append(np.flatnonzero(end < start) + rows.start)
        name = self._codes["name"][0][rows]
        lookup = np.append(self._timed_name, False)  # code -1 (no name) lands on the last slot
        timed = np.flatnonzero((self._codes[BUCKET][0][rows] >= 0) | lookup[name])
        held, starts, ends = self._times
        held.append(timed + rows.start)
        starts.append(start[timed].astype(np.int64, copy=False))
        ends.append(end[timed].astype(np.int64, copy=False))

    def bucketed_codes_of(self, column: str) -> tuple[np.ndarray, np.ndarray, tuple]:
        """(rows with an rl.bucket, their codes, the values) of a column decoded at those rows only."""
        held, codes, values = self._bucketed[column]
        return (np.concatenate(held) if held else np.zeros(0, np.int64),
                np.concatenate(codes) if codes else np.zeros(0, np.int32), tuple(values))

    def codes_of(self, column: str) -> tuple[np.ndarray, tuple]:
        out, values = self._codes[column]
        return out, tuple(values)

    def arrays(self, table: pa.Table) -> SpanArrays:
        if self.at != self.n:
            raise IngestError(f"the spans files hold {self.at} rows where their metadata counts {self.n}; "
                              "re-run nemo-telemetry ingest")
        name, names = self.codes_of("name")
        run, runs = self.codes_of("run_id")
        bucket_raw, bucket_values = self.codes_of(BUCKET)
        lookup = np.array([BUCKETS.index(v) if v in BUCKETS else UNKNOWN_BUCKET for v in bucket_values] + [NO_BUCKET],
                          dtype=np.int8)
        iteration, has_iteration = self._ints[ITERATION]
        if self._timed is None:
            (start, _), (end, _) = (self._ints[c] for c in ("start_ns", "end_ns"))
        else:
            held, starts, ends = (np.concatenate(part) if part else np.zeros(0, np.int64) for part in self._times)
            start, end = HeldRows(self.n, held, starts), HeldRows(self.n, held, ends)
        arrays = SpanArrays(
            table=table, name=name, names=names, run=run, runs=runs, start=start, end=end, bucket=lookup[bucket_raw],
            bucket_raw=bucket_raw, bucket_values=bucket_values, iteration=iteration, has_iteration=has_iteration,
        )
        if self._timed is not None:
            valid = np.ones(self.n, dtype=bool)
            valid[np.concatenate(self._invalid) if self._invalid else np.zeros(0, np.int64)] = False
            arrays.__dict__["valid_interval"] = valid
        return arrays


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
    the column; a file written before the column, or a hand-built map, in the map). A process's
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
        codes = _filled(chunk.indices, -1)
        if kept.all() and here.size and here.min() == here.max():
            if here[0] >= 0:
                pairs.update((int(here[0]), str(values[v])) for v in _codes_present(codes))
            continue
        sel = kept & (codes >= 0)
        pairs.update((g, str(values[v])) for g, v in pairs_present(here[sel], codes[sel], len(values)))
    return pairs


def _codes_present(codes: np.ndarray) -> list[int]:
    """The distinct codes (-1 left out) of a chunk, which holds one or a few: its least and
    greatest are present, and each code between them is tested by one comparison pass (a
    count of every code converts them all to 64 bits first: 8x slower)."""
    low, high = int(codes.min()), int(codes.max())
    if high - low > _FEW_VALUES:
        return np.flatnonzero(np.bincount(codes[codes >= 0], minlength=high + 1)).tolist()
    middle = {code for code in range(low + 1, high) if code >= 0 and (codes == code).any()}
    return sorted(code for code in {low, high} | middle if code >= 0)


def _map_pairs(spans: pa.Table, key: str, group: np.ndarray, keep: np.ndarray) -> set[tuple[int, str]]:
    """:func:`resource_pairs` of the ``resource_attributes`` map."""
    pairs: set[tuple[int, str]] = set()
    values: dict[str, int] = {}
    for start, chunk, is_key, item_codes, local in _resource_chunks(spans, key, values):
        here, kept = group[start:start + len(chunk)], keep[start:start + len(chunk)]
        if kept.all() and here.size and here.min() == here.max():
            present = np.zeros(len(local), dtype=bool)  # the last slot is where null values (-1) land
            if len(local) <= _FEW_VALUES:  # one comparison pass per value beats gathering every entry (3x)
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
    return _filled(arr.indices, -1), arr.dictionary.to_pylist()


def _equals(arr: pa.Array, value: str) -> np.ndarray:
    codes, values = _dictionary(arr)
    return code_mask(codes, [i for i, v in enumerate(values) if v == value], len(values))
