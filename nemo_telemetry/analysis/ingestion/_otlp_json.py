"""OTLP/JSON (protobuf's JSON mapping of ``ExportTraceServiceRequest``) into :class:`SpanColumns`.

Accepts what real writers produce: lowerCamelCase or original field names, int64 as strings
or numbers, enums as ints or names, ids as hex (any case) or base64, missing optional fields.
The hot path is one list comprehension per column over a request's spans.

A span with a bad field (see :func:`span_problem`) is rejected alone: it is not appended, and
``cols.rejected`` gets one line naming it and the field; its neighbours are kept. A request
that is not shaped like one at all (a span that is not an object, say) is rejected whole.
"""

from __future__ import annotations

import re
from typing import Any

from nemo_telemetry.analysis.ingestion._columns import SpanColumns, text_id_hex
from nemo_telemetry.analysis.ingestion.anyvalue import json_value_string, json_value_type

__all__ = ["decode_json_request", "scope_name_version", "span_problem", "event_problem", "link_problem",
           "extend_json_attributes", "resource_attributes", "camel_case", "resource_fields", "scope_fields",
           "uint32"]

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
_DECIMAL = re.compile(r"-?[0-9]+")  # an int64 written as a string (ASCII digits only)


def decode_json_request(doc: Any, cols: SpanColumns) -> int:
    """Append the spans of one parsed ``ExportTraceServiceRequest``; return how many.

    Raises ``ValueError`` (with ``cols`` left unchanged) when ``doc`` is not shaped like one;
    a span with a bad field is left out and named in ``cols.rejected``.
    """
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object, got {type(doc).__name__}")
    if "resource_spans" in doc:
        doc = camel_case(doc)
    mark = cols.mark()
    try:
        return _decode(doc, cols)
    except (AttributeError, TypeError, KeyError, ValueError, RecursionError) as exc:
        cols.rollback(mark)
        raise ValueError(f"not an OTLP ExportTraceServiceRequest ({type(exc).__name__}: {exc})") from None


def _decode(doc: dict, cols: SpanColumns) -> int:
    added = 0
    number = 0  # the span's place in the request, as rejections name it
    for rs in doc.get("resourceSpans") or ():
        resource_index = len(cols.resources)
        attributes, extras = resource_fields(rs.get("resource") or _EMPTY, rs.get("schemaUrl"))
        cols.resources.append(attributes)
        cols.resource_extras.append(extras)
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            scope = ss.get("scope") or ss.get("instrumentationLibrary") or _EMPTY
            scope_index = len(cols.scopes)
            cols.scopes.append(scope_fields(scope, ss.get("schemaUrl")))
            spans = ss.get("spans") or ()
            problems = [span_problem(s) for s in spans]
            if any(problems):
                cols.rejected.extend(
                    f"span {number + i} rejected: {p}" for i, p in enumerate(problems) if p is not None
                )
                number += len(spans)
                spans = [s for s, p in zip(spans, problems) if p is None]
            else:
                number += len(spans)
            _decode_spans(spans, cols, scope_index, resource_index)
            added += len(spans)
    return added


_TOP = 1 << 63  # timestamps are int64 nanoseconds: 1 <= t < 2**63


def _timestamp_problem(value: Any, required: bool) -> str | None:
    """Why ``value`` is not a timestamp (an int64 as a number or a string of digits), or None.
    0 and absent are "missing" where the field is ``required`` (a span's start and end)."""
    if value is None:
        return "is missing" if required else None  # null or absent
    if type(value) is int:
        number = value
    elif type(value) is str and _DECIMAL.fullmatch(value):
        if len(value) > 20:  # past int64 whatever the digits; int() of thousands of them is refused
            return f"is out of range ({_shown(value)}: not 0..2^63-1)"
        number = int(value)
    else:
        return f"is not an integer ({_shown(value)})"
    if number >= _TOP or number < 0:
        return f"is out of range ({_shown(number)}: not 0..2^63-1)"
    if number == 0 and required:
        return "is missing (0)"
    return None


