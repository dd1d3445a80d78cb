"""Log records over OTLP/HTTP: a real HTTP server on 127.0.0.1 receives the bridge's export."""

from __future__ import annotations

import http.server
import logging
import threading

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from nemo_telemetry.instrument import RLSpanGroup, init_telemetry_driver, managed_span, shutdown_telemetry
from nemo_telemetry.instrument import environment_variables as env


@pytest.fixture()
def otlp_logs_server():
    """An OTLP/HTTP endpoint that keeps every ``/v1/logs`` request body (and answers 200)."""
    received: list[tuple[str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # the http.server interface
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_records_are_exported_over_otlp_with_their_span_ids(otlp_logs_server, monkeypatch):
    endpoint, received = otlp_logs_server
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_ENDPOINT, endpoint)
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf")
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "otlp", "logs_enabled": True},
                          algorithm="grpo")
    log = logging.getLogger("trainer.otlp_logs")
    log.setLevel(logging.INFO)
    with managed_span(RLSpanGroup.GENERATION, "rl.grpo.generation") as span:
        log.info("sent over OTLP")
    assert shutdown_telemetry(timeout_s=5)

    bodies = [body for path, body in received if path == "/v1/logs"]
    records = []
    for body in bodies:
        request = ExportLogsServiceRequest()
        request.ParseFromString(body)
        records += [r for rl in request.resource_logs for sl in rl.scope_logs for r in sl.log_records]
    (record,) = [r for r in records if r.body.string_value == "sent over OTLP"]
    ctx = span.get_span_context()
    assert (record.trace_id.hex(), record.span_id.hex()) == (format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
    assert record.severity_text == "INFO"
    assert any(path == "/v1/traces" for path, _ in received)  # the spans went to the same collector


def test_the_sdks_own_records_are_not_fed_back_to_its_exporter(tmp_path):
    from nemo_telemetry.analysis import read_logs

    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path), "logs_enabled": True})
    logging.getLogger("opentelemetry.exporter.otlp.proto.http").warning("Failed to export logs batch")
    logging.getLogger("trainer.otlp_logs").warning("kept")
    assert shutdown_telemetry(timeout_s=5)
    assert read_logs(tmp_path).column("body").to_pylist() == ["kept"]


def test_the_sdks_logs_module_loads_only_when_log_export_starts():
    import json
    import subprocess
    import sys

    code = ("import sys, json\n"
            "import nemo_telemetry.instrument as ti\n"
            "before = 'opentelemetry.sdk._logs' in sys.modules\n"
            "ti.DumpLogExporter\n"
            "print(json.dumps([before, 'opentelemetry.sdk._logs' in sys.modules]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [False, True]
