"""Batches of OTLP/JSON lines into Arrow columns through the compiled scan (``_json_kernel``).

The scan copies the strings it needs into a per-thread arena (one region per column kind) and
says where each lies; here the columns are built from the arena in bulk (``_strings_kernel``:
``gather``, ``text_ids`` for lowercase ids and their keys), attributes are promoted where they lie
in the arena (``_promote.promote_records``, as the protobuf walk's; ``value_strings`` builds the
key and value arrays only where that cannot: keys with escapes, text that is not ASCII), and the rare parts
(resources, scopes, events, links, values that are not strings, ints or bools, strings with
escapes) are parsed by orjson one by one, from the block or the arena. Lines the scan leaves
alone come back to the caller with their status, for the orjson path.
"""

from __future__ import annotations

import threading

import numpy as np
import orjson
import pyarrow as pa

from nemo_telemetry.analysis.kernels import compiled as _compiled
from nemo_telemetry.analysis.model.tree import trace_key_of
from nemo_telemetry.analysis.ingestion._columns import OtlpTables, SpanArrays, SpanColumns, build_tables, text_id_hex, grown_records, scratch_matrix, special_rows, string_array
from nemo_telemetry.analysis.ingestion._columns import AttributeRecords
from nemo_telemetry.analysis.ingestion._kernel_arrays import TypeTags, empty_strings, uint32_column, value_types
from nemo_telemetry.analysis.ingestion._otlp_json import event_problem, extend_json_attributes, link_problem, resource_fields, scope_fields, uint32
from nemo_telemetry.analysis.ingestion.anyvalue import json_value_string, json_value_type

__all__ = ["decode_json_lines", "decode_json_block", "LINE_OK", "LINE_OTHER_SIGNAL", "LINE_FALLBACK", "LINE_BLANK"]

LINE_OK, LINE_OTHER_SIGNAL, LINE_FALLBACK, LINE_BLANK = 0, 1, 2, 3


def decode_json_lines(lines: list[bytes]) -> tuple[OtlpTables, np.ndarray]:
    """The tables of the lines the scan understood, and each line's LINE_* status."""
    sizes = np.fromiter((len(line) for line in lines), dtype=np.int64, count=len(lines))
    ends = np.cumsum(sizes)
    return decode_json_block(b"".join(lines), ends - sizes, ends)


