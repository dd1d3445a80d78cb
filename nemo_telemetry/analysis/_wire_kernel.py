"""The protobuf walk of ``ExportTraceServiceRequest`` batches, compiled with numba.

One sequential pass over the bytes records, per span and per attribute, where each field's
value lies in the buffer (offset and length) or its integer value; nothing else. Python then
cuts strings and converts columns in bulk (``_otlp_wire``). One pass: the arrays are sized
from a guess, and a request that does not fit is walked again after the caller grows them.

Field numbers are from ``opentelemetry/proto/{collector/trace,trace,common,resource}/v1``.
An error returns a negative code and the caller falls back to upb request by request.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# error codes
OK = 0
E_TRUNCATED = -1  # a length or varint runs past its message
E_WIRE_TYPE = -2  # groups (3, 4) or an unknown wire type
E_ROOM = -3  # an output array is full: grow it and walk the request again

# span columns: rows of an int64 (SPAN_COLUMNS, spans) matrix, so each column is contiguous
(TRACE_S, TRACE_N, SPAN_S, SPAN_N, PARENT_S, PARENT_N, STATE_S, STATE_N, NAME_S, NAME_N, KIND,
 START, END, CODE, MSG_S, MSG_N, SCOPE, RESOURCE, ATTR_FIRST, ATTR_COUNT) = range(20)
SPAN_COLUMNS = 20
# Span fields 1-5 (trace_id, span_id, trace_state, parent_span_id, name): their start columns
_ID_COLUMNS = np.array([TRACE_S, SPAN_S, STATE_S, PARENT_S, NAME_S], dtype=np.int64)
# attribute columns: rows of an (ATTR_COLUMNS, attributes) matrix
KEY_S, KEY_N, VTYPE, VAL_S, VAL_N, VAL_INT, ANY_S, ANY_N = range(8)
ATTR_COLUMNS = 8
# side records: resources and scopes (start, length, owner), events and links (span, start, length)
SIDE_COLUMNS = 3


@njit(cache=True, nogil=True, inline="always")
def _varint(buf, pos, end):
    """(value, next position); next position -1 when it runs past ``end``."""
    if pos < end and buf[pos] < 0x80:
        return np.uint64(buf[pos]), pos + 1
    result = np.uint64(0)
    shift = np.uint64(0)
    while pos < end:
        byte = np.uint64(buf[pos])
        pos += 1
        result |= (byte & np.uint64(0x7F)) << shift
        if byte < np.uint64(0x80):
            return result, pos
        shift += np.uint64(7)
        if shift > np.uint64(63):
            return result, np.int64(-1)
    return result, np.int64(-1)


@njit(cache=True, nogil=True, inline="always")
def _field(buf, pos, end):
    """(number, wire type, value start, value end, varint value, next position or error)."""
    tag, pos = _varint(buf, pos, end)
    if pos < 0:
        return 0, 0, 0, 0, np.uint64(0), E_TRUNCATED
    wire = np.int64(tag & np.uint64(7))
    number = np.int64(tag >> np.uint64(3))
    if wire == 2:
        length, start = _varint(buf, pos, end)
        if start < 0 or length > np.uint64(end - start):
            return 0, 0, 0, 0, np.uint64(0), E_TRUNCATED
        stop = start + np.int64(length)
        return number, wire, start, stop, length, stop
    if wire == 0:
        value, nxt = _varint(buf, pos, end)
        if nxt < 0:
            return 0, 0, 0, 0, np.uint64(0), E_TRUNCATED
        return number, wire, pos, nxt, value, nxt
    if wire == 1 or wire == 5:
        stop = pos + (8 if wire == 1 else 4)
        if stop > end:
            return 0, 0, 0, 0, np.uint64(0), E_TRUNCATED
        return number, wire, pos, stop, np.uint64(0), stop
    return 0, 0, 0, 0, np.uint64(0), E_WIRE_TYPE


@njit(cache=True, nogil=True)
def _fixed64(buf, pos):
    value = np.uint64(0)
    for k in range(8):
        value |= np.uint64(buf[pos + k]) << np.uint64(8 * k)
    return np.int64(value)


@njit(cache=True, nogil=True)
def _any_value(buf, start, end, attrs, a):
    """Fill attribute row ``a`` from the AnyValue message ``[start, end)``."""
    attrs[ANY_S, a] = start
    attrs[ANY_N, a] = end - start
    pos = start
    while pos < end:
        number, wire, vs, ve, value, pos = _field(buf, pos, end)
        if pos < 0:
            return pos
        attrs[VTYPE, a] = number if 1 <= number <= 7 else 0
        attrs[VAL_S, a] = vs
        attrs[VAL_N, a] = ve - vs
        if wire == 0:
            attrs[VAL_INT, a] = np.int64(value)
        elif wire == 1:
            attrs[VAL_INT, a] = _fixed64(buf, vs)
    return OK


@njit(cache=True, nogil=True)
def _key_value(buf, start, end, attrs, a):
    for column in range(ATTR_COLUMNS):  # the arrays are reused: every field starts afresh
        attrs[column, a] = 0
    attrs[KEY_S, a] = start
    attrs[ANY_S, a] = start
    pos = start
    while pos < end:
        number, wire, vs, ve, value, pos = _field(buf, pos, end)
        if pos < 0:
            return pos
        if number == 1 and wire == 2:
            attrs[KEY_S, a] = vs
            attrs[KEY_N, a] = ve - vs
        elif number == 2 and wire == 2:
            err = _any_value(buf, vs, ve, attrs, a)
            if err < 0:
                return err
    return OK


@njit(cache=True, nogil=True)
def _status(buf, start, end, spans, i):
    pos = start
    while pos < end:
        number, wire, vs, ve, value, pos = _field(buf, pos, end)
        if pos < 0:
            return pos
        if number == 2 and wire == 2:
            spans[MSG_S, i] = vs
            spans[MSG_N, i] = ve - vs
        elif number == 3 and wire == 0:
            spans[CODE, i] = np.int64(value)
    return OK


@njit(cache=True, nogil=True)
def _span(buf, start, end, spans, i, attrs, a, events, e, links, ln):
    """Walk one Span into row ``i``; returns (attributes, events, links, error). The error
    E_ROOM means an array is full: the caller grows them and walks the request again."""
    for column in range(SPAN_COLUMNS):  # the arrays are reused: every field starts afresh
        spans[column, i] = 0
    for column in _ID_COLUMNS:
        spans[column, i] = start  # absent: an empty cut at the span's start keeps order
    spans[MSG_S, i] = start
    spans[ATTR_FIRST, i] = a
    n_attrs = 0
    n_events = 0
    n_links = 0
    pos = start
    while pos < end:
        number, wire, vs, ve, value, pos = _field(buf, pos, end)
        if pos < 0:
            return n_attrs, n_events, n_links, pos
        if number == 9 and wire == 2:
            if a + n_attrs >= attrs.shape[1]:
                return n_attrs, n_events, n_links, E_ROOM
            err = _key_value(buf, vs, ve, attrs, a + n_attrs)
            if err < 0:
                return n_attrs, n_events, n_links, err
            n_attrs += 1
        elif wire == 2 and 1 <= number <= 5:
            column = _ID_COLUMNS[number - 1]
            spans[column, i] = vs
            spans[column + 1, i] = ve - vs
        elif number == 7 and wire == 1:
            spans[START, i] = _fixed64(buf, vs)
        elif number == 8 and wire == 1:
            spans[END, i] = _fixed64(buf, vs)
        elif number == 6 and wire == 0:
            spans[KIND, i] = np.int64(value)
        elif number == 15 and wire == 2:
            err = _status(buf, vs, ve, spans, i)
            if err < 0:
                return n_attrs, n_events, n_links, err
        elif number == 11 and wire == 2:
            if e + n_events >= events.shape[0]:
                return n_attrs, n_events, n_links, E_ROOM
            events[e + n_events, 0] = i
            events[e + n_events, 1] = vs
            events[e + n_events, 2] = ve - vs
            n_events += 1
        elif number == 13 and wire == 2:
            if ln + n_links >= links.shape[0]:
                return n_attrs, n_events, n_links, E_ROOM
            links[ln + n_links, 0] = i
            links[ln + n_links, 1] = vs
            links[ln + n_links, 2] = ve - vs
            n_links += 1
    spans[ATTR_COUNT, i] = n_attrs
    return n_attrs, n_events, n_links, OK


@njit(cache=True, nogil=True)
def _request(buf, pos, end, request, counts, spans, attrs, resources, scopes, events, links):
    """Walk one request; ``counts`` (spans, attributes, resource spans, scope spans, events,
    links) advance only when all of it fit. Returns OK or an error code."""
    i, a, r, s, e, ln = counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]
    while pos < end:
        number, wire, rs_start, rs_end, value, pos = _field(buf, pos, end)
        if pos < 0:
            return pos
        if number != 1 or wire != 2:
            continue
        if r >= resources.shape[0]:
            return E_ROOM
        resources[r, 0] = rs_start
        resources[r, 1] = 0
        resources[r, 2] = request
        rpos = rs_start
        while rpos < rs_end:
            number, wire, ss_start, ss_end, value, rpos = _field(buf, rpos, rs_end)
            if rpos < 0:
                return rpos
            if number == 1 and wire == 2:
                resources[r, 0] = ss_start
                resources[r, 1] = ss_end - ss_start
            if number != 2 or wire != 2:
                continue
            if s >= scopes.shape[0]:
                return E_ROOM
            scopes[s, 0] = ss_start
            scopes[s, 1] = 0
            scopes[s, 2] = r
            spos = ss_start
            while spos < ss_end:
                number, wire, vs, ve, value, spos = _field(buf, spos, ss_end)
                if spos < 0:
                    return spos
                if number == 1 and wire == 2:
                    scopes[s, 0] = vs
                    scopes[s, 1] = ve - vs
                if number != 2 or wire != 2:
                    continue
                if i >= spans.shape[1]:
                    return E_ROOM
                na, ne, nl, err = _span(buf, vs, ve, spans, i, attrs, a, events, e, links, ln)
                if err < 0:
                    return err
                spans[SCOPE, i] = s
                spans[RESOURCE, i] = r
                i += 1
                a += na
                e += ne
                ln += nl
            s += 1
        r += 1
    counts[0], counts[1], counts[2], counts[3], counts[4], counts[5] = i, a, r, s, e, ln
    return OK


@njit(cache=True, nogil=True)
def walk(buf, starts, ends, first, counts, spans, attrs, resources, scopes, events, links):
    """Record every span of the requests from ``first`` on, ``counts`` advancing with each.

    Returns (next request, error): next request is ``starts.size`` when all are done; with
    E_ROOM it is the request that did not fit (grow the arrays and call again from there);
    with another error it is the malformed request.
    """
    for request in range(first, starts.size):
        err = _request(buf, starts[request], ends[request], request, counts, spans, attrs, resources, scopes,
                       events, links)
        if err < 0:
            return request, err
    return starts.size, OK


_HEX_PAIRS = np.frombuffer("".join(f"{byte:02x}" for byte in range(256)).encode(), dtype=np.uint8)


@njit(cache=True, nogil=True)
def hex_ids(buf, starts, lengths, width):
    """Lowercase hex of each id of ``width`` bytes ("" when absent) and its first 8 bytes as a
    big-endian uint64 key (0 when absent). Returns (offsets, hex, keys, ok); ``ok`` is False
    when an id has another length."""
    n = starts.size
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] = offsets[i] + (2 * width if lengths[i] == width else 0)
        if lengths[i] != width and lengths[i] != 0:
            return offsets, np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint64), False
    text = np.empty(offsets[n], dtype=np.uint8)
    keys = np.zeros(n, dtype=np.uint64)
    pairs, two, eight = _HEX_PAIRS, np.uint64(2), np.uint64(8)
    for i in range(n):
        if lengths[i] == 0:
            continue
        start, out = np.uint64(starts[i]), np.uint64(offsets[i])
        key = np.uint64(0)
        for j in range(np.uint64(width)):  # unsigned indices and a pair table: 2.5x a nibble loop
            byte = np.uint64(buf[start + j])
            text[out + two * j] = pairs[two * byte]
            text[out + two * j + np.uint64(1)] = pairs[two * byte + np.uint64(1)]
            if j < eight:
                key = (key << eight) | byte
        keys[i] = key
    return offsets, text, keys, True
