"""The compiled JSON-lines scan gives exactly what orjson gives, and leaves odd lines to it."""

from __future__ import annotations

import orjson
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.ingestion._otlp_json_fast import LINE_FALLBACK, LINE_OK, LINE_OTHER_SIGNAL, decode_json_lines
from nemo_telemetry.analysis.synthetic import synthetic_requests

from test_ingest_formats import hex_ids, make_sdk_spans, numbers_and_enum_ints
from test_ingest_wire import _with_every_value_type

# Tests of the compiled kernels: they take them on these small inputs too, as auto would not.
pytestmark = pytest.mark.usefixtures("compiled_kernels")


def _orjson_path(lines):
    cols = SpanColumns()
    for line in lines:
        decode_json_request(orjson.loads(line), cols)
    return cols.to_tables()


def _sdk_lines():
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(_with_every_value_type())
    span = request.resource_spans[0].scope_spans[0].spans[1]
    span.name = 'quote " backslash \\ tab \t unicode é'
    span.attributes[0].key = "key\nwith newline"
    as_dict = MessageToDict(request)
    return [
        orjson.dumps(hex_ids(as_dict)) + b"\n",
        orjson.dumps(numbers_and_enum_ints(hex_ids(as_dict, upper=True))) + b"\n",
        orjson.dumps(as_dict),  # base64 ids
        b"  " + orjson.dumps(hex_ids(MessageToDict(encode_spans(make_sdk_spans())))) + b"  \r\n",
    ]


@pytest.mark.parametrize("source", ["sdk", "synthetic"])
def test_scan_equals_the_orjson_path(source):
    if source == "sdk":
        lines = _sdk_lines()
    else:  # small first guesses: the arrays grow several times
        lines = [orjson.dumps(r) for r in synthetic_requests(3000, spans_per_request=7, ranks=3)]
    fast, status = decode_json_lines(lines)
    assert status.tolist() == [LINE_OK] * len(lines)
    slow = _orjson_path(lines)
    for name in ("spans", "events", "links"):
        assert getattr(fast, name).to_pylist() == getattr(slow, name).to_pylist(), name
    if source == "sdk":
        names = fast.spans.column("name").to_pylist()
        assert 'quote " backslash \\ tab \t unicode é' in names
        assert any(k == "key\nwith newline" for k, _ in fast.spans.column("attributes")[1].as_py())


def test_lines_the_scan_does_not_know_are_left_to_orjson():
    good = orjson.dumps(next(synthetic_requests(11, ranks=1)))
    snake = orjson.dumps({"resource_spans": []})
    unknown_field = good.replace(b'"kind":', b'"unknownField":1,"kind":', 1)
    lines = [good, b"not json", snake, b'{"resourceMetrics": []}', good[:-5], unknown_field, good]
    tables, status = decode_json_lines(lines)
    assert status.tolist() == [LINE_OK, LINE_FALLBACK, LINE_FALLBACK, LINE_OTHER_SIGNAL, LINE_FALLBACK,
                               LINE_FALLBACK, LINE_OK]
    assert tables.spans.num_rows == 22
