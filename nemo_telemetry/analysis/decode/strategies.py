"""Every way a spans table becomes the one :class:`~nemo_telemetry.analysis.decode.spans.SpanArrays`.

- :func:`span_arrays`: a table in memory (a batch, a file, the rows goodput reads), its tree
  found on first use in the thread that asks;
- :meth:`SpanReader.table`: a whole table in memory, its key index built, sorted and searched by
  workers while this thread decodes the columns and the rules start;
- :meth:`SpanReader.files`: a dataset's spans files decoded batch by batch as they are read
  (:mod:`store.read`'s projection), each batch let go once copied; the parents from the rows the
  files hold (``parent_row``, :class:`FileParents`), the few references they leave resolved by a
  worker;
- :func:`rows_arrays`: rows handed over as arrays (the partitioned check's driver: a few rows of
  many files, ids as uint64 keys, the orphan test done already).

A :class:`SpanReader` owns its workers (:attr:`ReadSettings.threads`), and waits for or cancels
them when its ``with`` block ends. :mod:`decode.reference` builds the same structure row by row,
for the tests.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.decode.spans import (
    BUCKETS, NO_BUCKET, RUN_RESOURCES, UNKNOWN_BUCKET, Later, Parents, RunPairs, SpanArrays,
)
from nemo_telemetry.analysis.model.columns import codes_into, distinct_codes, filled, ints_into, pairs_present
from nemo_telemetry.analysis.model.keys import (
    NO_PARENT, PARENT_ELSEWHERE, build_index, index_orphans, key_index, parent_rows, sort_index,
)
from nemo_telemetry.analysis.model.resources import resource_pairs
from nemo_telemetry.analysis.model.schema import (
    BUCKET, EFFICIENCY_CATEGORY, ITERATION, PARENT_ROW, PROMOTED_RESOURCE_ATTRIBUTES,
)
from nemo_telemetry.analysis.model.status import error_rows
from nemo_telemetry.analysis.model.tree import TRACE_LOW, mixed_key, with_id_keys
from nemo_telemetry.analysis.model.walk import KeyScan
from nemo_telemetry.analysis.settings.machine import ReadSettings
from nemo_telemetry.analysis.store.read import READ_COLUMNS, projected_rows, scan_file_batches, span_projection
from nemo_telemetry.errors import DamagedDatasetError, IngestError

__all__ = ["span_arrays", "SpanReader", "rows_arrays", "FileParents", "index_parents"]

# What the decoded arrays replace: columns a reader lets go of once a batch is decoded.
_DECODED = ("name", "run_id", BUCKET, EFFICIENCY_CATEGORY, "start_ns", "end_ns", ITERATION)


def span_arrays(spans: pa.Table, *, threads: int = 1) -> SpanArrays:
    """The columns goodput and the findings use; the tree (:class:`Parents`) and the run pairs are
    found when first read, in the thread that reads them (``threads`` for the index's sorts)."""
    spans = with_id_keys(spans)
    decoder = _SpanDecoder(spans.num_rows)
    for batch in spans.to_batches():
        decoder.add(batch)
    index = Later(lambda: sort_index(key_index(spans, sort=False), threads=threads))
    return decoder.arrays(spans, Later(lambda: index_parents(index.get())),
                          Later(lambda: index_orphans(index.get(), threads=threads)["orphan"]),
                          Later(lambda: table_pairs(spans, decoder)))


def index_parents(index: dict) -> Parents:
    """:class:`Parents` that search a sorted key index for the rows asked about."""
    has_parent, wanted, sorted_spans = index["has_parent"], index["_mixed"][1], index["_sorted_spans"]
    traces = index["_traces"]

    def of(rows: np.ndarray) -> np.ndarray:
        out = np.full(len(rows), -1, dtype=np.int64)
        asked = has_parent[rows]
        named = rows[asked]
        if len(named):
            out[asked] = parent_rows(sorted_spans, wanted[named], named, traces)
        return out

    return Parents(of, has_parent)


def table_pairs(spans: pa.Table, decoder: _SpanDecoder) -> RunPairs:
    """:class:`RunPairs` of a whole table, whose codes ``decoder`` holds."""
    run, (name, names) = decoder.codes_of("run_id")[0], decoder.codes_of("name")
    every = np.ones(len(run), dtype=bool)
    return RunPairs(frozenset(pairs_present(run, name, len(names))),
                    {key: frozenset(resource_pairs(spans, key, run, every)) for key in RUN_RESOURCES})


class SpanReader:
    """Decodes tables and spans files with workers of its own: ``with SpanReader(settings) as read:``.

    What the workers compute (the key index, the parents, the orphan test) reaches the arrays as
    :class:`Later` values; when the block ends the workers finish (so the arrays stay whole after
    it) and are joined; when it ends by an exception, work still queued is cancelled. Workers
    only ever wait for work submitted before theirs, so one thread is enough.
    """

    def __init__(self, settings: ReadSettings | None = None) -> None:
        self.settings = settings if settings is not None else ReadSettings.from_machine()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def __enter__(self) -> SpanReader:
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.settings.threads), thread_name_prefix="nemo-decode")
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # a bad run_id, say: no one reads what is still queued
            for pending in self._pending:
                pending.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool = None

    def _submit(self, work, *args, **kwargs) -> Future:
        if self._pool is None:
            raise RuntimeError("a SpanReader decodes inside its with block")
        future = self._pool.submit(work, *args, **kwargs)
        self._pending.append(future)
        return future

    def _links_of_index(self, index: Future) -> tuple[Later[Parents], Later[np.ndarray]]:
        """The parents and orphans of an unsorted key index (a future): a worker sorts it, then
        another runs the orphan test while the parents are searched for the rows a walk asks."""
        threads = self.settings.threads
        ordered = self._submit(lambda: sort_index(index.result(), threads=threads))
        orphan = self._submit(lambda: index_orphans(ordered.result(), threads=threads)["orphan"])
        return Later(lambda: index_parents(ordered.result())), Later(orphan.result)

    def table(self, spans: pa.Table) -> SpanArrays:
        """:func:`span_arrays` of a whole table, its tree found by the workers meanwhile."""
        spans = with_id_keys(spans)
        index = self._submit(key_index, spans, sort=False)
        links, orphans = self._links_of_index(index)
        decoder = _SpanDecoder(spans.num_rows)
        for batch in spans.to_batches():
            decoder.add(batch)
        return decoder.arrays(spans, links, orphans, Later(lambda: table_pairs(spans, decoder)))

    def files(self, files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS,
              batch_rows: int | None = None) -> SpanArrays:
        """The spans ``files`` decoded batch by batch as they are read (``batch_rows``, else the
        settings'): the decoded columns of each batch are let go once copied, and the run pairs
        gathered on the way; the table keeps the ids, the process columns and the group columns. The parents come from the files'
        ``parent_row`` (:class:`FileParents`, which checks each file's column against its keys), a
        worker resolving the references they leave. Every file of the dataset format holds it
        (:mod:`~nemo_telemetry.analysis.store.formats`). ``status_message``, where asked, is read
        afterwards and only from the files with a span in error status: the table holds it in the
        batches with such a span, nulls in the others.
        """
        at_failures = [c for c in _AT_FAILURES if c in columns]  # read afterwards, where spans failed
        dataset, read = span_projection(files, tuple(dict.fromkeys(
            (*(c for c in columns if c not in at_failures), PARENT_ROW, TRACE_LOW))))
        n = projected_rows(dataset)
        decoder = _SpanDecoder(n, gather_pairs=True)
        parents = FileParents(n)
        # the span groups column stays, beside the pairs gathered from it: missing-group-spans names
        # each process that enabled a group (findings.groups.group_presence reads it per row)
        let_go = {*_DECODED, PARENT_ROW, "parent_key", "resource_attributes"}
        kept_columns = [c for c in read if c not in let_go]
        lane_columns = [c for c in FileParents.READ if c in read]
        kept: list[pa.RecordBatch] = []
        placed: list[tuple[str, int, int]] = []  # each kept batch's file, its first row there, its rows
        # the parent rows (and each file's check of them) on a lane of their own beside this
        # thread's decode, where the settings allow a second thread: each batch's in turn
        with _Lane(self.settings.threads > 1) as lane:
            for path, batch in scan_file_batches(dataset, read, batch_rows or self.settings.batch_rows,
                                                 threads=self.settings.threads):
                try:
                    decoder.add(batch)
                except Exception:
                    lane.drain()  # an earlier batch's parents error first, as the batches came
                    raise
                kept.append(batch.select(kept_columns))
                first = placed[-1][1] + placed[-1][2] if placed and placed[-1][0] == path else 0
                placed.append((path, first, batch.num_rows))
                lane.run(parents.add, path, batch.select(lane_columns))
            lane.run(parents.finish)  # the last file's check, here: its error is the read's, not a rule's
            lane.drain()
        table = pa.Table.from_batches(kept, schema=pa.schema([dataset.schema.field(c) for c in kept_columns]))
        for column in at_failures:
            table = table.append_column(*_at_failures(table, placed, column))
        pairs = Later.known(decoder.run_pairs())
        resolved = self._submit(parents.resolved, table)
        return decoder.arrays(table, Later(lambda: resolved.result()[0]), Later(lambda: resolved.result()[1]), pairs)