def _id_problem(value: Any, width: int, required: bool) -> str | None:
    """Why ``value`` is not an id of ``width`` bytes (hex, any case, or base64), or None."""
    if value is None or value == "":
        return "is missing" if required else None
    if type(value) is not str:
        return f"is not a string ({_shown(value)})"
    if text_id_hex(value, width) is None:
        return f"is not {2 * width} hex digits or base64 of {width} bytes ({_shown(value)})"
    return None


def _text_problem(value: Any) -> str | None:
    if value is None or type(value) is str:  # absent: empty
        return None
    return f"is not a string ({_shown(value)})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first(parts) -> str | None:
    return next((p for p in parts if p is not None), None)


def span_problem(span: Any) -> str | None:
    """The first bad field of a JSON span (field and why), or None when it can be kept.

    Checked: ids (trace and span ids required, the parent's optional), name and trace state
    (strings; a null name too is rejected), start and end (required int64 nanoseconds), and
    each event and link (:func:`event_problem`, :func:`link_problem`): a bad event or link
    rejects its span, so a span is kept whole or not at all."""
    if not isinstance(span, dict):
        raise TypeError(f"a span is not an object ({_shown(span)})")
    get = span.get
    problem = _first((
        _field("traceId", _id_problem(get("traceId"), 16, True), ids=True),
        _field("spanId", _id_problem(get("spanId"), 8, True), ids=True),
        _field("parentSpanId", _id_problem(get("parentSpanId"), 8, False), ids=True),
        _field("name", "is null" if "name" in span and get("name") is None else _text_problem(get("name"))),
        _field("traceState", _text_problem(get("traceState"))),
        _field("kind", _enum_problem(get("kind"))),
        _field("startTimeUnixNano", _timestamp_problem(get("startTimeUnixNano"), True)),
        _field("endTimeUnixNano", _timestamp_problem(get("endTimeUnixNano"), True)),
        _field("status", _status_problem(get("status"))),
        _field("attributes", _attributes_problem(get("attributes"))),
    ))
    if problem is not None:
        return problem
    for name in _SPAN_COUNTS:  # flags and dropped counts: usually absent, one lookup each
        value = get(name)
        if value is not None and type(value) is not int and (problem := _uint32_problem(value)) is not None:
            return _field(name, problem)
        if type(value) is int and not 0 <= value < _U32:
            return _field(name, _uint32_problem(value))
    for key in ("events", "links"):
        if get(key) is not None and not isinstance(get(key), list):
            return f"{key} is not a list ({_shown(get(key))})"
    for i, event in enumerate(get("events") or ()):
        if (problem := event_problem(event)) is not None:
            return f"events[{i}].{problem}"
    for i, link in enumerate(get("links") or ()):
        if (problem := link_problem(link)) is not None:
            return f"links[{i}].{problem}"
    return None


def event_problem(event: Any) -> str | None:
    """The first bad field of a span event (its time may be absent), or None."""
    if not isinstance(event, dict):
        return f"event is not an object ({_shown(event)})"
    return _first((
        _field("timeUnixNano", _timestamp_problem(event.get("timeUnixNano"), False)),
        _field("name", _text_problem(event.get("name"))),
        _field("attributes", _attributes_problem(event.get("attributes"))),
        _field("droppedAttributesCount", _uint32_problem(event.get("droppedAttributesCount"))),
    ))


def link_problem(link: Any) -> str | None:
    """The first bad field of a span link (trace and span ids required), or None."""
    if not isinstance(link, dict):
        return f"link is not an object ({_shown(link)})"
    return _first((
        _field("traceId", _id_problem(link.get("traceId"), 16, True)),
        _field("spanId", _id_problem(link.get("spanId"), 8, True)),
        _field("traceState", _text_problem(link.get("traceState"))),
        _field("attributes", _attributes_problem(link.get("attributes"))),
        _field("flags", _uint32_problem(link.get("flags"))),
        _field("droppedAttributesCount", _uint32_problem(link.get("droppedAttributesCount"))),
    ))


_SPAN_COUNTS = ("flags", "droppedAttributesCount", "droppedEventsCount", "droppedLinksCount")
_U32 = 1 << 32


