"""The protobuf walk of ``ExportTraceServiceRequest`` batches, compiled with numba.

One sequential pass over the bytes records, per span and per attribute, where each string
lies in the buffer (offset and length), each number's value, each id as big-endian uint64
keys, and each span name's index among the batch's distinct names; nothing else. Python then
cuts strings and converts columns in bulk (``_otlp_wire``).
One pass: the arrays are sized from a guess, and a request that does not fit is walked again
after the caller grows them.

Each message is read field by field on its tag: every field we read has a number below 16, so
its tag and (mostly) its length are one byte each, read inline; longer varints and fields we do
not read go through the generic path, so any valid encoding, in any field order, reads as upb
reads it. Field numbers are from ``opentelemetry/proto/{collector/trace,trace,common,resource}/v1``.
A request with an error (a negative code) adds nothing and is left to upb, as is one with a
span with a bad field (E_SPAN), which the upb path rejects alone and names.

The walk's functions are compiled without reference counting (``_nrt=False``, as numba's own
string kernels are): every array is borrowed from the caller for the whole call, and counting
each pass of an array to a helper cost a third of the walk.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit
from numba.core import types
from numba.extending import intrinsic

from nemo_telemetry.analysis.kernels._words import load8 as _load64

if sys.byteorder != "little":  # the word loads below read little-endian
    raise ImportError("the compiled protobuf walk needs a little-endian machine")

# error codes; a read that runs past its message returns position -1, which is E_TRUNCATED
OK = 0
E_TRUNCATED = -1  # a length or varint runs past its message
E_WIRE_TYPE = -2  # groups (3, 4), an unknown wire type or field number 0
E_ROOM = -3  # an output array is full: grow it and walk the request again
E_ID = -4  # a trace or span id of another length than 16 or 8 bytes
E_REPEATED = -5  # a resource, scope or attribute value given twice: protobuf merges them, upb does
E_SPAN = -6  # a span without a trace or span id, or a start or end of 0 (absent) or past int64
_INT64_MAX = np.uint64(0x7FFFFFFFFFFFFFFF)

# span columns: rows of an int64 (SPAN_COLUMNS, spans) matrix, so each column is contiguous.
# Ids are big-endian uint64 keys (a trace id's two halves) with their length (0: absent);
# NAME_CODE is the name's index among the batch's distinct names (see _name_code).
(TRACE_HI, TRACE_LO, TRACE_N, SPAN_K, SPAN_N, PARENT_K, PARENT_N, STATE_S, STATE_N, NAME_S, NAME_N,
 NAME_CODE, KIND, START, END, CODE, MSG_S, MSG_N, SCOPE, RESOURCE, ATTR_COUNT,
 FLAGS, DROPPED_ATTRIBUTES, DROPPED_EVENTS, DROPPED_LINKS) = range(25)
SPAN_COLUMNS = 25
# counts: spans, attributes, resource spans, scope spans, events, links, distinct names
COUNTS = 7
# attribute columns: rows of an (ATTR_COLUMNS, attributes) matrix. VTYPE is the AnyValue field
# number (0: none); VAL is a string's start or an int's or bool's value; ANY_S/ANY_N bound the
# AnyValue message, set only for the kinds upb reads (VTYPE 4 and up: a string, int or bool
# value leaves them as they were, so those rows of a reused matrix are rarely touched).
KEY_S, KEY_N, VTYPE, VAL, VAL_N, ANY_S, ANY_N = range(7)
ATTR_COLUMNS = 7
# side records: resources and scopes (start, length, owner, schema URL start, schema URL length),
# events and links (span, start, length)
SIDE_COLUMNS = 5

# one-byte tags, (field number << 3) | wire type, named by field number and wire type
_T1_LEN, _T2_LEN, _T3_LEN, _T4_LEN, _T5_LEN, _T6_LEN, _T7_LEN = 0x0A, 0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A
_T9_LEN, _T11_LEN, _T13_LEN, _T15_LEN = 0x4A, 0x5A, 0x6A, 0x7A
_T2_VARINT, _T3_VARINT, _T6_VARINT = 0x10, 0x18, 0x30
_T10_VARINT, _T12_VARINT, _T14_VARINT = 0x50, 0x60, 0x70
_TAG16_FIXED32 = (16 << 3) | 5  # a two-byte tag (0x85 0x01), read as this number
_T4_FIXED64, _T7_FIXED64, _T8_FIXED64 = 0x21, 0x39, 0x41


@intrinsic
def _byteswap(typingctx, value):
    """A uint64 with its bytes reversed: big-endian ids read as numbers."""

    def codegen(context, builder, signature, args):
        return builder.bswap(args[0])

    return types.uint64(value), codegen


@njit(cache=True, nogil=True, _nrt=False)
def _long_varint(buf, pos, end):
    """(value, next position) of a varint of any length; next position -1 past ``end``."""
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


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _varint(buf, pos, end):
    """(value, next position), a one-byte varint read inline; next position -1 past ``end``."""
    if pos < end and buf[pos] < 0x80:
        return np.uint64(buf[pos]), pos + 1
    return _long_varint(buf, pos, end)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _tag(buf, pos, end):
    """(tag, next position) of the field at ``pos < end``; (-1, -1) when it runs past ``end``."""
    byte = buf[pos]
    if byte < 0x80:
        return np.int64(byte), pos + 1
    tag, pos = _long_varint(buf, pos, end)
    return (np.int64(tag), pos) if pos >= 0 else (np.int64(-1), pos)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _length(buf, pos, end):
    """(value start, value end) of the length-delimited value at ``pos``; (-1, -1) past ``end``."""
    if pos < end and buf[pos] < 0x80:
        stop = pos + 1 + np.int64(buf[pos])
        if stop > end:
            return np.int64(-1), np.int64(-1)
        return pos + 1, stop
    length, start = _long_varint(buf, pos, end)
    if start < 0 or length > np.uint64(end - start):
        return np.int64(-1), np.int64(-1)
    return start, start + np.int64(length)


@njit(cache=True, nogil=True, _nrt=False)
def _tag_at(buf, pos, end):
    """:func:`_tag` as a call, for paths rarely taken (inlining everywhere costs compile time)."""
    return _tag(buf, pos, end)


@njit(cache=True, nogil=True, _nrt=False)
def _length_at(buf, pos, end):
    """:func:`_length` as a call, for paths rarely taken."""
    return _length(buf, pos, end)


@njit(cache=True, nogil=True, _nrt=False)
def _varint_at(buf, pos, end):
    """:func:`_varint` as a call, for paths rarely taken."""
    return _varint(buf, pos, end)


@njit(cache=True, nogil=True, _nrt=False)
def _skip(buf, pos, end, tag):
    """The position after the value of a field not read, its ``tag`` ending at ``pos``; < 0 on error."""
    if tag < 8:  # a failed tag read (-1) or field number 0, which protobuf forbids
        return E_TRUNCATED if tag < 0 else E_WIRE_TYPE
    wire = tag & 7
    if wire == 0:
        value, pos = _varint(buf, pos, end)
        return pos
    if wire == 2:
        start, stop = _length(buf, pos, end)
        return stop
    if wire == 1 or wire == 5:
        stop = pos + (8 if wire == 1 else 4)
        return stop if stop <= end else E_TRUNCATED
    return E_WIRE_TYPE


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _usual_key_value(buf, start, end):
    """The KeyValue ``[start, end)`` read straight when it has the usual shape: a key, then a
    value holding one string, int or bool, one-byte tags and lengths. Returns (usual, key
    start, key length, value type, value, value length, AnyValue start); ``usual`` False for
    any other shape, which the generic loop reads."""
    if end - start < 4 or buf[start] != _T1_LEN or buf[start + 1] >= 0x80:
        return False, 0, 0, 0, 0, 0, 0
    key_n = np.int64(buf[start + 1])
    at = start + 2 + key_n  # the value's tag
    if at + 4 > end or buf[at] != _T2_LEN or buf[at + 1] >= 0x80 or at + 2 + np.int64(buf[at + 1]) != end:
        return False, 0, 0, 0, 0, 0, 0
    any_s = at + 2
    tag = buf[any_s]
    if tag == _T1_LEN and buf[any_s + 1] < 0x80 and any_s + 2 + np.int64(buf[any_s + 1]) == end:
        return True, start + 2, key_n, 1, any_s + 2, end - any_s - 2, any_s
    if tag == _T3_VARINT or tag == _T2_VARINT:
        value, pos = _varint(buf, any_s + 1, end)
        if pos == end:
            return True, start + 2, key_n, np.int64(tag >> 3), np.int64(value), 0, any_s
    return False, 0, 0, 0, 0, 0, 0


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _key_value(buf, start, end, attrs, a):
    """Fill attribute row ``a`` from the KeyValue message ``[start, end)``; OK or an error."""
    usual, key_s, key_n, vtype, val, val_n, any_s = _usual_key_value(buf, start, end)
    if usual:
        attrs[KEY_S, a] = key_s
        attrs[KEY_N, a] = key_n
        attrs[VTYPE, a] = vtype
        attrs[VAL, a] = val
        attrs[VAL_N, a] = val_n
        return OK  # ANY_S/ANY_N unset: only the kinds upb reads need them (untouched scratch)
    key_s, key_n, vtype, val, val_n, any_s, any_n = start, 0, 0, 0, 0, start, 0
    has_value = False
    pos = start
    while pos < end:
        tag, pos = _tag_at(buf, pos, end)
        if tag == _T1_LEN:
            key_s, pos = _length_at(buf, pos, end)
            key_n = pos - key_s
        elif tag == _T2_LEN:
            if has_value:
                return E_REPEATED
            has_value = True
            any_s, stop = _length_at(buf, pos, end)
            if any_s < 0:
                return E_TRUNCATED
            any_n = stop - any_s
            pos = any_s
            while pos < stop:  # the AnyValue: the last of its oneof fields wins
                tag, pos = _tag_at(buf, pos, stop)
                if tag == _T1_LEN:
                    val, pos = _length_at(buf, pos, stop)
                    vtype, val_n = 1, pos - val
                elif tag == _T2_VARINT or tag == _T3_VARINT:
                    value, pos = _varint_at(buf, pos, stop)
                    vtype, val, val_n = tag >> 3, np.int64(value), 0
                elif tag == _T4_FIXED64 or tag == _T5_LEN or tag == _T6_LEN or tag == _T7_LEN:
                    pos = _skip(buf, pos, stop, tag)  # doubles, arrays, lists, bytes: upb reads them
                    vtype = tag >> 3
                else:
                    pos = _skip(buf, pos, stop, tag)
                if pos < 0:
                    return pos
        else:
            pos = _skip(buf, pos, end, tag)
        if pos < 0:
            return pos
    attrs[KEY_S, a] = key_s
    attrs[KEY_N, a] = key_n
    attrs[VTYPE, a] = vtype
    attrs[VAL, a] = val
    attrs[VAL_N, a] = val_n
    attrs[ANY_S, a] = any_s
    attrs[ANY_N, a] = any_n
    return OK


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _enum32(value):
    """An enum's varint as protobuf reads it: an int32, its low 32 bits (upb does the same)."""
    return np.int64(np.int32(np.uint32(value & np.uint64(0xFFFFFFFF))))