# Columns a rule reads only at the spans that ended in error (failed-step quotes the message):
# SpanReader.files reads them afterwards, from the files that hold such a span, not for every row.
_AT_FAILURES = ("status_message",)


def _at_failures(table: pa.Table, placed: list[tuple[str, int, int]], column: str) -> tuple[pa.Field, pa.ChunkedArray]:
    """``column`` for ``table``, whose rows are batches ``placed`` (each: its file, its first row
    there, its rows) one after another: as the file holds it in a batch with a span in error
    status, null in the others (no rule reads it there). A file is read again only where one of
    its batches has such a span."""
    error = error_rows(table)
    field = pa.field(column, pa.string())
    if not error.any():
        return field, pa.chunked_array([pa.nulls(table.num_rows, field.type)], field.type)
    chunks: list[pa.Array] = []
    read: dict[str, pa.ChunkedArray] = {}
    at = 0
    for path, first, rows in placed:
        if error[at:at + rows].any():
            if path not in read:
                dataset, columns = span_projection([path], (column,))
                read[path] = dataset.to_table(columns=columns).column(column).cast(field.type)
            chunks.extend(read[path].slice(first, rows).chunks)
        else:
            chunks.append(pa.nulls(rows, field.type))
        at += rows
    return field, pa.chunked_array(chunks, field.type)


