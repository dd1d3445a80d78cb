"""A span with a bad field is rejected alone, named by file, line or record, and field; a
protobuf request that cannot be decoded is rejected alone. Each case runs on both decoder
paths, switched the way a user switches them (``NEMO_TELEMETRY_COMPILED=0``: the reference
paths, orjson and upb), and the two paths agree."""

from __future__ import annotations

import copy

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nemo_telemetry.analysis import ingest, load_traces
from nemo_telemetry.analysis.ingestion.anyvalue import MAX_VALUE_DEPTH
from nemo_telemetry.analysis.ingestion._otlp_json_fast import LINE_FALLBACK, decode_json_lines
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf, write_json_lines, write_length_prefixed

SPANS = 201  # the bad span's request: it and 200 neighbours
BAD = 100  # the bad span's place in its request
MISSING = object()


@pytest.fixture(params=["compiled", "reference"])
def decoder(request, monkeypatch):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1" if request.param == "compiled" else "0")
    return request.param


@pytest.fixture(scope="module")
def requests():
    """Three requests of one rank: 11 spans, SPANS spans, 11 spans."""
    small = list(synthetic_requests(22, spans_per_request=11, ranks=1, seed=1))
    big = next(synthetic_requests(SPANS, spans_per_request=SPANS, ranks=1, seed=2))
    return [small[0], big, small[1]]


def _spans(request):
    return request["resourceSpans"][0]["scopeSpans"][0]["spans"]


def test_the_switch_takes_the_reference_path(decoder):
    line = orjson.dumps(next(synthetic_requests(3, spans_per_request=3, ranks=1)))
    _, status = decode_json_lines([line])
    assert (status[0] == LINE_FALLBACK) == (decoder == "reference")


JSON_CASES = [
    ("name", 5, "name is not a string"),
    ("name", None, "name is null"),
    ("name", {"a": 1}, "name is not a string"),
    ("startTimeUnixNano", None, "startTimeUnixNano is missing"),
    ("startTimeUnixNano", MISSING, "startTimeUnixNano is missing"),
    ("startTimeUnixNano", "soon", "startTimeUnixNano is not an integer"),
    ("startTimeUnixNano", 1.7672e18, "startTimeUnixNano is not an integer"),
    ("startTimeUnixNano", True, "startTimeUnixNano is not an integer"),
    ("startTimeUnixNano", -5, "startTimeUnixNano is out of range"),
    ("startTimeUnixNano", "-5", "startTimeUnixNano is out of range"),
    ("startTimeUnixNano", "0", "startTimeUnixNano is missing (0)"),
    ("startTimeUnixNano", 2**63, "startTimeUnixNano is out of range"),
    ("endTimeUnixNano", str(2**63), "endTimeUnixNano is out of range"),
    ("endTimeUnixNano", str(2**64 + 5), "endTimeUnixNano is out of range"),
    ("endTimeUnixNano", MISSING, "endTimeUnixNano is missing"),
    ("endTimeUnixNano", [1], "endTimeUnixNano is not an integer"),
    ("traceId", "ab" * 15, "malformed trace/span ids: traceId"),
    ("traceId", "zz" * 16, "malformed trace/span ids: traceId"),
    ("traceId", MISSING, "malformed trace/span ids: traceId is missing"),
    ("spanId", 12345, "malformed trace/span ids: spanId is not a string"),
    ("spanId", "AAAAAAAA", "malformed trace/span ids: spanId"),  # base64 of 6 bytes
    ("parentSpanId", "xyz", "malformed trace/span ids: parentSpanId"),
    ("events", [{"timeUnixNano": "later", "name": "e"}], "events[0].timeUnixNano is not an integer"),
    ("events", [{"timeUnixNano": "5", "name": 7}], "events[0].name is not a string"),
    ("links", [{"traceId": "ab" * 16, "spanId": "cd"}], "links[0].spanId is not 16 hex digits"),
    ("attributes", [{"key": 5, "value": {"stringValue": "x"}}], "attributes[0] has no string key"),
    ("attributes", [{"key": "k", "value": {"stringValue": 5}}], "attributes[0].value.stringValue is not a string"),
    ("attributes", [{"key": "k", "value": {"intValue": "x"}}], "attributes[0].value is not an AnyValue"),
    ("status", {"code": 2, "message": 5}, "status message is not a string"),
]