def _uint32_problem(value: Any) -> str | None:
    """Why ``value`` is not a uint32 / fixed32 (a number or a string of digits), or None."""
    if value is None:
        return None
    if type(value) is str and _DECIMAL.fullmatch(value) and len(value) <= 11:
        value = int(value)
    if type(value) is not int:
        return f"is not an integer ({_shown(value)})"
    if not 0 <= value < _U32:
        return f"is out of range ({_shown(value)}: not 0..2^32-1)"
    return None


def uint32(value: Any) -> int:
    """A uint32 field already checked (:func:`_uint32_problem`): absent is 0."""
    return int(value) if value else 0


def _enum_problem(value: Any) -> str | None:
    if type(value) is int and not -_TOP <= value < _TOP:
        return f"is out of range ({_shown(value)})"
    if value is None or type(value) in (int, str):  # unknown values become null, as for protobuf
        return None
    return f"is not an enum name or number ({_shown(value)})"


def _status_problem(status: Any) -> str | None:
    if status is None:
        return None
    if not isinstance(status, dict):
        return f"is not an object ({_shown(status)})"
    return _first((
        _field("code", _enum_problem(status.get("code"))),
        _field("message", _text_problem(status.get("message"))),
    ))


def _attributes_problem(kvs: Any) -> str | None:
    """Why a list of KeyValues cannot be read (a key not a string, a value not an AnyValue), or None."""
    if kvs is None:
        return None
    if not isinstance(kvs, list):
        return f"is not a list ({_shown(kvs)})"
    for i, kv in enumerate(kvs):
        if not isinstance(kv, dict) or type(kv.get("key", "")) is not str:
            return f"[{i}] has no string key ({_shown(kv)})"
        value = kv.get("value")
        if value is None:
            continue
        if not isinstance(value, dict):
            return f"[{i}].value is not an AnyValue ({_shown(value)})"
        if "stringValue" in value:
            if type(value["stringValue"]) is not str:
                return f"[{i}].value.stringValue is not a string ({_shown(value['stringValue'])})"
            continue
        try:
            json_value_string(value)
        except (AttributeError, TypeError, KeyError, ValueError, RecursionError) as exc:
            return f"[{i}].value is not an AnyValue ({type(exc).__name__}: {exc})"
    return None


def _field(name: str, problem: str | None, ids: bool = False) -> str | None:
    if problem is None:
        return None
    said = f"{name}{'' if problem[0] in '[.' else ' '}{problem}"  # "attributes[0]...", "name is ..."
    return f"malformed trace/span ids: {said}" if ids else said


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
    cols.flags += [uint32(s.get("flags")) for s in spans]
    cols.dropped_attributes += [uint32(s.get("droppedAttributesCount")) for s in spans]
    cols.dropped_events += [uint32(s.get("droppedEventsCount")) for s in spans]
    cols.dropped_links += [uint32(s.get("droppedLinksCount")) for s in spans]
    extend_json_attributes(cols.attrs, [s.get("attributes") or () for s in spans])
    events = [s.get("events") for s in spans]
    if any(events):
        _decode_events(events, cols, first)
    links = [s.get("links") for s in spans]
    if any(links):
        _decode_links(links, cols, first)


def _decode_events(events: list, cols: SpanColumns, first: int) -> None:
    flat = [(first + i, e) for i, evs in enumerate(events) if evs for e in evs]
    cols.event_span += [row for row, _ in flat]
    cols.event_time += [e.get("timeUnixNano") or 0 for _, e in flat]
    cols.event_name += [e.get("name") or "" for _, e in flat]
    cols.event_dropped += [uint32(e.get("droppedAttributesCount")) for _, e in flat]
    extend_json_attributes(cols.event_attrs, [e.get("attributes") or () for _, e in flat])


def _decode_links(links: list, cols: SpanColumns, first: int) -> None:
    flat = [(first + i, link) for i, ls in enumerate(links) if ls for link in ls]
    cols.link_span += [row for row, _ in flat]
    cols.link_trace_id += [link.get("traceId") or "" for _, link in flat]
    cols.link_span_id += [link.get("spanId") or "" for _, link in flat]
    cols.link_trace_state += [link.get("traceState") or "" for _, link in flat]
    cols.link_flags += [uint32(link.get("flags")) for _, link in flat]
    cols.link_dropped += [uint32(link.get("droppedAttributesCount")) for _, link in flat]
    extend_json_attributes(cols.link_attrs, [link.get("attributes") or () for _, link in flat])


