"""The Ray engine: ingest, goodput and check past one machine, on Ray and Ray Data.

- :func:`ray_ingest` decodes each dump file in its own Ray task (a streaming generator that
  yields one batch of tables at a time, so a task never holds a whole file) and this process
  deduplicates and writes the batches in file order, exactly as :func:`ingest.ingest` does.
- :func:`ray_goodput` runs :mod:`streaming`'s steps (attribution over the compact edge table,
  per-batch partials, merge) with Ray Data mapping them over the Parquet dataset's files; the
  merged result is a few rows per step.
- :func:`ray_check` reads the columns the findings use with Ray Data (in parallel, projected,
  in file order) and computes the findings here with :func:`findings.check_run`.

Every result equals the local engine's on the same data. ``ray`` is imported only when an
engine function is called; :func:`connect` joins the cluster ``RAY_ADDRESS`` names, or starts
a local one, unless this process is already connected.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nemo_telemetry.analysis import streaming
from nemo_telemetry.analysis.dataset import DatasetWriter, read_dataset
from nemo_telemetry.analysis.ingest import BATCH_SPANS, IngestSummary, Source, _Pipeline, _raw_files
from nemo_telemetry.analysis.partitions import span_files
from nemo_telemetry.errors import NemoTelemetryError

__all__ = ["connect", "ray_scan", "ray_ingest", "ray_goodput", "ray_check", "read_columns"]

_FILES_IN_FLIGHT_PER_CPU = 2
_BATCHES_AHEAD = 2  # decoded batches a file task may hold before this process takes them


def connect():
    """The ``ray`` module, connected: to ``RAY_ADDRESS`` when set, else to a new local cluster."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency of the analysis extra
        raise NemoTelemetryError("--engine ray needs Ray: pip install 'ray[data]'") from None
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, include_dashboard=False,
                 configure_logging=False, log_to_driver=False)
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    return ray


# -- Ray Data over the dataset -----------------------------------------------------------------


def _read(files: Sequence[Path], columns: Sequence[str], *, ordered: bool = False):
    import ray.data

    present = set(pq.read_schema(files[0]).names) if files else set()
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = ordered
    dataset = ray.data.read_parquet([str(f) for f in files], partitioning=None)
    return dataset.select_columns([c for c in columns if c in present])


def ray_scan() -> streaming.Scan:
    """A :data:`streaming.Scan` that maps the function over the files' blocks with Ray Data."""

    def scan(fn: Callable[[pa.Table], pa.Table], columns: Sequence[str], files: Sequence[Path]) -> Iterator[pa.Table]:
        if not files:
            return
        mapped = _read(files, columns).map_batches(fn, batch_format="pyarrow", batch_size=None, zero_copy_batch=True)
        yield from mapped.iter_batches(batch_format="pyarrow", batch_size=None)

    return scan


def ray_goodput(root: str | Path, *, run_id: str | None = None):
    """``run_goodput`` (by step) of the dataset at ``root``, computed on the Ray cluster."""
    connect()
    return streaming.partitioned_goodput(Path(root), ray_scan(), run_id=run_id)


def read_columns(root: str | Path, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of the spans table, read by Ray Data in parallel, rows in file order."""
    connect()
    files = span_files(Path(root))
    if not files:
        return read_dataset(Path(root), "spans", columns=[c for c in columns])
    import ray

    refs = _read(files, columns, ordered=True).to_arrow_refs()
    return pa.concat_tables(ray.get(refs), promote_options="permissive")


def ray_check(root: str | Path, **options):
    """``check_run`` over the dataset at ``root``: the columns it reads come through Ray Data."""
    from nemo_telemetry.analysis._arrays import READ_COLUMNS
    from nemo_telemetry.analysis.findings import check_run

    return check_run(read_columns(root, READ_COLUMNS), **options)


# -- ingest ------------------------------------------------------------------------------------


def _decode_file(path: str, fmt: str | None, batch_spans: int) -> Iterator[tuple]:
    """Ray task body: ("tables", OtlpTables) per batch of ``path``, then ("counts", dict)."""
    batches: list = []
    pipeline = _Pipeline(lambda tables: batches.append(tables) or tables, batch_spans=batch_spans)
    pipeline.counts["files"] += 1
    from nemo_telemetry.analysis._detect import iter_records

    for record in iter_records(Path(path), fmt):
        pipeline.add_record(record.kind, record.where, record.payload)
        while batches:
            yield ("tables", batches.pop(0))
    summary = pipeline.summary()
    while batches:
        yield ("tables", batches.pop(0))
    yield ("counts", {"rejected_records": summary.rejected_records, "skipped_records": summary.skipped_records,
                      "warnings": list(summary.warnings)})


def ray_ingest(
    inputs: Source,
    *,
    out: str | Path,
    format: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    batch_spans: int = BATCH_SPANS,
) -> IngestSummary:
    """:func:`ingest.ingest` with each file decoded by a Ray task; the dataset and summary are the same.

    Tasks run ahead (two files per cluster CPU), and this process takes their batches file by
    file, in input order, so the deduplication keeps the same first copy of a repeated span.
    """
    ray = connect()
    files = _raw_files(inputs, format)
    writer = DatasetWriter(Path(out))
    decode = ray.remote(_decode_file).options(num_cpus=1, _generator_backpressure_num_objects=_BATCHES_AHEAD)
    limit = max(1, int(ray.cluster_resources().get("CPU", 1)) * _FILES_IN_FLIGHT_PER_CPU)
    todo = deque(files)
    running: deque = deque()
    totals = dict.fromkeys(("spans", "events", "links", "duplicates_dropped", "rejected_records",
                            "skipped_records"), 0)
    traces: set = set()
    runs: set = set()
    warnings: list[str] = []
    done_bytes = 0
    while todo or running:
        while todo and len(running) < limit:
            path, fmt = todo.popleft()
            running.append((path, decode.remote(str(path), fmt, batch_spans)))
        path, generator = running.popleft()
        for ref in generator:
            kind, payload = ray.get(ref)
            if kind == "counts":
                totals["rejected_records"] += payload["rejected_records"]
                totals["skipped_records"] += payload["skipped_records"]
                warnings.extend(payload["warnings"])
                continue
            written = writer.write(payload)
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
