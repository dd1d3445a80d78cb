"""OTLP/JSON (protobuf's JSON mapping of ``ExportTraceServiceRequest``) into :class:`SpanColumns`.

Accepts what real writers produce: lowerCamelCase or original field names, int64 as strings
or numbers, enums as ints or names, ids as hex (any case) or base64, missing optional fields.
The hot path is one list comprehension per column over a request's spans.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from nemo_telemetry.analysis._columns import SpanColumns

__all__ = ["decode_json_request", "any_value_to_python", "value_to_string"]

_EMPTY: dict = {}
_KINDS = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
_STATUS = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
_SNAKE = re.compile(r"_([a-z])")


def decode_json_request(doc: Any, cols: SpanColumns) -> int:
    """Append the spans of one parsed ``ExportTraceServiceRequest``; return how many.

    Raises ``ValueError`` (with ``cols`` left unchanged) when ``doc`` is not shaped like one.
    """
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    if "resource_spans" in doc:
        doc = _camel_case(doc)
    mark = cols.mark()
    try:
        return _decode(doc, cols)
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        cols.rollback(mark)
        raise ValueError(f"not an OTLP ExportTraceServiceRequest ({type(exc).__name__}: {exc})") from None


def _decode(doc: dict, cols: SpanColumns) -> int:
    added = 0
    for rs in doc.get("resourceSpans") or ():
        resource = rs.get("resource") or _EMPTY
        resource_index = len(cols.resources)
        cols.resources.append(_attribute_dict(resource.get("attributes")))
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or _EMPTY
            scope_index = len(cols.scopes)
            cols.scopes.append((scope.get("name") or None, scope.get("version") or None))
            spans = ss.get("spans") or ()
            _decode_spans(spans, cols, scope_index, resource_index)
            added += len(spans)
    return added


def _decode_spans(spans: list, cols: SpanColumns, scope_index: int, resource_index: int) -> None:
    n = len(spans)
    first = len(cols.span_id)
    cols.trace_id += [s.get("traceId") or "" for s in spans]
    cols.span_id += [s.get("spanId") or "" for s in spans]
    cols.parent_span_id += [s.get("parentSpanId") or "" for s in spans]
    cols.trace_state += [s.get("traceState") or "" for s in spans]
    cols.name += [s.get("name") or "" for s in spans]
    cols.kind += _enum([s.get("kind", 0) for s in spans], _KINDS)
    cols.start_ns += [s.get("startTimeUnixNano", 0) for s in spans]
    cols.end_ns += [s.get("endTimeUnixNano", 0) for s in spans]
    status = [s.get("status") or _EMPTY for s in spans]
    cols.status_code += _enum([st.get("code", 0) for st in status], _STATUS)
    cols.status_message += [st.get("message") or "" for st in status]
    cols.scope_index += [scope_index] * n
    cols.resource_index += [resource_index] * n
    _extend_attributes(cols.attrs, [s.get("attributes") or () for s in spans])
    events = [s.get("events") for s in spans]
    if any(events):
        _decode_events(events, cols, first)
    links = [s.get("links") for s in spans]
    if any(links):
        _decode_links(links, cols, first)


def _decode_events(events: list, cols: SpanColumns, first: int) -> None:
    flat = [(first + i, e) for i, evs in enumerate(events) if evs for e in evs]
    cols.event_span += [row for row, _ in flat]
    cols.event_time += [e.get("timeUnixNano", 0) for _, e in flat]
    cols.event_name += [e.get("name") or "" for _, e in flat]
    _extend_attributes(cols.event_attrs, [e.get("attributes") or () for _, e in flat])


def _decode_links(links: list, cols: SpanColumns, first: int) -> None:
    flat = [(first + i, link) for i, ls in enumerate(links) if ls for link in ls]
    cols.link_span += [row for row, _ in flat]
    cols.link_trace_id += [link.get("traceId") or "" for _, link in flat]
    cols.link_span_id += [link.get("spanId") or "" for _, link in flat]
    cols.link_trace_state += [link.get("traceState") or "" for _, link in flat]
    _extend_attributes(cols.link_attrs, [link.get("attributes") or () for _, link in flat])


def _extend_attributes(target, per_owner: list) -> None:
    flat = [kv for kvs in per_owner for kv in kvs]
    values = [kv.get("value") or _EMPTY for kv in flat]
    strings = [v.get("stringValue") for v in values]
    for i in [i for i, s in enumerate(strings) if s is None]:
        strings[i] = value_to_string(any_value_to_python(values[i]))
    target.extend([len(kvs) for kvs in per_owner], [kv["key"] for kv in flat], strings)


def _attribute_dict(kvs: list | None) -> dict[str, str | None]:
    return {kv["key"]: value_to_string(any_value_to_python(kv.get("value"))) for kv in kvs or ()}


def _enum(values: list, names: dict[str, int]) -> list:
    if all(type(v) is int for v in values):
        return values
    return [v if type(v) is int else names.get(v, _to_int(v)) for v in values]


def _to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def any_value_to_python(value: dict | None) -> Any:
    """A JSON ``AnyValue`` as a Python value (bytes as lowercase hex text)."""
    if not value:
        return None
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "boolValue" in value:
        flag = value["boolValue"]
        return flag if isinstance(flag, bool) else str(flag).lower() == "true"
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "bytesValue" in value:
        return _bytes_hex(value["bytesValue"])
    if "arrayValue" in value:
        return [any_value_to_python(v) for v in (value["arrayValue"] or _EMPTY).get("values") or ()]
    if "kvlistValue" in value:
        kvs = (value["kvlistValue"] or _EMPTY).get("values") or ()
        return {kv["key"]: any_value_to_python(kv.get("value")) for kv in kvs}
    return None


def value_to_string(value: Any) -> str | None:
    """The schema's string encoding of an attribute value (see ``analysis/schema.py``)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _bytes_hex(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).hex()
    except (binascii.Error, ValueError):
        return str(text).lower()


def _camel_case(obj: Any) -> Any:
    """Original (snake_case) protobuf field names to the lowerCamelCase the decoder reads."""
    if isinstance(obj, dict):
        return {_SNAKE.sub(lambda m: m.group(1).upper(), k): _camel_case(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_camel_case(v) for v in obj]
    return obj