def decode_json_block(buffer: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> tuple[OtlpTables, np.ndarray]:
    """Like :func:`decode_json_lines` for the lines ``buffer[starts[i]:ends[i]]`` of one block;
    every line is LINE_FALLBACK (for the orjson path) when the seam (``_compiled``) says the
    block is too small for the compiled scan, or the scan fails."""

    def orjson_path() -> tuple[OtlpTables, np.ndarray]:
        return OtlpTables.empty(), np.full(starts.size, LINE_FALLBACK, dtype=np.int8)

    scan = lambda k, w: _scan(k, w, buffer, starts, ends)  # noqa: E731
    size = int(ends[-1] - starts[0]) if starts.size else 0  # the lines, not the buffer's spare room
    return _compiled.run(("_json_kernel", "_strings_kernel"), size, scan, orjson_path, unit="json-bytes")


def _scan(k, w, buffer: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> tuple[OtlpTables, np.ndarray]:
    data = np.frombuffer(buffer, dtype=np.uint8)
    data.flags.writeable = False  # one compiled signature for bytes and bytearray blocks
    status = np.zeros(starts.size, dtype=np.int8)
    region = data.size + 16
    arena = _scratch_arena(k.ARENAS * region)
    counts = np.zeros(k.COUNT_COLUMNS, dtype=np.int64)
    counts[6 : 6 + k.ARENAS] = np.arange(k.ARENAS) * region
    guess = max(64, len(buffer) // 256)  # a span of a few attributes takes ~400 bytes of JSON
    arrays = [
        scratch_matrix("json-spans", k.SPAN_COLUMNS, guess),
        scratch_matrix("json-attributes", k.ATTR_COLUMNS, 4 * guess),
        *(np.zeros((max(16, 2 * starts.size), k.SIDE_COLUMNS), dtype=np.int64) for _ in range(2)),
        *(np.zeros((64, k.SIDE_COLUMNS), dtype=np.int64) for _ in range(2)),
    ]
    line = 0
    room = (np.zeros(1, dtype=np.int64), np.zeros(k.ARENAS, dtype=np.int64))  # the scan's flags and cursors
    while (line := k.scan(data, starts, ends, line, status, counts, *arrays, arena, *room)) < starts.size:
        arrays = [grown_records(a, int(c), 1 if i < 2 else 0) for i, (a, c) in enumerate(zip(arrays, counts))]
    n = int(counts[0])
    if n == 0:
        return OtlpTables.empty(), status
    spans, attrs = arrays[0][:, :n], arrays[1][:, : int(counts[1])]
    side = [a[: int(c)] for a, c in zip(arrays[2:], counts[2:6])]
    arena = arena.view()
    arena.flags.writeable = False  # the string builders' one signature, as for protobuf blocks
    try:
        return _assemble(k, w, buffer, arena, spans, attrs, *side), status
    except (pa.ArrowInvalid, orjson.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError, RecursionError):
        # e.g. invalid UTF-8 or an odd resource: let the exact path judge every line
        status[status == LINE_OK] = LINE_FALLBACK
        return OtlpTables.empty(), status


def _assemble(k, w, buffer, arena, spans, attrs, resources, scopes, events, links) -> OtlpTables:
    """The tables; string starts in ``spans`` and ``attrs`` are positions in ``arena``, raw
    slices (resources, scopes, events, links, rare values) positions in ``buffer``."""
    extras = SpanColumns()
    for attributes, fields in _parsed_once(buffer, resources, _resource):
        extras.resources.append(attributes)
        extras.resource_extras.append(fields)
    extras.scopes.extend(_parsed_once(buffer, scopes, _scope))
    _events_and_links(buffer, events, links, extras)
    escaped = spans[k.ESCAPED]

    def text(column: int) -> pa.Array:
        return _strings(w, arena, spans[column], spans[column + 1], (escaped >> column) & 1 == 1)

    trace_id, trace_key, trace_low = _ids(w, arena, spans[k.TRACE_S], spans[k.TRACE_N], 16)
    span_id, span_key, _ = _ids(w, arena, spans[k.SPAN_S], spans[k.SPAN_N], 8)
    parent_id, parent_key, _ = _ids(w, arena, spans[k.PARENT_S], spans[k.PARENT_N], 8)
    hex_ids = all(key is not None for key in (trace_key, span_key, parent_key))
    keys = (trace_key_of(trace_key, trace_low), span_key, parent_key, trace_low) if hex_ids else None
    records, attr_types = _attribute_records(k, w, buffer, arena, attrs)
    attr_keys = attr_values = None
    if (attrs[k.ATTR_ESCAPED] & 2).any():  # a key with escapes: decoded by orjson, promoted from arrays
        attr_keys, attr_values = records.strings()
        records = None
    arrays = SpanArrays(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_id,
        trace_state=text(k.STATE_S),
        name=text(k.NAME_S),
        kind=pa.array(spans[k.KIND].copy()),  # copies: the matrices are reused
        start_ns=pa.array(spans[k.START].copy()),
        end_ns=pa.array(spans[k.END].copy()),
        status_code=pa.array(spans[k.CODE].copy()),
        status_message=text(k.MSG_S),
        scope_index=pa.array(spans[k.SCOPE].astype(np.int32)),
        resource_index=pa.array(spans[k.RESOURCE].astype(np.int32)),
        attr_counts=spans[k.ATTR_COUNT],
        attr_keys=attr_keys,
        attr_values=attr_values,
        attr_records=records,
        attr_types=attr_types,
        flags=uint32_column(spans[k.FLAGS]),
        dropped_attributes_count=uint32_column(spans[k.DROPPED_ATTRIBUTES]),
        dropped_events_count=uint32_column(spans[k.DROPPED_EVENTS]),
        dropped_links_count=uint32_column(spans[k.DROPPED_LINKS]),
        id_keys=keys,
        # the deduplicator's words, from the digits already read (no hex parsed back)
        span_words=np.stack((trace_key, trace_low, span_key), axis=1) if hex_ids else None,
    )
    return build_tables(arrays, extras)


def _strings(w, arena: np.ndarray, start, length, escaped: np.ndarray) -> pa.Array:
    """JSON string contents (in ``arena``) as strings, UTF-8 checked; the few with escapes are
    decoded by orjson."""
    if not escaped.any() and not length.any():  # every one empty (trace states, status messages, mostly)
        return empty_strings(start.size)
    offsets, chars = w.gather(arena, np.ascontiguousarray(start), np.ascontiguousarray(length))
    strings = pa.Array.from_buffers(pa.large_string(), start.size, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])
    strings.validate(full=True)  # UTF-8
    if not escaped.any():
        return strings
    rows = np.flatnonzero(escaped)
    decoded = [orjson.loads(b'"' + arena[s : s + n].tobytes() + b'"') for s, n in zip(start[rows].tolist(), length[rows].tolist())]
    index = np.arange(start.size)
    index[rows] = start.size + np.arange(rows.size)
    return pa.concat_arrays([strings, pa.array(decoded, pa.large_string())]).take(pa.array(index))


def _ids(w, data: np.ndarray, start, length, width: int) -> tuple[pa.Array, np.ndarray | None, np.ndarray | None]:
    """Hex ids lower-cased with the uint64 keys of their first and second 8 bytes; otherwise
    (base64 ids, as protobuf's JSON mapping writes them) decoded one by one, keys left to the
    table builder."""
    start, length = np.ascontiguousarray(start), np.ascontiguousarray(length)
    offsets, chars, keys, low, ok = w.text_ids(data, start, length, width)
    if not ok:
        offsets, chars = w.gather(data, start, length)
    ids = pa.Array.from_buffers(pa.large_string(), start.size, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])
    if ok:
        return ids, keys, low
    hexed = [text_id_hex(s, width) if s else "" for s in ids.to_pylist()]  # base64, as the scan let through
    if None in hexed:
        raise ValueError("an id is not hex or base64 of its size")  # the exact path names it
    return pa.array(hexed, pa.string()), None, None


_SPECIAL = 16  # and beyond: a value decoded by orjson (see _attribute_records); past every V_* kind


def _attribute_records(k, w, buffer: bytes, arena: np.ndarray, attrs: np.ndarray) -> tuple[AttributeRecords, TypeTags]:
    """Where the scan put each attribute's key and value in the arena, for promotion to read in
    place, and each value's type tag. Rare kinds and strings with escapes are decoded by orjson
    first: their rows' kind becomes ``_SPECIAL`` + their number among those strings (-1 for
    none). ``strings()`` builds the key and value arrays instead (keys with escapes decoded)."""
    kind = attrs[k.VTYPE].copy()
    escaped = (kind == k.V_STRING) & (attrs[k.ATTR_ESCAPED] & 1 == 1)
    rows = np.flatnonzero((kind == k.V_RARE) | escaped)
    special_strings, tags = _special_values(k, buffer, arena, attrs, kind, rows)
    special_strings, special = special_rows(kind, rows, special_strings)
    special_offsets = np.zeros(len(special_strings) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in special_strings], out=special_offsets[1:])
    special_data = np.frombuffer(b"".join(special_strings), dtype=np.uint8)
    value = np.where(kind == k.V_STRING, attrs[k.VAL_S], attrs[k.VAL_INT])  # a string's start, or the number
    record_kind = np.where(special >= 0, _SPECIAL + special, kind)

    def strings() -> tuple[pa.Array, pa.Array]:
        keys = _strings(w, arena, attrs[k.KEY_S], attrs[k.KEY_N], attrs[k.ATTR_ESCAPED] & 2 == 2)
        offsets, chars, valid = w.value_strings(
            arena, kind, np.ascontiguousarray(attrs[k.VAL_S]), np.ascontiguousarray(attrs[k.VAL_N]),
            np.ascontiguousarray(attrs[k.VAL_INT]), special, special_offsets, special_data, k.V_STRING, k.V_BOOL,
            k.V_INT,
        )
        return keys, string_array(offsets, chars, valid)

    records = AttributeRecords(
        arena, np.ascontiguousarray(attrs[k.KEY_S]), np.ascontiguousarray(attrs[k.KEY_N]), record_kind, value,
        np.ascontiguousarray(attrs[k.VAL_N]), special_offsets, special_data, (k.V_STRING, k.V_BOOL, k.V_INT, _SPECIAL),
        strings,
    )
    return records, tags