@njit(cache=True, nogil=True, _nrt=False)
def _status(buf, start, end, spans, i):
    """Status fields into row ``i`` (set to their defaults first); OK or an error."""
    pos = start
    while pos < end:
        tag, pos = _tag_at(buf, pos, end)
        if tag == _T2_LEN:
            vs, pos = _length_at(buf, pos, end)
            spans[MSG_S, i] = vs
            spans[MSG_N, i] = pos - vs
        elif tag == _T3_VARINT:
            value, pos = _varint_at(buf, pos, end)
            spans[CODE, i] = _enum32(value)
        else:
            pos = _skip(buf, pos, end, tag)
        if pos < 0:
            return pos
    return OK


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _hash(buf, start, length):
    """A hash of ``buf[start:start + length]`` from its length and its first and last eight
    bytes (the probe compares whole strings, so strings alike there only probe further)."""
    h = np.uint64(length) * np.uint64(0x9E3779B97F4A7C15)
    if length >= 8:
        h ^= _load64(buf, start) * np.uint64(0xC2B2AE3D27D4EB4F)
        h ^= _load64(buf, start + length - 8) * np.uint64(0x165667B19E3779F9)
    else:
        for pos in range(start, start + length):
            h = (h ^ np.uint64(buf[pos])) * np.uint64(0x100000001B3)
    return h ^ (h >> np.uint64(29))


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _same(buf, a, b, length):
    """Whether ``buf[a:a + length] == buf[b:b + length]``."""
    k = 0
    while k + 8 <= length:
        if _load64(buf, a + k) != _load64(buf, b + k):
            return False
        k += 8
    while k < length:
        if buf[a + k] != buf[b + k]:
            return False
        k += 1
    return True


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _name_code(buf, start, length, slots, names, counts):
    """The index of the name ``buf[start:start + length]`` among the batch's distinct names in
    order of first appearance, as Arrow's ``dictionary_encode`` numbers them; a new name is added
    to ``names`` (start, length), ``slots`` being its hash table (a power of two in size, more
    than ``names`` holds, so a probe always ends). -1 once there are more distinct
    names than ``names`` holds (``counts[6]`` is then -1). A request walked again after E_ROOM
    finds its names already there, in the order it added them: the codes come out the same."""
    distinct = counts[6]
    if distinct < 0:
        return -1
    mask = np.uint64(slots.size - 1)
    slot = _hash(buf, start, length) & mask
    while True:
        code = slots[slot]
        if code < 0:
            break
        if names[code, 1] == length and _same(buf, names[code, 0], start, length):
            return np.int64(code)
        slot = (slot + np.uint64(1)) & mask
    if distinct == names.shape[0]:
        counts[6] = -1
        return -1
    slots[slot] = distinct
    names[distinct, 0] = start
    names[distinct, 1] = length
    counts[6] = distinct + 1
    return distinct


