"""What the analysis reads of a dataset's spans files: one projection of the committed files
(:data:`READ_COLUMNS` for ``check``, :data:`GOODPUT_COLUMNS` for ``goodput``), as a whole table or
as record batches, and which files a source (a dataset directory or raw dump files) stands for.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as ds

from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION, SPAN_GROUP
from nemo_telemetry.analysis.settings.machine import available_cpus
from nemo_telemetry.analysis.store.constants import ConstantArrays, file_constants
from nemo_telemetry.analysis.store.commits import FileProblem, committed_files, damaged_error
from nemo_telemetry.analysis.store.dataset import checked_parquet
from nemo_telemetry.analysis.store.formats import reader
from nemo_telemetry.analysis.store.repair import verify_dataset
from nemo_telemetry.analysis.store.sources import single_dataset
from nemo_telemetry.errors import DamagedDatasetError, IngestError

__all__ = ["READ_COLUMNS", "GOODPUT_COLUMNS", "STEP_GOODPUT_COLUMNS", "read_dataset_spans", "span_source_files",
           "reading_errors", "read_span_files", "scan_span_files", "scan_batches", "span_projection",
           "reusing_pool", "scan_file_batches", "held_constant", "HeldConstant", "projected_rows"]

# What check reads from a dataset: span and parent ids come from the uint64 keys (hex strings
# cost more to read than everything else together); trace ids are read as dictionaries, as ingest
# writes them, since their values repeat on every span of a trace. The enabled span groups come
# from their own column, not the resource attribute map (every resource attribute of every span). No
# finding reads service_name or rank (goodput's by="rank" does: GOODPUT_COLUMNS has them).
READ_COLUMNS = (
    "trace_id", "name", "start_ns", "end_ns", "run_id", BUCKET, ITERATION,
    EFFICIENCY_CATEGORY, "span_groups", "trace_key", "span_key", "parent_key", "trace_low",
    "service_name", "rank",  # the process: step spans without rl.iteration are numbered per run and process
    "status_code", "status_message",  # a step whose span ended in error is failed; the finding quotes the message
    SPAN_GROUP,  # the group each span was opened in: missing-group-spans decides presence by it
    "span_groups_namespace",  # the namespace each process resolved its span groups in
    "kind",  # an orphan server or consumer span has a remote parent (remote-parent), not a lost one
    "flags",  # ... unless the exporter's is-remote bits say otherwise (model.remote.parent_is_remote)
)
# Row-group-sized batches (ingest writes pyarrow's default row groups, 2**20 rows): a few large chunks decode
# with less overhead per batch than the scanner's default 2**17, and every per-chunk loop
# over the columns runs a few times instead of a hundred.
_READ_BATCH_ROWS = 1 << 20
_SCAN_BATCH_ROWS = 1 << 17  # scan_span_files: small enough that the pool reuses each batch's pages for the next
_READAHEAD_PER_THREAD = 2  # batches decoded ahead per file and thread: each thread has the next batch to decode
_DICTIONARY_READS = ("trace_id", "resource_attributes.key_value.key", "resource_attributes.key_value.value")

GOODPUT_COLUMNS = ("name", "start_ns", "end_ns", "service_name", "run_id", "rank", BUCKET, ITERATION,
                   "trace_key", "span_key", "parent_key", "trace_low", "status_code")  # status: failed steps
# goodput by step reads no service_name or rank (only by="rank" does): two columns fewer to read.
STEP_GOODPUT_COLUMNS = tuple(c for c in GOODPUT_COLUMNS if c not in ("service_name", "rank"))


def read_dataset_spans(root: Path, files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS) -> pa.Table:
    """The committed spans ``files`` of the dataset at ``root`` (:func:`span_source_files`), whole,
    projected onto ``columns`` (:data:`READ_COLUMNS`: what check reads; :data:`GOODPUT_COLUMNS`:
    what goodput reads). Raw dump files are ``ingestion.read.read_for_analysis``'s, which decodes them."""
    with reading_errors(root):
        return read_span_files(files, columns=columns)


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
        damaged = verify_dataset(root).damaged if root is not None else ()
        if damaged:  # a page overwritten in place (size and footer as committed): named by a whole read
            error = damaged_error(root, [FileProblem(d.path, d.problem, d.rows) for d in damaged])
            raise DamagedDatasetError(f"cannot read the spans table: {error}", error.damaged) from None
        raise IngestError(f"{root}: cannot read the spans table ({exc}); re-run nemo-telemetry ingest") from None


