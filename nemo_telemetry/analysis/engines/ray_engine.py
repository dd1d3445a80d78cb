"""The Ray engine: ingest, goodput and check past one machine, as plain Ray tasks.

- :func:`ray_ingest` decodes each dump file in its own Ray task (a streaming generator that
  yields one batch of tables at a time, so a task never holds a whole file) and this process
  deduplicates and writes the batches in file order, exactly as :func:`ingest.ingest` does; the
  metrics and log dumps' tables are staged by the same :class:`ingest.SignalDumps`.
- :func:`ray_goodput` schedules :mod:`goodput.partials`' steps (the walks across files, then
  :mod:`goodput.rules`' per-batch partials and merge) as plain Ray tasks over groups of the
  Parquet dataset's files (:func:`map_groups`); the merge is shuffled by (run, iteration) to one
  reducer per CPU, so this process receives a few rows per step.
- :func:`ray_check` runs :mod:`engines.partitioned_check`'s stages (per-file facts, ancestor walks,
  :mod:`findings.rules`' per-file partials, then the few rows the messages name) as Ray tasks
  over the same file groups; this process merges them and :func:`findings.checks.finish` writes
  the messages.

Every result equals the local engine's on the same data. ``ray`` is imported only when an
engine function is called; :func:`connect` joins the cluster ``RAY_ADDRESS`` names, or starts
a local one, unless this process is already connected.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections import deque
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES
from nemo_telemetry.analysis.goodput import partials as streaming
from nemo_telemetry.analysis.goodput.numbering import number_steps
from nemo_telemetry.analysis.goodput.rules import FLEET_BY
from nemo_telemetry.analysis.store.dataset import DatasetWriter, drop_duplicates
from nemo_telemetry.analysis.store.read import reading_errors
from nemo_telemetry.analysis.ingestion.ingest import (BATCH_SPANS, FILE_ROWS, write_threads, IngestSummary, Source, IngestPipeline,
                                            SignalDumps, dump_files_detected, ingest_inputs)
from nemo_telemetry.errors import IngestError, NemoTelemetryError

__all__ = ["connect", "map_groups", "map_reduce", "reducer_count", "ray_scan", "ray_ingest", "ray_goodput", "ray_check"]

_FILES_IN_FLIGHT_PER_CPU = 2
_BATCHES_AHEAD = 2  # decoded batches a file task may hold before this process takes them
TASK_ATTEMPTS = 4  # a file's decode tasks whose worker may die before the ingest fails (Ray's default: 3 retries)
STALL_TIMEOUT_S = 900.0  # seconds a file's decode task may send nothing before the ingest fails


def connect():
    """The ``ray`` module, connected: to ``RAY_ADDRESS`` when set, else to a new local cluster."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency of the analysis extra
        raise NemoTelemetryError("--engine ray needs Ray: pip install ray") from None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        address = os.environ.get("RAY_ADDRESS") or None
        try:
            ray.init(address=address, include_dashboard=False, configure_logging=False, log_to_driver=False)
        except Exception as exc:  # Ray raises plain Exception / ConnectionError for these
            where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray cluster"
            raise NemoTelemetryError(f"--engine ray could not start or join {where} ({exc}); check that the "
                                     "cluster is up (ray status), or use --engine local") from None
    return ray


# -- plain Ray tasks over the dataset's files -------------------------------------------------

_TASKS_PER_CPU = 2  # file groups per cluster CPU: enough to balance, few enough to keep the fixed cost low


