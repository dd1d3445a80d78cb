"""``collect`` serves ``/v1/traces``, ``/v1/metrics`` and ``/v1/logs``: a request of the endpoint's
signal is answered 200 once durable, and what it holds is read back by the same readers as an
ingest's (``read_spans`` / ``read_metrics`` / ``read_logs`` on the dataset); a body that is not a
request of the endpoint's signal (another signal's, a bare ``ResourceSpans``, a Jaeger API
response) is answered 400 naming what it is, and nothing is written; a full disk is 503 with
``Retry-After`` for every signal. Real HTTP on 127.0.0.1; the bodies are the OpenTelemetry Python
SDK's own OTLP encodings (``tests/analysis/_otlp_signals.py``)."""

from __future__ import annotations

import gzip
import warnings

import httpx
import orjson
import pytest
from _otlp_signals import LOG_RECORDS, POINTS, SPANS, otlp_json, sdk_requests
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from nemo_telemetry.analysis import IncompleteDatasetWarning, read_logs, read_metrics, read_spans
from nemo_telemetry.analysis.ingestion.collect import RETRY_AFTER_S, CollectorServer
from _monitor_receiver import monitor_receiver

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
SIGNALS = ("traces", "metrics", "logs")
ROWS = {"traces": SPANS, "metrics": POINTS, "logs": LOG_RECORDS}


def _rows(dataset, signal: str) -> int:
    """The rows a reader sees in the dataset now (while the receiver runs: its session is open)."""
    read = {"traces": read_spans, "metrics": read_metrics, "logs": read_logs}[signal]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteDatasetWarning)
        return read(dataset).num_rows


def _body(signal: str, content_type: str) -> bytes:
    return sdk_requests()[signal] if content_type == "protobuf" else orjson.dumps(otlp_json(signal))


def _message(response: httpx.Response) -> str:
    if response.headers["content-type"].startswith("application/json"):
        return response.json()["message"]
    return Status.FromString(response.content).message


@pytest.fixture()
def collector(tmp_path):
    server = CollectorServer(tmp_path / "ds", port=0).start()
    yield server
    server.stop()


@pytest.mark.parametrize("content_type", ["protobuf", "json"])
@pytest.mark.parametrize("signal", SIGNALS)
def test_each_endpoint_stores_its_signal_durably_before_it_answers(collector, tmp_path, signal, content_type):
    headers = PROTOBUF if content_type == "protobuf" else JSON
    response = httpx.post(f"{collector.url}/v1/{signal}", content=_body(signal, content_type), headers=headers)
    assert response.status_code == 200, response.text
    # Readable by the dataset's readers as soon as it is answered: the commit came first.
    assert {s: _rows(tmp_path / "ds", s) for s in SIGNALS} == {s: ROWS[s] if s == signal else 0 for s in SIGNALS}
    # The same body again (an exporter whose answer was lost) is stored once.
    assert httpx.post(f"{collector.url}/v1/{signal}", content=_body(signal, content_type), headers=headers) \
        .status_code == 200
    summary = collector.stop()
    assert (summary.spans, summary.metric_points, summary.logs, summary.requests) == (
        ROWS[signal] if signal == "traces" else 0, ROWS[signal] if signal == "metrics" else 0,
        ROWS[signal] if signal == "logs" else 0, 2)
    assert _rows(tmp_path / "ds", signal) == ROWS[signal]


def test_gzip_bodies_and_what_collect_and_ingest_store_agree(collector, tmp_path):
    """A gzip-encoded body of each signal; the dataset's rows equal an ingest of the same requests."""
    from nemo_telemetry.analysis import ingest

    folder = tmp_path / "dumps"
    folder.mkdir()
    for signal in SIGNALS:
        body = sdk_requests()[signal]
        headers = {**PROTOBUF, "Content-Encoding": "gzip"}
        assert httpx.post(f"{collector.url}/v1/{signal}", content=gzip.compress(body), headers=headers).status_code == 200
        (folder / signal).write_bytes(len(body).to_bytes(4, "big") + body)
    collector.stop()
    ingest([folder], out=tmp_path / "ingested")
    for read in (read_metrics, read_logs):
        assert sorted(map(repr, read(tmp_path / "ds").to_pylist())) == \
            sorted(map(repr, read(tmp_path / "ingested").to_pylist()))
    assert read_spans(tmp_path / "ds").num_rows == read_spans(tmp_path / "ingested").num_rows == SPANS


WRONG = [  # (endpoint, body, content type, what the message says)
    *[(endpoint, sig, kind, f"send it to /v1/{sig}") for endpoint in SIGNALS for sig in SIGNALS if sig != endpoint
      for kind in ("protobuf", "json")],
    ("traces", {"resource": {}, "scopeSpans": [{"spans": []}]}, "json", "looks like one ResourceSpans"),
    ("traces", {"data": [{"traceID": "ab" * 8, "spans": []}], "total": 0}, "json", "no resourceSpans"),
    ("metrics", {"scopeMetrics": []}, "json", "looks like one ResourceMetrics"),
    ("logs", [{"resourceLogs": []}], "json", "JSON list"),
    ("metrics", b"\xff\xfe not protobuf", "protobuf", "ExportMetricsServiceRequest"),
    ("logs", b"\xff\xfe not protobuf", "protobuf", "ExportLogsServiceRequest"),
]