def read_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS) -> pa.Table:
    """``columns`` of the spans Parquet ``files``, the one projection every engine reads (the string
    columns that repeat as dictionaries), by the reader of the dataset format (:func:`span_projection`)."""
    dataset, columns = span_projection(files, columns)
    # Into the system allocator's pool rather than Arrow's default (mimalloc): on a loaded 2-core
    # machine 10M spans read in 2-3 s against 6-10 s there, and check's peak RSS is 0.1-0.2 GB lower.
    return dataset.to_table(columns=columns, batch_size=_READ_BATCH_ROWS, memory_pool=pa.system_memory_pool())


def scan_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS,
                    batch_rows: int | None = None, threads: int | None = None) -> Iterator[pa.RecordBatch]:
    """:func:`read_span_files`' projection as record batches in dataset order, for a caller that keeps
    only part of each batch (goodput keeps its few rows and the walk's columns).

    Small batches in a pool that reuses what the previous batches freed (jemalloc, where this
    pyarrow has it): the columns a caller lets go cost no new pages, and page faults are most of
    a read's system time (10M spans: goodput's read faults in 0.44 GB instead of 0.78). ``threads``:
    how many threads the scan keeps busy (default: :func:`~nemo_telemetry.analysis.settings.machine.available_cpus`).
    """
    dataset, columns = span_projection(files, columns)
    yield from scan_batches(dataset, columns, batch_rows, threads=threads)


def scan_batches(dataset: ds.Dataset, columns: list[str], batch_rows: int | None, *,
                 threads: int | None = None) -> Iterator[pa.RecordBatch]:
    """``columns`` of ``dataset`` as record batches in dataset order (:func:`scan_span_files`)."""
    for _, batch in scan_file_batches(dataset, columns, batch_rows, threads=threads):
        yield batch


def scan_file_batches(dataset: ds.Dataset, columns: list[str], batch_rows: int | None, *,
                      threads: int | None = None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """:func:`scan_batches`, each batch with the path of the file it comes from (a file's batches
    come together, in its order). A few batches per thread are decoded ahead: every thread has the
    next batch to decode, and a few batches' memory is in flight."""
    readahead = _READAHEAD_PER_THREAD * (threads if threads else available_cpus())
    held = held_constant(dataset, columns)
    scanned = [c for c in columns if c not in held.columns]
    scanner = dataset.scanner(columns=scanned, batch_size=batch_rows or _SCAN_BATCH_ROWS,
                              batch_readahead=readahead, memory_pool=reusing_pool())
    if not held.columns:
        for tagged in scanner.scan_batches():
            yield tagged.fragment.path, tagged.record_batch
        return
    schema = pa.schema([dataset.schema.field(c) for c in columns])
    repeated = ConstantArrays()
    for tagged in scanner.scan_batches():
        batch, path = tagged.record_batch, tagged.fragment.path
        rows, values = batch.num_rows, held.values[path]
        yield path, pa.RecordBatch.from_arrays(
            [repeated.get(field, values[field.name], rows) if field.name in held.columns
             else batch.column(field.name) for field in schema], schema=schema)


@dataclass(frozen=True)
class HeldConstant:
    """The columns of a read that every file holds one value in, and each file's values (by path)."""

    columns: frozenset[str]
    values: dict[str, dict[str, Any]]


def held_constant(dataset: ds.Dataset, columns: list[str]) -> HeldConstant:
    """Of ``columns``, those every file of ``dataset`` holds one value in
    (:func:`~nemo_telemetry.analysis.store.constants.file_constants`, from the footers the
    format's check read already): a scan leaves them out and repeats each file's value instead."""
    values: dict[str, dict[str, Any]] = {}
    common: set[str] | None = None
    for fragment in dataset.get_fragments():
        held = file_constants(fragment.metadata, fragment.physical_schema, columns)
        values[fragment.path] = held
        common = set(held) if common is None else common & set(held)
        if not common:
            return HeldConstant(frozenset(), {})
    return HeldConstant(frozenset(common or ()), values)


def projected_rows(dataset: ds.Dataset) -> int:
    """The rows of ``dataset``'s files, from the footers :func:`span_projection` read already
    (a count through the scanner reads them again)."""
    return sum(fragment.metadata.num_rows for fragment in dataset.get_fragments())


def span_projection(files: list[str], columns: tuple[str, ...]) -> tuple[ds.Dataset, list[str]]:
    """The spans ``files`` as one dataset and the columns of ``columns`` to read of it, by the reader
    of the dataset format (:mod:`~nemo_telemetry.analysis.store.formats`), which refuses a file of
    another format (a :class:`~nemo_telemetry.errors.DatasetFormatError` naming it)."""
    fmt = checked_parquet(ds.ParquetReadOptions(dictionary_columns=list(_DICTIONARY_READS)))
    dataset = ds.dataset(files, format=fmt)
    return reader().project(dataset, columns)


@cache
def reusing_pool() -> pa.MemoryPool:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without jemalloc
        return pa.system_memory_pool()