def _special_values(k, buffer: bytes, arena: np.ndarray, attrs: np.ndarray, kind: np.ndarray, rows: np.ndarray):
    """The schema's strings of the ``rows`` orjson decodes (rare kinds, strings with escapes),
    and every attribute's type tag."""
    rare = np.flatnonzero(kind == k.V_RARE)
    special_strings, rare_tags = [], []
    for row in rows.tolist():
        if kind[row] == k.V_RARE:
            s, n = int(attrs[k.ANY_S, row]), int(attrs[k.ANY_N, row])
            value = orjson.loads(buffer[s : s + n])
            text = json_value_string(value)
            rare_tags.append(json_value_type(value))
        else:
            s, n = int(attrs[k.VAL_S, row]), int(attrs[k.VAL_N, row])
            text = orjson.loads(b'"' + arena[s : s + n].tobytes() + b'"')
        special_strings.append(text)
    return special_strings, value_types(kind, {k.V_BOOL: "bool", k.V_INT: "int"}, rare, rare_tags)


_SCRATCH = threading.local()


def _scratch_arena(size: int) -> np.ndarray:
    """The scan's string arena, reused by this thread from block to block (fresh pages cost a
    page fault each); only what the scan writes is read, and every output is copied out."""
    arena = getattr(_SCRATCH, "arena", None)
    if arena is None or arena.size < size:
        arena = np.empty(size, dtype=np.uint8)
        _SCRATCH.arena = arena
    return arena