@pytest.mark.parametrize(("endpoint", "body", "kind", "says"), WRONG,
                         ids=[f"{e}-{b if isinstance(b, str) else i}-{k}" for i, (e, b, k, _) in enumerate(WRONG)])
def test_a_body_that_is_not_the_endpoints_request_is_400_and_names_it(collector, tmp_path, endpoint, body, kind, says):
    if isinstance(body, str):
        body = _body(body, kind)
    elif not isinstance(body, bytes):
        body = orjson.dumps(body)
    response = httpx.post(f"{collector.url}/v1/{endpoint}", content=body, headers=PROTOBUF if kind == "protobuf" else JSON)
    assert response.status_code == 400
    assert says in _message(response)
    summary = collector.stop()
    assert (summary.requests, summary.rejected_requests) == (0, 1)
    assert [_rows(tmp_path / "ds", s) for s in SIGNALS] == [0, 0, 0]  # nothing written, nothing acknowledged


@pytest.mark.parametrize("signal", ["metrics", "logs"])
def test_empty_requests_are_answered_200(collector, tmp_path, signal):
    for body, headers in ((b"", PROTOBUF), (b"{}", JSON)):
        assert httpx.post(f"{collector.url}/v1/{signal}", content=body, headers=headers).status_code == 200


def test_a_partial_success_counts_the_bad_data_points(collector, tmp_path):
    request = otlp_json("metrics")
    points = request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["sum"]["dataPoints"]
    points.append({**points[0], "timeUnixNano": str(1 << 63)})  # past int64: this point alone is refused
    response = httpx.post(f"{collector.url}/v1/metrics", content=orjson.dumps(request), headers=JSON)
    assert response.status_code == 200
    assert response.json()["partialSuccess"]["rejectedDataPoints"] == "1"
    assert "does not fit in int64" in response.json()["partialSuccess"]["errorMessage"]
    again = httpx.post(f"{collector.url}/v1/metrics", content=orjson.dumps({**request, "x": 1}), headers=JSON)
    assert again.status_code == 200  # another body (an unknown field beside): stored as well
    assert _rows(tmp_path / "ds", "metrics") == 2 * POINTS  # the good points of both bodies
    assert collector.stop().rejected_metric_points == 2


def test_protobuf_partial_success_has_the_signals_response_type(collector):
    request = otlp_json("metrics")
    request["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["sum"]["dataPoints"][0]["timeUnixNano"] = "0"
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    body = ParseDict(request, ExportMetricsServiceRequest()).SerializeToString()
    response = httpx.post(f"{collector.url}/v1/metrics", content=body, headers=PROTOBUF)
    assert response.status_code == 200
    answer = ExportMetricsServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_data_points == 1
    assert "timeUnixNano" in answer.partial_success.error_message


@pytest.mark.parametrize("signal", ["metrics", "logs"])
def test_full_filesystem_is_503_for_every_signal_then_recovers(small_filesystem, signal):
    dataset = small_filesystem.root / "ds"
    body = sdk_requests()[signal]
    with CollectorServer(dataset, port=0) as server, httpx.Client() as client:
        small_filesystem.fill()
        response = client.post(f"{server.url}/v1/{signal}", content=body, headers=PROTOBUF)
        assert (response.status_code, response.headers.get("retry-after")) == (503, str(RETRY_AFTER_S))
        assert _rows(dataset, signal) == 0
        small_filesystem.free()
        assert client.post(f"{server.url}/v1/{signal}", content=body, headers=PROTOBUF).status_code == 200
    summary = server.summary()
    assert (summary.unavailable_requests, summary.requests) == (1, 1)
    assert _rows(dataset, signal) == ROWS[signal]


def test_monitor_port_takes_metrics_and_logs_too(tmp_path):
    with monitor_receiver(tmp_path / "ds") as (where, summaries):
        base = where["traces_url"].removesuffix("/v1/traces")
        with httpx.Client() as client:
            for signal in SIGNALS:
                assert client.post(f"{base}/v1/{signal}", content=sdk_requests()[signal], headers=PROTOBUF) \
                    .status_code == 200
            wrong = client.post(f"{base}/v1/traces", content=sdk_requests()["logs"], headers=PROTOBUF)
            assert wrong.status_code == 400 and "/v1/logs" in _message(wrong)
    receiver = summaries[0].receiver
    assert (receiver.spans, receiver.metric_points, receiver.logs, receiver.rejected_requests) == (
        SPANS, POINTS, LOG_RECORDS, 1)
    assert (read_metrics(tmp_path / "ds").num_rows, read_logs(tmp_path / "ds").num_rows) == (POINTS, LOG_RECORDS)
