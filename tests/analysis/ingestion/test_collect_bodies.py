"""A body is acknowledged only when it was decoded whole: every gzip member inflated (within the
request bound), a body cut short or followed by bytes that are not gzip refused with 400, a
Content-Length that is not a byte count refused with 400. A real server on 127.0.0.1, spoken to
with httpx and over raw sockets, for ``collect`` and for ``monitor --port``."""

from __future__ import annotations

import gzip
import http.client
import socket
import time

import httpx
import orjson
import pytest
from google.rpc.status_pb2 import Status

from nemo_telemetry.analysis import IncompleteDatasetWarning, read_spans
from nemo_telemetry.analysis.ingestion.collect import MAX_GZIP_MEMBERS, CollectorServer
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf
from _monitor_receiver import monitor_receiver

LIMIT = 64 * 1024
PROTOBUF_GZIP = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
JSON_GZIP = {"Content-Type": "application/json", "Content-Encoding": "gzip"}


@pytest.fixture()
def collector(tmp_path):
    server = CollectorServer(tmp_path / "ds", port=0, max_request_bytes=LIMIT).start()
    yield server
    server.stop()


def _two_requests() -> list[dict]:
    """Two OTLP/JSON requests of 50 spans each, no span in both."""
    return list(synthetic_requests(100, spans_per_request=50, ranks=1))[:2]


def _message(response: httpx.Response) -> str:
    if response.headers["content-type"].startswith("application/json"):
        return response.json()["message"]
    return Status.FromString(response.content).message


def _stored(path) -> int:
    return read_spans(path).num_rows if (path / "spans").is_dir() else 0


def test_a_two_member_protobuf_body_is_decoded_whole(collector, tmp_path):
    first, second = (to_protobuf(r) for r in _two_requests())
    body = gzip.compress(first) + gzip.compress(second)  # protobuf messages concatenated are one merged message
    response = httpx.post(collector.traces_url, content=body, headers=PROTOBUF_GZIP)
    assert response.status_code == 200
    collector.stop()
    assert collector.summary().spans == 100
    assert read_spans(tmp_path / "ds").num_rows == 100


def test_a_json_body_split_across_three_members_is_decoded_whole(collector, tmp_path):
    document = orjson.dumps(_two_requests()[0])
    third = len(document) // 3
    body = b"".join(gzip.compress(part) for part in (document[:third], document[third:2 * third],
                                                      document[2 * third:]))
    response = httpx.post(collector.traces_url, content=body, headers=JSON_GZIP)
    assert (response.status_code, response.json()) == (200, {})
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 50


def test_every_cut_point_of_a_gzip_body_is_400_or_the_whole_body_never_a_partial_ack(collector, tmp_path):
    first, second = (gzip.compress(to_protobuf(r)) for r in _two_requests())
    body = first + second
    with httpx.Client() as client:
        for cut in range(len(body)):
            response = client.post(collector.traces_url, content=body[:cut], headers=PROTOBUF_GZIP)
            if cut == len(first):  # the first member alone is a whole body: its 50 spans
                assert response.status_code == 200
                continue
            assert response.status_code == 400, cut
            assert "gzip body" in _message(response) or "not a gzip member" in _message(response), _message(response)
        assert collector.summary().spans == 50
        with pytest.warns(IncompleteDatasetWarning, match="still running"):
            assert read_spans(tmp_path / "ds").num_rows == 50
        assert client.post(collector.traces_url, content=body, headers=PROTOBUF_GZIP).status_code == 200
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 100
    assert collector.summary().rejected_requests == len(body) - 1


def test_a_truncated_body_says_it_is_truncated(collector):
    body = gzip.compress(to_protobuf(_two_requests()[0]))
    response = httpx.post(collector.traces_url, content=body[:-4], headers=PROTOBUF_GZIP)  # its size field cut
    assert response.status_code == 400
    assert "truncated gzip body" in _message(response) and "send the whole body" in _message(response)


@pytest.mark.parametrize("garbage", [b"\0", b"\0" * 64, b"trailing text", b"\x1f"], ids=["nul", "zeros", "text", "half-magic"])
def test_bytes_after_the_last_member_that_are_not_gzip_are_400(collector, tmp_path, garbage):
    body = gzip.compress(to_protobuf(_two_requests()[0])) + garbage
    response = httpx.post(collector.traces_url, content=body, headers=PROTOBUF_GZIP)
    assert response.status_code == 400
    assert "are not a gzip member" in _message(response) or "truncated gzip body" in _message(response)
    collector.stop()
    assert _stored(tmp_path / "ds") == 0


