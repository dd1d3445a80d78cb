"""Every signal is told by its content, in every format, whatever the file's name: traces, metrics
and logs as an OTLP/JSON document, JSON lines, length-prefixed protobuf (plain or the Collector's
per-request zstd) and a bare protobuf request, each also gzip or zstd compressed. A file of one
signal is never decoded as another (no "traceId has 0 bytes" for a metrics dump), and ``ingest``
counts what it read of each signal. The requests are the OpenTelemetry Python SDK's own OTLP
encodings (``tests/analysis/_otlp_signals.py``)."""

from __future__ import annotations

import json
import warnings

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import ingest, read_logs, read_metrics, read_spans
from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source
from nemo_telemetry.cli.app import app

from _otlp_signals import COMPRESSIONS, FORMATS, dump_bytes, per_request

SIGNALS = ("traces", "metrics", "logs")
CASES = [(s, f, c) for s in SIGNALS for f in FORMATS for c in COMPRESSIONS]


@pytest.mark.parametrize(("signal", "fmt", "compression"), CASES,
                         ids=[f"{s}-{f}{c}" for s, f, c in CASES])
def test_each_signal_is_read_by_content_whatever_the_name(signal, fmt, compression, tmp_path):
    data, requests = dump_bytes(signal, fmt, compression)
    path = tmp_path / "export.out"  # a name that says nothing: no metrics-*, logs-*, no extension that fits
    path.write_bytes(data)
    summary = ingest([path], out=tmp_path / "ds")
    expected = {name: n * requests for name, n in per_request(signal).items()}
    expected["spans"] = per_request(signal)["spans"]  # a request sent twice: its spans are kept once
    assert {"spans": summary.spans, "metric_points": summary.metric_points, "logs": summary.logs} == expected
    assert summary.duplicates_dropped == per_request(signal)["spans"] * (requests - 1)
    assert (summary.rejected_records, summary.warnings) == (0, ())  # nothing said about another signal
    # The dataset's tables, and the raw file read directly (warning of nothing), hold the same rows.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_spans(tmp_path / "ds").num_rows == read_spans(path).num_rows == expected["spans"]
        assert read_metrics(tmp_path / "ds").num_rows == read_metrics(path).num_rows == expected["metric_points"]
        assert read_logs(tmp_path / "ds").num_rows == read_logs(path).num_rows == expected["logs"]


def test_the_values_survive_every_format(tmp_path):
    """Not only the counts: the protobuf and JSON forms of one request give the same rows."""
    tables = {}
    for fmt in ("document.json", "bare.pb", "frames.pb"):
        for signal in SIGNALS:
            path = tmp_path / fmt / signal
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(dump_bytes(signal, fmt)[0])
        tables[fmt] = (read_metrics(tmp_path / fmt), read_logs(tmp_path / fmt), read_spans(tmp_path / fmt))
    metrics, logs, spans = tables["document.json"]
    assert sorted(metrics["name"].to_pylist()) == ["latency", "requests", "temperature"]
    assert logs["body"].to_pylist() == ["line 0", "line 1", "line 2"]
    assert sorted(spans["name"].to_pylist()) == ["child", "root"]
    assert all(trace_id for trace_id in logs["trace_id"].to_pylist()) is False  # logged outside any span
    other_metrics, other_logs, other_spans = tables["bare.pb"]
    assert _rows(other_metrics) == _rows(metrics)
    assert other_logs.to_pylist() == logs.to_pylist()
    ids = ["trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns"]
    assert _rows(other_spans.select(ids)) == _rows(spans.select(ids))
    frames_metrics = tables["frames.pb"][0]
    assert frames_metrics.num_rows == 2 * metrics.num_rows  # two requests in the file


def _rows(table) -> list:
    return sorted(table.to_pylist(), key=repr)


def test_a_folder_of_every_signal_and_format(tmp_path):
    """One folder with every file: each signal's reader takes its own files, and nothing else."""
    folder = tmp_path / "dumps"
    folder.mkdir()
    totals = {"spans": 0, "metric_points": 0, "logs": 0}
    for index, (signal, fmt, compression) in enumerate(CASES):
        data, requests = dump_bytes(signal, fmt, compression)
        (folder / f"part-{index:03d}").write_bytes(data)
        for name, n in per_request(signal).items():
            totals[name] += n if name == "spans" else n * requests  # every trace file holds the same spans
    totals["spans"] = per_request("traces")["spans"]
    summary = ingest([folder], out=tmp_path / "ds")
    assert {"spans": summary.spans, "metric_points": summary.metric_points, "logs": summary.logs} == totals
    assert (summary.rejected_records, summary.skipped_files, summary.warnings) == (0, 0, ())
    assert read_metrics(folder).num_rows == metrics_for_source(folder).num_rows == totals["metric_points"]
    assert read_logs(folder).num_rows == totals["logs"]
    assert read_metrics(tmp_path / "ds").num_rows == totals["metric_points"]
    assert read_logs(tmp_path / "ds").num_rows == totals["logs"]