@pytest.mark.parametrize(("field", "value", "why"), JSON_CASES, ids=[f"{c[0]}={c[1]!r}"[:40] for c in JSON_CASES])
def test_json_span_with_a_bad_field_is_rejected_alone(decoder, requests, tmp_path, field, value, why):
    bad = copy.deepcopy(requests[1])
    span = _spans(bad)[BAD]
    if value is MISSING:
        del span[field]
    else:
        span[field] = value
    path = write_json_lines(tmp_path / "bad.jsonl", [requests[0], bad, requests[2]])
    summary = ingest([path], out=tmp_path / "ds")
    assert (summary.spans, summary.rejected_records) == (11 + SPANS - 1 + 11, 1), summary.warnings
    assert len(summary.warnings) == 1 and summary.warnings[0].startswith(f"{path}:2: span {BAD} rejected: {why}"), summary.warnings
    kept = set(load_traces(tmp_path / "ds").spans.column("span_id").to_pylist())
    expected = {s["spanId"] for r in requests for s in _spans(r)} - {_spans(requests[1])[BAD]["spanId"]}
    assert kept == expected


def _proto_requests(requests):
    return [ExportTraceServiceRequest.FromString(to_protobuf(r)) for r in requests]


def _set(message, path: str, value):
    *parents, last = path.split(".")
    for part in parents:
        message = getattr(message, part)
    setattr(message, last, value)


PROTO_CASES = [
    ("start_time_unix_nano", 2**63, "startTimeUnixNano is out of range"),
    ("start_time_unix_nano", 2**64 - 1, "startTimeUnixNano is out of range"),
    ("end_time_unix_nano", 2**63 + 12345, "endTimeUnixNano is out of range"),
    ("start_time_unix_nano", 0, "startTimeUnixNano is missing (0)"),
    ("trace_id", b"\x01" * 5, "malformed trace/span ids: traceId has 5 bytes"),
    ("trace_id", b"", "malformed trace/span ids: traceId has 0 bytes"),
    ("span_id", b"", "malformed trace/span ids: spanId has 0 bytes"),
    ("parent_span_id", b"\x01\x02\x03", "malformed trace/span ids: parentSpanId has 3 bytes"),
    ("events", 2**63, "events[0].timeUnixNano is out of range"),
    ("links", b"\x01\x02\x03", "links[0].spanId has 3 bytes"),
]


@pytest.mark.parametrize(("field", "value", "why"), PROTO_CASES, ids=[f"{c[0]}={c[1]!r}"[:40] for c in PROTO_CASES])
def test_protobuf_span_with_a_bad_field_is_rejected_alone(decoder, requests, tmp_path, field, value, why):
    messages = _proto_requests(requests)
    span = messages[1].resource_spans[0].scope_spans[0].spans[BAD]
    if field == "events":
        span.events.add(time_unix_nano=value, name="e")
    elif field == "links":
        span.links.add(trace_id=span.trace_id, span_id=value)
    else:
        _set(span, field, value)
    payloads = [m.SerializeToString() for m in messages]
    path = write_length_prefixed(tmp_path / "bad.pb", payloads)
    summary = ingest([path], out=tmp_path / "ds")
    assert (summary.spans, summary.rejected_records) == (11 + SPANS - 1 + 11, 1), summary.warnings
    offset = 4 + len(payloads[0])  # the second record's length prefix
    assert len(summary.warnings) == 1, summary.warnings
    assert summary.warnings[0].startswith(f"{path}: record 2 (byte {offset}): span {BAD} rejected: {why}")
    spans = load_traces(tmp_path / "ds").spans
    assert min(spans.column("start_ns").to_pylist()) > 0 and min(spans.column("end_ns").to_pylist()) > 0


