"""A bad log record or metric data point costs only itself in ``ingest``: the run's spans, the other
records and points are kept; each bad one is counted in the summary (text and ``--json``) and
named (file, line, path in the request, field)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from typer.testing import CliRunner

from nemo_telemetry.analysis import ingest, read_logs, read_spans
from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source
from nemo_telemetry.analysis.synthetic import synthetic_requests, write_json_lines
from nemo_telemetry.cli.app import app

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")

RESOURCE = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}},
                           {"key": "nemo.run.id", "value": {"stringValue": "run-1"}}]}


def _metrics_request(points: list[dict]) -> dict:
    return {"resourceMetrics": [{"resource": RESOURCE, "scopeMetrics": [
        {"scope": {"name": "t"}, "metrics": [{"name": "rl.efficiency.seconds", "gauge": {"dataPoints": points}}]}]}]}


def _point(i: int, **fields) -> dict:
    return {"timeUnixNano": str(1_000 + i), "asDouble": float(i),
            "attributes": [{"key": "i", "value": {"intValue": str(i)}}], **fields}


def _log_request(records: list[dict]) -> dict:
    return {"resourceLogs": [{"resource": RESOURCE, "scopeLogs": [{"logRecords": records}]}]}


def _record(i: int, **fields) -> dict:
    return {"timeUnixNano": str(2_000 + i), "severityText": "INFO", "body": {"stringValue": f"line {i}"}, **fields}


@pytest.fixture()
def run(tmp_path) -> Path:
    """A run's dumps: 300 spans; metrics lines whose second point has a bad field (a number
    past int64, a value of the wrong type); log lines whose second record's severityText is
    not a string."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    write_json_lines(folder / "traces-1.jsonl", list(synthetic_requests(300, spans_per_request=100)))
    metrics = [_metrics_request([_point(0), _point(1, timeUnixNano=str(1 << 63))]),
               _metrics_request([_point(2), _point(3, asDouble="fast")]),
               _metrics_request([_point(4), _point(5)])]
    (folder / "metrics-1.jsonl").write_text("\n".join(json.dumps(m) for m in metrics) + "\n")
    logs = [_log_request([_record(0), _record(1, severityText=5)]),
            _log_request([_record(2), _record(3, severityText={"stringValue": "WARN"})])]
    (folder / "logs-1.jsonl").write_text("\n".join(json.dumps(r) for r in logs) + "\n")
    return folder


def test_bad_log_records_and_metric_points_cost_only_themselves(run, tmp_path):
    summary = ingest(run, out=tmp_path / "ds")
    assert summary.spans >= 300 and read_spans(tmp_path / "ds").num_rows == summary.spans
    assert (summary.metric_points, summary.logs, summary.rejected_records) == (4, 2, 4)
    points = metrics_for_source(tmp_path / "ds")
    assert sorted(dict(a)["i"] for a in points["attributes"].to_pylist()) == ["0", "2", "4", "5"]
    assert read_logs(tmp_path / "ds")["body"].to_pylist() == ["line 0", "line 2"]
    metrics, logs = run / "metrics-1.jsonl", run / "logs-1.jsonl"
    where = "resourceMetrics[0].scopeMetrics[0].metrics[0] 'rl.efficiency.seconds'.dataPoints[1]"
    assert sorted(summary.warnings) == sorted([
        f"{logs}:1: resourceLogs[0].scopeLogs[0].logRecords[1]: severityText 5 is int, not a string",
        f"{logs}:2: resourceLogs[0].scopeLogs[0].logRecords[1]: severityText {{'stringValue': 'WARN'}} is dict, "
        "not a string",
        f"{metrics}:1: {where}.timeUnixNano: 9223372036854775808 does not fit in int64",
        f"{metrics}:2: {where}: Couldn't parse float: fast at NumberDataPoint.asDouble",
    ])


def test_a_protobuf_metric_point_past_int64_costs_only_itself(tmp_path):
    requests = [ParseDict(_metrics_request([_point(2 * i), _point(2 * i + 1)]), ExportMetricsServiceRequest())
                for i in range(3)]
    requests[1].resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].time_unix_nano = (1 << 64) - 1
    path = tmp_path / "metrics-1.pb"
    path.write_bytes(b"".join(struct.pack(">I", r.ByteSize()) + r.SerializeToString() for r in requests))
    summary = ingest(path, out=tmp_path / "ds")
    points = metrics_for_source(tmp_path / "ds")
    assert sorted(dict(a)["i"] for a in points["attributes"].to_pylist()) == ["0", "1", "3", "4", "5"]
    assert summary.metric_points == 5
    assert (f"{path}: record 2: resourceMetrics[0].scopeMetrics[0].metrics[0] 'rl.efficiency.seconds'"
            ".dataPoints[0].timeUnixNano: 18446744073709551615 does not fit in int64") in summary.warnings


