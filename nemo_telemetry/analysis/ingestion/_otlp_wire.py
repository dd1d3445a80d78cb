"""Batches of serialized ``ExportTraceServiceRequest`` straight into Arrow columns.

upb parses a request fast, but reading its spans back out through Python attribute access
costs a Python object per span and field. Instead a compiled walk (:mod:`._wire_kernel`, numba) records
where each string's bytes are, each number, and each id as uint64 keys; here the strings are
cut out of the buffer in bulk (span names dictionary-encoded, only the distinct ones copied),
ids become hex from their keys, and only rare values (doubles, bytes, arrays, key-value lists,
events, links, resources, scopes) go through upb one by one.

A request the walk does not take (groups, a length past its message, an id of odd length, a
resource, scope or attribute value given twice, a span without ids or with a timestamp of 0 or
past int64) is decoded by upb alone, which rejects the bad request or span and names it
(:func:`decode_frames_each`); what fails once the batch is walked (invalid UTF-8, a rare part
upb refuses) sends the whole batch to upb. :func:`decode_frames` raises :class:`WireError`
instead. A batch the seam (``_compiled``) keeps off the compiled path (small, numba missing or
broken, ``NEMO_TELEMETRY_COMPILED=0``) takes upb's path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from nemo_telemetry.analysis.kernels import compiled as _compiled
from nemo_telemetry.analysis.model.tree import trace_key_of
from nemo_telemetry.analysis.ingestion._columns import AttributeRecords, OtlpTables, SpanArrays, SpanColumns, build_tables, grown_records, scratch_matrix, string_array, string_offsets
from nemo_telemetry.analysis.ingestion._kernel_arrays import empty_strings, uint32_column, value_types
from nemo_telemetry.analysis.ingestion._otlp_proto import decode_proto_request, event_problem, extend_proto_attributes, link_problem, proto_resource_fields, proto_scope_fields
from nemo_telemetry.analysis.ingestion.anyvalue import proto_value_string, proto_value_type

__all__ = ["WireError", "decode_requests", "decode_frames", "decode_frames_each", "decode_batch"]

_STRING, _BOOL, _INT, _DOUBLE, _ARRAY, _KVLIST, _BYTES = 1, 2, 3, 4, 5, 6, 7  # AnyValue field numbers
_TAGS = {_BOOL: "bool", _INT: "int", _DOUBLE: "double", _BYTES: "bytes"}  # type tags by field
_SPECIAL = 16  # and beyond: a value written by upb (see _attribute_records)
_MOST_NAMES = 4096  # distinct span names a batch dictionary-encodes in the kernel


class WireError(ValueError):
    """The batch is not plain OTLP protobuf the fast path handles; decode it request by request."""


_KERNELS = ("_wire_kernel", "_strings_kernel")


def _fast_path_not_taken():
    raise WireError("fast protobuf path not taken (small batch, NEMO_TELEMETRY_COMPILED=0, or no working numba)")


def _walked(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, strict: bool) -> tuple[OtlpTables, np.ndarray]:
    """:func:`_walk` through the seam (``_compiled``): ``WireError`` when it is not taken."""
    size = int(ends[-1] - starts[0]) if len(starts) else 0
    return _compiled.run(_KERNELS, size, lambda k, s: _walk(k, s, data, starts, ends, strict), _fast_path_not_taken,
                         passes=(WireError,))


def decode_requests(payloads: list[bytes]) -> OtlpTables:
    """The tables of several serialized requests; ``WireError`` when the fast path cannot."""
    return decode_frames(*_joined(payloads))


def decode_frames(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> OtlpTables:
    """The tables of the serialized requests at ``data[starts[i]:ends[i]]`` (uint8, read-only),
    e.g. frames read straight from a length-prefixed file; ``WireError`` when the fast path
    cannot. Nothing returned keeps a view of ``data``: the caller may reuse it."""
    return _walked(data, starts, ends, strict=True)[0]


def _walk(k, s, data: np.ndarray, starts: np.ndarray, ends: np.ndarray, strict: bool) -> tuple[OtlpTables, np.ndarray]:
    """The tables of the requests the compiled walk takes, and the indices of those it does not
    (``WireError`` for the first of them when ``strict``). ``WireError`` too when the fast path
    cannot be assembled (a rare part upb cannot read)."""
    if data.flags.writeable:
        data = data.view()
        data.flags.writeable = False  # the kernels are compiled for read-only buffers
    counts = np.zeros(k.COUNTS, dtype=np.int64)
    slots = np.full(1 << (2 * _MOST_NAMES - 1).bit_length(), -1, dtype=np.int32)  # a power of two
    names = (slots, np.empty((_MOST_NAMES, 2), dtype=np.int64))
    guess = max(64, data.size // 128)  # an RL span with a few attributes takes ~150 bytes
    spans = scratch_matrix("wire-spans", k.SPAN_COLUMNS, guess)
    attrs = scratch_matrix("wire-attributes", k.ATTR_COLUMNS, 4 * guess)
    side = [np.zeros((max(16, 2 * len(starts)), k.SIDE_COLUMNS), dtype=np.int64) for _ in range(2)]
    side += [np.zeros((64, k.SIDE_COLUMNS), dtype=np.int64) for _ in range(2)]
    errors = np.zeros(len(starts), dtype=np.int64)
    request = 0
    while True:
        request, err = k.walk(data, starts, ends, request, counts, spans, attrs, *side, *names, errors)
        if err != k.E_ROOM:
            break
        spans, attrs = grown_records(spans, int(counts[0]), 1), grown_records(attrs, int(counts[1]), 1)
        side = [grown_records(a, int(c), 0) for a, c in zip(side, counts[2:6])]
    bad = np.flatnonzero(errors)
    if strict and bad.size:
        first = int(bad[0])
        raise WireError(f"request {first}: {_problem(k, int(errors[first]))}")
    n = int(counts[0])
    spans, attrs = spans[:, :n], attrs[:, : int(counts[1])]
    side = [a[: int(c)] for a, c in zip(side, counts[2:6])]
    if n == 0:
        return OtlpTables.empty(), bad
    distinct = int(counts[6])
    try:
        return _assemble(k, s, data, spans, attrs, *side, names[1][:distinct] if distinct >= 0 else None), bad
    except (DecodeError, ValueError) as exc:  # a rare part upb reads: bad UTF-8, nesting past the limit
        raise WireError(f"a resource, scope, event, link or value the fast path cannot read ({exc})") from None


def _joined(payloads: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The payloads end to end, read-only, and where each starts and ends. The buffer is this
    thread's, reused from batch to batch (a fresh one costs a page fault per 4 KiB); nothing
    returned keeps a view of it."""
    sizes = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1]) if len(payloads) else 0
    data = scratch_matrix("wire-buffer", 1, total // 8 + 1).view(np.uint8).reshape(-1)[:total]
    for payload, start, end in zip(payloads, starts.tolist(), ends.tolist()):
        data[start:end] = np.frombuffer(payload, dtype=np.uint8)
    data = data.view()
    data.flags.writeable = False  # the kernels are compiled for read-only buffers
    return data, starts, ends


def _problem(k, err: int) -> str:
    problems = {k.E_TRUNCATED: "a field runs past its message", k.E_ID: "an id of unexpected length",
                k.E_REPEATED: "a message field given twice (upb merges them)",
                k.E_SPAN: "a span without ids, or a timestamp 0 or past int64"}
    return problems.get(err, "an unsupported wire type")


def _assemble(k, s, data: np.ndarray, spans, attrs, resources, scopes, events, links, names) -> OtlpTables:
    extras = SpanColumns()
    for attributes, fields in _resources(data, resources):
        extras.resources.append(attributes)
        extras.resource_extras.append(fields)
    extras.scopes.extend(_scopes(data, scopes))
    _events_and_links(data, events, links, extras)
    trace_id, trace_high = _hex_ids(k, spans[k.TRACE_HI], spans[k.TRACE_LO], spans[k.TRACE_N], 16)
    trace_low = spans[k.TRACE_LO].view(np.uint64).copy()
    span_id, span_key = _hex_ids(k, spans[k.SPAN_K], spans[k.SPAN_K], spans[k.SPAN_N], 8)
    parent_id, parent_key = _hex_ids(k, spans[k.PARENT_K], spans[k.PARENT_K], spans[k.PARENT_N], 8)
    records, types = _attribute_records(k, s, data, attrs)
    arrays = SpanArrays(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent_id,
        trace_state=_strings(k, s, data, spans[k.STATE_S], spans[k.STATE_N]),
        name=_names(k, s, data, spans, names),
        # views of the reused matrices where the table builder reads them into new arrays
        # (enums re-encoded, owner indices gathered); copies where the column is the table's
        kind=pa.array(spans[k.KIND]),
        start_ns=pa.array(spans[k.START].copy()),
        end_ns=pa.array(spans[k.END].copy()),
        status_code=pa.array(spans[k.CODE]),
        status_message=_strings(k, s, data, spans[k.MSG_S], spans[k.MSG_N]),
        scope_index=pa.array(spans[k.SCOPE]),
        resource_index=pa.array(spans[k.RESOURCE]),
        attr_counts=spans[k.ATTR_COUNT],
        attr_records=records,
        attr_types=types,
        flags=uint32_column(spans[k.FLAGS]),
        dropped_attributes_count=uint32_column(spans[k.DROPPED_ATTRIBUTES]),
        dropped_events_count=uint32_column(spans[k.DROPPED_EVENTS]),
        dropped_links_count=uint32_column(spans[k.DROPPED_LINKS]),
        id_keys=(trace_key_of(trace_high, trace_low), span_key, parent_key, trace_low),
        # the deduplicator's words: copied (the matrix is reused), no hex parsed back
        span_words=np.stack((spans[k.TRACE_HI], spans[k.TRACE_LO], spans[k.SPAN_K]), axis=1).view(np.uint64),
    )
    return build_tables(arrays, extras)


def _strings(k, s, data: np.ndarray, start: np.ndarray, length: np.ndarray) -> pa.Array:
    """``buffer[start:start + length]`` of each element as a string array (UTF-8 checked), of
    the table's type (int32 offsets) unless its bytes need int64 offsets."""
    total = int(length.sum())
    if total == 0:  # every one empty (trace states, status messages, mostly)
        return empty_strings(length.size)
    offsets, chars = string_offsets(length.size, total), np.empty(total, dtype=np.uint8)
    s.gather_into(data, start, length, offsets, chars)  # rows of C matrices: contiguous already
    return _checked(k, offsets, chars, "a string field")


def _names(k, s, data: np.ndarray, spans: np.ndarray, names: np.ndarray | None) -> pa.Array:
    """Span names dictionary-encoded as the walk numbered them, as the spans table keeps them
    (an RL run has a few dozen distinct names): only the distinct ones (``names``: start and
    length of each) are copied and UTF-8 checked. Past ``_MOST_NAMES`` distinct names in a
    batch (``names`` None), plain strings."""
    if names is None:
        return _strings(k, s, data, spans[k.NAME_S], spans[k.NAME_N])
    words = _strings(k, s, data, names[:, 0].copy(), names[:, 1].copy()).cast(pa.string())
    return pa.DictionaryArray.from_arrays(pa.array(spans[k.NAME_CODE].astype(np.int32)), words, safe=False)


def _checked(k, offsets: np.ndarray, chars: np.ndarray, what: str, valid: np.ndarray | None = None) -> pa.Array:
    """A string array over a kernel's output. Plain ASCII needs no UTF-8 check (the offsets are
    right by construction); anything else gets Arrow's full one, ``WireError`` when it fails."""
    if not k.is_ascii(chars):
        try:
            return string_array(offsets, chars, valid)
        except pa.ArrowInvalid as exc:
            raise WireError(f"invalid UTF-8 in {what} ({exc})") from None
    bitmap = None if valid is None or valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    kind = pa.string() if offsets.dtype == np.int32 else pa.large_string()
    return pa.Array.from_buffers(kind, offsets.size - 1, [bitmap, pa.py_buffer(offsets), pa.py_buffer(chars)])


def _hex_ids(k, high: np.ndarray, low: np.ndarray, length: np.ndarray, width: int) -> tuple[pa.Array, np.ndarray]:
    """Lowercase hex of each id ("" where absent) from the walk's keys, as the schema's string
    type (int32 offsets, so no cast copies it later), and its uint64 key (a copy: the walk's
    matrix is reused)."""
    small = length.size * 2 * width < 2**31
    offsets = np.empty(length.size + 1, dtype=np.int32 if small else np.int64)
    text = k.hex_ids(high, low, length, width, offsets)
    kind = pa.string() if small else pa.large_string()
    strings = pa.Array.from_buffers(kind, length.size, [None, pa.py_buffer(offsets), pa.py_buffer(text)])
    return strings, high.view(np.uint64).copy()


def _attribute_records(k, s, data: np.ndarray, attrs: np.ndarray) -> tuple[AttributeRecords, pa.Array]:
    """Where the walk found each attribute's key and value, for promotion to read in place, and
    each value's type tag. Doubles, bytes, arrays and key-value lists (rare in RL traces) are
    written by upb first: their rows' kind becomes ``_SPECIAL`` + their number among those
    strings (-1 for none)."""
    kind = attrs[k.VTYPE]  # changed in place: the matrix is scratch, not read again
    rows = np.flatnonzero(kind >= _DOUBLE)
    first = attrs[k.ANY_S][rows]
    bounds = zip(first.tolist(), (first + attrs[k.ANY_N][rows]).tolist())
    values = [AnyValue.FromString(data[s:e].tobytes()) for s, e in bounds]
    rare = [proto_value_string(value) for value in values]
    # by the AnyValue field the walk saw; arrays and lists by what they hold (upb read them)
    composite = np.flatnonzero((kind[rows] == _ARRAY) | (kind[rows] == _KVLIST))
    types = value_types(kind, _TAGS, rows[composite], [proto_value_type(values[i]) for i in composite.tolist()])
    present = np.array([text is not None for text in rare], dtype=np.bool_)
    kind[rows[~present]] = -1
    kind[rows[present]] = _SPECIAL + np.arange(int(present.sum()))
    rare = [text.encode() for text in rare if text is not None]
    rare_offsets = np.zeros(len(rare) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rare], out=rare_offsets[1:])
    rare_data = np.frombuffer(b"".join(rare), dtype=np.uint8)
    value = attrs[k.VAL]  # a string's start, or an int's or bool's value

    def strings() -> tuple[pa.Array, pa.Array]:
        """The key and value string arrays (UTF-8 checked), where promotion needs them."""
        keys = _strings(k, s, data, attrs[k.KEY_S], attrs[k.KEY_N])
        special = np.where(kind >= _SPECIAL, kind - _SPECIAL, -1)
        offsets, chars, valid = s.value_strings(
            data, kind, value, attrs[k.VAL_N], value, special, rare_offsets, rare_data, _STRING, _BOOL, _INT,
        )
        return keys, _checked(k, offsets, chars, "a string value", valid)

    return AttributeRecords(
        data, attrs[k.KEY_S], attrs[k.KEY_N], kind, value, attrs[k.VAL_N], rare_offsets, rare_data,
        (_STRING, _BOOL, _INT, _SPECIAL), strings,
    ), types