class _Lane:
    """Calls run one after another, in the order given, on one worker thread of their own (or in
    the calling thread, where ``threaded`` is false); at most :attr:`_WAITING` wait, enough that the
    caller seldom waits for the lane (the batches they hold are of the few columns the calls read).
    :meth:`drain` waits for every call and raises the first one's error, as running them in turn
    would have; an error ends the lane (later calls are skipped)."""

    _WAITING = 16

    def __init__(self, threaded: bool) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nemo-lane") if threaded else None
        self._waiting: list[Future] = []
        self._failed = False

    def __enter__(self) -> _Lane:
        return self

    def __exit__(self, *exc) -> None:
        self._failed = True  # whatever still waits is skipped
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def run(self, call, *args) -> None:
        if self._pool is None:
            call(*args)
            return
        if len(self._waiting) >= self._WAITING:
            self._waiting.pop(0).result()
        self._waiting.append(self._pool.submit(self._guarded, call, *args))

    def _guarded(self, call, *args) -> None:
        if self._failed:
            return
        try:
            call(*args)
        except BaseException:
            self._failed = True
            raise

    def drain(self) -> None:
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            future.result()


def rows_arrays(*, trace_id: list, keys: tuple[np.ndarray, ...], name: tuple[np.ndarray, tuple],
                run: tuple[np.ndarray, tuple], bucket: tuple[np.ndarray, tuple], category: tuple[np.ndarray, tuple],
                start: np.ndarray, end: np.ndarray, iteration: np.ndarray, has_iteration: np.ndarray,
                orphan: np.ndarray, pairs: RunPairs) -> SpanArrays:
    """Rows handed over as arrays (codes and their values, uint64 id keys: span, trace, parent and
    where given trace_low),
    chosen from a dataset whose orphan test and run pairs were found already (``orphan``,
    ``pairs``): parents are found among these rows."""
    span_key, trace_key, parent_key, *low = keys
    table = pa.table({"trace_id": pa.array(list(trace_id), pa.string()), "span_key": pa.array(span_key),
                      "trace_key": pa.array(trace_key), "parent_key": pa.array(parent_key),
                      **({TRACE_LOW: pa.array(low[0])} if low else {})})
    n = len(span_key)

    def links() -> Parents:
        return index_parents(sort_index(build_index([keys], n, None)))

    bucket_raw, bucket_values = bucket
    return SpanArrays(
        table=table, name=name[0], names=name[1], run=run[0], runs=run[1], start=start, end=end,
        valid_interval=end >= start, bucket=_bucket_index(bucket_values)[bucket_raw], bucket_raw=bucket_raw,
        bucket_values=bucket_values, category=category[0], categories=category[1], iteration=iteration,
        has_iteration=has_iteration, links=Later(links), orphans=Later.known(np.asarray(orphan, bool)),
        pairs=Later.known(pairs))