def test_cli_ingest_counts_and_names_them_in_text_and_json(run, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["ingest", str(run), "--out", str(tmp_path / "a"), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["rejected_records"], document["metric_points"], document["logs"]) == (4, 4, 2)
    assert any("severityText 5 is int, not a string" in w for w in document["warnings"])
    text = runner.invoke(app, ["ingest", str(run), "--out", str(tmp_path / "b")])
    assert text.exit_code == 0, text.output
    assert "rejected records" in text.stdout and "Traceback" not in text.output
    shown = "".join(text.stderr.split())  # rich wraps the lines at the terminal's width
    assert "doesnotfitinint64" in shown and "severityText5isint" in shown


@pytest.mark.parametrize(("field", "value", "why"), [
    ("timeUnixNano", 2000.5, "timeUnixNano 2000.5 is not an integer"),
    ("timeUnixNano", True, "timeUnixNano True is not an integer"),
    ("timeUnixNano", "2e3", "timeUnixNano '2e3' is not an integer"),
    ("timeUnixNano", str(1 << 63), "timeUnixNano 9223372036854775808 does not fit in int64"),
    ("severityNumber", "SEVERITY_NUMBER_INFO9", "severityNumber 'SEVERITY_NUMBER_INFO9' is not a severity"),
    ("body", "plain text", "body is str, not an AnyValue object"),
    ("attributes", [{"key": 5, "value": {"stringValue": "x"}}], "attributes[0] has no string key"),
    ("attributes", [{"key": "n", "value": {"intValue": 1.5}}], "attributes[0] ('n'): intValue 1.5 is not an integer"),
])
def test_a_log_record_field_is_never_rounded_or_coerced(field, value, why, tmp_path):
    from nemo_telemetry.analysis.ingestion.logs import read_log_dumps

    path = tmp_path / "logs-1.jsonl"
    path.write_text(json.dumps(_log_request([_record(0), _record(1, **{field: value}), _record(2)])) + "\n"
                    + json.dumps(_log_request([_record(3)])) + "\n")
    result = read_log_dumps([path])
    assert result.table["body"].to_pylist() == ["line 0", "line 2", "line 3"]
    assert result.problems == [f"{path}:1: resourceLogs[0].scopeLogs[0].logRecords[1]: {why}"]


def test_an_integral_log_time_given_as_a_float_is_read_exactly(tmp_path):
    from nemo_telemetry.analysis.ingestion.logs import read_log_dumps

    path = tmp_path / "logs-1.jsonl"
    path.write_text(json.dumps(_log_request([_record(0, timeUnixNano=2000.0)])) + "\n")
    result = read_log_dumps([path])
    assert result.problems == [] and result.table["time_ns"].to_pylist() == [2000]


def test_a_time_of_thousands_of_digits_costs_only_its_record_or_point(tmp_path):
    """A number no double holds (orjson refuses the line): the span reader leaves the line to
    the log and metrics readers, which reject the one record or point that holds it."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    huge = "9" * 5000
    logs = json.dumps(_log_request([_record(0), _record(1, timeUnixNano="HUGE")])).replace('"HUGE"', huge)
    (folder / "logs-1.jsonl").write_text(logs + "\n" + json.dumps(_log_request([_record(2)])) + "\n")
    metrics = json.dumps(_metrics_request([_point(0), _point(1, timeUnixNano="HUGE")])).replace('"HUGE"', huge)
    (folder / "metrics-1.jsonl").write_text(metrics + "\n" + json.dumps(_metrics_request([_point(2)])) + "\n")
    summary = ingest(folder, out=tmp_path / "ds")
    assert (summary.logs, summary.metric_points, summary.rejected_records) == (2, 2, 2), summary.warnings
    assert read_logs(tmp_path / "ds")["body"].to_pylist() == ["line 0", "line 2"]
    points = metrics_for_source(tmp_path / "ds")
    assert sorted(dict(a)["i"] for a in points["attributes"].to_pylist()) == ["0", "2"]
    assert any(w.startswith(f"{folder / 'logs-1.jsonl'}:1: resourceLogs[0].scopeLogs[0].logRecords[1]: timeUnixNano")
               for w in summary.warnings)
    assert f"{folder / 'metrics-1.jsonl'}:1: resourceMetrics[0].scopeMetrics[0].metrics[0] 'rl.efficiency.seconds'" \
           ".dataPoints[1]: timeUnixNano: a number of thousands of digits, past int64" in summary.warnings