def _resources(data: np.ndarray, records: np.ndarray) -> list[tuple[dict, tuple]]:
    """Each resource's attributes and fields beside them (``proto_resource_fields``); requests
    from one process repeat the same resource, so equal bytes are parsed once (their dict is
    shared: read-only)."""
    out, parsed = [], {}
    for start, length, _, url_start, url_length in records.tolist():
        raw = data[start : start + length].tobytes()
        url = data[url_start : url_start + url_length].tobytes().decode()
        fields = parsed.get((raw, url))
        if fields is None:
            fields = parsed[(raw, url)] = proto_resource_fields(Resource.FromString(raw), url)
        out.append(fields)
    return out


def _scopes(data: np.ndarray, records: np.ndarray) -> list[tuple]:
    """Each scope's fields (``proto_scope_fields``); equal bytes are parsed once, as resources."""
    out, parsed = [], {}
    for start, length, _, url_start, url_length in records.tolist():
        raw = data[start : start + length].tobytes()
        url = data[url_start : url_start + url_length].tobytes()
        fields = parsed.get((raw, url))
        if fields is None:
            fields = parsed[(raw, url)] = proto_scope_fields(InstrumentationScope.FromString(raw), url.decode())
        out.append(fields)
    return out


def _events_and_links(data: np.ndarray, events: np.ndarray, links: np.ndarray, extras: SpanColumns) -> None:
    """Events and links are rare in RL traces: upb parses each one."""
    for owner, start, length, *_ in events.tolist():
        event = Span.Event.FromString(data[start : start + length].tobytes())
        if event_problem(event) is not None:
            raise WireError("an event with a bad field")  # upb's path rejects its span, named
        extras.event_span.append(owner)
        extras.event_time.append(event.time_unix_nano)
        extras.event_name.append(event.name)
        extras.event_dropped.append(event.dropped_attributes_count)
        extend_proto_attributes(extras.event_attrs, [event.attributes])
    for owner, start, length, *_ in links.tolist():
        link = Span.Link.FromString(data[start : start + length].tobytes())
        if link_problem(link) is not None:
            raise WireError("a link with a bad field")
        extras.link_span.append(owner)
        extras.link_trace_id.append(link.trace_id)
        extras.link_span_id.append(link.span_id)
        extras.link_trace_state.append(link.trace_state)
        extras.link_flags.append(link.flags)
        extras.link_dropped.append(link.dropped_attributes_count)
        extend_proto_attributes(extras.link_attrs, [link.attributes])