def _bucket_index(bucket_values: tuple) -> np.ndarray:
    """Bucket code -> index into BUCKETS (UNKNOWN_BUCKET for a value no rollup knows); the last
    slot, which code -1 lands on, NO_BUCKET."""
    return np.array([BUCKETS.index(v) if v in BUCKETS else UNKNOWN_BUCKET for v in bucket_values] + [NO_BUCKET],
                    dtype=np.int8)


class FileParents:
    """Every span's parent row in the dataset, from its file's ``parent_row`` column (the row in
    that file) as batches are read; then (:meth:`resolved`) the references no file answered, by
    one pass over the span keys (:meth:`~nemo_telemetry.analysis.model.walk.KeyScan.lookup`).

    Those references are gathered from each batch as it is read, a run of equal ones (siblings
    stored together) once: a million references of a few thousand parents cost as those.

    The column indexes its file's row order, which a tool that rewrites the file can change: once a
    file is read, its keys are gathered at the rows the column names (one gather per file) and
    compared with each span's trace and parent keys, so a reordered file is an error naming it,
    never wrong parents.
    """

    KEYS = ("span_key", "trace_key", "parent_key", TRACE_LOW)
    """The id keys each file's check of its ``parent_row`` compares."""
    READ = (PARENT_ROW, *KEYS)
    """The columns :meth:`add` reads of a batch."""

    def __init__(self, n: int) -> None:
        self.rows = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
        self.has_parent = np.empty(n, dtype=bool)
        self.at, self.file_start, self.highest = 0, 0, -1
        self.path: str | None = None
        self.last = None  # the last reference gathered
        self.elsewhere: list[np.ndarray] = []  # per batch: its rows whose parent is not in their file
        self.fresh: list[np.ndarray] = []  # per batch: which of those start a run of equal references
        self.wanted: list[np.ndarray] = []  # per batch: those runs' references (mixed keys)
        self.parent: list[np.ndarray] = []  # per batch: and their parent keys
        self.trace: list[tuple[np.ndarray, np.ndarray]] = []  # per batch: and their traces (key, low)
        self.file_keys: list[tuple] = []  # the current file's batches: (span, trace, parent) keys, to check the column
        self.scratch: dict[str, np.ndarray] = {}  # the check's buffers, reused from file to file (no new pages)
        self.finished = False

    def add(self, path: str, batch: pa.RecordBatch) -> None:
        if path != self.path:
            self._file_done()
            self.path, self.file_start, self.highest = path, self.at, -1
        local = filled(batch.column(PARENT_ROW), PARENT_ELSEWHERE)  # a null (never written): looked up
        if len(local) == 0:
            return
        self.file_keys.append(tuple(batch.column(c) for c in self.KEYS))
        if local.min() < PARENT_ELSEWHERE:
            self._damaged(int(local.min()))
        self.highest = max(self.highest, int(local.max()))
        at = slice(self.at, self.at + len(local))
        out = self.rows[at]
        np.add(local, self.file_start, out=out, casting="unsafe")  # in range: n rows fit the array's type
        np.copyto(out, local, where=local < 0, casting="unsafe")
        np.not_equal(local, NO_PARENT, out=self.has_parent[at])
        elsewhere = np.flatnonzero(local == PARENT_ELSEWHERE)
        if elsewhere.size:
            trace, parent, low = (filled(batch.column(c), 0).astype(np.uint64, copy=False)[elsewhere]
                                  for c in ("trace_key", "parent_key", TRACE_LOW))
            fresh = np.empty(len(parent), dtype=bool)  # a run: one reference (parent id and trace)
            fresh[0] = self.last is None or (parent[0], trace[0], low[0]) != self.last
            np.not_equal(parent[1:], parent[:-1], out=fresh[1:])
            fresh[1:] |= (trace[1:] != trace[:-1]) | (low[1:] != low[:-1])
            self.last = (parent[-1], trace[-1], low[-1])
            self.elsewhere.append(elsewhere + self.at)
            self.fresh.append(fresh)
            trace, parent, low = trace[fresh], parent[fresh], low[fresh]
            self.wanted.append(mixed_key(trace, parent))  # each run's, once
            self.parent.append(parent)
            self.trace.append((trace, low))
        self.at = at.stop

    def finish(self) -> None:
        """Check the last file read (each earlier one was checked when the next began)."""
        if not self.finished:
            self._file_done()
            self.finished = True

    def _file_done(self) -> None:
        if self.highest >= self.at - self.file_start:
            self._damaged(self.highest)
        if not self.file_keys:
            return
        span, trace, parent, low = (filled(k[0] if len(k) == 1 else pa.chunked_array(k), 0).astype(np.uint64, copy=False)
                                    for k in zip(*self.file_keys))  # a file of one batch: no copy
        self.file_keys = []
        rows = self.rows[self.file_start:self.at]
        # positions as numpy indexes them (intp), in range (the highest was checked above, the
        # lowest is 0), gathered with mode="clip": numpy takes int32 positions, or into ``out``
        # with the default mode="raise", through a converted or buffered copy of every one
        local, got, wrong, other = (self._buffer(name, len(rows), dtype) for name, dtype in (
            ("local", np.intp), ("got", np.uint64), ("wrong", bool), ("other", bool)))
        np.subtract(rows, self.file_start, out=local)
        np.maximum(local, 0, out=local)  # where no parent is in the file (< 0): row 0, its mismatch ignored below
        np.not_equal(np.take(span, local, out=got, mode="clip"), parent, out=wrong)
        for keys in (trace, low):
            if keys[0] == keys.min() == keys.max():  # one trace in the file (a run is one): equal at every row
                continue
            wrong |= np.not_equal(np.take(keys, local, out=got, mode="clip"), keys, out=other)
        wrong &= np.greater_equal(rows, 0, out=other)
        if wrong.any():
            at = int(np.argmax(wrong))
            problem = (f"its {PARENT_ROW} column does not index its rows (row {at} names parent "
                       f"{int(parent[at]):016x}, its {PARENT_ROW} row {int(local[at])} holds span "
                       f"{int(span[local[at]]):016x}): rewritten in another row order, or damaged")
            raise DamagedDatasetError(f"{self.path}: {problem}. Re-run nemo-telemetry ingest of its dumps into a "
                                      "new folder", ((str(self.path), problem),))

    def _buffer(self, name: str, n: int, dtype) -> np.ndarray:
        held = self.scratch.get(name)
        if held is None or len(held) < n or held.dtype != dtype:
            held = self.scratch[name] = np.empty(n, dtype=dtype)
        return held[:n]

    def _damaged(self, value: int) -> None:
        raise IngestError(f"{self.path}: its {PARENT_ROW} column holds {value}, which is no row of the file; "
                          "re-run nemo-telemetry ingest")

    def resolved(self, table: pa.Table) -> tuple[Parents, np.ndarray]:
        """Every span's :class:`Parents` and orphan test (``table``: the decoded one, which holds
        the span and trace keys the lookups read)."""
        self.finish()
        parents = self.rows
        orphan = parents == PARENT_ELSEWHERE  # then: those whose reference no span holds (not even itself)
        if self.elsewhere:
            found = KeyScan(table).lookup(np.concatenate(self.wanted), np.concatenate(self.parent),
                                          *(np.concatenate(k) for k in zip(*self.trace)))
            first = 0  # the batch's first reference among all
            for rows, fresh in zip(self.elsewhere, self.fresh):  # a batch at a time: small temporaries
                run = np.cumsum(fresh) - 1 + first
                first = int(run[-1]) + 1
                parents[rows], held = KeyScan.pick(found, run, rows)
                orphan[rows[held]] = False
        np.maximum(parents, -1, out=parents)  # a reference no file answered: no parent row
        return Parents(parents.__getitem__, self.has_parent), orphan


