"""The compiled protobuf walk gives exactly what upb gives, and hands odd input back to upb."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_proto import decode_proto_request
from nemo_telemetry.analysis.ingestion._otlp_wire import WireError, decode_batch, decode_requests
from nemo_telemetry.analysis.synthetic import synthetic_requests, to_protobuf

from test_ingest_formats import make_sdk_spans

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")


def _with_every_value_type() -> bytes:
    request = encode_spans(make_sdk_spans())
    span = request.resource_spans[0].scope_spans[0].spans[0]
    values = {
        "double": AnyValue(double_value=1.0),
        "negative": AnyValue(int_value=-5),
        "bytes": AnyValue(bytes_value=b"\x01\xff"),
        "array": AnyValue(array_value=ArrayValue(values=[AnyValue(string_value="a"), AnyValue(int_value=2)])),
        "kvlist": AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(bool_value=False))])),
        "empty": AnyValue(),
        "unicode": AnyValue(string_value="größe ✓"),
    }
    span.attributes.extend(KeyValue(key=k, value=v) for k, v in values.items())
    span.trace_state = "vendor=1"
    return request.SerializeToString()


def _upb(payloads):
    cols = SpanColumns()
    for payload in payloads:
        decode_proto_request(payload, cols)
    return cols.to_tables()


@pytest.mark.parametrize("source", ["sdk", "synthetic"])
def test_compiled_walk_equals_upb(source):
    if source == "sdk":
        payloads = [_with_every_value_type(), _with_every_value_type()]
    else:
        payloads = [to_protobuf(r) for r in synthetic_requests(1500, spans_per_request=100)]
    fast, slow = decode_requests(payloads), _upb(payloads)
    for name in ("spans", "events", "links"):
        assert getattr(fast, name).schema == getattr(slow, name).schema
        assert getattr(fast, name).to_pylist() == getattr(slow, name).to_pylist(), name
    if source == "sdk":
        attributes = dict(fast.spans.column("attributes")[0].as_py())
        assert attributes["double"] == "1.0" and attributes["negative"] == "-5"
        assert attributes["bytes"] == "01ff" and attributes["array"] == '["a",2]'
        assert attributes["kvlist"] == '{"k":false}' and attributes["empty"] is None


def test_odd_input_goes_back_to_upb_which_names_the_bad_request():
    good = to_protobuf(next(synthetic_requests(11, ranks=1)))
    odd_id = ExportTraceServiceRequest.FromString(good)
    odd_id.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01\x02\x03"
    truncated = good[: len(good) // 2]
    for bad in (odd_id.SerializeToString(), truncated):
        with pytest.raises(WireError):
            decode_requests([good, bad])
    tables, rejected = decode_batch([good, truncated, good])
    assert [index for index, _ in rejected] == [1]
    assert tables.spans.num_rows == 22
    spans_rejected: list = []
    tables, rejected = decode_batch([good, odd_id.SerializeToString()], spans_rejected)
    assert rejected == []  # no request rejected: the span with the odd id alone
    assert [index for index, _ in spans_rejected] == [1]
    assert "span 0 rejected: malformed trace/span ids: spanId" in spans_rejected[0][1]
    assert tables.spans.num_rows == 21