def _nested_value(depth: int) -> bytes:
    """An AnyValue of ``depth`` nested arrays around a string, as bytes (protobuf's Python
    classes would recurse that deep to build it)."""
    value = b"\x0a\x01x"  # string_value "x"
    for _ in range(depth):
        values = b"\x0a" + _varint(len(value)) + value  # ArrayValue.values
        value = b"\x2a" + _varint(len(values)) + values  # AnyValue.array_value
    return value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _len(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _with_extra_span_attribute(payload: bytes, template, attribute: bytes) -> bytes:
    """``payload`` with one more ResourceSpans (appended: repeated fields concatenate) whose
    span is ``template`` plus the raw KeyValue ``attribute``."""
    span = copy.deepcopy(template)
    span.span_id = b"\xee" * 8  # a span of its own, not a duplicate of the template
    span = span.SerializeToString() + _len(9, attribute)
    return payload + _len(1, _len(2, _len(2, span)))


def _bad_utf8_resource_key(payload: bytes) -> bytes:
    message = ExportTraceServiceRequest.FromString(payload)
    message.resource_spans[0].resource.attributes.add(key="KEYX").value.string_value = "v"
    return message.SerializeToString().replace(b"KEYX", b"K\xff\xfeX")


REQUEST_CASES = {
    "bad UTF-8 in a resource attribute key": lambda payload, span: _bad_utf8_resource_key(payload),
    "bad UTF-8 in a span name": lambda payload, span: payload.replace(span.name.encode(), b"\xc3" + span.name.encode()[1:], 1),
    "AnyValue nested 3,000 deep": lambda payload, span: _with_extra_span_attribute(
        payload, span, _len(1, b"deep") + _len(2, _nested_value(3000))),
    "AnyValue nested past the limit": lambda payload, span: _with_extra_span_attribute(
        payload, span, _len(1, b"deep") + _len(2, _nested_value(MAX_VALUE_DEPTH + 1))),
    "a wrong wire type": lambda payload, span: payload + b"\x0f",  # field 1, wire type 7
    "a length past the request": lambda payload, span: payload + b"\x0a\xff\xff\x03",
}


@pytest.mark.parametrize("case", list(REQUEST_CASES))
def test_protobuf_request_that_cannot_be_decoded_is_rejected_alone(decoder, requests, tmp_path, case):
    messages = _proto_requests(requests)
    payloads = [m.SerializeToString() for m in messages]
    template = messages[1].resource_spans[0].scope_spans[0].spans[0]
    payloads[1] = REQUEST_CASES[case](payloads[1], template)
    path = write_length_prefixed(tmp_path / "bad.pb", payloads)
    summary = ingest([path], out=tmp_path / "ds")
    assert (summary.spans, summary.rejected_records) == (22, 1), summary.warnings
    assert len(summary.warnings) == 1
    assert summary.warnings[0].startswith(f"{path}: record 2 (byte {4 + len(payloads[0])}): ")


def test_nesting_within_the_limit_is_kept(decoder, requests, tmp_path):
    """The documented limit: ``MAX_VALUE_DEPTH`` nested arrays in an attribute value."""
    messages = _proto_requests(requests)
    payloads = [m.SerializeToString() for m in messages]
    template = messages[1].resource_spans[0].scope_spans[0].spans[0]
    payloads[1] = _with_extra_span_attribute(payloads[1], template, _len(1, b"deep") + _len(2, _nested_value(MAX_VALUE_DEPTH)))
    path = write_length_prefixed(tmp_path / "deep.pb", payloads)
    summary = ingest([path], out=tmp_path / "ds")
    assert (summary.spans, summary.rejected_records) == (11 + SPANS + 1 + 11, 0)


def test_both_paths_agree_on_every_bad_field(requests, tmp_path, monkeypatch):
    """One file of every JSON case and one of every protobuf case, each read by both paths:
    the same spans, events and links, the same rejections."""
    lines, payloads = [], []
    for field, value, _ in JSON_CASES:
        bad = copy.deepcopy(requests[1])
        span = _spans(bad)[BAD]
        if value is MISSING:
            del span[field]
        else:
            span[field] = value
        lines.append(bad)
    for field, value, _ in PROTO_CASES:
        message = _proto_requests(requests)[1]
        span = message.resource_spans[0].scope_spans[0].spans[BAD]
        if field == "events":
            span.events.add(time_unix_nano=value, name="e")
        elif field == "links":
            span.links.add(trace_id=span.trace_id, span_id=value)
        else:
            _set(span, field, value)
        payloads.append(message.SerializeToString())
    files = [write_json_lines(tmp_path / "bad.jsonl", lines + requests), write_length_prefixed(tmp_path / "bad.pb", payloads)]
    read = {}
    for path in ("1", "0"):
        monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", path)
        read[path] = [load_traces(f) for f in files]
    for compiled, reference in zip(read["1"], read["0"]):
        assert compiled.summary == reference.summary
        for table in ("spans", "events", "links"):
            assert _rows(getattr(compiled, table)) == _rows(getattr(reference, table)), table
    assert read["1"][0].summary.rejected_records == len(JSON_CASES)
    assert read["1"][1].summary.rejected_records == len(PROTO_CASES)


def _rows(table) -> list:
    """Rows in id order: the compiled path appends the lines it leaves to orjson after the rest."""
    return sorted(table.to_pylist(), key=lambda row: (row["trace_id"], row["span_id"], repr(row)))
