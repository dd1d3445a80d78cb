"""The public analysis names notebooks and the CLI are written against, from ``nemo_telemetry.analysis``."""

from __future__ import annotations

import ast
from pathlib import Path

import nemo_telemetry.analysis as analysis
import nemo_telemetry.errors as errors

PINNED = {
    "SPANS_SCHEMA", "EVENTS_SCHEMA", "LINKS_SCHEMA", "IngestError", "IncompleteDatasetWarning", "spans_table",
    "parent_indices", "attributed_iterations", "with_id_keys", "ingest", "IngestSummary", "IngestWarning",
    "TraceTables", "load_traces", "read_spans", "read_events", "read_links", "Waterfall", "WaterfallError",
    "waterfall", "critical_path", "to_chrome_trace", "to_html", "METRICS_SCHEMA", "read_metrics", "step_windows",
    "metrics_by_step", "efficiency_by_step", "with_efficiency_columns", "stitch_vllm_spans", "LOGS_SCHEMA",
    "read_logs", "goodput_by_step", "run_goodput", "RunGoodput", "StepOutlier", "compare_runs", "goodput_document",
    "check_run", "CheckReport", "Finding", "FINDING_CODES", "merge_intervals", "CollectorServer", "CollectSummary",
    "run_collector",
}
# issue 17: everything the CLI calls is public, so the CLI reads no module of the package directly
PINNED |= {"ENGINES", "goodput_with_engine", "check_with_engine", "ingest_with_engine", "read_for_analysis",
           "GOODPUT_COLUMNS", "SEVERITIES", "BUCKETS", "STEP_COLUMNS", "FORMATS", "dump_files", "lint_paths",
           "DEFAULT_COLLAPSE_THRESHOLD", "write_goodput_plot", "UnknownRunError", "LintError"}
# the receiver's bounds `collect --help` shows, from the light module the CLI's options are defined with
PINNED |= {"DEFAULT_MAX_CONNECTIONS", "DEFAULT_READ_TIMEOUT_S"}
PINNED |= {"DEFAULT_MAX_REQUEST_BYTES"}
PINNED |= {"run_monitor", "MonitorState", "MonitorSummary", "MonitorView", "StepRecord", "RunStatus", "Alert",
           "DumpFollower", "FollowCounts", "MONITOR_SERIES", "MonitorError"}
# issue 33: one writer at a time, damaged files named, verify and repair
PINNED |= {"DatasetLockedError", "DamagedDatasetError", "verify_dataset", "repair_dataset", "VerifyReport",
           "RepairReport"}
# issue 32: a dataset of a format this version does not read
PINNED |= {"DatasetFormatError"}
# issue 33: the receivers' bearer token file and the error of a receiver that refuses to start as asked
PINNED |= {"read_token_file", "ReceiverSecurityError"}
# issue 30: the dataset back to OTLP
PINNED |= {"to_otlp_traces", "to_otlp_logs", "to_otlp_metrics"}

CLI = Path(analysis.__file__).resolve().parent.parent / "cli"


def test_pinned_names_are_public():
    assert PINNED <= set(analysis.__all__)


def test_every_public_name_resolves_and_is_listed_once():
    assert len(analysis.__all__) == len(set(analysis.__all__))
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
    assert callable(analysis.ingest) and callable(analysis.waterfall)  # the functions, not their modules


def test_the_cli_imports_analysis_names_only_from_the_package():
    reached = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nemo_telemetry.analysis."):
                reached.append(f"{path.name}: {node.module}")
            if isinstance(node, ast.ImportFrom) and node.module == "nemo_telemetry.analysis":
                assert {a.name for a in node.names} <= set(analysis.__all__), path.name
    assert reached == []


def test_every_error_class_is_under_the_one_root_in_errors():
    for name in errors.__all__:
        value = getattr(errors, name)
        if not issubclass(value, Warning):  # the warnings are UserWarnings, on purpose
            assert issubclass(value, errors.NemoTelemetryError), name
    from nemo_telemetry.analysis.lint import LintError
    from nemo_telemetry.analysis.views.waterfall import WaterfallError
    from nemo_telemetry.demo import DemoError

    assert (LintError, WaterfallError, DemoError) == (errors.LintError, errors.WaterfallError, errors.DemoError)
