"""What the analysis reads of a dataset's spans files: one projection of the committed files
(:data:`READ_COLUMNS` for ``check``, :data:`GOODPUT_COLUMNS` for ``goodput``), as a whole table or
as record batches, and which files a source (a dataset directory or raw dump files) stands for.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.dataset as ds

from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION, SPAN_GROUP
from nemo_telemetry.analysis.store.commits import FileProblem, committed_files, damaged_error
from nemo_telemetry.analysis.store.dataset import checked_parquet
from nemo_telemetry.analysis.store.repair import verify_dataset
from nemo_telemetry.analysis.store.sources import single_dataset
from nemo_telemetry.errors import DamagedDatasetError, IngestError

__all__ = ["READ_COLUMNS", "GOODPUT_COLUMNS", "STEP_GOODPUT_COLUMNS", "read_for_analysis", "span_source_files",
           "reading_errors", "read_span_files", "scan_span_files", "scan_batches", "span_projection", "has_id_keys",
           "reusing_pool", "scan_file_batches", "every_file_has"]

# What check reads from a dataset: span and parent ids come from the uint64 keys (hex strings
# cost more to read than everything else together); trace ids are read as dictionaries, as ingest
# writes them, since their values repeat on every span of a trace. The enabled span groups come
# from their own column, not the resource attribute map (200 MB in memory at 10M spans); a file
# written before that column adds the map to the read (:func:`read_span_files`). No finding reads
# service_name or rank (goodput's by="rank" does: GOODPUT_COLUMNS has them).
READ_COLUMNS = (
    "trace_id", "name", "start_ns", "end_ns", "run_id", BUCKET, ITERATION,
    EFFICIENCY_CATEGORY, "span_groups", "trace_key", "span_key", "parent_key",
    "service_name", "rank",  # the process: step spans without rl.iteration are numbered per run and process
    SPAN_GROUP,  # the group each span was opened in: missing-group-spans decides presence by it
    "span_groups_namespace",  # the namespace each process resolved its span groups in
)
# Promoted resource columns that files written before them lack: such a file holds the
# attribute in the resource map, which a read of the column then adds (resource_pairs reads both).
_PROMOTED_LATER = ("span_groups",)
# Span columns that files written before them lack, with nothing to read in their place: those
# files' rows read as nulls (a span without a recorded group is placed by its name).
_ADDED_LATER = (SPAN_GROUP, "span_groups_namespace")
# Row-group-sized batches (ingest writes pyarrow's default row groups, 2**20 rows): a few large chunks decode
# with less overhead per batch than the scanner's default 2**17, and every per-chunk loop
# over the columns runs a few times instead of a hundred.
_READ_BATCH_ROWS = 1 << 20
_SCAN_BATCH_ROWS = 1 << 17  # scan_span_files: small enough that the pool reuses each batch's pages for the next
_SCAN_READAHEAD = 4  # batches decoded ahead per file: both cores busy, a few batches' memory in flight
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
        damaged = verify_dataset(root).damaged if root is not None else ()
        if damaged:  # a page overwritten in place (size and footer as committed): named by a whole read
            error = damaged_error(root, [FileProblem(d.path, d.problem, d.rows) for d in damaged])
            raise DamagedDatasetError(f"cannot read the spans table: {error}", error.damaged) from None
        raise IngestError(f"{root}: cannot read the spans table ({exc}); re-run nemo-telemetry ingest") from None


def read_span_files(files: list[str], *, columns: tuple[str, ...] = READ_COLUMNS) -> pa.Table:
    """``columns`` of the spans Parquet ``files``, the one projection every engine reads: the string
    columns that repeat as dictionaries, the hex ids where a file was written before the id keys,
    and the resource map where one was written before the span groups column."""
    dataset, columns = span_projection(files, columns)
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
    dataset, columns = span_projection(files, columns)
    yield from scan_batches(dataset, columns, batch_rows)


def scan_batches(dataset: ds.Dataset, columns: list[str], batch_rows: int | None) -> Iterator[pa.RecordBatch]:
    """``columns`` of ``dataset`` as record batches in dataset order (:func:`scan_span_files`)."""
    for _, batch in scan_file_batches(dataset, columns, batch_rows):
        yield batch


def scan_file_batches(dataset: ds.Dataset, columns: list[str],
                      batch_rows: int | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """:func:`scan_batches`, each batch with the path of the file it comes from (a file's batches
    come together, in its order)."""
    scanner = dataset.scanner(columns=columns, batch_size=batch_rows or _SCAN_BATCH_ROWS,
                              batch_readahead=_SCAN_READAHEAD, memory_pool=reusing_pool())
    for tagged in scanner.scan_batches():
        yield tagged.fragment.path, tagged.record_batch


def every_file_has(dataset: ds.Dataset, column: str) -> bool:
    """Whether every file of ``dataset`` holds ``column`` (its schema is the first file's)."""
    return all(column in fragment.physical_schema.names for fragment in dataset.get_fragments())


def span_projection(files: list[str], columns: tuple[str, ...]) -> tuple[ds.Dataset, list[str]]:
    fmt = checked_parquet(ds.ParquetReadOptions(dictionary_columns=list(_DICTIONARY_READS)))
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
    later = [c for c in (*_PROMOTED_LATER, *_ADDED_LATER) if c in columns]
    if not later:
        return dataset, tuple(columns)
    schemas = [fragment.physical_schema for fragment in dataset.get_fragments()]  # each file's footer
    fields = {c: [schema.field(c) for schema in schemas if c in schema.names] for c in later}
    if (any(len(found) < len(schemas) for c, found in fields.items() if c in _PROMOTED_LATER)
            and "resource_attributes" not in columns):
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
def reusing_pool() -> pa.MemoryPool:
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