def _parsed_once(buffer, records: np.ndarray, parse) -> list:
    """``parse(object text, schema URL text)`` of each record (start, length, _, URL start, URL
    length); requests from one process repeat the same resource and scope, so equal text is
    parsed once (its result is shared: read-only)."""
    out, parsed = [], {}
    for start, length, _, url_start, url_length in records.tolist():
        key = (bytes(buffer[start : start + length]), bytes(buffer[url_start : url_start + url_length]))
        fields = parsed.get(key)
        if fields is None:
            fields = parsed[key] = parse(*key)
        out.append(fields)
    return out


def _resource(text: bytes, url: bytes) -> tuple[dict, tuple]:
    resource = orjson.loads(text) if text else {}
    return resource_fields(resource or {}, _url(url))


def _scope(text: bytes, url: bytes) -> tuple:
    scope = orjson.loads(text) if text else {}
    return scope_fields(scope or {}, _url(url))


def _url(text: bytes):
    return orjson.loads(text) if text else None


def _events_and_links(buffer: bytes, events: np.ndarray, links: np.ndarray, extras: SpanColumns) -> None:
    """Events and links, parsed by orjson; ``ValueError`` for one with a bad field, which
    rejects its span: the caller sends the lines to the exact path, which names it."""
    for start, length, owner, *_ in events.tolist():
        event = orjson.loads(buffer[start : start + length])
        if event_problem(event) is not None:
            raise ValueError("an event with a bad field")
        extras.event_span.append(owner)
        extras.event_time.append(event.get("timeUnixNano") or 0)
        extras.event_name.append(event.get("name") or "")
        extras.event_dropped.append(uint32(event.get("droppedAttributesCount")))
        extend_json_attributes(extras.event_attrs, [event.get("attributes") or ()])
    for start, length, owner, *_ in links.tolist():
        link = orjson.loads(buffer[start : start + length])
        if link_problem(link) is not None:
            raise ValueError("a link with a bad field")
        extras.link_span.append(owner)
        extras.link_trace_id.append(link.get("traceId") or "")
        extras.link_span_id.append(link.get("spanId") or "")
        extras.link_trace_state.append(link.get("traceState") or "")
        extras.link_flags.append(uint32(link.get("flags")))
        extras.link_dropped.append(uint32(link.get("droppedAttributesCount")))
        extend_json_attributes(extras.link_attrs, [link.get("attributes") or ()])
