"""The Parquet dataset on disk: writing batches (deduplicated) and reading tables back.

Layout::

    DATASET/spans/run_id=<run id, URI-escaped>/rank=<rank>/part-*.parquet
                                        (hive style, see partitions.py; a missing run id or rank
                                         is written __HIVE_DEFAULT_PARTITION__)
    DATASET/events/part-*.parquet
    DATASET/links/part-*.parquet

Every file holds every column of its table (the partition column too), so a file is readable
on its own and the directory names only serve pruning. Writing and reading stay in this one
module so that finer partitioning (rank, time window) changes one place.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from nemo_telemetry.analysis._columns import SPANS_TABLE_SCHEMA, OtlpTables
from nemo_telemetry.analysis.partitions import split_by_partition
from nemo_telemetry.analysis.schema import EVENTS_SCHEMA, ITERATION, LINKS_SCHEMA
from nemo_telemetry.errors import IngestError

__all__ = [
    "DatasetWriter",
    "SpanDeduplicator",
    "is_dataset",
    "read_dataset",
    "NO_RUN_PARTITION",
]

NO_RUN_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_HELD_FILES = 4  # a bulk DatasetWriter holds at most this many files' worth of spans
_SCHEMAS = {"spans": SPANS_TABLE_SCHEMA, "events": EVENTS_SCHEMA, "links": LINKS_SCHEMA}
# Min/max statistics where they can prune (times, iterations, names, id keys); not for random
# hex ids, free text or the attribute maps, whose statistics cost a third of the write.
_SPAN_STATISTICS = [
    f.name
    for f in SPANS_TABLE_SCHEMA
    if f.name not in ("trace_id", "span_id", "parent_span_id", "status_message", "trace_state", "attributes",
                      "resource_attributes")
]

# Dictionary pages only for columns with few distinct values (names, enums, buckets, ranks,
# iterations, the attribute maps' keys and values). For ids the writer would build a
# dictionary, overflow it and fall back to plain pages: a third of the write, for nothing.
_SPAN_DICTIONARY = [
    f.name
    for f in SPANS_TABLE_SCHEMA
    if pa.types.is_dictionary(f.type) or f.name in ("rank", ITERATION, "status_message", "trace_state")
] + [f"{m}.key_value.{part}" for m in ("attributes", "resource_attributes") for part in ("key", "value")]


def is_dataset(path: Path) -> bool:
    """A directory ingest wrote (it has a ``spans/`` folder)."""
    return Path(path).is_dir() and (Path(path) / "spans").is_dir()


def read_dataset(root: Path, table: str = "spans", *, columns: list[str] | None = None) -> pa.Table:
    """One table of the dataset at ``root`` (empty with the right schema when it has no rows)."""
    schema = _SCHEMAS[table]
    files = sorted(str(p) for p in (Path(root) / table).rglob("*.parquet"))
    if not files:
        empty = schema.empty_table()
        return empty.select(columns) if columns else empty
    try:
        dataset = ds.dataset(files, format="parquet", schema=schema)
        return dataset.to_table(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise IngestError(f"{root}: cannot read the {table} table ({exc}); re-run ingest") from None


class SpanDeduplicator:
    """Remembers every (trace id, span id) admitted and drops repeats, across batches.

    Keys are the 24 raw id bytes as three uint64 words in a compiled open-addressing hash set
    (``_dedup_kernel``), so a batch costs one probe per span however much was seen before;
    ids that are not 32/16 hex digits are keyed on a digest of their text.
    """

    def __init__(self) -> None:
        self._table = np.zeros((1024, 3), dtype=np.uint64)
        self._used = np.zeros(1024, dtype=np.bool_)
        self._count = 0

    def remember(self, spans: pa.Table) -> None:
        """Add the keys of spans already stored (an existing dataset) without filtering."""
        self.admit(spans)

    def admit(self, spans: pa.Table, keys: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of the rows of ``spans`` not seen before (first of repeats in a batch).
        ``keys`` are ``span_keys(spans)`` when the caller computed them already (on another
        thread: only the admission itself has to run in order)."""
        keys = span_keys(spans) if keys is None else keys
        fresh = np.zeros(len(keys), dtype=bool)
        if len(keys) == 0:
            return fresh
        self._reserve(len(keys))
        self._count += _dedup_kernel().admit(self._table, self._used, keys, fresh)
        return fresh

    def _reserve(self, more: int) -> None:
        """Keep the set at most half full after ``more`` insertions."""
        capacity = self._table.shape[0]
        if 2 * (self._count + more) <= capacity:
            return
        while 2 * (self._count + more) > capacity:
            capacity *= 2
        table, used = np.zeros((capacity, 3), dtype=np.uint64), np.zeros(capacity, dtype=np.bool_)
        _dedup_kernel().rehash(self._table, self._used, table, used)
        self._table, self._used = table, used


def _dedup_kernel():
    from nemo_telemetry.analysis import _dedup_kernel

    return _dedup_kernel


def _string_buffers(column) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a string column, nulls as empty strings, ready for a kernel."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.null_count:
        arr = pc.fill_null(arr, "")
    arr = arr.cast(pa.large_string())
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    return offsets, (np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8))