@njit(cache=True, nogil=True, _nrt=False, inline="always")  # inlined: called per span, and a call passes every array
def _span(buf, start, end, spans, i, attrs, a, events, e, links, ln, slots, names, counts):
    """Walk one Span into row ``i``; returns (attributes, events, links, error). The error
    E_ROOM means an array is full: the caller grows them and walks the request again."""
    zero = np.uint64(0)
    trace_hi, trace_lo, trace_n, span_k, span_n, parent_k, parent_n = zero, zero, 0, zero, 0, zero, 0
    state_s, state_n, name_s, name_n = start, 0, start, 0  # absent: an empty cut keeps order
    kind, begin, finish = 0, zero, zero
    spans[CODE, i] = 0
    spans[FLAGS, i] = 0
    spans[DROPPED_ATTRIBUTES, i] = 0
    spans[DROPPED_EVENTS, i] = 0
    spans[DROPPED_LINKS, i] = 0
    spans[MSG_S, i] = start
    spans[MSG_N, i] = 0
    n_attrs = 0
    n_events = 0
    n_links = 0
    pos = start
    while pos < end:
        tag, pos = _tag(buf, pos, end)
        if tag == _T9_LEN:
            vs, pos = _length(buf, pos, end)
            if vs < 0:
                return n_attrs, n_events, n_links, E_TRUNCATED
            if a + n_attrs >= attrs.shape[1]:
                return n_attrs, n_events, n_links, E_ROOM
            err = _key_value(buf, vs, pos, attrs, a + n_attrs)
            if err < 0:
                return n_attrs, n_events, n_links, err
            n_attrs += 1
        elif tag == _T1_LEN:
            vs, pos = _length(buf, pos, end)
            trace_n = pos - vs
            if trace_n == 16:
                trace_hi, trace_lo = _byteswap(_load64(buf, vs)), _byteswap(_load64(buf, vs + 8))
            elif trace_n == 0:
                trace_hi, trace_lo = zero, zero
            elif vs >= 0:
                return n_attrs, n_events, n_links, E_ID
        elif tag == _T2_LEN or tag == _T4_LEN:
            vs, pos = _length(buf, pos, end)
            n = pos - vs
            if n != 8 and n != 0 and vs >= 0:
                return n_attrs, n_events, n_links, E_ID
            key = _byteswap(_load64(buf, vs)) if n == 8 else zero
            if tag == _T2_LEN:
                span_k, span_n = key, n
            else:
                parent_k, parent_n = key, n
        elif tag == _T5_LEN:
            name_s, pos = _length(buf, pos, end)
            name_n = pos - name_s
        elif tag == _T7_FIXED64 or tag == _T8_FIXED64:
            if pos + 8 > end:
                return n_attrs, n_events, n_links, E_TRUNCATED
            if tag == _T7_FIXED64:
                begin = _load64(buf, pos)
            else:
                finish = _load64(buf, pos)
            pos += 8
        elif tag == _T6_VARINT:
            value, pos = _varint(buf, pos, end)
            kind = _enum32(value)
        elif tag == _T3_LEN:
            state_s, pos = _length(buf, pos, end)
            state_n = pos - state_s
        elif tag == _TAG16_FIXED32:
            if pos + 4 > end:
                return n_attrs, n_events, n_links, E_TRUNCATED
            spans[FLAGS, i] = np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8) | (np.int64(buf[pos + 2]) << 16) | (
                np.int64(buf[pos + 3]) << 24)
            pos += 4
        elif tag == _T10_VARINT or tag == _T12_VARINT or tag == _T14_VARINT:
            value, pos = _varint_at(buf, pos, end)
            # a uint32 as protobuf reads it: the varint's low 32 bits
            spans[DROPPED_ATTRIBUTES + (tag - _T10_VARINT) // 16, i] = np.int64(value & np.uint64(0xFFFFFFFF))
        elif tag == _T15_LEN:
            vs, pos = _length(buf, pos, end)
            if vs >= 0:
                err = _status(buf, vs, pos, spans, i)
                if err < 0:
                    return n_attrs, n_events, n_links, err
        elif tag == _T11_LEN or tag == _T13_LEN:
            vs, pos = _length(buf, pos, end)
            if vs >= 0 and tag == _T11_LEN:
                if e + n_events >= events.shape[0]:
                    return n_attrs, n_events, n_links, E_ROOM
                events[e + n_events, 0] = i
                events[e + n_events, 1] = vs
                events[e + n_events, 2] = pos - vs
                n_events += 1
            elif vs >= 0:
                if ln + n_links >= links.shape[0]:
                    return n_attrs, n_events, n_links, E_ROOM
                links[ln + n_links, 0] = i
                links[ln + n_links, 1] = vs
                links[ln + n_links, 2] = pos - vs
                n_links += 1
        else:
            pos = _skip(buf, pos, end, tag)
        if pos < 0:
            return n_attrs, n_events, n_links, pos
    # 1 <= start, end < 2**63 in one compare each: 0 wraps to the top; fixed64 past int64 is
    # legal on the wire and would wrap to a negative int64
    if trace_n != 16 or span_n != 8 or begin - np.uint64(1) >= _INT64_MAX or finish - np.uint64(1) >= _INT64_MAX:
        return n_attrs, n_events, n_links, E_SPAN
    spans[TRACE_HI, i] = trace_hi
    spans[TRACE_LO, i] = trace_lo
    spans[TRACE_N, i] = trace_n
    spans[SPAN_K, i] = span_k
    spans[SPAN_N, i] = span_n
    spans[PARENT_K, i] = parent_k
    spans[PARENT_N, i] = parent_n
    spans[STATE_S, i] = state_s
    spans[STATE_N, i] = state_n
    spans[NAME_S, i] = name_s
    spans[NAME_N, i] = name_n
    spans[NAME_CODE, i] = _name_code(buf, name_s, name_n, slots, names, counts)
    spans[KIND, i] = kind
    spans[START, i] = begin
    spans[END, i] = finish
    spans[ATTR_COUNT, i] = n_attrs
    return n_attrs, n_events, n_links, OK


@njit(cache=True, nogil=True, _nrt=False)
def _request(buf, pos, end, request, counts, spans, attrs, resources, scopes, events, links, slots, names):
    """Walk one request; ``counts`` (spans, attributes, resource spans, scope spans, events,
    links) advance only when all of it fit. Returns OK or an error code."""
    i, a, r, s, e, ln = counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]
    while pos < end:
        tag, pos = _tag_at(buf, pos, end)
        if tag != _T1_LEN:  # resource_spans
            pos = _skip(buf, pos, end, tag)
            if pos < 0:
                return pos
            continue
        rpos, pos = _length_at(buf, pos, end)
        if rpos < 0:
            return E_TRUNCATED
        if r >= resources.shape[0]:
            return E_ROOM
        resources[r, 0], resources[r, 1], resources[r, 2] = rpos, -1, request
        resources[r, 3], resources[r, 4] = rpos, 0
        rs_end = pos
        while rpos < rs_end:
            tag, rpos = _tag_at(buf, rpos, rs_end)
            if tag == _T1_LEN:  # resource
                if resources[r, 1] >= 0:
                    return E_REPEATED
                vs, rpos = _length_at(buf, rpos, rs_end)
                resources[r, 0], resources[r, 1] = vs, rpos - vs
            elif tag == _T3_LEN:  # schema_url (the last one given wins, as protobuf reads it)
                vs, rpos = _length_at(buf, rpos, rs_end)
                resources[r, 3], resources[r, 4] = vs, rpos - vs
            elif tag == _T2_LEN:  # scope_spans
                spos, rpos = _length_at(buf, rpos, rs_end)
                if spos < 0:
                    return E_TRUNCATED
                if s >= scopes.shape[0]:
                    return E_ROOM
                scopes[s, 0], scopes[s, 1], scopes[s, 2] = spos, -1, r
                scopes[s, 3], scopes[s, 4] = spos, 0
                ss_end = rpos
                while spos < ss_end:
                    tag, spos = _tag(buf, spos, ss_end)
                    if tag == _T1_LEN:  # scope
                        if scopes[s, 1] >= 0:
                            return E_REPEATED
                        vs, spos = _length_at(buf, spos, ss_end)
                        scopes[s, 0], scopes[s, 1] = vs, spos - vs
                    elif tag == _T3_LEN:  # schema_url
                        vs, spos = _length_at(buf, spos, ss_end)
                        scopes[s, 3], scopes[s, 4] = vs, spos - vs
                    elif tag == _T2_LEN:  # span
                        vs, spos = _length(buf, spos, ss_end)
                        if vs < 0:
                            return E_TRUNCATED
                        if i >= spans.shape[1]:
                            return E_ROOM
                        na, ne, nl, err = _span(buf, vs, spos, spans, i, attrs, a, events, e, links, ln, slots, names, counts)
                        if err < 0:
                            return err
                        spans[SCOPE, i] = s
                        spans[RESOURCE, i] = r
                        i += 1
                        a += na
                        e += ne
                        ln += nl
                    else:
                        spos = _skip(buf, spos, ss_end, tag)
                    if spos < 0:
                        return spos
                scopes[s, 1] = max(scopes[s, 1], 0)
                s += 1
            else:
                rpos = _skip(buf, rpos, rs_end, tag)
            if rpos < 0:
                return rpos
        resources[r, 1] = max(resources[r, 1], 0)
        r += 1
    counts[0], counts[1], counts[2], counts[3], counts[4], counts[5] = i, a, r, s, e, ln
    return OK


