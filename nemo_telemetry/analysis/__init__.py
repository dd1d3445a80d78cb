"""The reading half of nemo-telemetry: OTLP dumps in, Arrow tables and small dataclasses out.

Nothing here prints; the CLI renders what these functions return, and notebooks use them
directly. The public API is listed once, in ``__all__``; each name is imported from its module on
first use (``_HOMES``), so that importing the package, or defining the CLI's options from
:mod:`nemo_telemetry.analysis.settings.choices`, loads no numpy, pyarrow or pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# What a type checker reads for the names __getattr__ below loads on first use: the same modules as
# _MODULE_NAMES (tests/test_typing.py keeps the two in step). Never executed, so importing stays light.
if TYPE_CHECKING:
    from nemo_telemetry.errors import (
        CompiledPathWarning, DamagedDatasetError, DatasetFormatError, DatasetLockedError, IncompleteDatasetWarning,
        IngestError, IngestWarning, LintError, MonitorError, ReceiverSecurityError, SettingsError, UnknownRunError,
        WaterfallError,
    )
    from nemo_telemetry.analysis.settings.choices import (
        DEFAULT_COLLAPSE_THRESHOLD, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_TIMEOUT_S,
        ENGINES, FORMATS, SEVERITIES,
    )
    from nemo_telemetry.analysis.model.schema import EVENTS_SCHEMA, LINKS_SCHEMA, SPANS_SCHEMA
    from nemo_telemetry.analysis.model.records import spans_table
    from nemo_telemetry.analysis.model.tree import parent_indices, with_id_keys
    from nemo_telemetry.analysis.model.walk import attributed_iterations
    from nemo_telemetry.analysis.model.intervals import merge_intervals
    from nemo_telemetry.analysis.store.read import GOODPUT_COLUMNS
    from nemo_telemetry.analysis.ingestion.read import read_for_analysis
    from nemo_telemetry.analysis.settings.machine import ReadSettings
    from nemo_telemetry.analysis.store.repair import RepairReport, VerifyReport, repair_dataset, verify_dataset
    from nemo_telemetry.analysis.ingestion.warmup import KernelWarmUp, kernels_compiling, warm_up_kernels
    from nemo_telemetry.analysis.ingestion.ingest import (
        IngestSummary, TraceTables, dump_files, ingest, load_traces, read_events, read_links, read_spans,
    )
    from nemo_telemetry.analysis.ingestion.collect import (
        CollectSummary, CollectorServer, read_token_file, run_collector,
    )
    from nemo_telemetry.analysis.ingestion.metrics import (
        METRICS_SCHEMA, efficiency_by_step, metrics_by_step, read_metrics, step_windows, with_efficiency_columns,
    )
    from nemo_telemetry.analysis.ingestion.logs import LOGS_SCHEMA, read_logs
    from nemo_telemetry.analysis.goodput.steps import (
        BUCKETS, RunGoodput, STEP_COLUMNS, StepOutlier, compare_runs, goodput_by_step, goodput_document, run_goodput,
    )
    from nemo_telemetry.analysis.goodput.census import SpanCensus, RunCensus, span_census
    from nemo_telemetry.analysis.goodput.fleets import FLEET_COLUMNS, FleetFinding, FleetGoodput
    from nemo_telemetry.analysis.findings.checks import CheckReport, FINDING_CODES, Finding, check_run
    from nemo_telemetry.analysis.engines.choose import check_with_engine, goodput_with_engine, ingest_with_engine
    from nemo_telemetry.analysis.views.waterfall import Waterfall, critical_path, waterfall
    from nemo_telemetry.analysis.views.perfetto import to_chrome_trace
    from nemo_telemetry.analysis.views.html_view import to_html
    from nemo_telemetry.analysis.views.stitch import stitch_vllm_spans
    from nemo_telemetry.analysis.views.otlp import to_otlp_logs, to_otlp_metrics, to_otlp_traces
    from nemo_telemetry.analysis.views.plots import write_goodput_plot
    from nemo_telemetry.analysis.lint import lint_paths
    from nemo_telemetry.analysis.ingestion.follow import DumpFollower, FollowCounts
    from nemo_telemetry.analysis.monitor.state import MonitorState, RunStatus, StepRecord
    from nemo_telemetry.analysis.monitor.run import Alert, MonitorSummary, MonitorView, run_monitor
    from nemo_telemetry.analysis.monitor.export import MONITOR_SERIES

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
    "to_otlp_traces",
    "to_otlp_logs",
    "to_otlp_metrics",
    "LOGS_SCHEMA",
    "read_logs",
    "goodput_by_step",
    "run_goodput",
    "RunGoodput",
    "StepOutlier",
    "compare_runs",
    "goodput_document",
    "SpanCensus",
    "RunCensus",
    "span_census",
    "FLEET_COLUMNS",
    "FleetGoodput",
    "FleetFinding",
    "check_run",
    "CheckReport",
    "Finding",
    "FINDING_CODES",
    "merge_intervals",
    "CollectorServer",
    "CollectSummary",
    "run_collector",
    "read_token_file",
    "ReceiverSecurityError",
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
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DumpFollower",
    "FollowCounts",
    "MonitorState",
    "RunStatus",
    "StepRecord",
    "Alert",
    "MonitorSummary",
    "MonitorView",
    "run_monitor",
    "MONITOR_SERIES",
    "MonitorError",
    "DatasetLockedError",
    "DamagedDatasetError",
    "DatasetFormatError",
    "verify_dataset",
    "repair_dataset",
    "VerifyReport",
    "RepairReport",
    "ReadSettings",
    "SettingsError",
]

_MODULE_NAMES = {  # each module and the public names it defines, in the pipeline's order
    "nemo_telemetry.errors": (
        "IngestError", "IncompleteDatasetWarning", "IngestWarning", "CompiledPathWarning", "LintError",
        "UnknownRunError", "WaterfallError", "MonitorError", "DatasetLockedError", "DamagedDatasetError",
        "ReceiverSecurityError", "SettingsError", "DatasetFormatError",
    ),
    "nemo_telemetry.analysis.settings.choices": (
        "FORMATS", "SEVERITIES", "ENGINES", "DEFAULT_COLLAPSE_THRESHOLD", "DEFAULT_MAX_CONNECTIONS",
        "DEFAULT_READ_TIMEOUT_S", "DEFAULT_MAX_REQUEST_BYTES",
    ),
    "nemo_telemetry.analysis.model.schema": ("SPANS_SCHEMA", "EVENTS_SCHEMA", "LINKS_SCHEMA"),
    "nemo_telemetry.analysis.model.records": ("spans_table",),
    "nemo_telemetry.analysis.model.tree": ("parent_indices", "with_id_keys"),
    "nemo_telemetry.analysis.model.walk": ("attributed_iterations",),
    "nemo_telemetry.analysis.model.intervals": ("merge_intervals",),
    "nemo_telemetry.analysis.store.read": ("GOODPUT_COLUMNS",),
    "nemo_telemetry.analysis.ingestion.read": ("read_for_analysis",),
    "nemo_telemetry.analysis.settings.machine": ("ReadSettings",),
    "nemo_telemetry.analysis.store.repair": ("verify_dataset", "repair_dataset", "VerifyReport", "RepairReport"),
    "nemo_telemetry.analysis.ingestion.warmup": ("KernelWarmUp", "warm_up_kernels", "kernels_compiling"),
    "nemo_telemetry.analysis.ingestion.ingest": (
        "ingest", "IngestSummary", "TraceTables", "load_traces", "read_spans", "read_events", "read_links",
        "dump_files",
    ),
    "nemo_telemetry.analysis.ingestion.collect": ("CollectorServer", "CollectSummary", "run_collector", "read_token_file"),
    "nemo_telemetry.analysis.ingestion.metrics": (
        "METRICS_SCHEMA", "read_metrics", "step_windows", "metrics_by_step", "efficiency_by_step",
        "with_efficiency_columns",
    ),
    "nemo_telemetry.analysis.ingestion.logs": ("LOGS_SCHEMA", "read_logs"),
    "nemo_telemetry.analysis.goodput.steps": (
        "goodput_by_step", "run_goodput", "RunGoodput", "StepOutlier", "compare_runs", "goodput_document",
        "BUCKETS", "STEP_COLUMNS",
    ),
    "nemo_telemetry.analysis.goodput.census": ("SpanCensus", "RunCensus", "span_census"),
    "nemo_telemetry.analysis.goodput.fleets": ("FLEET_COLUMNS", "FleetGoodput", "FleetFinding"),
    "nemo_telemetry.analysis.findings.checks": ("check_run", "CheckReport", "Finding", "FINDING_CODES"),
    "nemo_telemetry.analysis.engines.choose": ("goodput_with_engine", "check_with_engine", "ingest_with_engine"),
    "nemo_telemetry.analysis.views.waterfall": ("Waterfall", "waterfall", "critical_path"),
    "nemo_telemetry.analysis.views.perfetto": ("to_chrome_trace",),
    "nemo_telemetry.analysis.views.html_view": ("to_html",),
    "nemo_telemetry.analysis.views.stitch": ("stitch_vllm_spans",),
    "nemo_telemetry.analysis.views.otlp": ("to_otlp_traces", "to_otlp_logs", "to_otlp_metrics"),
    "nemo_telemetry.analysis.views.plots": ("write_goodput_plot",),
    "nemo_telemetry.analysis.lint": ("lint_paths",),
    "nemo_telemetry.analysis.ingestion.follow": ("DumpFollower", "FollowCounts"),
    "nemo_telemetry.analysis.monitor.state": ("MonitorState", "RunStatus", "StepRecord"),
    "nemo_telemetry.analysis.monitor.run": ("Alert", "MonitorSummary", "MonitorView", "run_monitor"),
    "nemo_telemetry.analysis.monitor.export": ("MONITOR_SERIES",),
}
_HOMES = {name: module for module, names in _MODULE_NAMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use and keep the name here for the next lookup."""
    module = _HOMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
