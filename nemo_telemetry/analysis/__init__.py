"""The reading half of nemo-telemetry: OTLP dumps in, Arrow tables and small dataclasses out.

Nothing here prints; the CLI renders what these functions return, and notebooks use them
directly. The public API is listed once, in ``__all__``.
"""

from __future__ import annotations

from nemo_telemetry.analysis.ingestion.collect import CollectorServer, CollectSummary, run_collector
from nemo_telemetry.analysis.ingestion.ingest import (
    IngestSummary,
    IngestWarning,
    TraceTables,
    ingest,
    load_traces,
    read_events,
    read_links,
    read_spans,
)
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA, SPANS_SCHEMA
from nemo_telemetry.analysis.model.tree import parent_indices, with_id_keys
from nemo_telemetry.analysis.model.walk import attributed_iterations
from nemo_telemetry.analysis.views.waterfall import Waterfall, WaterfallError, critical_path, waterfall
from nemo_telemetry.analysis.views.perfetto import to_chrome_trace
from nemo_telemetry.analysis.views.html_view import to_html
from nemo_telemetry.analysis.ingestion.metrics import (
    METRICS_SCHEMA,
    efficiency_by_step,
    metrics_by_step,
    read_metrics,
    step_windows,
    with_efficiency_columns,
)
from nemo_telemetry.analysis.views.stitch import stitch_vllm_spans
from nemo_telemetry.analysis.ingestion.logs import LOGS_SCHEMA, read_logs
from nemo_telemetry.analysis.goodput.steps import (
    RunGoodput,
    StepOutlier,
    compare_runs,
    goodput_by_step,
    goodput_document,
    run_goodput,
)
from nemo_telemetry.analysis.findings.checks import FINDING_CODES, CheckReport, Finding, check_run
from nemo_telemetry.analysis.model.intervals import merge_intervals
from nemo_telemetry.analysis.kernels.warmup import KernelWarmUp, kernels_compiling, warm_up_kernels
from nemo_telemetry.analysis.ingestion.ingest import FORMATS, dump_files
from nemo_telemetry.analysis.model._arrays import GOODPUT_COLUMNS, read_for_analysis
from nemo_telemetry.analysis.goodput.steps import BUCKETS, STEP_COLUMNS
from nemo_telemetry.analysis.findings.checks import SEVERITIES
from nemo_telemetry.analysis.engines.choose import ENGINES, check_with_engine, goodput_with_engine, ingest_with_engine
from nemo_telemetry.analysis.views.waterfall import DEFAULT_COLLAPSE_THRESHOLD
from nemo_telemetry.analysis.views.plots import write_goodput_plot
from nemo_telemetry.analysis.lint import lint_paths
from nemo_telemetry.errors import CompiledPathWarning, IncompleteDatasetWarning, IngestError, LintError, UnknownRunError

__all__ = [
    "SPANS_SCHEMA",
    "EVENTS_SCHEMA",
    "LINKS_SCHEMA",
    "IngestError",
    "IncompleteDatasetWarning",
    "spans_table",
    "parent_indices",
    "attributed_iterations",
    "with_id_keys",
    "ingest",
    "IngestSummary",
    "IngestWarning",
    "CompiledPathWarning",
    "KernelWarmUp",
    "warm_up_kernels",
    "kernels_compiling",
    "TraceTables",
    "load_traces",
    "read_spans",
    "read_events",
    "read_links",
    "Waterfall",
    "WaterfallError",
    "waterfall",
    "critical_path",
    "to_chrome_trace",
    "to_html",
    "METRICS_SCHEMA",
    "read_metrics",
    "step_windows",
    "metrics_by_step",
    "efficiency_by_step",
    "with_efficiency_columns",
    "stitch_vllm_spans",
    "LOGS_SCHEMA",
    "read_logs",
    "goodput_by_step",
    "run_goodput",
    "RunGoodput",
    "StepOutlier",
    "compare_runs",
    "goodput_document",
    "check_run",
    "CheckReport",
    "Finding",
    "FINDING_CODES",
    "merge_intervals",
    "CollectorServer",
    "CollectSummary",
    "run_collector",
    "FORMATS",
    "dump_files",
    "read_for_analysis",
    "GOODPUT_COLUMNS",
    "BUCKETS",
    "STEP_COLUMNS",
    "SEVERITIES",
    "ENGINES",
    "goodput_with_engine",
    "check_with_engine",
    "ingest_with_engine",
    "DEFAULT_COLLAPSE_THRESHOLD",
    "write_goodput_plot",
    "lint_paths",
    "LintError",
    "UnknownRunError",
]