@njit(cache=True, nogil=True, _nrt=False)
def walk(buf, starts, ends, first, counts, spans, attrs, resources, scopes, events, links, slots, names, errors):
    """Record every span of the requests from ``first`` on, ``counts`` advancing with each;
    span names are numbered as they come (``slots``, ``names``: see :func:`_name_code`). A
    request the walk cannot take adds nothing and gets its error code in ``errors`` (OK for
    the others): the caller decodes those with upb.

    Returns (next request, error): next request is ``starts.size`` when all are done; with
    E_ROOM it is the request that did not fit (grow the arrays and call again from there).
    """
    for request in range(first, starts.size):
        err = _request(buf, starts[request], ends[request], request, counts, spans, attrs, resources, scopes,
                       events, links, slots, names)
        if err == E_ROOM:
            return request, err
        errors[request] = err
    return starts.size, OK


# the two lowercase hex characters of each byte as one little-endian 16-bit word
_HEX_PAIRS = np.frombuffer("".join(f"{byte:02x}" for byte in range(256)).encode(), dtype="<u2").astype(np.uint64)


@njit(cache=True, nogil=True)
def hex_ids(high, low, lengths, width, offsets):
    """Lowercase hex of ids given as big-endian uint64 keys ("" where ``lengths`` is 0); the
    second key ``low`` is read for 16-byte ids only. Fills ``offsets`` (n + 1, int32 or int64,
    the caller's choice) and returns the uint8 text."""
    n = lengths.size
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] = offsets[i] + (2 * width if lengths[i] != 0 else 0)
    words = np.empty(offsets[n] // 8, dtype=np.uint64)  # 8 characters a word: 4 bytes of key
    pairs = _HEX_PAIRS
    for i in range(n):
        if lengths[i] == 0:
            continue
        out = np.uint64(offsets[i] // 8)
        for half in range(np.uint64(width // 8)):
            key = np.uint64(high[i] if half == 0 else low[i])
            for w in range(np.uint64(2)):
                word = np.uint64(0)
                for j in range(np.uint64(4)):  # the key's bytes from the top
                    shift = np.uint64(56) - np.uint64(8) * j - np.uint64(32) * w
                    word |= pairs[(key >> shift) & np.uint64(0xFF)] << (np.uint64(16) * j)
                words[out] = word
                out += np.uint64(1)
    return words.view(np.uint8)


@njit(cache=True, nogil=True)
def is_ascii(chars):
    """Whether every byte is below 0x80: such text is valid UTF-8 without a closer look."""
    seen = np.uint8(0)
    for i in range(chars.size):
        seen |= chars[i]
    return seen < 0x80
