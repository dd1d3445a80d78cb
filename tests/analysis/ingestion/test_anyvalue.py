"""One AnyValue encoding: the same value reads as the same string in a span attribute (both
decoders of JSON and of protobuf, and through ``read_spans``), a metric point attribute (JSON and
protobuf dumps) and a log record attribute."""

from __future__ import annotations

import base64
import json

import orjson
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from nemo_telemetry.analysis import read_logs, read_metrics, read_spans
from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.ingestion._otlp_json_fast import decode_json_lines
from nemo_telemetry.analysis.ingestion._otlp_proto import decode_proto_request
from nemo_telemetry.analysis.ingestion._otlp_wire import decode_requests
from nemo_telemetry.analysis.synthetic import to_protobuf

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")

RAW = b"\x00\xff\x10"
# (AnyValue in OTLP/JSON, the string model/schema.py says the tables hold)
VALUES = {
    "text": ({"stringValue": "naïve ✓ \"quoted\""}, "naïve ✓ \"quoted\""),
    "flag": ({"boolValue": True}, "true"),
    "flag_as_text": ({"boolValue": "false"}, "false"),
    "number": ({"intValue": "-42"}, "-42"),
    "double": ({"doubleValue": 0.1}, "0.1"),
    "whole_double": ({"doubleValue": 3.0}, "3.0"),
    "raw": ({"bytesValue": base64.b64encode(RAW).decode()}, "00ff10"),
    "nested": ({"kvlistValue": {"values": [
        {"key": "ünï", "value": {"arrayValue": {"values": [
            {"intValue": "1"}, {"stringValue": "é✓"}, {"boolValue": False}, {"doubleValue": 2.5},
            {"bytesValue": base64.b64encode(RAW).decode()},
            {"kvlistValue": {"values": [{"key": "deep", "value": {"arrayValue": {"values": []}}}]}},
        ]}}},
    ]}}, '{"ünï":[1,"é✓",false,2.5,"00ff10",{"deep":[]}]}'),
}
# protobuf's JSON mapping has no bool given as text: that spelling is OTLP/JSON only
PROTO_VALUES = {k: v for k, v in VALUES.items() if k != "flag_as_text"}
EXPECTED = {key: text for key, (_, text) in VALUES.items()}
PROTO_EXPECTED = {key: text for key, (_, text) in PROTO_VALUES.items()}

TRACE, SPAN = "ab" * 16, "cd" * 8
RESOURCE = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}},
                           {"key": "nemo.run.id", "value": {"stringValue": "run-1"}}]}


def _attributes(values: dict) -> list[dict]:
    return [{"key": key, "value": value} for key, (value, _) in values.items()]


