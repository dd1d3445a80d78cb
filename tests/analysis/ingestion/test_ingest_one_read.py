"""Ingest reads each dump file once: a metrics or log dump's spans, metrics and logs come from
one read of its bytes (the same look at its head told what it holds), and the dataset gets the
same points and records as ``read_metrics`` and ``read_logs`` give for those files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_telemetry.analysis import ingest, read_logs, read_metrics, read_spans
from nemo_telemetry.analysis.synthetic import synthetic_requests

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")

RESOURCE = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}},
                           {"key": "nemo.run.id", "value": {"stringValue": "run-1"}}]}


def metrics_dump_line(i: int) -> str:
    point = {"timeUnixNano": str(1_000 + i), "asDouble": float(i),
             "attributes": [{"key": "rl.efficiency.category", "value": {"stringValue": f"idle/c{i % 7}"}}]}
    return json.dumps({"resourceMetrics": [{"resource": RESOURCE, "scopeMetrics": [
        {"scope": {"name": "t"}, "metrics": [{"name": "rl.efficiency.seconds", "gauge": {"dataPoints": [point]}}]}]}]})


def logs_dump_line(i: int) -> str:
    record = {"timeUnixNano": str(2_000 + i), "severityText": "INFO", "body": {"stringValue": f"line {i} " + "x" * 200}}
    return json.dumps({"resourceLogs": [{"resource": RESOURCE, "scopeLogs": [{"logRecords": [record]}]}]})


def _bytes_read() -> int:
    """Bytes this process has read through read(2) and friends (all its threads)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_metrics_and_a_log_dump_are_each_read_once(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "traces-1.jsonl").write_text("\n".join(json.dumps(r) for r in synthetic_requests(20)) + "\n")
    (dumps / "metrics-1.jsonl").write_text("\n".join(metrics_dump_line(i) for i in range(4000)) + "\n")
    (dumps / "logs-1.jsonl").write_text("\n".join(logs_dump_line(i) for i in range(8000)) + "\n")
    ingest([dumps / "traces-1.jsonl"], out=tmp_path / "warm")  # kernels and imports loaded before measuring
    signal_bytes = sum((dumps / name).stat().st_size for name in ("metrics-1.jsonl", "logs-1.jsonl"))
    trace_bytes = (dumps / "traces-1.jsonl").stat().st_size

    before = _bytes_read()
    summary = ingest([dumps], out=tmp_path / "ds")
    read = _bytes_read() - before

    # once each, plus the look at each file's head (64 KiB at most) and the dataset's own small files
    print(f"read {read:,} bytes for {signal_bytes:,} of metrics and logs and {trace_bytes:,} of traces")
    assert read < signal_bytes + trace_bytes + 3 * (64 << 10) + (1 << 20), (read, signal_bytes, trace_bytes)
    assert (summary.metric_points, summary.logs) == (4000, 8000)
    assert summary.skipped_records == 4000  # the metrics requests, as before: not traces, not errors
    assert summary.spans == read_spans(dumps / "traces-1.jsonl").num_rows
    from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source  # the dataset's metrics

    assert metrics_for_source(tmp_path / "ds").to_pylist() == read_metrics(dumps).replace_schema_metadata(None).to_pylist()
    assert read_logs(tmp_path / "ds").to_pylist() == read_logs(dumps).to_pylist()