class _SpanDecoder:
    """:class:`SpanArrays`' columns a batch at a time, into arrays as long as the whole table: one
    decode for a table in memory and for spans files read batch by batch."""

    CODES = ("name", "run_id", BUCKET, EFFICIENCY_CATEGORY)
    INTS = ("start_ns", "end_ns", ITERATION)

    def __init__(self, n: int, *, gather_pairs: bool = False) -> None:
        self.n, self.at = n, 0
        # Codes and iterations as int16 and int32 while their values fit (a column is widened, its
        # rows so far copied, before a batch that may not): fewer pages to write than full width.
        self._codes: dict[str, tuple[np.ndarray, dict]] = {c: (np.empty(n, np.int16), {}) for c in self.CODES}
        self._ints: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
            c: (np.empty(n, np.int32 if c == ITERATION else np.int64), np.empty(n, bool) if c == ITERATION else None)
            for c in self.INTS}
        self._valid_interval = np.empty(n, bool)  # each batch's, while its times are in cache
        # (run, name) pairs and (run, value) pairs of resource attributes, gathered batch by batch
        self._names: set[tuple[int, int]] = set()
        self._resources: dict[str, set[tuple[int, str]]] = {key: set() for key in RUN_RESOURCES}
        self._gather = gather_pairs

    @property
    def gathered_columns(self) -> tuple[str, ...]:
        """The promoted resource columns whose pairs are gathered batch by batch."""
        return tuple(PROMOTED_RESOURCE_ATTRIBUTES[k] for k in RUN_RESOURCES if k in PROMOTED_RESOURCE_ATTRIBUTES)

    def add(self, batch: pa.RecordBatch) -> None:
        rows = slice(self.at, self.at + batch.num_rows)
        if rows.stop > self.n:
            raise IngestError(f"the spans files hold more rows than the {self.n} their metadata counts; "
                              "re-run nemo-telemetry ingest")
        names = batch.schema.names
        for column, (out, values) in self._codes.items():
            if column in names:
                chunk = batch.column(column)
                more = len(chunk.dictionary) if pa.types.is_dictionary(chunk.type) else len(chunk)
                if len(values) + more > np.iinfo(out.dtype).max:
                    out = self._widen(self._codes, column, np.int32)
                codes_into(chunk, values, out[rows])
            else:
                out[rows] = -1
        for column, (out, valid) in self._ints.items():
            if column in names:
                chunk = batch.column(column)
                if out.dtype != np.int64 and chunk.null_count < len(chunk):
                    low, high = (v.as_py() for v in pc.min_max(chunk).values())
                    if low < np.iinfo(out.dtype).min or high > np.iinfo(out.dtype).max:
                        out = self._widen(self._ints, column, np.int64)
                ints_into(chunk, out[rows], None if valid is None else valid[rows])
            else:
                out[rows] = 0
                if valid is not None:
                    valid[rows] = False
        (start, _), (end, _) = self._ints["start_ns"], self._ints["end_ns"]
        np.greater_equal(end[rows], start[rows], out=self._valid_interval[rows])
        if self._gather:
            self._gather_pairs(batch, rows)
        self.at = rows.stop

    def _gather_pairs(self, batch: pa.RecordBatch, rows: slice) -> None:
        run, (name, names) = self._codes["run_id"][0][rows], self._codes["name"]
        if len(run) and run.min() == run.max():  # one run in the batch (a file per run): its names alone
            if run[0] >= 0:
                self._names.update((int(run[0]), code) for code in distinct_codes(name[rows], len(names)))
        else:
            self._names.update(pairs_present(run, name[rows], len(names)))
        if len(run):
            table, every = pa.Table.from_batches([batch]), np.ones(len(run), dtype=bool)
            for key, pairs in self._resources.items():
                pairs |= resource_pairs(table, key, run, every)

    def run_pairs(self) -> RunPairs:
        """The pairs gathered from every batch (a decoder built with ``gather_pairs``)."""
        return RunPairs(frozenset(self._names), {key: frozenset(v) for key, v in self._resources.items()})

    def _widen(self, arrays: dict, column: str, dtype) -> np.ndarray:
        """``column``'s array in ``arrays`` as the wider ``dtype``, with the rows decoded so far."""
        out, other = arrays[column]
        wide = np.empty(self.n, dtype)
        wide[:self.at] = out[:self.at]
        arrays[column] = (wide, other)
        return wide

    def codes_of(self, column: str) -> tuple[np.ndarray, tuple]:
        out, values = self._codes[column]
        return out, tuple(values)

    def arrays(self, table: pa.Table, links: Later[Parents], orphans: Later[np.ndarray],
               pairs: Later[RunPairs]) -> SpanArrays:
        if self.at != self.n:
            raise IngestError(f"the spans files hold {self.at} rows where their metadata counts {self.n}; "
                              "re-run nemo-telemetry ingest")
        name, names = self.codes_of("name")
        run, runs = self.codes_of("run_id")
        bucket_raw, bucket_values = self.codes_of(BUCKET)
        category, categories = self.codes_of(EFFICIENCY_CATEGORY)
        iteration, has_iteration = self._ints[ITERATION][0], cast(np.ndarray, self._ints[ITERATION][1])
        start, end = self._ints["start_ns"][0], self._ints["end_ns"][0]
        index = _bucket_index(bucket_values)
        # values that list BUCKETS' first entries in their order (as ingest writes them, usually)
        # index as they are: a narrowing copy instead of a gather
        same = index[-1] == NO_BUCKET and np.array_equal(index[:-1], np.arange(len(index) - 1))
        return SpanArrays(
            table=table, name=name, names=names, run=run, runs=runs, start=start, end=end,
            valid_interval=self._valid_interval, bucket=bucket_raw.astype(np.int8) if same else index[bucket_raw],
            bucket_raw=bucket_raw,
            bucket_values=bucket_values, category=category, categories=categories, iteration=iteration,
            has_iteration=has_iteration, links=links, orphans=orphans, pairs=pairs)