def decode_batch(payloads: list[bytes], rejected_spans: list | None = None) -> tuple[OtlpTables, list[tuple[int, str]]]:
    """Decode serialized requests, fast path first; also (index, problem) of each rejected
    request. Each span rejected alone for a bad field (its request's other spans kept) is
    added to ``rejected_spans`` as (index, problem), when given.

    What the fast path cannot take, upb decodes request by request (see
    :func:`decode_frames_each`), so one bad request (or span) is rejected and named while the
    others are kept.
    """
    rejected: list = []
    tables = decode_frames_each(*_joined(payloads), rejected, rejected_spans)
    return tables, rejected


def decode_frames_each(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, rejected: list,
                       rejected_spans: list | None = None) -> OtlpTables:
    """:func:`decode_frames` for the requests the compiled walk takes, and upb for each one it
    does not (for all of them when the batch cannot be assembled): one odd request costs the
    fast path only itself. Rejections go to ``rejected`` (whole requests) and
    ``rejected_spans`` as (index, problem)."""
    try:
        tables, bad = _walked(data, starts, ends, strict=False)
    except WireError:
        return _upb_each(data, starts, ends, range(len(starts)), rejected, rejected_spans)
    if not bad.size:
        return tables
    return OtlpTables.concat([tables, _upb_each(data, starts, ends, bad.tolist(), rejected, rejected_spans)])


def _upb_each(data, starts, ends, indices, rejected: list, rejected_spans: list | None) -> OtlpTables:
    """upb's tables of the requests ``indices``, each bad one (or bad span) named by index."""
    cols = SpanColumns()
    for index in indices:
        mark = cols.mark()
        try:
            decode_proto_request(data[starts[index] : ends[index]].tobytes(), cols)
        except (ValueError, RecursionError) as exc:
            cols.rollback(mark)
            rejected.append((index, str(exc)))
        if rejected_spans is not None:
            rejected_spans.extend((index, problem) for problem in cols.rejected[mark["rejected"] :])
    return cols.to_tables()
