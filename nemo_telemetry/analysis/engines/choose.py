"""Choosing an engine (what the CLI calls): the same result from memory, batch by batch, or Ray.

``local`` reads the goodput columns into memory, or streams a dataset a batch at a time
(:mod:`goodput.partials`, :mod:`engines.partitioned_check`) when it would not fit; ``ray`` hands the
dataset's files to :mod:`engines.ray_engine`, imported only then. Each engine drives the same rules
(:mod:`goodput.rules`, :mod:`findings.rules`).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES, ENGINES
from nemo_telemetry.analysis.goodput import steps as _goodput
from nemo_telemetry.analysis.goodput.fleets import FLEET_READ_COLUMNS
from nemo_telemetry.analysis.goodput.rules import FLEET_BY, check_by
from nemo_telemetry.analysis.settings.machine import ReadSettings
from nemo_telemetry.analysis.store.read import (
    GOODPUT_COLUMNS,
    STEP_GOODPUT_COLUMNS,
    READ_COLUMNS,
    reading_errors,
    span_source_files,
)
from nemo_telemetry.analysis.ingestion.read import read_for_analysis
from nemo_telemetry.analysis.store.commits import dataset_state
from nemo_telemetry.analysis.store.partitions import span_files
from nemo_telemetry.analysis.store.sources import single_dataset
from nemo_telemetry.analysis.goodput.partials import stream_goodput
from nemo_telemetry.errors import NemoTelemetryError

__all__ = ["ENGINES", "goodput_with_engine", "check_with_engine", "ingest_with_engine"]

_IN_MEMORY_BYTES_PER_SPAN = 200  # decoded goodput columns plus the arrays built from them, measured


def _dataset_rows(root: Path) -> int:
    """The spans the dataset holds: as its commit records count them, else from each file's footer."""
    recorded = dataset_state(root, warn=False).recorded_rows("spans")
    if recorded is not None:
        return recorded
    return sum(pq.ParquetFile(f).metadata.num_rows for f in span_files(root))


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise NemoTelemetryError(f"engine {engine!r}: choose one of {', '.join(ENGINES)}")


def _dataset_for(source, engine: str) -> Path:
    root = single_dataset(source)
    if root is None:
        raise NemoTelemetryError(f"--engine {engine} reads a dataset directory: run `nemo-telemetry ingest "
                                 "DUMPS... --out DATASET` (with --engine ray to decode in parallel) first")
    return root


def goodput_with_engine(source, *, engine: str = "local", run_id: str | None = None, by: str = "step",
                        memory_budget: int | None = None, threads: int | None = None) -> tuple[_goodput.RunGoodput, ...]:
    """``run_goodput`` of a dataset or dump files on the chosen engine.

    ``local`` works in memory, or streams the dataset a batch at a time when its goodput
    columns would take more than ``memory_budget`` bytes (default: :class:`ReadSettings`', a
    quarter of the memory available to this process, its cgroup's limit included); ``ray`` runs Ray
    tasks over the dataset's files. ``threads``: how many threads the local read keeps busy
    (default: the CPUs this process may use). ``by="rank"`` reads the dataset once more on the
    streaming and Ray engines (the rank partials).
    """
    _check_engine(engine)
    from nemo_telemetry.analysis.ingestion.metrics import with_step_metrics

    return with_step_metrics(_goodput_on_engine(source, engine=engine, run_id=run_id, by=by,
                                                memory_budget=memory_budget, threads=threads), source)


def _goodput_on_engine(source, *, engine: str, run_id: str | None, by: str,
                       memory_budget: int | None, threads: int | None) -> tuple[_goodput.RunGoodput, ...]:
    check_by(by)
    if engine == "ray":
        from nemo_telemetry.analysis.engines.ray_engine import ray_goodput

        return ray_goodput(_dataset_for(source, engine), run_id=run_id, by=by)  # names a damaged file itself
    root = single_dataset(source)
    settings = ReadSettings.from_machine(threads=threads, memory_budget=memory_budget)
    if root is not None and _dataset_rows(root) * _IN_MEMORY_BYTES_PER_SPAN > settings.memory_budget:
        with reading_errors(root):
            return stream_goodput(root, run_id=run_id, by=by)
    if by == "step" and root is not None:
        _, files = span_source_files(root)
        with reading_errors(root):
            rows = _goodput.read_goodput_rows(files, STEP_GOODPUT_COLUMNS, settings=settings) if files else None
        if rows is not None:
            return _goodput.goodput_of_rows(rows, run_id=run_id)
    columns = STEP_GOODPUT_COLUMNS if by == "step" else GOODPUT_COLUMNS
    if by in FLEET_BY:
        from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source

        columns = tuple(dict.fromkeys((*columns, *_PROCESS_COLUMNS, *FLEET_READ_COLUMNS)))
        return _goodput.run_goodput(read_for_analysis(source, columns=columns), run_id=run_id, by=by,
                                    metrics=metrics_for_source(source))
    columns = tuple(dict.fromkeys((*columns, *_PROCESS_COLUMNS)))
    return _goodput.run_goodput(read_for_analysis(source, columns=columns), run_id=run_id, by=by)


# A process (service, rank): the step spans without rl.iteration are numbered per run and process.
_PROCESS_COLUMNS = ("service_name", "rank")
CHECK_COLUMNS = tuple(dict.fromkeys((*READ_COLUMNS, *_PROCESS_COLUMNS)))
"""What ``check`` reads of a dataset it holds in memory."""


def check_with_engine(source, *, engine: str = "local", memory_budget: int | None = None,
                      threads: int | None = None, **options):
    """``check_run`` over a dataset or dump files; on ``ray`` the findings' rules run in Ray tasks
    (:mod:`partitioned_check`), the report being the same. ``memory_budget`` and ``threads`` are
    checked as :class:`ReadSettings` takes them; the local engine decodes a dataset batch by batch
    whatever its size."""
    _check_engine(engine)
    settings = ReadSettings.from_machine(threads=threads, memory_budget=memory_budget)
    if engine == "ray":
        from nemo_telemetry.analysis.engines.ray_engine import ray_check

        return ray_check(_dataset_for(source, engine), **options)  # names a damaged file itself
    from nemo_telemetry.analysis.findings.checks import check_run, check_span_files

    root, files = span_source_files(source)
    if files:
        with reading_errors(root):
            return check_span_files(files, settings=settings, **options)
    return check_run(read_for_analysis(source, columns=CHECK_COLUMNS), **options)


def ingest_with_engine(inputs, *, out, engine: str = "local", format: str | None = None, progress=None,
                       max_request_bytes: int | None = None, stall_timeout_s: float | None = None):
    """``ingest`` on the chosen engine: ``ray`` decodes the files in parallel Ray tasks.
    ``max_request_bytes``: the bound on one decompressed line, record or document, on either engine
    (None: the default, ``collect``'s). ``stall_timeout_s`` (Ray): how long one task may send
    nothing before the ingest fails (None: its default)."""
    _check_engine(engine)
    bound = DEFAULT_MAX_REQUEST_BYTES if max_request_bytes is None else max_request_bytes
    if engine == "ray":
        from nemo_telemetry.analysis.engines.ray_engine import STALL_TIMEOUT_S, ray_ingest

        return ray_ingest(inputs, out=out, format=format, progress=progress, max_request_bytes=bound,
                          stall_timeout_s=STALL_TIMEOUT_S if stall_timeout_s is None else stall_timeout_s)
    from nemo_telemetry.analysis.ingestion.ingest import ingest

    return ingest(inputs, out=out, format=format, progress=progress, max_request_bytes=bound)
