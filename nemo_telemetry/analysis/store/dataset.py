"""The Parquet dataset on disk: writing batches (deduplicated) and reading tables back.

Layout::

    DATASET/spans/run_id=<run id, URI-escaped>/rank=<rank>/part-*.parquet
                                        (hive style, see partitions.py; a missing run id or rank
                                         is written __HIVE_DEFAULT_PARTITION__)
    DATASET/events/part-*.parquet
    DATASET/links/part-*.parquet
    DATASET/metrics/<content hash>.parquet
    DATASET/logs/<content hash>.parquet
    DATASET/_commits/*.json             which of those files are committed (commits.py)

Every file holds every column of its table (the partition column too), so a file is readable
on its own and the directory names only serve pruning. A spans file also holds the row of each
span's parent within the file (``parent_row``, :func:`with_parent_rows`), an index ``check``
reads instead of joining every span's parent reference. A reader reads the committed files
only: a file is written under ``DATASET/_staging/``, fsync'd, and renamed into place once the
commit that records it is written (commits.py). Writing and reading stay in this one module so that finer
partitioning (rank, time window) changes one place.
"""

from __future__ import annotations

import hashlib
import os
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

from nemo_telemetry.analysis.kernels.dedup import dedup as _dedup

from nemo_telemetry.analysis.store import commits
from nemo_telemetry.analysis.store.constants import declare_constants
from nemo_telemetry.analysis.model.tables import SPANS_TABLE_SCHEMA, OtlpTables
from nemo_telemetry.analysis.store.partitions import split_by_partition
from nemo_telemetry.analysis.model.columns import filled
from nemo_telemetry.analysis.model.keys import local_parent_rows
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, ITERATION, LINKS_SCHEMA, PARENT_ROW
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.errors import IngestError

__all__ = [
    "DatasetWriter",
    "SpanDeduplicator",
    "RecentSpanDeduplicator",
    "is_dataset",
    "checked_parquet",
    "read_dataset",
    "NO_RUN_PARTITION",
    "SPANS_PARQUET_OPTIONS",
    "with_parent_rows",
    "span_keys",
    "write_span_file",
    "write_table_file",
    "span_file_table",
]

NO_RUN_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_HELD_FILES = 4  # a bulk DatasetWriter holds at most this many files' worth of spans
_FSYNC_THREADS = 8  # a commit's fsyncs run at once (files and folders of a commit: one per partition)
_SCHEMAS = {"spans": SPANS_TABLE_SCHEMA, "events": EVENTS_SCHEMA, "links": LINKS_SCHEMA}
# Min/max statistics where they can prune (times, iterations, names, id keys); not for random
# hex ids, free text or the attribute maps, whose statistics cost a third of the write.
_SPAN_STATISTICS = [
    f.name
    for f in SPANS_TABLE_SCHEMA
    if f.name not in ("trace_id", "span_id", "parent_span_id", "status_message", "trace_state")
    and not pa.types.is_map(f.type)
]

# Dictionary pages only for columns with few distinct values (names, enums, buckets, ranks,
# iterations, trace ids, the attribute maps' keys and values). For span ids the writer would
# build a dictionary, overflow it and fall back to plain pages: work on every write, for nothing.
# Trace ids repeat on every span of a trace, and a run is one trace or a few (a carrier joins its
# processes): as a dictionary, trace ids read as a few values and an index, and the file is
# smaller and written faster. The same holds for their uint64 keys (``trace_key``, ``trace_low``),
# which decode from a dictionary page and runs of one index with less work than from plain pages
# to decompress. A file of very many traces overflows the dictionary page and falls back to plain
# pages, as span ids would.
_SPAN_DICTIONARY = [
    f.name
    for f in SPANS_TABLE_SCHEMA
    if pa.types.is_dictionary(f.type)
    or f.name in ("rank", ITERATION, "status_message", "trace_state", "trace_id", "trace_key", "trace_low")
    or pa.types.is_uint32(f.type)  # flags and dropped counts: one or two values in a file
] + [f"{f.name}.key_value.{part}" for f in SPANS_TABLE_SCHEMA if pa.types.is_map(f.type) for part in ("key", "value")]
# Times and parent rows as deltas: a process's spans are stored as they end, so each time is close to
# the one before it and each parent row close to its own row; the small differences bit-pack into
# pages that are smaller than plain ones and decode with less work than decompressing them.
_SPAN_DELTAS = {"start_ns": "DELTA_BINARY_PACKED", "end_ns": "DELTA_BINARY_PACKED", PARENT_ROW: "DELTA_BINARY_PACKED"}
# Page checksums (CRC32 of each page, written and verified by Parquet itself): a page overwritten
# in place, the file's size and footer unchanged, fails its read instead of decoding to other numbers.
SPANS_PARQUET_OPTIONS = {"write_statistics": _SPAN_STATISTICS, "use_dictionary": _SPAN_DICTIONARY,
                         "column_encoding": _SPAN_DELTAS, "write_page_checksum": True}
