"""``collect``: a real OTLP/HTTP receiver on 127.0.0.1, fed by the real SDK exporter and by httpx."""

from __future__ import annotations

import gzip
import threading

import httpx
import orjson
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status as SpanStatus, StatusCode

from nemo_telemetry.analysis import IncompleteDatasetWarning, read_events, read_links, read_spans
from nemo_telemetry.analysis.ingestion.collect import CollectorServer, run_collector
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf
from nemo_telemetry.instrument import DumpSpanExporter

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def _emit_run(provider: TracerProvider) -> None:
    """A small instrumented step: nested spans, every attribute type, an event, a link, an error."""
    tracer = provider.get_tracer("nemo_telemetry.tests", "0.1")
    for iteration in range(3):
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": iteration}) as step:
            with tracer.start_as_current_span(
                "rl.generation.generate",
                kind=SpanKind.CLIENT,
                attributes={"rl.bucket": "productive", "ratio": 0.5, "ok": True, "tags": ["x", "y"]},
            ) as generate:
                generate.add_event("first_token", {"tokens": 7})
            with tracer.start_as_current_span(
                "rl.efficiency.wait",
                links=[Link(step.get_span_context(), {"why": "straggler"})],
                attributes={"rl.bucket": "idle", "rl.efficiency.category": "generation_straggler"},
            ) as wait:
                wait.set_status(SpanStatus(StatusCode.ERROR, "timed out"))


def _sorted(table):
    return table.sort_by([("trace_id", "ascending"), ("span_id", "ascending")]).to_pylist()


def test_sdk_exporter_into_collect_equals_dump_files_ingested(tmp_path):
    """The issue's final check: the same spans through collect and through dump files."""
    resource = Resource.create({"service.name": "trainer", "nemo.run.id": "run-7", "nv.dl.rank": 0})
    with CollectorServer(tmp_path / "collected", port=0) as collector:
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=collector.traces_url, compression=Compression.Gzip))
        )
        provider.add_span_processor(SimpleSpanProcessor(DumpSpanExporter(tmp_path / "dumps")))
        _emit_run(provider)
        provider.shutdown()  # flushes the batch processor into the collector
    summary = collector.summary()
    assert (summary.requests, summary.spans, summary.rejected_requests) == (1, 9, 0)
    from_collector = read_spans(tmp_path / "collected")
    from_files = read_spans(tmp_path / "dumps")
    assert from_collector.num_rows == 9
    assert _sorted(from_collector) == _sorted(from_files)
    assert _sorted(read_events(tmp_path / "collected")) == _sorted(read_events(tmp_path / "dumps"))
    assert _sorted(read_links(tmp_path / "collected")) == _sorted(read_links(tmp_path / "dumps"))
    assert set(from_collector.column("run_id").to_pylist()) == {"run-7"}


@pytest.fixture()
def collector(tmp_path):
    server = CollectorServer(tmp_path / "ds", port=0, max_request_bytes=64 * 1024).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def request_body():
    request = next(synthetic_requests(11, ranks=1))
    return request, to_protobuf(request)


def test_protobuf_request_gets_a_protobuf_success_response(collector, request_body, tmp_path):
    response = httpx.post(collector.traces_url, content=request_body[1], headers=PROTOBUF)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-protobuf"
    assert ExportTraceServiceResponse.FromString(response.content) == ExportTraceServiceResponse()
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_json_request_with_gzip_gets_a_json_response(collector, request_body, tmp_path):
    body = gzip.compress(orjson.dumps(request_body[0]))
    response = httpx.post(collector.traces_url, content=body, headers={**JSON, "Content-Encoding": "gzip"})
    assert (response.status_code, response.headers["content-type"]) == (200, "application/json")
    assert response.json() == {}
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_a_retried_request_is_not_stored_twice(collector, request_body, tmp_path):
    for _ in range(2):
        assert httpx.post(collector.traces_url, content=request_body[1], headers=PROTOBUF).status_code == 200
    summary = collector.stop()
    assert (summary.spans, summary.duplicates_dropped) == (11, 11)
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_oversized_request_is_413(collector):
    response = httpx.post(collector.traces_url, content=b"\x0a" * (65 * 1024), headers=PROTOBUF)
    assert response.status_code == 413
    assert "over the 65536-byte limit" in Status.FromString(response.content).message


