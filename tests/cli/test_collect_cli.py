"""``nemo-telemetry collect`` as a real process: kill -9 while the SDK exporter streams, a full
filesystem, signals with a stalled client, and what ``--help`` promises."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
from typer.testing import CliRunner

from nemo_telemetry.analysis import IncompleteDatasetWarning, read_spans
from nemo_telemetry.analysis.ingestion.collect import CollectorServer
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf
from nemo_telemetry.cli.app import app

PROTOBUF = {"Content-Type": "application/x-protobuf"}
runner = CliRunner()


def _start_collect(out, *options: str) -> tuple[subprocess.Popen, str]:
    """A ``nemo-telemetry collect`` process and its traces URL (read from its first line)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import main; main()",
               "collect", "--out", str(out), "--port", "0", *options]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    line = proc.stderr.readline()
    match = re.search(r"(http://\S+/v1/traces)", line)
    assert match, line + proc.stderr.read()
    return proc, match.group(1)


class _RecordingExporter(OTLPSpanExporter):
    """The real SDK exporter; remembers the ids of every batch the collector answered 200."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint=endpoint, timeout=2)
        self.acknowledged: set[tuple[str, str]] = set()

    def export(self, spans):
        result = super().export(spans)
        if result is SpanExportResult.SUCCESS:
            self.acknowledged |= {(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in spans}
        return result


def test_kill_9_while_the_sdk_exporter_streams_loses_no_acknowledged_span(tmp_path):
    proc, url = _start_collect(tmp_path / "ds")
    exporter = _RecordingExporter(url)
    provider = TracerProvider(resource=Resource.create({"service.name": "trainer", "nemo.run.id": "run-9"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=64, schedule_delay_millis=5))
    tracer = provider.get_tracer("test")
    streaming = threading.Event()
    streaming.set()

    def stream() -> None:
        step = 0
        while streaming.is_set():
            with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": step}):
                with tracer.start_as_current_span("rl.generation.generate", attributes={"rl.bucket": "productive"}):
                    pass
            step += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while len(exporter.acknowledged) < 2000 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-stream: requests in flight, commits in flight
        proc.wait(10)
    finally:
        streaming.clear()
        thread.join()
        exporter.shutdown()  # no retries against the dead collector: what was queued stays unsent
        provider.shutdown()
        proc.kill()
        proc.communicate()
    acknowledged = set(exporter.acknowledged)
    assert len(acknowledged) >= 2000
    with pytest.warns(IncompleteDatasetWarning, match="incomplete: the collect started .* did not finish"):
        spans = read_spans(tmp_path / "ds")
    stored = set(zip(spans.column("trace_id").to_pylist(), spans.column("span_id").to_pylist()))
    assert acknowledged <= stored, f"{len(acknowledged - stored)} acknowledged spans are not in the dataset"
    CollectorServer(tmp_path / "ds", port=0).start().stop()  # the next collect that stops cleanly finishes it
    with warnings.catch_warnings():
        warnings.simplefilter("error", IncompleteDatasetWarning)
        assert read_spans(tmp_path / "ds").num_rows == len(stored)


def test_stopped_with_spans_unwritten_exits_2_with_the_reason(small_filesystem):
    requests = [to_protobuf(r) for r in synthetic_requests(40, spans_per_request=20, ranks=1)]
    proc, url = _start_collect(small_filesystem.root / "ds")
    try:
        assert httpx.post(url, content=requests[0], headers=PROTOBUF).status_code == 200
        small_filesystem.fill()
        response = httpx.post(url, content=requests[1], headers=PROTOBUF)
        assert (response.status_code, response.headers["retry-after"]) == (503, "1")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 2
    message = " ".join(stderr.split())
    assert "20 received spans were not written" in message and "No space left on device" in message
    assert message.count("cannot write") == 1  # logged once when the outage began
    assert re.search(r"unwritten spans\s+│\s+20", stdout)
    small_filesystem.free()
    with pytest.warns(IncompleteDatasetWarning, match="did not finish"):  # its last writer could not close
        assert read_spans(small_filesystem.root / "ds").num_rows == 20


def test_sigterm_is_not_held_up_by_a_stalled_client(tmp_path):
    body = to_protobuf(next(synthetic_requests(11, ranks=1)))
    proc, url = _start_collect(tmp_path / "ds")
    host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
    try:
        with socket.create_connection((host, int(port)), timeout=10) as stalled:
            head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: {len(body)}\r\n\r\n"
            stalled.sendall(head.encode() + body[:30])  # and nothing more: the read timeout is 10 s
            assert httpx.post(url, content=body, headers=PROTOBUF).status_code == 200
            time.sleep(0.2)
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            stdout, _ = proc.communicate(timeout=30)
            stopped_in = time.monotonic() - began
            assert stalled.recv(200).startswith(b"HTTP/1.1 503")
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert stopped_in < 3, stopped_in  # docs/guarantees.md's bound: about a second plus the commit in flight
    assert re.search(r"spans\s+│\s+11", stdout) and re.search(r"unavailable requests\s+│\s+1", stdout)


def test_out_under_a_regular_file_exits_2_naming_it_not_the_port(tmp_path):
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, ["collect", "--out", str(tmp_path / "file" / "ds"), "--port", "0"])
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert "cannot create the dataset" in message and "file" in message
    assert "choose another --port" not in message


def test_collect_help_states_every_bound():
    result = runner.invoke(app, ["collect", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for promise in ("committed on disk", "503 with Retry-After", "--max-connections", "--read-timeout-s",
                    "60 s", "backlog 1024", "--max-request-mib", "Exit 2"):
        assert promise in text, promise


def _log_request(i: int) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    request = ExportLogsServiceRequest()
    scoped = request.resource_logs.add().scope_logs.add()
    record = scoped.log_records.add()
    record.time_unix_nano, record.severity_number = 1_700_000_000_000_000_000 + i, 9
    record.body.string_value = f"log-{i}"
    return request.SerializeToString()


def _metric_request(i: int) -> bytes:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "rl.test.sequence"
    point = metric.gauge.data_points.add()
    point.time_unix_nano, point.as_int = 1_700_000_000_000_000_000 + i, i
    attribute = point.attributes.add()
    attribute.key, attribute.value.string_value = "seq", str(i)
    return request.SerializeToString()


def test_kill_9_while_logs_and_metrics_stream_loses_no_acknowledged_record(tmp_path):
    """The /v1/logs and /v1/metrics endpoints answer 200 only for what is durable, as /v1/traces does."""
    from nemo_telemetry.analysis import read_logs, read_metrics

    proc, url = _start_collect(tmp_path / "ds")
    base = url.removesuffix("/v1/traces")
    acknowledged: dict[str, set[str]] = {"logs": set(), "metrics": set()}
    streaming = threading.Event()
    streaming.set()

    def stream(signal_name: str, make) -> None:
        i = 0
        with httpx.Client(timeout=5) as client:
            while streaming.is_set():
                try:
                    answer = client.post(f"{base}/v1/{signal_name}", content=make(i), headers=PROTOBUF)
                except httpx.HTTPError:
                    return  # the collector is gone
                if answer.status_code == 200:
                    acknowledged[signal_name].add(str(i))
                i += 1

    threads = [threading.Thread(target=stream, args=("logs", _log_request)),
               threading.Thread(target=stream, args=("metrics", _metric_request))]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 20
        while min(map(len, acknowledged.values())) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # mid-stream: requests in flight, commits in flight
        proc.wait(10)
    finally:
        streaming.clear()
        for thread in threads:
            thread.join()
        proc.kill()
        proc.communicate()
    logs_sent, metrics_sent = set(acknowledged["logs"]), set(acknowledged["metrics"])
    assert len(logs_sent) >= 50 and len(metrics_sent) >= 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteDatasetWarning)  # the killed collect never finished
        logs, metrics = read_logs(tmp_path / "ds"), read_metrics(tmp_path / "ds")
    stored_logs = {body.removeprefix("log-") for body in logs.column("body").to_pylist()}
    stored_points = {dict(a)["seq"] for a in metrics.column("attributes").to_pylist()}
    assert logs_sent <= stored_logs, f"{len(logs_sent - stored_logs)} acknowledged log records are lost"
    assert metrics_sent <= stored_points, f"{len(metrics_sent - stored_points)} acknowledged points are lost"