def _trace_request(values: dict) -> dict:
    span = {"traceId": TRACE, "spanId": SPAN, "name": "rl.grpo.probe", "kind": 1,
            "startTimeUnixNano": "1000", "endTimeUnixNano": "2000", "attributes": _attributes(values)}
    return {"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [{"scope": {"name": "t"}, "spans": [span]}]}]}


def _metrics_request(values: dict) -> dict:
    point = {"timeUnixNano": "1500", "asDouble": 1.0, "attributes": _attributes(values)}
    metric = {"name": "rl.probe", "gauge": {"dataPoints": [point]}}
    return {"resourceMetrics": [{"resource": RESOURCE, "scopeMetrics": [{"scope": {"name": "t"},
                                                                          "metrics": [metric]}]}]}


def _logs_request(values: dict) -> dict:
    record = {"timeUnixNano": "1500", "body": {"stringValue": "probe"}, "traceId": TRACE, "spanId": SPAN,
              "attributes": _attributes(values)}
    return {"resourceLogs": [{"resource": RESOURCE, "scopeLogs": [{"scope": {"name": "t"}, "logRecords": [record]}]}]}


def _length_prefixed(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def _span_attributes(spans) -> dict[str, str]:
    (row,) = spans.to_pylist()
    return {key: value for key, value in row["attributes"] if key in VALUES}


def _json_decoders(values: dict) -> dict[str, dict[str, str]]:
    """The span attributes each JSON span decoder reads."""
    line = orjson.dumps(_trace_request(values))
    exact = SpanColumns()
    decode_json_request(orjson.loads(line), exact)
    return {"compiled scan": _span_attributes(decode_json_lines([line])[0].spans),
            "orjson": _span_attributes(exact.to_tables().spans)}


def _proto_decoders(values: dict) -> dict[str, dict[str, str]]:
    """The span attributes each protobuf span decoder reads."""
    payload = to_protobuf(_trace_request(values))
    upb = SpanColumns()
    decode_proto_request(payload, upb)
    return {"compiled walk": _span_attributes(decode_requests([payload]).spans),
            "upb": _span_attributes(upb.to_tables().spans)}


def test_every_span_decoder_encodes_each_value_as_the_schema_says():
    assert _json_decoders(VALUES) == {"compiled scan": EXPECTED, "orjson": EXPECTED}
    assert _proto_decoders(PROTO_VALUES) == {"compiled walk": PROTO_EXPECTED, "upb": PROTO_EXPECTED}


@pytest.mark.parametrize("form", ["json", "protobuf"])
def test_the_same_value_reads_the_same_in_a_span_a_metric_and_a_log(tmp_path, form):
    if form == "json":
        values, expected = VALUES, EXPECTED
        (tmp_path / "traces-1.jsonl").write_text(json.dumps(_trace_request(values)) + "\n")
        (tmp_path / "metrics-1.jsonl").write_text(json.dumps(_metrics_request(values)) + "\n")
    else:
        values, expected = PROTO_VALUES, PROTO_EXPECTED
        (tmp_path / "traces-1.binpb").write_bytes(_length_prefixed(to_protobuf(_trace_request(values))))
        metrics = ParseDict(_metrics_request(values), ExportMetricsServiceRequest())
        (tmp_path / "metrics-1.binpb").write_bytes(_length_prefixed(metrics.SerializeToString()))
    (tmp_path / "logs-1.jsonl").write_text(json.dumps(_logs_request(values)) + "\n")

    span = _span_attributes(read_spans(tmp_path / f"traces-1.{'jsonl' if form == 'json' else 'binpb'}"))
    (point,) = read_metrics(tmp_path / f"metrics-1.{'jsonl' if form == 'json' else 'binpb'}").to_pylist()
    (log,) = read_logs(tmp_path / "logs-1.jsonl").to_pylist()
    metric = dict(point["attributes"])
    logged = dict(log["attributes"])
    assert span == expected
    assert metric == expected
    assert logged == expected


def test_a_metric_value_nested_too_deep_costs_only_its_request_and_is_named(tmp_path):
    """The nesting bound spans and logs keep holds for metrics too: the point (here its request's
    only one) is counted and named, not read."""
    deep = {"stringValue": "x"}
    for _ in range(40):
        deep = {"arrayValue": {"values": [deep]}}
    bad = _metrics_request({"d": (deep, None)})
    good = _metrics_request({"flag": VALUES["flag"]})
    path = tmp_path / "metrics-deep.jsonl"
    path.write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    table = read_metrics(path)
    assert [dict(row["attributes"]) for row in table.to_pylist()] == [{"flag": "true"}]
    from nemo_telemetry.analysis.ingestion.metrics import FIRST_PROBLEM_KEY, MALFORMED_KEY

    assert table.schema.metadata[MALFORMED_KEY] == b"1"
    assert table.schema.metadata[FIRST_PROBLEM_KEY].decode() == (
        f"{path}:1: resourceMetrics[0].scopeMetrics[0].metrics[0] 'rl.probe'.dataPoints[0].attributes: "
        "an attribute value nested more than 32 deep")
