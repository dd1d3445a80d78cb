"""Serialized ``ExportTraceServiceRequest`` protobuf into :class:`SpanColumns`.

upb parses the message; columns come out through list comprehensions over the repeated
fields. Ids stay raw bytes here and become hex in one vectorized pass in ``_columns``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nemo_telemetry.analysis._columns import SpanColumns
from nemo_telemetry.analysis._otlp_json import value_to_string

__all__ = ["decode_proto_request", "parse_proto_request"]


def parse_proto_request(payload: bytes) -> ExportTraceServiceRequest:
    """Parse one request; ``ValueError`` naming the problem when it is not one."""
    try:
        return ExportTraceServiceRequest.FromString(payload)
    except DecodeError as exc:
        raise ValueError(f"not a protobuf ExportTraceServiceRequest ({exc})") from None


def decode_proto_request(payload: bytes | ExportTraceServiceRequest, cols: SpanColumns) -> int:
    """Append the spans of one serialized (or parsed) request; return how many."""
    request = payload if isinstance(payload, ExportTraceServiceRequest) else parse_proto_request(payload)
    added = 0
    for rs in request.resource_spans:
        resource_index = len(cols.resources)
        cols.resources.append({kv.key: _value_string(kv.value) for kv in rs.resource.attributes})
        for ss in rs.scope_spans:
            scope_index = len(cols.scopes)
            cols.scopes.append((ss.scope.name or None, ss.scope.version or None))
            _decode_spans(ss.spans, cols, scope_index, resource_index)
            added += len(ss.spans)
    return added


def _decode_spans(spans, cols: SpanColumns, scope_index: int, resource_index: int) -> None:
    n = len(spans)
    first = len(cols.span_id)
    cols.trace_id += [s.trace_id for s in spans]
    cols.span_id += [s.span_id for s in spans]
    cols.parent_span_id += [s.parent_span_id for s in spans]
    cols.trace_state += [s.trace_state for s in spans]
    cols.name += [s.name for s in spans]
    cols.kind += [s.kind for s in spans]
    cols.start_ns += [s.start_time_unix_nano for s in spans]
    cols.end_ns += [s.end_time_unix_nano for s in spans]
    status = [s.status for s in spans]
    cols.status_code += [st.code for st in status]
    cols.status_message += [st.message for st in status]
    cols.scope_index += [scope_index] * n
    cols.resource_index += [resource_index] * n
    _extend_attributes(cols.attrs, [s.attributes for s in spans])
    events = [s.events for s in spans]
    if any(events):
        flat = [(first + i, e) for i, evs in enumerate(events) for e in evs]
        cols.event_span += [row for row, _ in flat]
        cols.event_time += [e.time_unix_nano for _, e in flat]
        cols.event_name += [e.name for _, e in flat]
        _extend_attributes(cols.event_attrs, [e.attributes for _, e in flat])
    links = [s.links for s in spans]
    if any(links):
        flat = [(first + i, link) for i, ls in enumerate(links) for link in ls]
        cols.link_span += [row for row, _ in flat]
        cols.link_trace_id += [link.trace_id for _, link in flat]
        cols.link_span_id += [link.span_id for _, link in flat]
        cols.link_trace_state += [link.trace_state for _, link in flat]
        _extend_attributes(cols.link_attrs, [link.attributes for _, link in flat])


def _extend_attributes(target, per_owner: list) -> None:
    flat = [kv for kvs in per_owner for kv in kvs]
    target.extend(
        [len(kvs) for kvs in per_owner], [kv.key for kv in flat], [_value_string(kv.value) for kv in flat]
    )


def _value_string(value) -> str | None:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    return value_to_string(_python(value, which))


def _python(value, which: str | None) -> Any:
    """An ``AnyValue`` as a Python value, the same one the JSON decoder produces."""
    if which is None:
        return None
    if which == "bytes_value":
        return value.bytes_value.hex()
    if which == "array_value":
        return [_python(v, v.WhichOneof("value")) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _python(kv.value, kv.value.WhichOneof("value")) for kv in value.kvlist_value.values}
    return getattr(value, which)