"""How a spans file is written (``pq.write_table`` options): what a benchmark writes to measure reads as ingest's."""
_ID_KEYS = ("span_key", "trace_key", "parent_key", "trace_low")  # what with_parent_rows reads


def checked_parquet(read_options: ds.ParquetReadOptions | None = None) -> ds.ParquetFileFormat:
    """The Parquet format every reader of a dataset reads with: each page checked against its
    checksum where the file has them (a file written without reads as before)."""
    return ds.ParquetFileFormat(read_options=read_options or ds.ParquetReadOptions(),
                                default_fragment_scan_options=ds.ParquetFragmentScanOptions(
                                    page_checksum_verification=True))


def is_dataset(path: Path) -> bool:
    """A directory ingest wrote (it has a ``spans/`` folder)."""
    return Path(path).is_dir() and (Path(path) / "spans").is_dir()


def read_dataset(root: Path, table: str = "spans", *, columns: list[str] | None = None,
                 state: commits.DatasetState | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """One table of the dataset at ``root`` (empty with the right schema when it has no rows):
    its committed files only, in their sorted order. ``state``: read from it, without another
    warning. ``schema``: the table's, for ``metrics`` and ``logs`` (their readers own it)."""
    schema = _SCHEMAS[table] if schema is None else schema
    state = commits.dataset_state(root) if state is None else state
    files = [str(p) for p in state.files(table)]
    if not files:
        empty = schema.empty_table()
        return empty.select(columns) if columns else empty
    try:
        dataset = ds.dataset(files, format=checked_parquet(), schema=schema)
        return dataset.to_table(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise IngestError(f"{root}: cannot read the {table} table ({exc}); re-run ingest") from None


class SpanDeduplicator:
    """Remembers every (trace id, span id) admitted and drops repeats, across batches.

    Keys are the 24 raw id bytes as three uint64 words in a compiled open-addressing hash set
    (``_dedup_kernel``), so a batch costs one probe per span however much was seen before;
    ids that are not 32/16 hex digits are keyed on a digest of their text. Small batches (and
    every batch without numba) take ``_dedup_reference``, which keeps the same set.
    """

    def __init__(self) -> None:
        self._table = np.zeros((1024, 3), dtype=np.uint64)
        self._used = np.zeros(1024, dtype=np.bool_)
        self._count = 0

    def __len__(self) -> int:
        """Keys held."""
        return self._count

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
        self._count += _dedup("admit", len(keys), self._table, self._used, keys, fresh)
        return fresh

    def contains(self, keys: np.ndarray) -> np.ndarray:
        """Boolean mask of the rows of ``keys`` (``span_keys``) already in the set; adds nothing."""
        found = np.zeros(len(keys), dtype=bool)
        if len(keys):
            _dedup("contains", len(keys), self._table, self._used, np.ascontiguousarray(keys), found)
        return found

    def forget(self, keys: np.ndarray) -> None:
        """Remove ``keys`` (rows of ``span_keys``) from the set: spans that were not stored after all."""
        if len(keys):
            self._count -= _dedup("forget", len(keys), self._table, self._used, np.ascontiguousarray(keys))

    def _reserve(self, more: int) -> None:
        """Keep the set at most half full after ``more`` insertions."""
        capacity = self._table.shape[0]
        if 2 * (self._count + more) <= capacity:
            return
        while 2 * (self._count + more) > capacity:
            capacity *= 2
        table, used = np.zeros((capacity, 3), dtype=np.uint64), np.zeros(capacity, dtype=np.bool_)
        _dedup("rehash", self._count, self._table, self._used, table, used)
        self._table, self._used = table, used



class RecentSpanDeduplicator:
    """Drops repeats among the last ``window`` to ``2 * window`` spans admitted, in bounded memory.

    For a process that reads spans for as long as a run trains (``monitor --follow``): two
    generations of :class:`SpanDeduplicator`; once the newer holds ``window`` keys, the older is
    dropped and a fresh one started. A repeat further back than that (a file truncated and
    rewritten with more than ``window`` spans before its copy) is admitted again; a dataset's
    writer keeps the full set instead.
    """

    def __init__(self, window: int = 1 << 20) -> None:
        self.window = window
        self._older, self._newer = SpanDeduplicator(), SpanDeduplicator()

    def remember(self, spans: pa.Table) -> None:
        """As :meth:`SpanDeduplicator.remember`."""
        self.admit(spans)

    def admit(self, spans: pa.Table, keys: np.ndarray | None = None) -> np.ndarray:
        """As :meth:`SpanDeduplicator.admit`, over the spans of both generations."""
        keys = span_keys(spans) if keys is None else keys
        fresh = self._newer.admit(spans, keys)
        if len(self._older):
            fresh &= ~self._older.contains(keys)
        if len(self._newer) >= self.window:
            self._older, self._newer = self._newer, SpanDeduplicator()
        return fresh

    def forget(self, keys: np.ndarray) -> None:
        """As :meth:`SpanDeduplicator.forget`."""
        self._newer.forget(keys)
        self._older.forget(keys)

    @property
    def keys_held(self) -> int:
        """Keys in memory: at most ``2 * window``."""
        return len(self._older) + len(self._newer)


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
    odd = _dedup("id_words", len(keys), *_string_buffers(trace), *_string_buffers(span), keys)
    if odd.any():
        rows = np.flatnonzero(odd)
        parts = [pc.fill_null(column.take(rows).cast(pa.string()), "") for column in (trace, span)]
        text = pc.binary_join_element_wise(*parts, "/")
        digest = [hashlib.blake2b(s.encode(), digest_size=8).digest() for s in text.to_pylist()]
        keys[rows, 0] = keys[rows, 1] = np.uint64(0xFFFFFFFFFFFFFFFF)
        keys[rows, 2] = np.frombuffer(b"".join(digest), dtype=">u8")
    return keys


class DatasetWriter:
    """Adds batches to a dataset directory, in commits; re-ingesting a span already there is a no-op.

    ``write`` deduplicates a batch and stages its files (under ``_staging/``, which no reader
    lists); :meth:`commit` fsyncs them, appends one commit record (``commits.py``) and renames
    them into place: when it returns, those spans are durable and every reader sees them. The
    writer holds the dataset's lock (:class:`~commits.DatasetLock`) from its start to its close,
    so the span ids it loads at its start are every span committed until then. A
    file per (run, rank) partition of a batch by default: what ``collect`` needs, which commits
    before it acknowledges. For bulk ingest, ``file_rows=N`` holds each partition's spans until
    N of them make a file (fewer, larger files, cheaper to write and to read back; at most
    ``_HELD_FILES * N`` spans are held in all), and ``background_writes=T`` encodes and fsyncs
    files on T threads while the caller decodes the next batches (pyarrow releases the GIL).
    :meth:`start` records an ingest's inputs before anything is written, so that if it never
    reaches :meth:`close` (its final commit) every reader says the dataset is incomplete and
    how to finish it. Deduplication stays in the caller's order either way.
    """

    def __init__(self, root: Path, *, file_rows: int = 0, background_writes: int = 0,
                 lock: commits.DatasetLock | None = None) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise IngestError(f"{self.root}: exists and is not a directory; choose another --out")
        self._made: set[Path] = set()  # folders this writer created: their parents need an fsync
        self._make_folder(self.root)
        self._real_root = self.root.resolve()
        # The dataset's one writer (commits.DatasetLock): ``lock`` when the caller holds it across
        # several writers (a receiver reopens one after a failed write), else this writer's own.
        self._dataset_lock = commits.DatasetLock(self.root) if lock is None else None
        try:
            for table in _SCHEMAS:
                self._make_folder(self.root / table)
            self.writer = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
            self._lock = commits.WriterLock(self.root, self.writer)
        except BaseException:
            self._release_dataset()
            raise
        try:
            state, self._records = commits.prepare(self.root, self.writer)
            self._begun: dict | None = None
            self._unfinished = state.unfinished  # what a final commit of the same inputs completes
            self._committed = state.committed or frozenset()
            self._prefix = f"part-{self.writer}"
            self._sequence = 0
            self.dedup = SpanDeduplicator()
            self.dedup.remember(read_dataset(self.root, "spans", columns=["trace_id", "span_id"], state=state))
        except BaseException:
            self._lock.release()
            self._release_dataset()
            raise
        self._file_rows = file_rows
        self._held: dict[str, list[pa.Table]] = {}  # partition -> its spans not written yet
        self._held_rows: dict[str, int] = {}
        self._writers = background_writes
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()
        self._staged: list[tuple[Path, Path]] = []  # (temporary, final) of the files not committed yet
        self._staged_rows: dict[Path, int] = {}  # temporary -> its rows, for the commit record
        self._unsynced: set[Path] = set()  # staged files written here, fsync'd at the commit
        self._syncs: ThreadPoolExecutor | None = None
        self._uncommitted_keys: list[np.ndarray] = []  # keys ``write`` admitted since the last commit
        self._closed = False

    def start(self, inputs: list[str], *, tool: str = "ingest") -> None:
        """Record that an ingest of ``inputs`` begins (before any of its files is written); until
        :meth:`close`, readers say the dataset is incomplete. ``tool="collect"``: a receiver's
        session (``inputs`` empty), which the next collect's close finishes too."""
        self._begun = {"kind": "begin", "tool": tool, "inputs": [str(i) for i in inputs],
                       "out": str(self.root.resolve()), "started_ns": time.time_ns()}
        self._record(self._begun)

    def write(self, tables: OtlpTables) -> OtlpTables:
        """Stage the spans not seen before (and their events and links); return what was staged.

        Staged spans are visible and durable once :meth:`commit` (or :meth:`close`) returns.
        If that commit fails, or staging itself raises an ``OSError``, everything staged since
        the last commit is removed and forgotten by the deduplicator (writing it again stores it).
        """
        keys = span_keys(tables.spans)
        fresh = self.dedup.admit(tables.spans, keys)
        self._uncommitted_keys.append(keys[fresh])
        return self.write_fresh(tables.keep_spans(fresh))

    def write_fresh(self, fresh: OtlpTables) -> OtlpTables:
        """Stage tables already filtered by ``self.dedup`` (the ingest pipeline filters them; a
        failed commit does not un-see those: ingest ends on one)."""
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

    def stage_table(self, relative: str, table: pa.Table) -> None:
        """Stage ``table`` as the file ``relative`` (e.g. ``metrics/<hash>.parquet``, named by its
        content) in the next commit; nothing when a file of that name is committed already."""
        if relative in self._committed:
            return
        path = self.root / relative
        self._make_folder(path.parent)
        self._submit(_write_table, table, path)

    def commit(self, **info) -> None:
        """Make every staged file durable and visible: write what is held, fsync, rename, then
        append one commit record (``info``, JSON values, goes into it).

        An ``OSError`` (ENOSPC, EIO, EACCES) is raised unchanged; the files of the failed commit
        are removed and the writer stays usable (a later write and commit may succeed).
        """
        self._commit(final=False, info=info)

    def close(self) -> None:
        """The final commit (what is held, every staged file), then let the dataset go.

        After an ingest's final commit its start is finished, and so are the unfinished ingests
        it repeats (same inputs or fewer). On an error the files not committed are removed and
        the error raised; the start stays unfinished, and readers say so.
        """
        if self._closed:
            return
        try:
            self._commit(final=True, info={})
        finally:
            self._end()

    def abort(self) -> None:
        """Let the dataset go without committing what is staged (its files are removed)."""
        if self._closed:
            return
        try:
            self._discard()
        finally:
            self._end()

    def _commit(self, *, final: bool, info: dict) -> None:
        try:
            for relative in list(self._held):
                self._write_partition(relative)
            while self._pending:
                self._pending.popleft().result()
            self._publish(final, info)
        except BaseException:
            self._discard()
            raise
        self._uncommitted_keys.clear()

    def _publish(self, final: bool, info: dict) -> None:
        """Fsync the staged files and their folders, append the commit record, then rename the files into place."""
        finishes: list[str] = []
        if final and self._begun is not None:
            inputs = set(self._begun["inputs"])
            finishes = [self.writer] + [u.writer for u in self._unfinished
                                        if not u.running and u.tool == self._begun["tool"]
                                        and set(u.inputs) <= inputs and u.out == self._begun["out"]]
        if not self._staged and not finishes:
            return
        folders = {tmp.parent for tmp, _ in self._staged}  # the staged files' names, durable before the record
        folders |= {made.parent for made in self._made}
        files = [str(final_path.relative_to(self.root)) for _, final_path in self._staged]
        sizes = {rel: commits.file_info(tmp, self._staged_rows.get(tmp, 0))
                 for rel, (tmp, _) in zip(files, self._staged)}
        record = {"kind": "commit", "files": files, "final": final, "sizes": sizes, **info}
        if finishes:
            record["finishes"] = finishes
        record_tmp, record_final = commits.stage_record(self.root, self.writer, self._records, record)
        try:
            # The files written in this thread (not fsync'd yet), every folder whose names changed
            # and the record's bytes, all before the record is renamed into place: concurrent fsyncs
            # share the file system's journal commits, so this costs about one fsync rather than one
            # per file and folder. The files stay in _staging/ until the record is in place (a plain
            # read of the table folders never sees an uncommitted file), then are renamed;
            # a rename lost to a crash is read where it is (commits.inspect_file) and redone by the next writer.
            unsynced = [tmp for tmp, _ in self._staged if tmp in self._unsynced]
            self._fsync_all(unsynced + sorted(folders) + [record_tmp])
            self._unsynced.clear()
        except BaseException:
            record_tmp.unlink(missing_ok=True)
            raise
        commits.publish_record(record_tmp, record_final)  # the commit counts from here
        self._records += 1
        staged, self._staged = self._staged, []
        self._staged_rows.clear()
        self._made.clear()
        for tmp, final_path in staged:
            try:
                os.replace(tmp, final_path)
            except OSError:  # committed all the same: readers read it under its temporary name
                pass
        if commits.compact(self.root, self.writer, self._records):
            self._records += 1

    def _record(self, record: dict) -> None:
        commits.write_record(self.root, self.writer, self._records, record)
        self._records += 1

    def _discard(self) -> None:
        """Remove the staged files (temporary or renamed), and un-see the spans ``write`` admitted."""
        for future in self._pending:
            future.cancel()
        for future in self._pending:
            try:
                future.result()
            except BaseException:  # the first error is already on its way up
                pass
        self._pending.clear()
        self._held.clear()
        self._held_rows.clear()
        for tmp, final_path in self._staged:
            for path in (tmp, final_path):
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    pass
        self._staged.clear()
        self._staged_rows.clear()
        self._unsynced.clear()
        for keys in self._uncommitted_keys:
            self.dedup.forget(keys)
        self._uncommitted_keys.clear()

    def _end(self) -> None:
        self._closed = True
        try:
            for pool in (self._pool, self._syncs):
                if pool is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
            self._pool = self._syncs = None
        finally:
            try:
                commits.remove_empty_folders(self.root / commits.STAGING / self.writer)
                self._lock.release()
            finally:
                self._release_dataset()

    def _release_dataset(self) -> None:
        if self._dataset_lock is not None:
            self._dataset_lock.release()
            self._dataset_lock = None

    def _fsync_all(self, paths: list[Path]) -> None:
        if len(paths) <= 1:
            for path in paths:
                _fsync(path)
            return
        if self._syncs is None:
            self._syncs = ThreadPoolExecutor(max_workers=_FSYNC_THREADS, thread_name_prefix="nemo-fsync")
        for done in [self._syncs.submit(_fsync, path) for path in paths]:
            done.result()

    def _make_folder(self, folder: Path) -> None:
        real_root = getattr(self, "_real_root", None)  # the dataset's own folder has no check
        if real_root is not None and not folder.resolve().is_relative_to(real_root):  # before anything is made there
            raise IngestError(f"{folder}: leads to {folder.resolve()} (a symbolic link), outside the dataset "
                              f"{self.root}; a writer writes only inside its dataset: remove the link (move what it points to "
                              f"into the dataset if it belongs there), then run this again")
        missing = [f for f in (folder, *folder.parents) if not f.exists()]
        folder.mkdir(parents=True, exist_ok=True)
        self._made.update(missing)

    def _write_partition(self, relative: str) -> None:
        pieces = self._held.pop(relative)
        del self._held_rows[relative]
        folder = self.root / "spans" / relative
        self._make_folder(folder)
        self._submit(_write_spans, pieces, folder / self._file_name())

    def _file_name(self) -> str:
        self._sequence += 1  # files of one partition sort in the order their spans came
        return f"{self._prefix}-{self._sequence:09d}.parquet"  # wide enough to sort as numbers

    def _submit(self, write, data, final_path: Path) -> None:
        """Write ``data`` to its temporary name (here, or on a background thread). A failed
        write discards what is staged since the last commit, as a failed commit does: no torn
        file may be renamed into place by the next one."""
        tmp = commits.staging_name(self.root, final_path, self.writer)
        self._make_folder(tmp.parent)
        self._staged.append((tmp, final_path))
        self._staged_rows[tmp] = sum(t.num_rows for t in data) if isinstance(data, list) else data.num_rows
        try:
            if not self._writers:
                write(data, tmp)
                self._unsynced.add(tmp)
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self._writers, thread_name_prefix="nemo-write")
            self._pending.append(self._pool.submit(_and_fsync, write, data, tmp))  # fsync'd there, overlapped
            while len(self._pending) > self._writers:  # bounds the tables waiting to be written
                self._pending.popleft().result()
        except BaseException:
            self._discard()
            raise


def with_parent_rows(spans: pa.Table) -> pa.Table:
    """``spans`` (one file's) and its ``parent_row`` column
    (:func:`~nemo_telemetry.analysis.model.keys.local_parent_rows`), as a spans file holds them (the
    dataset format: :mod:`~nemo_telemetry.analysis.store.formats`); a table without the id key columns
    gets them first (the index is made from them)."""
    spans = with_id_keys(spans)
    keys = (filled(spans.column(c), 0).astype(np.uint64, copy=False) for c in _ID_KEYS)
    return spans.append_column(pa.field(PARENT_ROW, pa.int32(), nullable=False), pa.array(local_parent_rows(*keys)))


def span_file_table(spans: pa.Table) -> pa.Table:
    """``spans`` as a spans file holds them: with their parents' rows (:func:`with_parent_rows`)
    and the columns that hold one value named in the file's metadata
    (:func:`~nemo_telemetry.analysis.store.constants.declare_constants`)."""
    return declare_constants(with_parent_rows(spans))


def _write_spans(pieces: list[pa.Table], path: Path) -> None:
    """One file of a partition's spans and their parents' rows in it: the pieces put together
    first (a table of many small chunks costs the Parquet writer more than the copy)."""
    table = pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)
    try:
        pq.write_table(span_file_table(table.combine_chunks()), path, **SPANS_PARQUET_OPTIONS)
    except OSError as exc:
        raise commits.with_path(exc, path) from exc


def write_span_file(spans: pa.Table, path: Path) -> None:
    """One spans file as a writer writes it (its parents' rows, the writer's Parquet options); not fsync'd."""
    _write_spans([spans], path)


def write_table_file(table: pa.Table, path: Path) -> None:
    """One events, links, metrics or logs file as a writer writes it; not fsync'd."""
    _write_table(table, path)


def _write_table(table: pa.Table, path: Path) -> None:
    try:
        pq.write_table(table, path, write_page_checksum=True)
    except OSError as exc:
        raise commits.with_path(exc, path) from exc


def _and_fsync(write, data, path: Path) -> None:
    write(data, path)
    _fsync(path)


def _fsync(path: Path) -> None:
    try:
        commits.fsync_path(path)
    except OSError as exc:
        raise commits.with_path(exc, path) from exc


def drop_duplicates(tables: OtlpTables, dedup: SpanDeduplicator, keys: np.ndarray | None = None) -> OtlpTables:
    """``tables`` without spans ``dedup`` has seen (and without those spans' events and links)."""
    # the duplicate spans' events and links were stored with them the first time
    return tables.keep_spans(dedup.admit(tables.spans, keys))