def test_members_that_together_inflate_past_the_limit_are_413(collector, tmp_path):
    member = gzip.compress(b"\0" * (LIMIT // 2 + 1))  # each under the limit, both over it
    response = httpx.post(collector.traces_url, content=member + member, headers=PROTOBUF_GZIP)
    assert response.status_code == 413
    collector.stop()
    assert _stored(tmp_path / "ds") == 0


def test_a_body_of_more_members_than_the_bound_is_400_quickly(collector, tmp_path):
    empty = gzip.compress(b"")
    began = time.monotonic()
    response = httpx.post(collector.traces_url, content=empty * (MAX_GZIP_MEMBERS + 1), headers=PROTOBUF_GZIP)
    assert response.status_code == 400
    assert f"more than {MAX_GZIP_MEMBERS} members" in _message(response)
    first = to_protobuf(_two_requests()[0])
    cut = len(first) // 3
    body = gzip.compress(first[:cut]) + gzip.compress(first[cut:]) + empty * (MAX_GZIP_MEMBERS - 2)
    assert httpx.post(collector.traces_url, content=body, headers=PROTOBUF_GZIP).status_code == 200
    assert time.monotonic() - began < 10
    collector.stop()
    assert read_spans(tmp_path / "ds").num_rows == 50


def test_a_large_body_of_many_members_is_decoded_whole(tmp_path):
    requests = [to_protobuf(r) for r in synthetic_requests(4000, spans_per_request=50, ranks=1)]
    body = b"".join(gzip.compress(r) for r in requests)  # members of ~2 KiB, past one feed of the inflater
    assert len(body) > 1 << 17 and len(requests) < MAX_GZIP_MEMBERS
    with CollectorServer(tmp_path / "ds", port=0) as server:
        assert httpx.post(server.traces_url, content=body, headers=PROTOBUF_GZIP).status_code == 200
    assert read_spans(tmp_path / "ds").num_rows == server.summary().spans >= 4000


def _raw_post(server: CollectorServer, head_lines: list[str], body: bytes = b"") -> http.client.HTTPResponse:
    host, port = server._httpd.server_address[:2]
    with socket.create_connection((host, port), timeout=10) as sock:
        head = ["POST /v1/traces HTTP/1.1", "Host: collect", "Content-Type: application/x-protobuf", *head_lines]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.body = response.read()
        return response


@pytest.mark.parametrize(
    "lengths",
    [["5" * 5000], ["-5"], ["abc"], ["0x10"], ["1e3"], [""], ["\u0665"], ["12", "13"], ["1" * 20]],
    ids=["5000-digits", "negative", "letters", "hex", "exponent", "empty", "arabic-digit", "two-values", "20-digits"],
)
def test_a_malformed_content_length_is_400_with_a_message_not_a_traceback(collector, capfd, lengths):
    response = _raw_post(collector, [f"Content-Length: {value}" for value in lengths], b"x" * 12)
    assert response.status == 400
    assert "malformed Content-Length" in Status.FromString(response.body).message
    assert collector.summary().rejected_requests == 1
    body = to_protobuf(_two_requests()[0])
    assert _raw_post(collector, [f"Content-Length: {len(body)}"], body).status == 200  # still serving
    assert "Traceback" not in capfd.readouterr().err


def test_a_content_length_with_leading_zeros_is_a_byte_count(collector):
    body = to_protobuf(_two_requests()[0])
    assert _raw_post(collector, [f"Content-Length: {'0' * 30}{len(body)}"], body).status == 200
    assert _raw_post(collector, ["Content-Length: 00000000000000000000000000000999999999"]).status == 413


def test_monitor_port_decodes_every_member_and_refuses_a_cut_body(tmp_path):
    with monitor_receiver(tmp_path / "ds") as (where, summaries):
        first, second = (to_protobuf(r) for r in _two_requests())
        body = gzip.compress(first) + gzip.compress(second)
        with httpx.Client() as client:
            assert client.post(where["traces_url"], content=body[:len(body) // 2], headers=PROTOBUF_GZIP).status_code == 400
            assert client.post(where["traces_url"], content=body + b"!", headers=PROTOBUF_GZIP).status_code == 400
            assert client.post(where["traces_url"], content=body, headers=PROTOBUF_GZIP).status_code == 200
    summary = summaries[0]
    assert (summary.spans, summary.receiver.spans, summary.receiver.rejected_requests) == (100, 100, 2)
    assert read_spans(tmp_path / "ds").num_rows == 100