def extend_json_attributes(target, per_owner: list) -> None:
    """Append the attributes of each owner (a span, event or link) to ``target``: how many,
    their keys, their values encoded once and their type tags (:mod:`.anyvalue`)."""
    flat = [kv for kvs in per_owner for kv in kvs]
    values = [kv.get("value") or _EMPTY for kv in flat]
    strings = [v.get("stringValue") for v in values]
    types = [None] * len(strings)
    for i in [i for i, s in enumerate(strings) if s is None]:
        strings[i] = json_value_string(values[i])
        types[i] = json_value_type(values[i])
    target.extend([len(kvs) for kvs in per_owner], [kv.get("key", "") for kv in flat], strings, types)


def resource_attributes(kvs: list | None) -> dict[str, str | None]:
    """A resource's attributes; ``ValueError`` when one cannot be read (the request is rejected:
    its resource is every span's)."""
    problem = _attributes_problem(kvs)
    if problem is not None:
        raise ValueError(f"resource attributes{problem}")
    return {kv.get("key", ""): json_value_string(kv.get("value")) for kv in kvs or ()}


def resource_fields(resource: Any, schema_url: Any) -> tuple[dict, tuple]:
    """A resource's attributes ({key: value string}) and what the spans table keeps beside them:
    ({key: type tag}, dropped attribute count, schema URL). ``ValueError`` when a field cannot be
    read (the request is rejected: its resource is every span's)."""
    if not isinstance(resource, dict):
        raise ValueError(f"a resource is not an object ({_shown(resource)})")
    kvs = resource.get("attributes")
    attributes = resource_attributes(kvs)
    return attributes, (_types(kvs), _header_count(resource.get("droppedAttributesCount")), _schema_url(schema_url))


def scope_fields(scope: Any, schema_url: Any) -> tuple:
    """A scope's (name, version, {key: value string}, {key: type tag}, dropped attribute count,
    schema URL); ``ValueError`` when a field cannot be read."""
    name, version = scope_name_version(scope)
    kvs = scope.get("attributes")
    return (name, version, resource_attributes(kvs), _types(kvs),
            _header_count(scope.get("droppedAttributesCount")), _schema_url(schema_url))


def _types(kvs: list | None) -> dict[str, str]:
    tags = {}
    for kv in kvs or ():
        tag = json_value_type(kv.get("value"))
        if tag is not None:
            tags[kv.get("key", "")] = tag
    return tags


def _header_count(value: Any) -> int:
    problem = _uint32_problem(value)
    if problem is not None:
        raise ValueError(f"droppedAttributesCount {problem}")
    return uint32(value)


def _schema_url(value: Any) -> str | None:
    problem = _text_problem(value)
    if problem is not None:
        raise ValueError(f"schemaUrl {problem}")
    return value or None


def scope_name_version(scope: Any) -> tuple[str | None, str | None]:
    """A scope's (name, version), None for empty; ``ValueError`` when they are not strings."""
    if not isinstance(scope, dict):
        raise ValueError(f"a scope is not an object ({_shown(scope)})")
    name, version = scope.get("name") or None, scope.get("version") or None
    if not all(v is None or type(v) is str for v in (name, version)):
        raise ValueError(f"scope name or version is not a string ({_shown(name)}, {_shown(version)})")
    return name, version


def _enum(values: list, names: dict[str, int]) -> list:
    if all(type(v) is int for v in values):
        return values
    return [v if type(v) is int else names.get(v, _to_int(v)) for v in values]


def _to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def camel_case(obj: Any) -> Any:
    """Original (snake_case) protobuf field names to the lowerCamelCase the decoder reads."""
    if isinstance(obj, dict):
        return {_SNAKE.sub(lambda m: m.group(1).upper(), k): camel_case(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [camel_case(v) for v in obj]
    return obj

