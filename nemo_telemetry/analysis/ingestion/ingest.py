"""Ingest: OTLP dump files into the spans, events and links tables, on disk or in memory.

``ingest(inputs, out=...)`` streams files into a Parquet dataset a batch at a time;
``read_spans(source)`` (and ``read_events`` / ``read_links`` / ``load_traces``) read a dataset
or ingest raw files on the fly. Malformed records are counted and reported with their file and
line, never fatal; a file that is not OTLP at all is an :class:`IngestError`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.ingestion._columns import OtlpTables, SpanColumns
from nemo_telemetry.analysis.ingestion._detect import (
    DEFAULT_MAX_REQUEST_BYTES,
    FORMATS,
    DumpFile,
    ReadBuffers,
    classify_json_line,
    detect_dump,
    expand_inputs,
    expand_inputs_found,
    iter_records,
)
from nemo_telemetry.analysis.ingestion._otlp_json_fast import LINE_FALLBACK, LINE_OTHER_SIGNAL, decode_json_block
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.ingestion._otlp_wire import decode_batch, decode_frames_each
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.ingestion.metrics import dataset_metric_points
from nemo_telemetry.analysis.ingestion.logs import DatasetLogFiles, dataset_log_files
from nemo_telemetry.analysis.settings.machine import available_cpus
from nemo_telemetry.analysis.store.commits import dataset_state
from nemo_telemetry.analysis.store.dataset import (
    DatasetWriter,
    SpanDeduplicator,
    drop_duplicates,
    read_dataset,
    span_keys,
)
from nemo_telemetry.analysis.store.sources import Source, split_sources
from nemo_telemetry.errors import IngestError, IngestWarning

__all__ = [
    "decode_threads",
    "write_threads",
    "IngestSummary",
    "IngestWarning",
    "TraceTables",
    "ingest",
    "load_traces",
    "read_spans",
    "read_events",
    "read_links",
    "FORMATS",
    "dump_files",
    "dump_files_detected",
    "ingest_inputs",
    "SignalDumps",
    "iter_records",  # the records of one dump file, for an engine that feeds an IngestPipeline itself
]

ProgressCallback = Callable[[int, int], None]
BATCH_SPANS = 1 << 16  # spans decoded before a batch is converted and written
# Requests held before they are decoded together. Half a read block: a full block (16 MiB) is a
# batch of its own, so only a few blocks' buffers are in flight and reused; the ends of small
# files gather up to this.
BATCH_PROTOBUF_BYTES = 8 << 20
BATCH_JSON_BYTES = 8 << 20
DECODE_AHEAD = 2  # the fewest batches decoding on worker threads while the next one is read (decode_threads)
WRITE_AHEAD = 2  # the fewest Parquet files written on worker threads while the next batches decode (write_threads)
FILE_ROWS = 1 << 17  # spans of a (run, rank) partition gathered into one Parquet file


def decode_threads() -> int:
    """Batches decoding at once: one per CPU this process may use (:func:`available_cpus`: its
    affinity and its cgroup's CPU quota), at least :data:`DECODE_AHEAD` so that one batch decodes
    while the next is read even on one CPU. The decoders release the GIL."""
    return max(DECODE_AHEAD, available_cpus())


def write_threads() -> int:
    """Parquet files encoded and fsync'd at once while the next batches decode: half the CPUs
    (decoding takes the others), at least :data:`WRITE_AHEAD` (the writes wait on the disk too)."""
    return max(WRITE_AHEAD, available_cpus() // 2)


@dataclass(frozen=True)
class IngestSummary:
    """What one ingest read and wrote. ``warnings`` name the file and line of each problem."""

    files: int = 0
    spans: int = 0
    events: int = 0
    links: int = 0
    traces: int = 0
    runs: int = 0
    duplicates_dropped: int = 0
    rejected_records: int = 0
    skipped_records: int = 0  # requests of other signals: not traces, not errors (log requests are in ``logs``)
    skipped_files: int = 0  # files inside an input directory that are not OTLP (each named in warnings)
    metric_points: int = 0  # data points of metrics dumps (told by content), written to DATASET/metrics
    logs: int = 0  # log records of log dump files, written to DATASET/logs
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class TraceTables:
    """The three tables of a source, and the summary of reading it."""

    spans: pa.Table
    events: pa.Table
    links: pa.Table
    summary: IngestSummary


@dataclass
class IngestPipeline:
    """Decodes records into batches, drops spans ``dedup`` has seen (when given one) and hands
    each batch to ``sink``, which returns what it kept."""

    sink: Callable[[OtlpTables], OtlpTables]
    dedup: SpanDeduplicator | None = None
    progress: ProgressCallback | None = None
    batch_spans: int = BATCH_SPANS
    cols: SpanColumns = field(default_factory=SpanColumns)
    counts: dict = field(default_factory=lambda: dict.fromkeys(
        ("files", "spans", "events", "links", "duplicates_dropped", "rejected_records", "skipped_records",
         "skipped_files"), 0
    ))
    traces: set = field(default_factory=set)
    runs: set = field(default_factory=set)
    warnings: list = field(default_factory=list)
    bytes_before: int = 0
    protobuf: list = field(default_factory=list)  # (where, payload) waiting for decode_batch
    protobuf_blocks: list = field(default_factory=list)  # ProtoFrames blocks waiting for the walk
    protobuf_bytes: int = 0
    json_blocks: list = field(default_factory=list)  # JsonLines blocks waiting for the scan
    json_bytes: int = 0
    decode_ahead: int = field(default_factory=decode_threads)  # 0: decode in the calling thread (a Ray task)
    executor: ThreadPoolExecutor | None = None
    in_flight: deque = field(default_factory=deque)  # (future of _Decoded, its read buffers), oldest first
    buffers: ReadBuffers = field(default_factory=ReadBuffers)  # blocks are read into these, reused
    max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a longer line, frame or document is rejected

    def add_file(self, path: Path, fmt: str | None, data: bytes | None = None, spans: bool = True) -> None:
        """Decode the spans of ``path`` (``data``: its bytes, when read already; ``spans=False``: a
        protobuf file of metrics or logs, whose requests are counted, not decoded)."""
        self.counts["files"] += 1
        done = [0]

        def on_bytes(count: int) -> None:
            done[0] = count
            if self.progress is not None:
                self.progress(self.bytes_before + count, self.counts["spans"] + len(self.cols))

        records = iter_records(path, fmt, on_bytes=on_bytes, buffers=self.buffers, data=data,
                               max_record_bytes=self.max_record_bytes, spans=spans)
        for record in records:
            self.add_record(record.kind, record.where, record.payload)
        self.bytes_before += path.stat().st_size

    def add_record(self, kind: str, where: str, payload: object) -> None:
        if kind == "other-signal":
            self.counts["skipped_records"] += 1
        elif kind == "rejected":
            self.reject(where, str(payload))
        elif kind == "json-lines":
            self.json_blocks.append(payload)
            self.json_bytes += len(payload)
        elif kind == "protobuf-frames":
            self.protobuf_blocks.append(payload)
            self.protobuf_bytes += len(payload)
        else:
            if isinstance(payload, (bytes, bytearray, memoryview)):
                self.protobuf.append((where, bytes(payload)))
                self.protobuf_bytes += len(payload)
            else:
                for problem in _decode_json(payload, self.cols):
                    self.reject(where, problem)
        if (
            len(self.cols) >= self.batch_spans
            or self.protobuf_bytes >= BATCH_PROTOBUF_BYTES
            or self.json_bytes >= BATCH_JSON_BYTES
        ):
            self.flush(where)

    def skip_files(self, skipped: list[str]) -> None:
        """Count the files an input directory held that are not OTLP (``skipped``: why, each)."""
        self.counts["skipped_files"] += len(skipped)
        self.warnings.extend(skipped)

    def reject(self, where: str, problem: str, count: int = 1) -> None:
        self.counts["rejected_records"] += count
        self.warnings.append(f"{where}: {problem}")

    def flush(self, where: str = "") -> None:
        """Hand the pending records to a decoding thread; write finished batches in order.

        The compiled scans and Arrow release the GIL, so one batch decodes while the next is
        read and the one before is deduplicated and written. At most ``decode_ahead`` batches
        are in flight, which bounds the memory held beyond the tables themselves.
        """
        if not len(self.cols) and not self.protobuf and not self.json_blocks and not self.protobuf_blocks:
            return
        batch = _Batch(self.json_blocks, self.cols, self.protobuf, self.protobuf_blocks, where)
        self.json_blocks, self.json_bytes = [], 0
        self.cols, self.protobuf, self.protobuf_blocks, self.protobuf_bytes = SpanColumns(), [], [], 0
        if self.decode_ahead <= 0:
            self._write(batch.decode(), batch.storage())
            return
        if self.executor is None:
            self.executor = ThreadPoolExecutor(max_workers=self.decode_ahead, thread_name_prefix="nemo-ingest")
        self.in_flight.append((self.executor.submit(batch.decode), batch.storage()))
        while len(self.in_flight) > self.decode_ahead:
            self._write_next()

    def _write_next(self) -> None:
        future, storage = self.in_flight.popleft()
        self._write(future.result(), storage)

    def _drain(self) -> None:
        try:
            while self.in_flight:
                self._write_next()
        finally:
            if self.executor is not None:
                self.executor.shutdown(wait=True, cancel_futures=True)
                self.executor = None

    def _write(self, decoded: "_Decoded", storage: list) -> None:
        """Count and write a decoded batch, and take back the buffers it was read into (the
        tables hold copies, never views of them)."""
        for buffer in storage:
            self.buffers.give(buffer)
        self.counts["skipped_records"] += decoded.skipped
        for where, problem, count in decoded.rejected:
            self.reject(where, problem, count)
        tables = decoded.tables
        if self.dedup is not None:
            tables = drop_duplicates(tables, self.dedup, decoded.keys)
        written = self.sink(tables)
        spans = written.spans
        self.counts["duplicates_dropped"] += decoded.tables.spans.num_rows - spans.num_rows
        self.counts["spans"] += spans.num_rows
        self.counts["events"] += written.events.num_rows
        self.counts["links"] += written.links.num_rows
        # A dropped duplicate's trace and run came with its first copy: the batch's are right.
        self.traces.update(decoded.traces)
        self.runs.update(decoded.runs)

    def summary(self) -> IngestSummary:
        self.flush()
        self._drain()
        return IngestSummary(
            **self.counts, traces=len(self.traces), runs=len(self.runs), warnings=tuple(self.warnings)
        )


@dataclass
class _Decoded:
    """A batch's tables and what decoding it found wrong, applied to the counts in order; also
    what the writing thread needs and can be computed beforehand on the decoding thread."""

    tables: OtlpTables
    rejected: list  # (where, problem, count)
    skipped: int
    keys: np.ndarray = field(init=False)  # span_keys(tables.spans), for the deduplicator
    traces: list = field(init=False)  # distinct trace ids of the batch
    runs: list = field(init=False)  # distinct run ids

    def __post_init__(self) -> None:
        spans = self.tables.spans
        words = self.tables.span_words
        self.keys = span_keys(spans) if words is None else words
        self.traces = _distinct_strings(spans.column("trace_id"), words)
        runs = pc.unique(spans.column("run_id").combine_chunks())  # a dictionary column: its codes
        self.runs = [run for run in runs.cast(pa.string()).to_pylist() if run]


@dataclass
class _Batch:
    """Records taken off the pipeline, decoded on a worker thread (no shared state touched)."""

    json_blocks: list  # JsonLines blocks for the compiled scan
    cols: SpanColumns  # requests already decoded by the orjson path
    protobuf: list  # (where, payload) for the compiled walk
    protobuf_blocks: list  # ProtoFrames blocks for the compiled walk
    where: str  # the last record's place, named when malformed ids are dropped

    def storage(self) -> list:
        """The buffers the blocks were read into, to reuse once the batch is decoded."""
        return [block.storage for block in self.json_blocks + self.protobuf_blocks]

    def decode(self) -> _Decoded:
        rejected: list = []
        parts, skipped = self._scan_json(rejected)
        if len(self.cols):
            parts.append(self.cols.to_tables())
        if self.protobuf:
            bad: list = []
            tables, requests = decode_batch([payload for _, payload in self.protobuf], bad)
            rejected.extend((self.protobuf[index][0], problem, 1) for index, problem in sorted(requests + bad, key=lambda item: item[0]))
            parts.append(tables)
        parts.extend(_walk_block(block, rejected) for block in self.protobuf_blocks)

        def report(n: int) -> None:
            rejected.append((self.where or "input", f"{n} span(s) with malformed trace/span ids dropped", n))

        return _Decoded(drop_malformed_ids(OtlpTables.concat(parts), report), rejected, skipped)

    def _scan_json(self, rejected: list) -> tuple[list[OtlpTables], int]:
        """Scan each block in bulk; lines the scan leaves alone go through orjson (into cols)."""
        parts, skipped = [], 0
        for block in self.json_blocks:
            tables, status = decode_json_block(block.buffer, block.starts, block.ends)
            skipped += int((status == LINE_OTHER_SIGNAL).sum())
            parts.append(tables)
            for index in np.flatnonzero(status == LINE_FALLBACK).tolist():
                where, line = block.line(index)
                if not line.strip():  # blank: only without the compiled scan, which skips them
                    continue
                record = classify_json_line(line, where)
                if record.kind == "traces":
                    rejected.extend((record.where, problem, 1) for problem in _decode_json(record.payload, self.cols))
                elif record.kind == "other-signal":
                    skipped += 1
                else:
                    rejected.append((record.where, str(record.payload), 1))
        return parts, skipped


def _decode_json(request: object, cols: SpanColumns) -> list[str]:
    """Decode one parsed JSON request into ``cols``; what it rejected: the whole request (one
    problem) or spans with a bad field (one each, the rest kept)."""
    before = len(cols.rejected)
    try:
        decode_json_request(request, cols)
    except ValueError as exc:
        return [str(exc)]
    return cols.rejected[before:]


def _walk_block(block, rejected: list) -> OtlpTables:
    """The tables of a block of protobuf requests, read in place by the compiled walk; the
    requests it cannot take upb decodes one by one, naming each bad one (or bad span)."""
    bad: list = []
    data = np.frombuffer(block.buffer, dtype=np.uint8)
    tables = decode_frames_each(data, block.starts, block.ends, bad, bad)
    rejected.extend((block.where(index), problem, 1) for index, problem in sorted(bad, key=lambda item: item[0]))
    return tables


def drop_malformed_ids(tables: OtlpTables, report: Callable[[int], None]) -> OtlpTables:
    spans = tables.spans
    ok = _has_length(spans.column("trace_id"), 32)
    ok &= _has_length(spans.column("span_id"), 16)
    bad = spans.num_rows - int(np.count_nonzero(ok))
    if not bad:
        return tables
    report(bad)
    return tables.keep_spans(ok)


def _has_length(column: pa.ChunkedArray, length: int) -> np.ndarray:
    """Whether each string is ``length`` bytes (ids are ASCII hex: bytes are characters); null
    is not. From the offsets, in their own width: no copy of the column, few temporaries."""
    parts = []
    for chunk in column.chunks:
        width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
        offsets = np.frombuffer(chunk.buffers()[1], dtype=width)[chunk.offset : chunk.offset + len(chunk) + 1]
        ok = (offsets[1:] - offsets[:-1]) == length
        if chunk.null_count:
            ok &= valid_rows(chunk)
        parts.append(ok)
    return parts[0] if len(parts) == 1 else np.concatenate(parts or [np.zeros(0, dtype=bool)])


def _distinct_strings(column: pa.ChunkedArray, words: np.ndarray | None = None) -> list:
    """The distinct values of a string column. Spans come in runs of one trace (one request),
    so repeats of the value before are dropped first, cheaply, and few values are hashed.
    ``words``: the id words of each row (``OtlpTables.span_words``, the trace id's bytes in the
    first two), where the decoder gave them: the repeats are found there, without a string compare."""
    values = column.combine_chunks()
    if words is not None and len(values) > 1 and words.shape[0] == len(values):
        changed = np.ones(len(values), dtype=np.bool_)
        changed[1:] = (words[1:, 0] != words[:-1, 0]) | (words[1:, 1] != words[:-1, 1])
        return pc.unique(values.take(pa.array(np.flatnonzero(changed)))).to_pylist()
    if len(values) > 1:
        changed = pc.fill_null(pc.not_equal(values.slice(1), values.slice(0, len(values) - 1)), True)
        values = pc.filter(values, pa.concat_arrays([pa.array([True]), changed]))
    return pc.unique(values).to_pylist()


def dump_files(inputs: Source) -> list[Path]:
    """The files ``inputs`` names: files as given, directories expanded (sorted, no hidden files)."""
    return expand_inputs(inputs)


def raw_files(inputs: Source, fmt: str | None) -> tuple[list[tuple[Path, str | None]], list[str]]:
    """Every file with its format, checked before anything is written, and why each file found
    in an input directory that is not OTLP is skipped (a README beside the dumps); a file named
    as input that is not OTLP is an :class:`IngestError`."""
    files, skipped = dump_files_detected(inputs, fmt)
    return [(dump.path, dump.format) for dump in files], skipped


def dump_files_detected(inputs: Source, fmt: str | None) -> tuple[list[DumpFile], list[str]]:
    """:func:`raw_files`, each file also marked a metrics or log dump (the same look at its head)."""
    if fmt is not None and fmt not in FORMATS:
        raise IngestError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    files, skipped = [], []
    for path, directory in expand_inputs_found(inputs):
        try:
            files.append(detect_dump(path, fmt))
        except IngestError as exc:
            if directory is None:
                raise
            skipped.append(f"{exc} Skipped (found in the input directory {directory}).")
    return files, skipped


def ingest(
    inputs: Source,
    *,
    out: str | Path,
    format: str | None = None,
    progress: ProgressCallback | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> IngestSummary:
    """Stream OTLP dump files (or directories of them) into the Parquet dataset at ``out``.

    Spans already in the dataset (same trace id and span id) are not written again; how many
    were dropped is in the summary. ``progress(bytes_done, spans_done)`` is called as it goes.
    The metrics and log dumps among the inputs go to ``out/metrics`` and ``out/logs``. A line,
    protobuf record or JSON document longer than ``max_request_bytes`` once decompressed
    (``collect``'s bound on a request) is rejected and named; the rest is kept.
    """
    if not max_request_bytes > 0:
        raise IngestError(f"max_request_bytes={max_request_bytes!r}: give a number of bytes > 0")
    files, skipped = dump_files_detected(inputs, format)
    writer = DatasetWriter(Path(out), file_rows=FILE_ROWS, background_writes=write_threads())
    try:
        writer.start(ingest_inputs(inputs))
        pipeline = IngestPipeline(writer.write_fresh, dedup=writer.dedup, progress=progress,
                                  max_record_bytes=max_request_bytes)
        pipeline.skip_files(skipped)
        signals = SignalDumps(max_record_bytes=max_request_bytes)
        for dump in files:
            pipeline.add_file(dump.path, dump.format, signals.read(dump), dump.spans)
        summary = signals.stage(writer, pipeline.summary())
    except BaseException:
        writer.abort()  # nothing of this ingest becomes visible; its start stays recorded
        raise
    writer.close()  # the final commit: every file durable and visible at once
    return summary


@dataclass
class SignalDumps:
    """The metrics and log dumps among an ingest's inputs: each read once (its bytes serve its
    spans too), their tables staged into the ingest's final commit. Every engine's ingest uses it."""

    metric_files: list = field(default_factory=list)
    metric_problems: list = field(default_factory=list)  # bad points (or metrics) left out, each named
    log_files: list = field(default_factory=list)  # a DatasetLogFiles per log dump, read with its bytes
    max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a longer line, record or document is rejected

    def read(self, dump: DumpFile) -> bytes | None:
        """The bytes of ``dump`` when it is a metrics or log dump (its tables kept), else None."""
        if not (dump.metrics or dump.logs):
            return None
        data = dump.path.read_bytes()
        if dump.metrics:
            points = dataset_metric_points(dump.path, data, self.max_record_bytes)
            self.metric_problems.extend(points.problems)
            if points.file is not None:
                self.metric_files.append(points.file)
        if dump.logs:  # read now: the bytes are let go once the file's spans are read
            self.log_files.append(dataset_log_files([(dump.path, data)], self.max_record_bytes))
        return data

    def stage(self, writer: DatasetWriter, summary: IngestSummary) -> IngestSummary:
        """Stage the metrics and logs tables with ``writer``; ``summary`` with their counts."""
        points = 0
        for relative, table in self.metric_files:
            writer.stage_table(relative, table)
            points += table.num_rows
        parts = self.log_files
        logs = DatasetLogFiles(tuple(f for part in parts for f in part.files), sum(part.records for part in parts),
                               sum(part.requests for part in parts), tuple(p for part in parts for p in part.problems))
        for relative, table in logs.files:
            writer.stage_table(relative, table)
        summary = dataclasses.replace(summary, metric_points=points,
                                      rejected_records=summary.rejected_records + len(self.metric_problems),
                                      warnings=summary.warnings + tuple(self.metric_problems))
        return _with_logs(summary, logs)


def _with_logs(summary: IngestSummary, logs) -> IngestSummary:
    """The summary once the log dumps' records are staged: their requests move from
    ``skipped_records`` to ``logs`` (as records), their bad records join the rejected ones."""
    return dataclasses.replace(
        summary, logs=logs.records, skipped_records=summary.skipped_records - logs.requests,
        rejected_records=summary.rejected_records + len(logs.problems),
        warnings=summary.warnings + logs.problems,
    )


def ingest_inputs(inputs: Source) -> list[str]:
    """The inputs as an ingest records them (absolute paths, in the order given), so the command
    that finishes an interrupted ingest works from any directory."""
    items = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    return [str(Path(item).absolute()) for item in items]


def load_traces(source: Source, *, format: str | None = None) -> TraceTables:
    """The three tables of a dataset directory, raw dump files, directories of them, or a list."""
    datasets, raw = split_sources(source)
    states = [dataset_state(d) for d in datasets]  # one warning per incomplete dataset, not per table
    parts = [OtlpTables(*(read_dataset(s.root, t, state=s) for t in ("spans", "events", "links"))) for s in states]
    summary = IngestSummary()
    if raw:
        pipeline = IngestPipeline(lambda tables: _keep(parts, tables), dedup=SpanDeduplicator())
        files, skipped = dump_files_detected(raw, format)
        pipeline.skip_files(skipped)
        for dump in files:
            pipeline.add_file(dump.path, dump.format, spans=dump.spans)
        summary = pipeline.summary()
    tables = OtlpTables.concat(parts)
    return TraceTables(tables.spans, tables.events, tables.links, summary)


def _keep(parts: list, tables: OtlpTables) -> OtlpTables:
    parts.append(OtlpTables(tables.spans, tables.events, tables.links))  # not the dedup words: spent
    return tables


def _read(source: Source, table: str) -> pa.Table:
    loaded = load_traces(source)
    summary = loaded.summary
    if summary.rejected_records or summary.skipped_files:
        shown = "; ".join(summary.warnings[:3])
        counts = [f"{n} {what}" for n, what in ((summary.rejected_records, "record(s) rejected"),
                                                (summary.skipped_files, "file(s) skipped")) if n]
        warnings.warn(f"{' and '.join(counts)} while reading: {shown}", IngestWarning, stacklevel=3)
    return getattr(loaded, table)


def read_spans(source: Source) -> pa.Table:
    """The spans table of a dataset directory or raw dump files (ingested in memory).

    Ids are lowercase hex; the columns are ``SPANS_SCHEMA`` followed by the uint64 id keys.
    """
    return _read(source, "spans")


def read_events(source: Source) -> pa.Table:
    """The span events table (``EVENTS_SCHEMA``) of a dataset or raw dump files."""
    return _read(source, "events")


def read_links(source: Source) -> pa.Table:
    """The span links table (``LINKS_SCHEMA``) of a dataset or raw dump files."""
    return _read(source, "links")