def span_keys(spans: pa.Table) -> np.ndarray:
    """(trace high, trace low, span) uint64 words per span: the 24 id bytes, or for odd ids
    two all-ones words and a digest of the text, so distinct odd ids stay distinct."""
    keys = np.zeros((spans.num_rows, 3), dtype=np.uint64)
    if spans.num_rows == 0:
        return keys
    trace, span = spans.column("trace_id"), spans.column("span_id")
    odd = _dedup_kernel().id_words(*_string_buffers(trace), *_string_buffers(span), keys)
    if odd.any():
        rows = np.flatnonzero(odd)
        parts = [pc.fill_null(column.take(rows).cast(pa.string()), "") for column in (trace, span)]
        text = pc.binary_join_element_wise(*parts, "/")
        digest = [hashlib.blake2b(s.encode(), digest_size=8).digest() for s in text.to_pylist()]
        keys[rows, 0] = keys[rows, 1] = np.uint64(0xFFFFFFFFFFFFFFFF)
        keys[rows, 2] = np.frombuffer(b"".join(digest), dtype=">u8")
    return keys


class DatasetWriter:
    """Appends batches to a dataset directory; re-ingesting a span already there is a no-op.

    By default a batch is on disk when ``write`` returns, a file per (run, rank) partition of
    it: what ``collect`` needs, since it acknowledges the spans. For bulk ingest,
    ``file_rows=N`` holds each partition's spans until N of them make a file (fewer, larger
    files, cheaper to write and to read back; at most ``_HELD_FILES * N`` spans are held in
    all), and ``background_writes=T`` encodes files on T threads while the caller decodes the
    next batches (pyarrow releases the GIL to encode). :meth:`close` then writes what is held,
    waits for every file, and raises the first error of any. Deduplication stays in the
    caller's order either way.
    """

    def __init__(self, root: Path, *, file_rows: int = 0, background_writes: int = 0) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise IngestError(f"{self.root}: exists and is not a directory; choose another --out")
        for table in _SCHEMAS:
            (self.root / table).mkdir(parents=True, exist_ok=True)
        self._prefix = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}"
        self._sequence = 0
        self.dedup = SpanDeduplicator()
        self.dedup.remember(read_dataset(self.root, "spans", columns=["trace_id", "span_id"]))
        self._file_rows = file_rows
        self._held: dict[str, list[pa.Table]] = {}  # partition -> its spans not written yet
        self._held_rows: dict[str, int] = {}
        self._writers = background_writes
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()

    def write(self, tables: OtlpTables) -> OtlpTables:
        """Write the spans not seen before (and their events and links); return what was written."""
        return self.write_fresh(drop_duplicates(tables, self.dedup))

    def write_fresh(self, fresh: OtlpTables) -> OtlpTables:
        """Write tables already filtered by ``self.dedup`` (the ingest pipeline filters them)."""
        if fresh.spans.num_rows:
            for relative, part in split_by_partition(fresh.spans):  # run_id=<run>/rank=<rank> (partitions.py)
                self._held.setdefault(relative, []).append(part)
                self._held_rows[relative] = self._held_rows.get(relative, 0) + part.num_rows
                if self._held_rows[relative] >= self._file_rows:
                    self._write_partition(relative)
            while sum(self._held_rows.values()) > _HELD_FILES * self._file_rows:  # many partitions
                self._write_partition(max(self._held_rows, key=self._held_rows.__getitem__))
        for table, data in (("events", fresh.events), ("links", fresh.links)):
            if data.num_rows:
                self._submit(_write_table, data, self.root / table / self._file_name())
        return fresh

    def close(self) -> None:
        """Write the spans still held, wait for every file; raise the first error of any."""
        try:
            for relative in list(self._held):
                self._write_partition(relative)
            while self._pending:
                self._pending.popleft().result()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None

    def _write_partition(self, relative: str) -> None:
        pieces = self._held.pop(relative)
        del self._held_rows[relative]
        folder = self.root / "spans" / relative
        folder.mkdir(parents=True, exist_ok=True)
        self._submit(_write_spans, pieces, folder / self._file_name())

    def _file_name(self) -> str:
        self._sequence += 1  # files of one partition sort in the order their spans came
        return f"{self._prefix}-{self._sequence:09d}.parquet"  # wide enough to sort as numbers

    def _submit(self, write, *args) -> None:
        if not self._writers:
            write(*args)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._writers, thread_name_prefix="nemo-write")
        self._pending.append(self._pool.submit(write, *args))
        while len(self._pending) > self._writers:  # bounds the tables waiting to be written
            self._pending.popleft().result()


def _write_spans(pieces: list[pa.Table], path: Path) -> None:
    """One file of a partition's spans: the pieces put together first (a table of many small
    chunks costs the Parquet writer more than the copy)."""
    table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
    pq.write_table(table.combine_chunks(), path, write_statistics=_SPAN_STATISTICS, use_dictionary=_SPAN_DICTIONARY)


def _write_table(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path)


def drop_duplicates(tables: OtlpTables, dedup: SpanDeduplicator, keys: np.ndarray | None = None) -> OtlpTables:
    """``tables`` without spans ``dedup`` has seen (and without those spans' events and links)."""
    mask = dedup.admit(tables.spans, keys)
    if mask.all():
        return tables
    spans = tables.spans.filter(pa.array(mask))
    return OtlpTables(spans, _owned_by(tables.events, spans), _owned_by(tables.links, spans))


def _owned_by(table: pa.Table, spans: pa.Table) -> pa.Table:
    """Rows of an events/links table whose span is in ``spans`` (all rows are new then)."""
    if table.num_rows == 0:
        return table
    # The duplicate spans' events were stored with them the first time: keep only
    # rows whose span row survived, matched on (trace_id, span_id).
    owners = pc.binary_join_element_wise(spans.column("trace_id"), spans.column("span_id"), "/")
    keys = pc.binary_join_element_wise(table.column("trace_id"), table.column("span_id"), "/")
    return table.filter(pc.is_in(keys, value_set=owners.combine_chunks()))