def _file_groups(files: Sequence[Path], groups: int) -> list[list[str]]:
    """``files`` cut into at most ``groups`` contiguous runs of about equal bytes (file order kept)."""
    sizes = [max(1, f.stat().st_size) for f in files]
    total, target = sum(sizes), max(1, sum(sizes) // max(1, groups))
    out: list[list[str]] = [[]]
    filled = 0
    for path, size in zip(files, sizes):
        if out[-1] and filled + size > target * len(out) and len(out) < groups:
            out.append([])
        out[-1].append(str(path))
        filled += size
    return [g for g in out if g] if total else []


def _scan_group(paths: list[str], fn: Callable[[pa.Table], pa.Table], columns: Sequence[str]) -> list[pa.Table]:
    """Task body: ``fn`` over every batch of the group's files, read here with pyarrow."""
    scan = streaming.local_scan(streaming.BATCH_ROWS)
    return [t for t in scan(fn, columns, [Path(p) for p in paths]) if t.num_rows]


def map_groups(function: Callable, files: Sequence[Path], *args) -> list:
    """``function(paths, *args)`` as one Ray task per group of files; the results in file order.

    The arguments are put in the object store once for all the tasks (a lookup index can be
    large). Plain tasks, not Ray Data: Ray Data plans every pass before it runs one, and a
    pass over a small dataset costs little more than its tasks (``bench/ray_goodput.py`` compares
    the two).
    """
    ray = connect()
    if not files:
        return []
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    remote = ray.remote(function).options(num_cpus=1)
    shared = [ray.put(a) for a in args]
    refs = [remote.remote(group, *shared) for group in _file_groups(files, cpus * _TASKS_PER_CPU)]
    return ray.get(refs)


def map_reduce(map_function: Callable, reduce_function: Callable, files: Sequence[Path], reducers: int,
               *args) -> tuple[list, list]:
    """``map_function(paths, reducers, *args)`` per group of files returns (its result for this
    process, piece 0 .. piece reducers-1); reducer r gets every group's piece r. Returns the
    groups' results (file order) and the reducers' results; the pieces never reach this process."""
    ray = connect()
    if not files:
        return [], []
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    shared = [ray.put(a) for a in args]
    mapper = ray.remote(map_function).options(num_cpus=1, num_returns=1 + reducers)
    outputs = [mapper.remote(group, reducers, *shared) for group in _file_groups(files, cpus * _TASKS_PER_CPU)]
    reducer = ray.remote(reduce_function).options(num_cpus=1)
    reduced = [reducer.remote(*[out[1 + r] for out in outputs]) for r in range(reducers)]
    return ray.get([out[0] for out in outputs]), ray.get(reduced)


def reducer_count() -> int:
    """One reducer per cluster CPU."""
    return max(1, int(connect().cluster_resources().get("CPU", 1)))


def ray_scan() -> streaming.Scan:
    """A :data:`streaming.Scan` whose batches are mapped by plain Ray tasks, a group of files each."""

    def scan(fn: Callable[[pa.Table], pa.Table], columns: Sequence[str], files: Sequence[Path]) -> Iterator[pa.Table]:
        for tables in map_groups(_scan_group, files, fn, tuple(columns)):
            yield from tables

    return scan


def _damage_named(function: Callable) -> Callable:
    """``function(root, ...)`` with a spans file that fails its read, in this process or in a task
    (a ``RayTaskError`` is also its cause's class), raised as the store names it: a
    ``DamagedDatasetError`` naming the file, for every caller of the engine's public functions."""

    @functools.wraps(function)
    def named(root: str | Path, **options):
        with reading_errors(Path(root)):
            return function(root, **options)

    return named


@_damage_named
def ray_goodput(root: str | Path, *, run_id: str | None = None, by: str = "step"):
    """``run_goodput`` of the dataset at ``root``, computed on the Ray cluster.

    The attribution walks as :func:`streaming.partitioned_goodput` does; then the merge is
    distributed too (:func:`map_reduce`): each map task splits its files' partials by a hash of
    (run, iteration), one reducer per cluster CPU merges the pieces of its steps and condenses
    their interval unions (:func:`streaming.condense_unions`), and this process only merges a
    few rows per step.
    """
    connect()
    plan = streaming.attribution(Path(root), ray_scan(), run_id=run_id)
    _, reduced = map_reduce(_partials_by_step, _reduce_steps, plan.files, reducer_count(), plan.attributed, run_id,
                            plan.numbers)
    accumulator = streaming.GoodputAccumulator()
    for table in reduced:
        accumulator.add(table)
    runs = accumulator.result(plan.order)
    if by in FLEET_BY:  # the fleet partials in Ray tasks too, merged here (a few rows per fleet and process)
        from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source

        return streaming.with_fleets(runs, accumulator.merged(), ray_scan(), plan, metrics_for_source(Path(root)),
                                     run_id=run_id, by=by)
    return streaming.with_ranks(runs, accumulator.merged(), ray_scan(), plan, run_id=run_id) if by == "rank" else runs


def _partials_by_step(paths: list[str], reducers: int, attributed, run_id: str | None, numbers=None) -> tuple:
    """Map task: nothing for the driver, and the group's partials in ``reducers`` pieces by their
    step's owner (``numbers``: the step spans without rl.iteration, numbered as they are read)."""
    return (None, *streaming.split_by_step(_scan_group(
        paths, lambda b: streaming.goodput_partial(number_steps(b, numbers), attributed=attributed,
                                                   run_id=run_id),
        streaming.GOODPUT_COLUMNS), reducers))


def _reduce_steps(*pieces: pa.Table) -> pa.Table:
    """Reduce task: every partial of its steps merged, the unions condensed to two rows per step."""
    accumulator = streaming.GoodputAccumulator()
    for piece in pieces:
        accumulator.add(piece)
    return streaming.partial_table(streaming.condense_unions(accumulator.merged()))


@_damage_named
def ray_check(root: str | Path, **options):
    """``check_run`` of the dataset at ``root``, its work done by Ray tasks over groups of files
    (:mod:`partitioned_check`: per-file facts, the walk's lookups, the rules' partials per file);
    this process merges what they return and finishes the report."""
    from nemo_telemetry.analysis.engines.partitioned_check import partitioned_check

    return partitioned_check(root, map_groups, map_reduce=map_reduce, reducers=reducer_count(), **options)


# -- ingest ------------------------------------------------------------------------------------


def _decode_file(path: str, fmt: str | None, batch_spans: int, data: bytes | None = None,
                 skip_spans: int = 0, max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 spans: bool = True) -> Iterator[tuple]:
    """Ray task body: ("tables", OtlpTables) per batch of ``path`` (``data``: its bytes, read
    already by the driver for a metrics or log dump), then ("counts", dict). ``skip_spans``: the
    first spans of the file, taken already from an attempt whose worker died, are not sent again.
    A line, record or document longer than ``max_record_bytes`` is rejected, as ingest rejects it;
    ``spans=False``: a protobuf file of metrics or logs, its requests counted, not decoded."""
    batches: list = []
    # One Ray task per file is already the parallelism: decode in this task's thread, not two more.
    pipeline = IngestPipeline(lambda tables: batches.append(tables) or tables, batch_spans=batch_spans, decode_ahead=0)
    pipeline.counts["files"] += 1
    from nemo_telemetry.analysis.ingestion.ingest import iter_records

    def unsent() -> Iterator[tuple]:
        nonlocal skip_spans
        while batches:
            tables = batches.pop(0)
            rows = tables.spans.num_rows
            if skip_spans >= rows:
                skip_spans -= rows
                continue
            if skip_spans:
                tables = tables.keep_spans(np.arange(rows) >= skip_spans)
                skip_spans = 0
            yield ("tables", tables)

    for record in iter_records(Path(path), fmt, buffers=pipeline.buffers, data=data,
                               max_record_bytes=max_record_bytes, spans=spans):
        pipeline.add_record(record.kind, record.where, record.payload)
        yield from unsent()
    summary = pipeline.summary()
    yield from unsent()
    yield ("counts", {"rejected_records": summary.rejected_records, "skipped_records": summary.skipped_records,
                      "warnings": list(summary.warnings)})


def ray_ingest(
    inputs: Source,
    *,
    out: str | Path,
    format: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    batch_spans: int = BATCH_SPANS,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> IngestSummary:
    """:func:`ingest.ingest` with each file decoded by a Ray task; the dataset and summary are the same.

    Tasks run ahead (two files per cluster CPU), and this process takes their batches file by
    file, in input order, so the deduplication keeps the same first copy of a repeated span.
    A file whose task's worker or node dies is decoded again from the first span not yet taken,
    at most :data:`TASK_ATTEMPTS` times in all; a task that sends nothing for
    ``stall_timeout_s`` is given up. Either failure is an :class:`IngestError` naming the file,
    and the dataset keeps what it had committed (this ingest is recorded as incomplete, and
    re-running it completes it). ``max_request_bytes`` bounds a decompressed line, record or document
    in the tasks and in the metrics and log readers, as :func:`ingest.ingest`'s does.
    """
    if not stall_timeout_s > 0:
        raise IngestError(f"stall_timeout_s must be positive, not {stall_timeout_s!r}")
    if not max_request_bytes > 0:
        raise IngestError(f"max_request_bytes={max_request_bytes!r}: give a number of bytes > 0")
    ray = connect()
    files, skipped = dump_files_detected(inputs, format)
    writer = DatasetWriter(Path(out), file_rows=FILE_ROWS, background_writes=write_threads())
    try:
        writer.start(ingest_inputs(inputs))
        signals = SignalDumps(max_record_bytes=max_request_bytes)
        decodes = _FileDecodes(ray, batch_spans, stall_timeout_s, max_request_bytes)
        try:
            summary = _ingest_files(decodes, [(dump, signals.read(dump)) for dump in files], writer, progress)
        finally:
            decodes.cancel()
        summary = dataclasses.replace(summary, skipped_files=len(skipped), warnings=tuple(skipped) + summary.warnings)
        summary = signals.stage(writer, summary)  # the metrics and logs tables, as ingest stages them
    except BaseException:
        writer.abort()  # nothing of this ingest becomes visible; its start stays recorded
        raise
    writer.close()  # the final commit: every file durable and visible at once
    return summary


class _FileDecodes:
    """The files' decode tasks on the cluster, run ahead of this process, and taken in order.

    Ray's own task retries are off for them: a streaming generator retried with backpressure on
    can wait forever for items its first attempt sent (ray-project/ray#43914, #54529), so a
    worker that dies is answered here, by a new task that skips the spans already taken.
    """

    def __init__(self, ray, batch_spans: int, stall_timeout_s: float,
                 max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.ray = ray
        self.batch_spans = batch_spans
        self.stall_timeout_s = stall_timeout_s
        self.max_record_bytes = max_record_bytes
        self.remote = ray.remote(_decode_file).options(num_cpus=1, max_retries=0,
                                                       _generator_backpressure_num_objects=_BATCHES_AHEAD)
        self.running: deque = deque()  # (dump, data, generator), in input order
        self.lost = _system_failures(ray)

    def submit(self, dump, data: bytes | None) -> None:
        self.running.append((dump, data, self._start(dump, data, 0)))

    def _start(self, dump, data: bytes | None, skip_spans: int):
        return self.remote.remote(str(dump.path), dump.format, self.batch_spans, data, skip_spans,
                                  self.max_record_bytes, dump.spans)

    def next_file(self) -> Iterator[tuple]:
        """The items of the oldest running file's task: ("tables", OtlpTables) ..., ("counts", dict)."""
        dump, data, generator = self.running.popleft()
        taken, failures = 0, []
        while True:
            try:
                for kind, payload in self._items(dump.path, generator):
                    taken += payload.spans.num_rows if kind == "tables" else 0
                    yield kind, payload
                return
            except self.lost as exc:
                failures.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
                if len(failures) >= TASK_ATTEMPTS:
                    raise IngestError(
                        f"{dump.path}: the Ray task decoding it failed {len(failures)} times, its worker "
                        f"or node lost each time (last: {failures[-1]}); nothing of this ingest was "
                        "committed: re-run it once the cluster is healthy") from None
                generator = self._restart(dump, data, taken)

    def _restart(self, dump, data: bytes | None, taken: int):
        """A new task for ``dump`` from span ``taken`` on, queued ahead of new tasks for the files
        after it: theirs are stopped, as they may hold every CPU while they wait to be taken."""
        generator = self._start(dump, data, taken)
        later = list(self.running)
        self.running.clear()
        for other, other_data, other_generator in later:
            self._stop(other_generator)
            self.running.append((other, other_data, self._start(other, other_data, 0)))
        return generator

    def _items(self, path: Path, generator) -> Iterator[tuple]:
        ray = self.ray
        while True:
            ready, _ = ray.wait([generator], timeout=self.stall_timeout_s)
            if not ready:
                raise self._stalled(path)
            try:
                ref = next(generator)
            except StopIteration:
                return
            try:
                yield ray.get(ref, timeout=self.stall_timeout_s)
            except ray.exceptions.GetTimeoutError:
                raise self._stalled(path) from None

    def _stalled(self, path: Path) -> IngestError:
        return IngestError(
            f"{path}: the Ray task decoding it sent nothing for {self.stall_timeout_s:g} s (a lost or "
            "stuck worker, or a cluster with no free CPU); nothing of this ingest was committed: re-run "
            "it, with a larger stall_timeout_s if the cluster is busy")

    def cancel(self) -> None:
        """Stop the tasks still running (after a failure); their partial output is dropped."""
        while self.running:
            self._stop(self.running.popleft()[2])

    def _stop(self, generator) -> None:
        try:
            self.ray.cancel(generator, force=True)
        except Exception:  # best effort: a task that ended cannot be cancelled
            pass


def _system_failures(ray) -> tuple[type, ...]:
    """Ray's errors for a task's worker, node or output lost (not an error the task raised)."""
    names = ("WorkerCrashedError", "NodeDiedError", "LocalRayletDiedError", "ObjectLostError", "OutOfMemoryError",
             "RaySystemError")
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


def _ingest_files(decodes: _FileDecodes, files: list, writer: DatasetWriter, progress) -> IngestSummary:
    """Decode ``files`` ((DumpFile, its bytes or None) pairs) on Ray tasks and write their batches
    in input order."""
    limit = max(1, int(decodes.ray.cluster_resources().get("CPU", 1)) * _FILES_IN_FLIGHT_PER_CPU)
    todo = deque(files)
    totals = dict.fromkeys(("spans", "events", "links", "duplicates_dropped", "rejected_records",
                            "skipped_records"), 0)
    traces: set = set()
    runs: set = set()
    warnings: list[str] = []
    done_bytes = 0
    while todo or decodes.running:
        while todo and len(decodes.running) < limit:
            decodes.submit(*todo.popleft())
        path = decodes.running[0][0].path
        for kind, payload in decodes.next_file():
            if kind == "counts":
                totals["rejected_records"] += payload["rejected_records"]
                totals["skipped_records"] += payload["skipped_records"]
                warnings.extend(payload["warnings"])
                continue
            written = writer.write_fresh(drop_duplicates(payload, writer.dedup))  # as ingest's pipeline
            totals["duplicates_dropped"] += payload.spans.num_rows - written.spans.num_rows
            totals["spans"] += written.spans.num_rows
            totals["events"] += written.events.num_rows
            totals["links"] += written.links.num_rows
            traces.update(_distinct(written.spans, "trace_id"))
            runs.update(v for v in _distinct(written.spans, "run_id") if v)
            if progress is not None:
                progress(done_bytes, totals["spans"])
        done_bytes += path.stat().st_size
        if progress is not None:
            progress(done_bytes, totals["spans"])
    return IngestSummary(files=len(files), traces=len(traces), runs=len(runs), warnings=tuple(warnings), **totals)


def _distinct(table: pa.Table, column: str) -> list:
    values = table.column(column).combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    return pc.unique(values).to_pylist()
