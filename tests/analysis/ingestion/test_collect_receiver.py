"""``collect`` holds up: chunked bodies, 100-continue, timeouts, the connection bound, 4xx for
every malformed request. A real server on 127.0.0.1, spoken to over raw sockets and
``http.client`` so each byte on the wire is the test's choice."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time

import orjson
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from nemo_telemetry.analysis.ingestion import _collect_commit as commit_module
from nemo_telemetry.analysis import read_spans
from nemo_telemetry.analysis.ingestion.collect import RETRY_AFTER_S, CollectorServer
from nemo_telemetry.analysis.store.dataset import DatasetWriter
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def body() -> bytes:
    return to_protobuf(next(synthetic_requests(11, ranks=1)))


@pytest.fixture()
def collector(tmp_path):
    server = CollectorServer(tmp_path / "ds", port=0, max_request_bytes=LIMIT).start()
    yield server
    server.stop()


def _connect(server: CollectorServer) -> socket.socket:
    host, port = server._httpd.server_address[:2]
    return socket.create_connection((host, port), timeout=10)


def _head(content_type: str = "application/x-protobuf", **headers: str) -> bytes:
    lines = ["POST /v1/traces HTTP/1.1", "Host: collect", f"Content-Type: {content_type}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunked(body: bytes, pieces: int = 3) -> bytes:
    size = -(-len(body) // pieces)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts)
    return chunks + b"0\r\nX-Trailer: ignored\r\n\r\n"


def _response(sock: socket.socket) -> http.client.HTTPResponse:
    response = http.client.HTTPResponse(sock)
    response.begin()
    response.read()
    return response


def test_chunked_body_over_a_raw_socket_is_stored(collector, body, tmp_path):
    with _connect(collector) as sock:
        sock.sendall(_head(Transfer_Encoding="chunked") + _chunked(body))
        assert _response(sock).status == 200
        sock.sendall(_head(Content_Length=str(len(body))) + body)  # the same connection goes on
        assert _response(sock).status == 200
    summary = collector.stop()
    assert (summary.requests, summary.spans, summary.duplicates_dropped) == (2, 11, 11)
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_chunked_body_from_http_client_is_stored(collector, body, tmp_path):
    host, port = collector._httpd.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    pieces = iter([body[:100], body[100:]])  # an iterable body without a length: sent chunked
    connection.request("POST", "/v1/traces", body=pieces, headers={"Content-Type": "application/x-protobuf"})
    response = connection.getresponse()
    assert response.status == 200
    connection.close()
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_gzip_json_body_sent_chunked_as_the_js_exporters_do(collector, tmp_path):
    request = next(synthetic_requests(11, ranks=1))
    with _connect(collector) as sock:
        sock.sendall(_head("application/json", Transfer_Encoding="chunked", Content_Encoding="gzip")
                     + _chunked(gzip.compress(orjson.dumps(request)), pieces=5))
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert (response.status, orjson.loads(response.read())) == (200, {})
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 11


def test_expect_100_continue_then_the_body(collector, body):
    with _connect(collector) as sock:
        sock.sendall(_head(Content_Length=str(len(body)), Expect="100-continue"))
        assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert _response(sock).status == 200
    assert collector.stop().spans == 11


def test_expect_100_continue_over_the_limit_is_413_before_the_body(collector):
    with _connect(collector) as sock:
        sock.sendall(_head(Content_Length=str(LIMIT + 1), Expect="100-continue"))
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 413  # not 100: the client need not send its body
        assert "over the 65536-byte limit" in Status.FromString(response.read()).message
    assert collector.summary().rejected_requests == 1


def test_chunked_body_over_the_limit_is_413_with_a_response_not_a_reset(collector):
    host, port = collector._httpd.server_address[:2]
    connection = http.client.HTTPConnection(host, port, timeout=10)
    pieces = (b"\x0a" * 16384 for _ in range(40))  # 640 KiB against a 64 KiB bound
    connection.request("POST", "/v1/traces", body=pieces, headers={"Content-Type": "application/x-protobuf"})
    response = connection.getresponse()
    assert response.status == 413
    assert "chunked request is over the 65536-byte limit" in Status.FromString(response.read()).message
    assert collector.summary().rejected_requests == 1


@pytest.mark.parametrize(
    ("wire", "status", "message"),
    [
        (b"zz\r\n", 400, "bad chunk size line"),
        (b"5\r\nabcdeXY", 400, "not followed by CRLF"),
        (b"-5\r\n", 400, "bad chunk size line"),
    ],
    ids=["not-hex", "no-crlf", "negative"],
)
def test_malformed_chunked_body_is_400_with_a_message(collector, wire, status, message):
    with _connect(collector) as sock:
        sock.sendall(_head(Transfer_Encoding="chunked") + wire)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == status
        assert message in Status.FromString(response.read()).message


def test_no_length_is_411_and_counted(collector):
    with _connect(collector) as sock:
        sock.sendall(_head())
        response = _response(sock)
    assert response.status == 411
    assert collector.summary().rejected_requests == 1


def test_unknown_transfer_encoding_is_501(collector):
    with _connect(collector) as sock:
        sock.sendall(_head(Transfer_Encoding="gzip"))
        assert _response(sock).status == 501


@pytest.mark.parametrize(
    ("span_fields", "problem"),
    [
        ({"name": 5}, "name is not a string"),
        ({"startTimeUnixNano": None}, "startTimeUnixNano is missing"),
        ({"startTimeUnixNano": str(2**64)}, "startTimeUnixNano is out of range"),
        ({"attributes": 5}, "attributes is not a list"),
    ],
    ids=["name-int", "start-null", "start-2^64", "attributes-int"],
)
def test_a_span_field_of_the_wrong_type_is_a_partial_success_naming_it(collector, span_fields, problem, tmp_path):
    """The bad span is rejected alone (never a reset, never the whole request) and named."""
    good = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "x", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
    bad = {**good, "spanId": "ef" * 8, **span_fields}
    payload = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [good, bad]}]}]})
    with _connect(collector) as sock:
        sock.sendall(_head("application/json", Content_Length=str(len(payload))) + payload)
        response = http.client.HTTPResponse(sock)
        response.begin()
        document = orjson.loads(response.read())
    assert response.status == 200
    assert document["partialSuccess"]["rejectedSpans"] == "1"
    assert f"span 1 rejected: {problem}" in document["partialSuccess"]["errorMessage"]
    summary = collector.stop()
    assert (summary.spans, summary.rejected_spans, summary.rejected_requests) == (1, 1, 0)
    assert read_spans(tmp_path / "ds").column("span_id").to_pylist() == ["cd" * 8]


def test_a_protobuf_span_past_int64_is_a_partial_success(collector):
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[
        Span(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="ok", start_time_unix_nano=1, end_time_unix_nano=2),
        Span(trace_id=b"\1" * 16, span_id=b"\3" * 8, name="wrapped?", start_time_unix_nano=2**63, end_time_unix_nano=2**64 - 1),
    ])])])
    body = request.SerializeToString()
    with _connect(collector) as sock:
        sock.sendall(_head(Content_Length=str(len(body))) + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        reply = ExportTraceServiceResponse.FromString(response.read())
    assert response.status == 200
    assert reply.partial_success.rejected_spans == 1
    assert "rejected" in reply.partial_success.error_message
    assert collector.stop().spans == 1


def test_an_undecodable_protobuf_request_is_400_naming_the_problem(collector):
    body = b"\x0a\x05\x12\x03\x12\x01\xff"  # resource_spans > scope_spans > span: cut short
    with _connect(collector) as sock:
        sock.sendall(_head(Content_Length=str(len(body))) + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 400
        assert "bad OTLP application/x-protobuf payload" in Status.FromString(response.read()).message
    assert collector.summary().rejected_requests == 1


class _RefusingWriter(DatasetWriter):
    """Test double (a fast unit test): the real writer, except that it refuses, as a data error,
    any batch holding a span named "refuse-me", and takes 0.3 s over its first write so that
    the requests sent meanwhile queue up for one group commit."""

    first = True

    def write(self, tables):
        if _RefusingWriter.first:
            _RefusingWriter.first = False
            time.sleep(0.3)
        if "refuse-me" in tables.spans.column("name").cast("string").to_pylist():
            raise ValueError("refused")
        return super().write(tables)


def test_a_request_the_writer_refuses_is_400_alone_not_its_whole_group(tmp_path, body, monkeypatch):
    monkeypatch.setattr(commit_module, "DatasetWriter", _RefusingWriter)
    _RefusingWriter.first = True
    server = CollectorServer(tmp_path / "ds", port=0).start()
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "refuse-me", "startTimeUnixNano": "1", "endTimeUnixNano": "2"}
    refused = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    others = [to_protobuf(r) for r in synthetic_requests(80, spans_per_request=10, ranks=1)][:8]
    statuses: dict[bytes, int] = {}

    def post(payload: bytes, content_type: str) -> None:
        with _connect(server) as sock:
            sock.sendall(_head(content_type, Content_Length=str(len(payload))) + payload)
            statuses[payload] = _response(sock).status

    blocker = threading.Thread(target=post, args=(body, "application/x-protobuf"))
    blocker.start()
    time.sleep(0.1)  # its write is under way; the nine below wait for the next commit together
    threads = [threading.Thread(target=post, args=(refused, "application/json"))]
    threads += [threading.Thread(target=post, args=(other, "application/x-protobuf")) for other in others]
    for thread in threads:
        thread.start()
    for thread in [blocker, *threads]:
        thread.join()
    summary = server.stop()
    assert statuses.pop(refused) == 400
    assert list(statuses.values()) == [200] * 9
    assert (summary.spans + summary.duplicates_dropped, summary.rejected_spans, summary.rejected_requests) == (91, 1, 1)
    assert read_spans(tmp_path / "ds").num_rows == summary.spans == 80  # the blocker's 11 are among the 80


def test_idle_keep_alive_connection_is_closed_after_the_read_timeout(tmp_path, body):
    server = CollectorServer(tmp_path / "ds", port=0, read_timeout_s=0.5).start()
    try:
        with _connect(server) as sock:
            sock.sendall(_head(Content_Length=str(len(body))) + body)
            assert _response(sock).status == 200
            began = time.monotonic()
            assert sock.recv(1) == b""  # the server closed it
            assert 0.3 < time.monotonic() - began < 3
    finally:
        server.stop()


def test_a_request_trickling_in_is_cut_at_the_request_deadline(tmp_path):
    """A byte every 0.1 s never trips the read timeout; the request's deadline stops it."""
    server = CollectorServer(tmp_path / "ds", port=0, read_timeout_s=5, request_timeout_s=0.5).start()
    try:
        with _connect(server) as sock:
            sock.sendall(_head(Content_Length="1000"))
            began, answer = time.monotonic(), b""
            try:
                while time.monotonic() - began < 5:
                    sock.sendall(b"\x0a")
                    time.sleep(0.1)
            except OSError:
                pass
            sock.settimeout(2)
            try:
                answer = sock.recv(200)
            except OSError:
                pass
            assert time.monotonic() - began < 3
            assert answer.startswith(b"HTTP/1.1 408")
    finally:
        server.stop()


