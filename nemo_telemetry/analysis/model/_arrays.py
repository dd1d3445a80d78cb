"""The spans table as the numpy arrays goodput and the findings compute on, built once per call.

Strings that repeat (names, buckets, runs, services) become integer codes into a small tuple
of values (:mod:`model.columns`), so every rule over names is decided once per distinct name and
then broadcast by code. The walk up the tree starts only from the rows that need it (the bucketed
spans), one level per numpy step, over the id key index (:mod:`model.keys`), so a 10-million-span
table costs a handful of gathers on small arrays. Spans files are decoded batch by batch as they
are read (:func:`decode_span_files`, over :mod:`store.read`'s projection).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import (
    code_mask, codes_into, codes_matching, column_codes, column_rows, filled, int_column, ints_into, pairs_present,
    row_value,
)
from nemo_telemetry.analysis.model.keys import (
    NO_PARENT, PARENT_ELSEWHERE, build_index, key_index, orphan_mask, parent_rows, sort_index,
)
from nemo_telemetry.analysis.model.resources import resource_pairs, resource_values
from nemo_telemetry.analysis.model.schema import (
    BUCKET, EFFICIENCY_CATEGORY, ITERATION, PARENT_ROW, PROMOTED_RESOURCE_ATTRIBUTES,
)
from nemo_telemetry.analysis.model.tree import mixed_key, parent_indices, unmixed_key, with_id_keys
from nemo_telemetry.analysis.model.walk import KeyScan, climb
from nemo_telemetry.analysis.store.read import READ_COLUMNS, scan_file_batches, span_projection
from nemo_telemetry.errors import DamagedDatasetError, IngestError

__all__ = ["BUCKETS", "UNKNOWN_BUCKET", "NO_BUCKET", "HeldRows", "SpanArrays", "span_arrays", "decode_span_files",
           "FileParents"]

BUCKETS = ("productive", "overhead", "idle", "wasted")
UNKNOWN_BUCKET = -2
NO_BUCKET = -1


class HeldRows:
    """A column kept at some rows only (``rows``, ascending): indexed by row numbers as the whole
    column would be, for the rows a rule reads it at. Any other row is an error, never a made-up
    value."""

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
        return column_codes(self.table, "service_name")

    @property
    def service(self) -> np.ndarray:
        return self._service[0]

    @property
    def services(self) -> tuple:
        return self._service[1]

    @cached_property
    def _category(self) -> tuple[np.ndarray, tuple]:
        return column_codes(self.table, EFFICIENCY_CATEGORY)

    @property
    def category(self) -> np.ndarray:
        return self._category[0]

    @property
    def categories(self) -> tuple:
        held = self.__dict__.get("_bucketed_category")
        return held[1] if held is not None else self._category[1]

    def bucketed_category(self, rows: np.ndarray) -> np.ndarray:
        """Efficiency category codes (-1: none) of ``rows``, rows with an ``rl.bucket``: the only
        rows whose category a rule reads, and all a decode of spans files keeps
        (:func:`decode_span_files`, a :class:`HeldRows`)."""
        held = self.__dict__.get("_bucketed_category")
        return self.category[rows] if held is None else held[0][rows]

    @cached_property
    def _rank(self) -> tuple[np.ndarray, np.ndarray]:
        return int_column(self.table, "rank")

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
            return sort_index(build_index([self._keys], len(self), self.has_parent))
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
            return self.parents[rows].astype(np.int64, copy=False)
        out = np.full(len(rows), -1, dtype=np.int64)
        named = np.flatnonzero(self.has_parent[rows])
        out[named] = parent_rows(self._sorted_spans, self._mixed[1][rows[named]], rows[named])
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

    def run_names(self, keep: np.ndarray) -> list[tuple[int, int]]:
        """The distinct (run code, name code) pairs of the ``keep`` rows (a run filter), sorted."""
        gathered = self.__dict__.get("_run_pairs")
        if gathered is None:
            return (pairs_present(self.run, self.name, len(self.names)) if keep.all()
                    else pairs_present(self.run[keep], self.name[keep], len(self.names)))
        runs = self._kept_runs(keep)
        return sorted(p for p in gathered.names if runs is None or p[0] in runs)

    def run_resources(self, key: str, keep: np.ndarray) -> set[tuple[int, str]]:
        """The distinct (run code, value) pairs of resource attribute ``key`` over the ``keep``
        rows (a run filter): :func:`~nemo_telemetry.analysis.model.resources.resource_pairs`."""
        gathered = self.__dict__.get("_run_pairs")
        if gathered is None or key not in gathered.resources:
            return resource_pairs(self.table, key, self.run, keep)
        runs = self._kept_runs(keep)
        return {p for p in gathered.resources[key] if runs is None or p[0] in runs}

    def _kept_runs(self, keep: np.ndarray) -> set[int] | None:
        """The run codes ``keep`` selects (None: every row), for pairs a decode gathered per run."""
        if keep.all():
            return None
        runs = np.flatnonzero(np.bincount(self.run[keep].astype(np.intp) + 1, minlength=1)) - 1
        if not np.array_equal(keep, code_mask(self.run, runs, len(self.runs))):
            raise ValueError("pairs gathered per run are read for a selection of whole runs only")
        return {int(r) for r in runs}

    def span_id(self, rows) -> list[str]:
        return self._ids("span_id", "span_key", rows)

    def trace_id(self, rows) -> list[str]:
        return self._ids("trace_id", "trace_key", rows)

    def _ids(self, column: str, key: str, rows) -> list[str]:
        """Hex ids of ``rows``: the id column when read, else the uint64 key (span ids are exact)."""
        rows = np.asarray(rows, dtype=np.int64)
        if column in self.table.column_names:
            return [str(row_value(self.table.column(column), r)) for r in rows]
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
    return tuple(filled(table.column(c), 0).astype(np.uint64, copy=False)
                 for c in ("span_key", "trace_key", "parent_key"))


def _has_parent(table: pa.Table, keys) -> np.ndarray:
    """Whether each span names a parent: ``parent_span_id`` is set, else (a key-only read) ``parent_key`` != 0."""
    if "parent_span_id" in table.column_names:
        return pc.is_valid(table.column("parent_span_id")).to_numpy(zero_copy_only=False)
    return keys()[2] != 0


def span_arrays(spans: pa.Table) -> SpanArrays:
    """Decode the columns goodput and the findings use (ids stay in ``table`` until a message needs them)."""
    spans = with_id_keys(spans)
    decoder = _SpanDecoder(spans.num_rows)
    for batch in spans.to_batches():
        decoder.add(batch)
    return decoder.arrays(spans)


def decode_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS, batch_rows: int | None = None,
                      timed_names: str | None = None,
                      run_resources: tuple[str, ...] = ()) -> tuple[SpanArrays, FileParents]:
    """:func:`span_arrays` of the spans ``files``, decoded batch by batch as :func:`scan_span_files`
    reads them, and their parents: the :class:`FileParents` the files hold (for
    :meth:`SpanArrays.adopt_index`).

    Each batch's decoded columns (names, runs, buckets, times, iterations; efficiency categories
    only where a span has a bucket, the only rows a rule reads them at) are let go once copied;
    ``table`` keeps the other columns (trace ids and keys, span groups). With ``timed_names`` (a
    regex), the start and end times are kept only at the rows with an ``rl.bucket`` or a name it
    matches (:class:`HeldRows`; ``valid_interval`` still covers every row): the rows whose times
    ``check`` reads, a few percent of a run's spans (160 MB less at 10M spans). With
    ``run_resources`` (resource attribute keys), their (run, value) pairs and the (run, name)
    pairs are gathered from each batch as it is read (:meth:`SpanArrays.run_resources`,
    :meth:`SpanArrays.run_names`), and their promoted columns let go (40 MB at 10M spans).

    Every file holds its spans' parent rows (``parent_row``: the dataset format,
    :mod:`~nemo_telemetry.analysis.store.formats`), so the parents come from there
    (:class:`FileParents`, which checks each file's column against its keys) and no key index is built.
    """
    dataset, columns = span_projection(files, tuple(dict.fromkeys((*columns, PARENT_ROW))))
    n = dataset.count_rows()
    decoder = _SpanDecoder(n, bucketed_codes=(EFFICIENCY_CATEGORY,), timed_names=timed_names,
                           run_resources=run_resources)
    parents = FileParents(n)
    # what the table keeps: what a rule or a message reads, other than the decoded columns
    let_go = ({*decoder.columns, PARENT_ROW, "parent_key"}
              | {PROMOTED_RESOURCE_ATTRIBUTES[key] for key in run_resources if key in PROMOTED_RESOURCE_ATTRIBUTES})
    kept_columns = [c for c in columns if c not in let_go]
    kept: list[pa.RecordBatch] = []

    def batches():
        for path, batch in scan_file_batches(dataset, columns, batch_rows):
            decoder.add(batch)
            kept.append(batch.select(kept_columns))
            parents.add(path, batch)
            yield batch

    for _ in batches():
        pass
    table = pa.Table.from_batches(kept, schema=pa.schema([dataset.schema.field(c) for c in kept_columns]))
    arrays = decoder.arrays(table)
    if run_resources:
        arrays.__dict__["_run_pairs"] = decoder.run_pairs
    arrays.__dict__["_bucketed_category"] = decoder.bucketed_codes_of(EFFICIENCY_CATEGORY)  # no column left to read
    return arrays, parents


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

    def __init__(self, n: int) -> None:
        self.rows = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
        self.has_parent = np.empty(n, dtype=bool)
        self.at, self.path, self.file_start, self.highest = 0, None, 0, -1
        self.last = None  # the last reference gathered
        self.elsewhere: list[np.ndarray] = []  # per batch: its rows whose parent is not in their file
        self.fresh: list[np.ndarray] = []  # per batch: which of those start a run of equal references
        self.wanted: list[np.ndarray] = []  # per batch: those runs' references (mixed keys)
        self.parent: list[np.ndarray] = []  # per batch: and their parent keys
        self.file_keys: list[tuple] = []  # the current file's batches: (span, trace, parent) keys, to check the column
        self.scratch: dict[str, np.ndarray] = {}  # the check's buffers, reused from file to file (no new pages)

    def add(self, path: str, batch: pa.RecordBatch) -> None:
        if path != self.path:
            self._file_done()
            self.path, self.file_start, self.highest = path, self.at, -1
        local = filled(batch.column(PARENT_ROW), PARENT_ELSEWHERE)  # a null (never written): looked up
        if len(local) == 0:
            return
        self.file_keys.append(tuple(batch.column(c) for c in ("span_key", "trace_key", "parent_key")))
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
            trace, parent = (filled(batch.column(c), 0).astype(np.uint64, copy=False)[elsewhere]
                             for c in ("trace_key", "parent_key"))
            wanted = mixed_key(trace, parent)
            fresh = np.empty(len(wanted), dtype=bool)
            fresh[0] = self.last is None or wanted[0] != self.last
            np.not_equal(wanted[1:], wanted[:-1], out=fresh[1:])
            self.last = wanted[-1]
            self.elsewhere.append(elsewhere + self.at)
            self.fresh.append(fresh)
            self.wanted.append(wanted[fresh])
            self.parent.append(parent[fresh])
        self.at = at.stop

    def _file_done(self) -> None:
        if self.highest >= self.at - self.file_start:
            self._damaged(self.highest)
        if not self.file_keys:
            return
        span, trace, parent = (filled(k[0] if len(k) == 1 else pa.chunked_array(k), 0).astype(np.uint64, copy=False)
                               for k in zip(*self.file_keys))  # a file of one batch: no copy
        self.file_keys = []
        rows = self.rows[self.file_start:self.at]
        local, got, wrong, other = (self._buffer(name, len(rows), dtype) for name, dtype in (
            ("local", rows.dtype), ("got", np.uint64), ("wrong", bool), ("other", bool)))
        np.subtract(rows, self.file_start, out=local)
        np.maximum(local, 0, out=local)  # where no parent is in the file (< 0): row 0, its mismatch ignored below
        np.not_equal(np.take(span, local, out=got), parent, out=wrong)
        wrong |= np.not_equal(np.take(trace, local, out=got), trace, out=other)
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

    def resolved(self, table: pa.Table) -> dict:
        """``parents`` (-1: root or orphan), ``has_parent`` and ``orphan`` of every span, for
        :meth:`SpanArrays.adopt_index` (``table``: the decoded one, which holds the span and
        trace keys the lookups read)."""
        self._file_done()
        parents = self.rows
        orphan = parents == PARENT_ELSEWHERE  # then: those whose reference no span holds (not even itself)
        if self.elsewhere:
            found = KeyScan(table).lookup(np.concatenate(self.wanted), np.concatenate(self.parent))
            first = 0  # the batch's first reference among all
            for rows, fresh in zip(self.elsewhere, self.fresh):  # a batch at a time: small temporaries
                run = np.cumsum(fresh) - 1 + first
                first = int(run[-1]) + 1
                parents[rows], held = KeyScan.pick(found, run, rows)
                orphan[rows[held]] = False
        return {"parents": parents, "has_parent": self.has_parent, "orphan": orphan}


@dataclass(frozen=True)
class _RunPairs:
    """What a decode gathered per run: (run, name) code pairs, and per resource attribute key its
    (run, value) pairs."""

    names: set
    resources: dict


class _SpanDecoder:
    """:func:`span_arrays`' columns a batch at a time, into arrays as long as the whole table: one
    decode for a table in memory and for spans files read batch by batch."""

    CODES = ("name", "run_id", BUCKET)
    INTS = ("start_ns", "end_ns", ITERATION)

    def __init__(self, n: int, codes: tuple[str, ...] = CODES, bucketed_codes: tuple[str, ...] = (),
                 timed_names: str | None = None, run_resources: tuple[str, ...] = ()) -> None:
        self.n, self.at = n, 0
        # (run, name) pairs and (run, value) pairs of resource attributes, gathered batch by batch
        self.run_pairs = _RunPairs(set(), {key: set() for key in run_resources}) if run_resources else None
        # Codes and iterations as int16 and int32 while their values fit (a column is widened, its
        # rows so far copied, before a batch that may not): 100 MB less to write at 10M spans.
        self._codes = {c: (np.empty(n, np.int16), {}) for c in codes}
        # only rl.iteration's nulls mean something (no iteration); times are never null by the schema
        ints = (ITERATION,) if timed_names else self.INTS
        self._ints = {c: (np.empty(n, np.int32 if c == ITERATION else np.int64), np.empty(n, bool) if c == ITERATION
                          else None) for c in ints}
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
        if self._timed is not None:
            self._keep_times(batch, rows)
        if self.run_pairs is not None:
            self._gather_run_pairs(batch, rows)
        if self._bucketed:
            with_bucket = np.flatnonzero(self._codes[BUCKET][0][rows] >= 0)
            for column, (held, codes, values) in self._bucketed.items():
                out = np.full(len(with_bucket), -1, np.int32)
                if column in names and len(with_bucket):
                    codes_into(batch.column(column).take(pa.array(with_bucket)), values, out)
                held.append(with_bucket + rows.start)
                codes.append(out)
        self.at = rows.stop

    def _gather_run_pairs(self, batch: pa.RecordBatch, rows: slice) -> None:
        run, (name, names) = self._codes["run_id"][0][rows], self._codes["name"]
        self.run_pairs.names.update(pairs_present(run, name[rows], len(names)))
        if len(run):
            table, every = pa.Table.from_batches([batch]), np.ones(len(run), dtype=bool)
            for key, pairs in self.run_pairs.resources.items():
                pairs |= resource_pairs(table, key, run, every)

    def _widen(self, arrays: dict, column: str, dtype) -> np.ndarray:
        """``column``'s array in ``arrays`` as the wider ``dtype``, with the rows decoded so far."""
        out, other = arrays[column]
        wide = np.empty(self.n, dtype)
        wide[:self.at] = out[:self.at]
        arrays[column] = (wide, other)
        return wide

    def _keep_times(self, batch: pa.RecordBatch, rows: slice) -> None:
        """The batch's invalid intervals, and its times at the rows that keep them (read in place
        from the batch: the other rows' times are never copied)."""
        names = self._codes["name"][1]
        if len(names) > len(self._timed_name):  # names first seen in this batch
            more = [v is not None and self._timed.search(v) is not None for v in list(names)[len(self._timed_name):]]
            self._timed_name = np.concatenate([self._timed_name, np.array(more, dtype=bool)])
        start, end = (filled(batch.column(c), 0) if c in batch.schema.names else np.zeros(batch.num_rows, np.int64)
                      for c in ("start_ns", "end_ns"))
        self._invalid.append(np.flatnonzero(end < start) + rows.start)
        name = self._codes["name"][0][rows]
        lookup = np.append(self._timed_name, False)  # code -1 (no name) lands on the last slot
        timed = np.flatnonzero((self._codes[BUCKET][0][rows] >= 0) | lookup[name])
        held, starts, ends = self._times
        held.append(timed + rows.start)
        starts.append(start[timed].astype(np.int64, copy=False))
        ends.append(end[timed].astype(np.int64, copy=False))

    def bucketed_codes_of(self, column: str) -> tuple[HeldRows, tuple]:
        """(codes at the rows with an rl.bucket, the values) of a column decoded at those rows only."""
        held, codes, values = self._bucketed[column]
        return HeldRows(self.n, np.concatenate(held) if held else np.zeros(0, np.int64),
                        np.concatenate(codes) if codes else np.zeros(0, np.int32)), tuple(values)

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