def test_gzip_bomb_is_413(collector):
    body = gzip.compress(b"\x00" * (1 << 20))
    response = httpx.post(collector.traces_url, content=body, headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert response.status_code == 413


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (b"\xff\xff\xff", PROTOBUF, "bad OTLP application/x-protobuf payload"),
        (b"{not json", JSON, "bad OTLP application/json payload"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [7]}]}]}', JSON, "not an OTLP"),
        (b"gzip?", {**JSON, "Content-Encoding": "gzip"}, "corrupt gzip body"),
    ],
    ids=["protobuf", "json", "json-shape", "gzip"],
)
def test_bad_payload_is_400_with_a_message(collector, body, headers, message):
    response = httpx.post(collector.traces_url, content=body, headers=headers)
    assert response.status_code == 400
    text = response.json()["message"] if "json" in headers["Content-Type"] else Status.FromString(response.content).message
    assert message in text
    assert collector.summary().rejected_requests == 1


def test_wrong_path_and_content_type(collector, request_body):
    assert httpx.post(collector.url + "/v1/profiles", content=b"", headers=PROTOBUF).status_code == 404
    assert httpx.post(collector.traces_url, content=b"x", headers={"Content-Type": "text/plain"}).status_code == 415


def test_malformed_ids_are_a_partial_success(collector, tmp_path):
    spans = [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "ok", "startTimeUnixNano": "1", "endTimeUnixNano": "2"},
        {"traceId": "", "spanId": "cd" * 8, "name": "no trace id", "startTimeUnixNano": "1", "endTimeUnixNano": "2"},
    ]
    body = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})
    response = httpx.post(collector.traces_url, content=body, headers=JSON)
    assert response.status_code == 200
    assert response.json()["partialSuccess"]["rejectedSpans"] == "1"
    collector.stop()
    assert read_spans(tmp_path / "ds").column("name").to_pylist() == ["ok"]


def test_every_acknowledged_span_is_on_disk_before_the_reply_over_keep_alive(tmp_path):
    """200 means committed: the dataset holds a request's spans as soon as its reply arrives,
    and stop() returns with the keep-alive connection still open and idle."""
    requests = list(synthetic_requests(200, spans_per_request=50, ranks=2))
    server = CollectorServer(tmp_path / "ds", port=0).start()
    acknowledged = 0
    with httpx.Client() as client:  # one keep-alive connection, left open across stop()
        for request in requests:
            assert client.post(server.traces_url, content=to_protobuf(request), headers=PROTOBUF).status_code == 200
            acknowledged += sum(len(rs["scopeSpans"][0]["spans"]) for rs in request["resourceSpans"])
            with pytest.warns(IncompleteDatasetWarning, match="the collect started .* is still running"):
                assert read_spans(tmp_path / "ds").num_rows == acknowledged
        summary = server.stop()
    assert summary.spans == acknowledged > 0


def test_run_collector_stops_on_its_event_and_returns_the_summary(tmp_path, request_body):
    stop = threading.Event()
    ready = threading.Event()
    servers = []

    def on_ready(server):
        servers.append(server)
        ready.set()

    result = []
    thread = threading.Thread(
        target=lambda: result.append(run_collector(tmp_path / "ds", port=0, on_ready=on_ready, stop=stop))
    )
    thread.start()
    assert ready.wait(10)
    assert httpx.post(servers[0].traces_url, content=request_body[1], headers=PROTOBUF).status_code == 200
    stop.set()
    thread.join(10)
    assert result[0].spans == 11
    assert read_spans(tmp_path / "ds").num_rows == 11
