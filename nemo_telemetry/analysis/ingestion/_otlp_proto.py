"""Serialized ``ExportTraceServiceRequest`` protobuf into :class:`SpanColumns`.

upb parses the message; columns come out through list comprehensions over the repeated
fields. Ids stay raw bytes here and become hex in one vectorized pass in ``_columns``.

upb rejects a request with invalid UTF-8 in any string, a wrong wire type, a truncated field,
or messages nested past its recursion limit (100); an attribute value nested more than
``MAX_VALUE_DEPTH`` (32) arrays or lists deep is refused here. Such a request is rejected whole. A span with a bad field (:func:`span_problem`) is
rejected alone and named in ``cols.rejected``.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nemo_telemetry.analysis.ingestion._columns import SpanColumns
from nemo_telemetry.analysis.ingestion.anyvalue import proto_value_string, proto_value_type

__all__ = ["decode_proto_request", "parse_proto_request", "span_problem", "event_problem", "link_problem",
           "extend_proto_attributes", "proto_resource_fields", "proto_scope_fields"]

_TOP = 1 << 63  # fixed64 timestamps past int64 are legal on the wire, out of range here


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
    number = 0  # the span's place in the request, as rejections name it
    for rs in request.resource_spans:
        resource_index = len(cols.resources)
        attributes, extras = proto_resource_fields(rs.resource, rs.schema_url)
        cols.resources.append(attributes)
        cols.resource_extras.append(extras)
        for ss in rs.scope_spans:
            scope_index = len(cols.scopes)
            cols.scopes.append(proto_scope_fields(ss.scope, ss.schema_url))
            spans = ss.spans
            problems = [span_problem(s) for s in spans]
            if any(problems):
                cols.rejected.extend(f"span {number + i} rejected: {p}" for i, p in enumerate(problems) if p is not None)
                spans = [s for s, p in zip(spans, problems) if p is None]
            number += len(problems)
            _decode_spans(spans, cols, scope_index, resource_index)
            added += len(spans)
    return added


def span_problem(span) -> str | None:
    """The first bad field of a Span (field and why), or None when it can be kept: a trace id
    of 16 bytes, a span id of 8 and a parent id of 8 or none; start and end in 1..2^63-1 (0 is
    absent); and in each event a time below 2^63, in each link ids of 16 and 8 bytes. A bad
    event or link rejects its span, as in the JSON decoder."""
    for name, value, sizes in (("traceId", span.trace_id, (16,)), ("spanId", span.span_id, (8,)),
                               ("parentSpanId", span.parent_span_id, (0, 8))):
        if len(value) not in sizes:
            return f"malformed trace/span ids: {name} has {len(value)} bytes"
    for name, value in (("startTimeUnixNano", span.start_time_unix_nano), ("endTimeUnixNano", span.end_time_unix_nano)):
        if value == 0:
            return f"{name} is missing (0)"
        if value >= _TOP:
            return f"{name} is out of range ({value}: not 0..2^63-1)"
    for i, event in enumerate(span.events):
        if (problem := event_problem(event)) is not None:
            return f"events[{i}].{problem}"
    for i, link in enumerate(span.links):
        if (problem := link_problem(link)) is not None:
            return f"links[{i}].{problem}"
    return None


def event_problem(event) -> str | None:
    if event.time_unix_nano >= _TOP:
        return f"timeUnixNano is out of range ({event.time_unix_nano}: not 0..2^63-1)"
    return None


def link_problem(link) -> str | None:
    if len(link.trace_id) != 16:
        return f"traceId has {len(link.trace_id)} bytes"
    if len(link.span_id) != 8:
        return f"spanId has {len(link.span_id)} bytes"
    return None


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
    cols.flags += [s.flags for s in spans]
    cols.dropped_attributes += [s.dropped_attributes_count for s in spans]
    cols.dropped_events += [s.dropped_events_count for s in spans]
    cols.dropped_links += [s.dropped_links_count for s in spans]
    extend_proto_attributes(cols.attrs, [s.attributes for s in spans])
    events = [s.events for s in spans]
    if any(events):
        flat = [(first + i, e) for i, evs in enumerate(events) for e in evs]
        cols.event_span += [row for row, _ in flat]
        cols.event_time += [e.time_unix_nano for _, e in flat]
        cols.event_name += [e.name for _, e in flat]
        cols.event_dropped += [e.dropped_attributes_count for _, e in flat]
        extend_proto_attributes(cols.event_attrs, [e.attributes for _, e in flat])
    links = [s.links for s in spans]
    if any(links):
        flat = [(first + i, link) for i, ls in enumerate(links) for link in ls]
        cols.link_span += [row for row, _ in flat]
        cols.link_trace_id += [link.trace_id for _, link in flat]
        cols.link_span_id += [link.span_id for _, link in flat]
        cols.link_trace_state += [link.trace_state for _, link in flat]
        cols.link_flags += [link.flags for _, link in flat]
        cols.link_dropped += [link.dropped_attributes_count for _, link in flat]
        extend_proto_attributes(cols.link_attrs, [link.attributes for _, link in flat])


def extend_proto_attributes(target, per_owner: list) -> None:
    """Append the attributes of each owner (a span, event or link) to ``target``: how many,
    their keys, and their values encoded once (:mod:`.anyvalue`)."""
    flat = [kv for kvs in per_owner for kv in kvs]
    target.extend(
        [len(kvs) for kvs in per_owner], [kv.key for kv in flat], [proto_value_string(kv.value) for kv in flat],
        [proto_value_type(kv.value) for kv in flat],
    )


def proto_resource_fields(resource, schema_url: str) -> tuple[dict, tuple]:
    """A protobuf resource's attributes and (type tags, dropped attribute count, schema URL), as
    the JSON decoder's ``resource_fields``."""
    kvs = resource.attributes
    return ({kv.key: proto_value_string(kv.value) for kv in kvs},
            (_types(kvs), resource.dropped_attributes_count, schema_url or None))


def proto_scope_fields(scope, schema_url: str) -> tuple:
    """A protobuf scope's fields, as the JSON decoder's ``scope_fields``."""
    kvs = scope.attributes
    return (scope.name or None, scope.version or None, {kv.key: proto_value_string(kv.value) for kv in kvs},
            _types(kvs), scope.dropped_attributes_count, schema_url or None)


def _types(kvs) -> dict[str, str]:
    return {kv.key: tag for kv in kvs if (tag := proto_value_type(kv.value)) is not None}