def test_the_cli_summary_counts_each_signal(tmp_path):
    folder = tmp_path / "dumps"
    folder.mkdir()
    for signal in SIGNALS:
        (folder / f"{signal[0]}.bin").write_bytes(dump_bytes(signal, "frames.pb")[0])
    result = CliRunner().invoke(app, ["ingest", str(folder), "--out", str(tmp_path / "ds"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["spans"], summary["metric_points"], summary["logs"]) == (2, 6, 6)
    assert (summary["rejected_records"], summary["warnings"]) == (0, [])
    text = CliRunner().invoke(app, ["ingest", str(folder), "--out", str(tmp_path / "ds2")])
    assert text.exit_code == 0, text.output
    rows = {cells[0]: cells[1] for cells in ([c.strip() for c in line.strip("│┃ ").split("│")]
                                             for line in text.stdout.splitlines()) if len(cells) == 2}
    assert (rows["spans"], rows["metric points"], rows["logs"]) == ("2", "6", "6")


def test_following_a_folder_of_every_signal_reads_the_spans_and_no_error(tmp_path):
    """``monitor --follow``'s reader: protobuf metrics and logs files are counted, not decoded as
    traces; a bare protobuf trace request is read at its end."""
    from nemo_telemetry.analysis.ingestion.follow import DumpFollower

    folder = tmp_path / "dumps"
    folder.mkdir()
    for index, (signal, fmt, compression) in enumerate(CASES):
        (folder / f"part-{index:03d}").write_bytes(dump_bytes(signal, fmt, compression)[0])
    follower = DumpFollower(folder)
    spans = [t for t in (follower.poll(), follower.close()) if t is not None]
    counts = follower.counts()
    assert (counts.rejected_records, counts.warnings, counts.skipped_files) == (0, (), 0)
    assert sum(t.num_rows for t in spans) == per_request("traces")["spans"]  # every trace file: the same spans
    received = sum(dump_bytes("traces", fmt, compression)[1] for signal, fmt, compression in CASES if signal == "traces")
    assert counts.duplicates_dropped == (received - 1) * per_request("traces")["spans"]  # bare ones too


def _request(signal: str, item: dict) -> bytes:
    """A request of ``signal`` holding one item (span, metric, log record) given as its proto's fields."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
    from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    if signal == "traces":
        return ExportTraceServiceRequest(resource_spans=[{"scope_spans": [{"spans": [Span(**item)]}]}]).SerializeToString()
    if signal == "metrics":
        return ExportMetricsServiceRequest(
            resource_metrics=[{"scope_metrics": [{"metrics": [Metric(**item)]}]}]).SerializeToString()
    return ExportLogsServiceRequest(resource_logs=[{"scope_logs": [{"log_records": [LogRecord(**item)]}]}]).SerializeToString()


SHAPES = [  # (signal, the item's fields): the items least like their signal's usual ones
    ("traces", {"trace_id": b"\1" * 16, "span_id": b"\2" * 8, "name": "no times"}),
    ("traces", {"trace_id": b"\1" * 16, "span_id": b"\2" * 8, "start_time_unix_nano": 1, "end_time_unix_nano": 2,
                "attributes": [{"key": "k", "value": {"int_value": 1}}], "flags": 257, "kind": 2}),
    ("metrics", {"name": "g", "gauge": {"data_points": [{"time_unix_nano": 5, "as_int": 1}]}}),
    ("metrics", {"name": "s", "unit": "By", "sum": {"data_points": [{"time_unix_nano": 5, "as_double": 1.0}]}}),
    ("metrics", {"name": "h", "histogram": {"data_points": [{"time_unix_nano": 5, "count": 1}]}}),
    ("metrics", {"name": "e", "exponential_histogram": {"data_points": [{"time_unix_nano": 5}]}}),
    ("metrics", {"name": "q", "description": "d", "summary": {"data_points": [{"time_unix_nano": 5}]}}),
    ("logs", {"time_unix_nano": 5, "body": {"string_value": "x"}}),
    ("logs", {"observed_time_unix_nano": 5, "severity_number": 9}),
    ("logs", {"body": {"string_value": "only a body"}, "attributes": [{"key": "k", "value": {"string_value": "v"}}]}),
    ("logs", {"severity_text": "INFO", "trace_id": b"\1" * 16, "span_id": b"\2" * 8, "flags": 1}),
]


@pytest.mark.parametrize(("signal", "item"), SHAPES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(SHAPES)])
def test_a_protobuf_request_is_told_by_its_first_items_shape(signal, item):
    from nemo_telemetry.analysis.ingestion._detect import proto_signal, signals_of_head

    body = _request(signal, item)
    assert proto_signal(body) == signal
    assert signals_of_head(len(body).to_bytes(4, "big") + body) == {signal}  # length-prefixed
    assert signals_of_head(body) == {signal}  # bare


def test_what_is_no_request_has_no_signal():
    from nemo_telemetry.analysis.ingestion._detect import proto_signal, signals_of_head

    assert proto_signal(b"") is None  # the empty request
    assert proto_signal(b"\x0a\x00") is None  # a resource with nothing in it
    assert proto_signal(b"# a README\n") is None
    assert signals_of_head(b'{"attributes": [{"key": "resourceLogs", "value": {"stringValue": "\\"resourceLogs\\":"}}]}') \
        == frozenset()  # the key's name as a value, and inside a string, is no request
