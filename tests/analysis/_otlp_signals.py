"""One OTLP export request of each signal, as the OpenTelemetry Python SDK's own OTLP exporters
encode it (``opentelemetry-exporter-otlp-proto-common``'s encoders, the bytes its HTTP and gRPC
exporters send), and the file formats a dump of it takes. Built at test time; nothing fetched."""

from __future__ import annotations

import base64
import gzip
import json
from functools import lru_cache

import zstandard
from google.protobuf.json_format import MessageToDict

# What each request holds: 2 spans; 3 metric points (a counter, a histogram, a gauge); 3 log records.
SPANS, POINTS, LOG_RECORDS = 2, 3, 3
FORMATS = ("document.json", "lines.jsonl", "frames.pb", "bare.pb", "zstd-frames.pb")
COMPRESSIONS = ("", ".gz", ".zst")
_IDS = ("traceId", "spanId", "parentSpanId")


@lru_cache(maxsize=None)
def sdk_requests() -> dict:
    """``{"traces" | "metrics" | "logs": the serialized ExportXServiceRequest}``."""
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    try:
        from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter as LogExporter
    except ImportError:  # older SDKs
        from opentelemetry.sdk._logs.export import InMemoryLogExporter as LogExporter

    resource = Resource.create({"service.name": "outside", "nemo.run.id": "run-x"})
    spans = InMemorySpanExporter()
    tracing = TracerProvider(resource=resource)
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracing.get_tracer("outside.tracer")
    with tracer.start_as_current_span("root"), tracer.start_as_current_span("child"):
        pass
    reader = InMemoryMetricReader()
    meter = MeterProvider(resource=resource, metric_readers=[reader]).get_meter("outside.meter")
    meter.create_counter("requests").add(3, {"route": "/a"})
    meter.create_histogram("latency", unit="s").record(2.5)
    meter.create_gauge("temperature").set(7)
    logs = LogExporter()
    log_provider = LoggerProvider(resource=resource)
    log_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    logger = log_provider.get_logger("outside.logger")
    for i in range(LOG_RECORDS):
        logger.emit(LogRecord(timestamp=1_000 + i, body=f"line {i}", severity_text="INFO", attributes={"i": i}))
    return {
        "traces": encode_spans(spans.get_finished_spans()).SerializeToString(),
        "metrics": encode_metrics(reader.get_metrics_data()).SerializeToString(),
        "logs": encode_logs(logs.get_finished_logs()).SerializeToString(),
    }


def otlp_json(signal: str) -> dict:
    """The request as OTLP/JSON (camelCase, ids in hex, int64 as strings), the Collector's file exporter's shape."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    kind = {"traces": ExportTraceServiceRequest, "metrics": ExportMetricsServiceRequest,
            "logs": ExportLogsServiceRequest}[signal]
    return _hex_ids(MessageToDict(kind.FromString(sdk_requests()[signal])))


def _hex_ids(doc):
    if isinstance(doc, dict):
        return {k: base64.b64decode(v).hex() if k in _IDS and isinstance(v, str) else _hex_ids(v)
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [_hex_ids(v) for v in doc]
    return doc


def dump_bytes(signal: str, fmt: str, compression: str = "") -> tuple[bytes, int]:
    """A dump of ``signal`` in ``fmt`` (one of :data:`FORMATS`), compressed as ``compression``
    (whole-file gzip or zstd), and how many requests it holds."""
    body = sdk_requests()[signal]
    line = json.dumps(otlp_json(signal)).encode()
    frame = len(body).to_bytes(4, "big") + body
    packed = zstandard.ZstdCompressor().compress(body)  # the Collector's per-request zstd
    data, requests = {
        "document.json": (json.dumps(otlp_json(signal), indent=2).encode(), 1),
        "lines.jsonl": (line + b"\n" + line + b"\n", 2),
        "frames.pb": (frame * 2, 2),
        "bare.pb": (body, 1),
        "zstd-frames.pb": (len(packed).to_bytes(4, "big") + packed, 1),
    }[fmt]
    if compression == ".gz":
        data = gzip.compress(data)
    elif compression == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    return data, requests


def per_request(signal: str) -> dict:
    """What one request of ``signal`` gives: ``{"spans": n, "metric_points": n, "logs": n}``."""
    counts = {"spans": 0, "metric_points": 0, "logs": 0}
    counts[{"traces": "spans", "metrics": "metric_points", "logs": "logs"}[signal]] = {
        "traces": SPANS, "metrics": POINTS, "logs": LOG_RECORDS}[signal]
    return counts