def test_stop_is_not_held_up_by_a_client_stalled_inside_its_body(tmp_path, body):
    server = CollectorServer(tmp_path / "ds", port=0).start()  # default 10 s read timeout
    with _connect(server) as stalled, _connect(server) as idle:
        stalled.sendall(_head(Content_Length=str(len(body))) + body[:50])
        idle.sendall(_head(Content_Length=str(len(body))) + body)
        assert _response(idle).status == 200
        time.sleep(0.2)  # the stalled request is being read
        began = time.monotonic()
        summary = server.stop()
        assert time.monotonic() - began < 1.5
        response = _response(stalled)
    assert response.status == 503 and response.getheader("Retry-After") == str(RETRY_AFTER_S)
    assert (summary.spans, summary.unavailable_requests) == (11, 1)


def _post_many(server: CollectorServer, body: bytes, count: int) -> list[object]:
    """``count`` connections opened at once, then a request on each: statuses, or the error."""
    socks = [_connect(server) for _ in range(count)]
    try:
        for sock in socks:
            sock.sendall(_head(Content_Length=str(len(body))) + body)
        results: list[object] = []
        for sock in socks:
            try:
                response = _response(sock)
                results.append((response.status, response.getheader("Retry-After")))
            except OSError as exc:
                results.append(exc)
        return results
    finally:
        for sock in socks:
            sock.close()


def test_200_concurrent_connections_are_all_served(collector, body):
    results = _post_many(collector, body, 200)
    assert results == [(200, None)] * 200


def test_connections_beyond_the_bound_get_503_with_retry_after_not_a_reset(tmp_path, body):
    """Up to as many again as the bound are answered 503 (more are closed unanswered)."""
    server = CollectorServer(tmp_path / "ds", port=0, max_connections=100).start()
    try:
        results = _post_many(server, body, 200)
    finally:
        summary = server.stop()
    assert set(results) <= {(200, None), (503, str(RETRY_AFTER_S))}, [r for r in results if isinstance(r, Exception)]
    assert results.count((200, None)) >= 100
    assert results.count((503, str(RETRY_AFTER_S))) == summary.unavailable_requests > 0
