"""A compiled scan of OTLP/JSON lines (the Collector file exporter's, and ours), with numba.

``orjson`` builds a Python dict for every span and attribute, and that alone is slower than
the target; this scan builds nothing. It walks each line once, knows the OTLP layout
(camelCase names, as the Collector and protobuf's JSON mapping write them), copies each string
it needs into an arena (one region per column kind) and records where it lies there (offset and
length), or records an integer value. Python then builds the columns from the arena in bulk
(``_otlp_json_fast``): dense, in-order reads, where cutting from the block itself would miss the
cache on nearly every string. Rare parts are recorded as raw slices of the block for orjson:
resources, scopes, events, links, and attribute values that are not strings, ints or bools.

Strings are passed over eight bytes at a time (a word with no quote, backslash or control
character needs one test), read and stored as unaligned words; a span's keys, written
``"key":``, are matched as three words against a table (the key that usually comes next
first), an attribute written as writers write it (``{"key":"...","value":{"stringValue":...}}``)
is read in one go by word compares, and runs of eight digits are converted in one step.

Bytes are read as ``buf[np.uint64(pos)]``: an unsigned index spares numba's negative-index
wraparound test on every byte (about a fifth of the scan). The scan and its helpers are compiled
without reference counting (``_nrt=False``, as the protobuf walk is): every array is the
caller's for the whole call, and counting each array passed to a helper (a span passes a dozen,
an attribute several) cost most of the scan.

A line the scan does not understand (not JSON, another layout, snake_case names, ...) is
marked and left to the orjson path, which handles and reports it exactly; so is a line with a
span the scan sees is bad (a timestamp absent, 0, negative or not an integer, an id of a wrong
length, a name that is not a string): the orjson path rejects that span alone.

This module walks lines and spans; its parts are ``_json_layout`` (the matrices, arenas and key
table), ``_json_lex`` (strings and numbers) and ``_json_objects`` (keys, arrays, attributes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nemo_telemetry.analysis.kernels._json_layout import (
    LINE_OK, LINE_OTHER_SIGNAL, LINE_FALLBACK, LINE_BLANK, TRACE_S, TRACE_N, SPAN_S, SPAN_N, PARENT_S,
    PARENT_N, STATE_S, STATE_N, NAME_S, NAME_N, KIND, START, END, CODE, MSG_S, MSG_N, SCOPE, RESOURCE,
    ATTR_COUNT, ESCAPED, FLAGS, DROPPED_ATTRIBUTES, DROPPED_EVENTS, DROPPED_LINKS, SPAN_COLUMNS, KEY_S, KEY_N, VTYPE, VAL_S, VAL_N, VAL_INT, ANY_S, ANY_N, ATTR_ESCAPED,
    ATTR_COLUMNS, V_ABSENT, V_STRING, V_BOOL, V_INT, V_RARE, SIDE_COLUMNS, K_RESOURCE_SPANS,
    K_RESOURCE_METRICS, K_RESOURCE_LOGS, K_RESOURCE, K_SCOPE_SPANS, K_SCOPE, K_SPANS, K_SCHEMA_URL, K_TRUE,
    K_FALSE, K_KINDS, K_CODES, A_ID, A_NAME, A_KEY, A_VALUE, A_OTHER, ARENAS, COUNT_COLUMNS, FAIL, KEY_NAMES,
    KEY_TRACE_ID, KEY_SPAN_ID, KEY_PARENT, KEY_NAME, KEY_KIND, KEY_START, KEY_END, KEY_ATTRIBUTES, KEY_STATUS,
    KEY_STATE, KEY_EVENTS, KEY_LINKS, KEY_FLAGS, KEY_DROPPED_LINKS, KEY_KEY, KEY_VALUE, KEY_STRING_VALUE, KEY_INT_VALUE, KEY_BOOL_VALUE,
    KEY_CODE, KEY_MESSAGE, KEY_FIRST_SKIPPABLE, SPAN_KEYS, ATTRIBUTE_KEYS, VALUE_KEYS, STATUS_KEYS,
    KEY_UNKNOWN, KEY_WORDS, KEY_MASKS, KEY_TEXT, KEY_LENGTHS, SPAN_TEXT_COLUMN, SPAN_TEXT_ARENA,
)
from nemo_telemetry.analysis.kernels._json_lex import (
    skip_space as _ws, equals as _eq, skippable as _skippable, copy_string_inline as _string_copy_inline,
    copy_string as _string_copy, skip_value as _skip, read_integer as _integer, read_enum as _enum,
)
from nemo_telemetry.analysis.kernels._json_objects import (
    next_key as _next_key, known_key as _key, seen_again as _again, next_item as _next_item, open_at as _open,
    read_attributes as _attributes,
)

# the scan, and its layout as the column builders (``_otlp_json_fast``) read it here
__all__ = [
    "scan", "LINE_OK", "LINE_OTHER_SIGNAL", "LINE_FALLBACK", "LINE_BLANK", "TRACE_S", "TRACE_N", "SPAN_S",
    "SPAN_N", "PARENT_S", "PARENT_N", "STATE_S", "STATE_N", "NAME_S", "NAME_N", "KIND", "START", "END",
    "CODE", "MSG_S", "MSG_N", "SCOPE", "RESOURCE", "ATTR_COUNT", "ESCAPED", "FLAGS", "DROPPED_ATTRIBUTES",
    "DROPPED_EVENTS", "DROPPED_LINKS", "SPAN_COLUMNS", "KEY_S",
    "KEY_N", "VTYPE", "VAL_S", "VAL_N", "VAL_INT", "ANY_S", "ANY_N", "ATTR_ESCAPED", "ATTR_COLUMNS",
    "V_ABSENT", "V_STRING", "V_BOOL", "V_INT", "V_RARE", "SIDE_COLUMNS", "K_RESOURCE_SPANS",
    "K_RESOURCE_METRICS", "K_RESOURCE_LOGS", "K_RESOURCE", "K_SCOPE_SPANS", "K_SCOPE", "K_SPANS",
    "K_TRUE", "K_FALSE", "K_KINDS", "K_CODES", "A_ID", "A_NAME", "A_KEY", "A_VALUE", "A_OTHER", "ARENAS",
    "COUNT_COLUMNS", "FAIL", "KEY_NAMES", "KEY_TRACE_ID", "KEY_SPAN_ID", "KEY_PARENT", "KEY_NAME",
    "KEY_KIND", "KEY_START", "KEY_END", "KEY_ATTRIBUTES", "KEY_STATUS", "KEY_STATE", "KEY_EVENTS",
    "KEY_LINKS", "KEY_KEY", "KEY_VALUE", "KEY_STRING_VALUE", "KEY_INT_VALUE", "KEY_BOOL_VALUE",
    "KEY_CODE", "KEY_MESSAGE", "KEY_FIRST_SKIPPABLE", "SPAN_KEYS", "ATTRIBUTE_KEYS", "VALUE_KEYS",
    "STATUS_KEYS", "KEY_UNKNOWN", "KEY_WORDS", "KEY_MASKS", "KEY_TEXT", "KEY_LENGTHS", "SPAN_TEXT_COLUMN",
    "SPAN_TEXT_ARENA",
]


@njit(cache=True, nogil=True, _nrt=False)
def _raw_items(buf, pos, end, side, at, owner, fill, flags):
    """Record each item of the array at ``pos`` as a raw slice: (count, position after)."""
    pos = _open(buf, pos, end, 91)
    if pos < 0:
        return 0, FAIL
    count = 0
    while True:
        item = _next_item(buf, pos, end, count == 0)
        if item == FAIL:
            return 0, FAIL
        if item <= -2:
            return count, -2 - item + 1
        pos = _skip(buf, item, end)
        if pos < 0:
            return 0, FAIL
        if fill and at + count >= side.shape[0]:
            flags[0] = 1
            return 0, FAIL
        if fill:
            side[at + count, 0] = item
            side[at + count, 1] = pos - item
            side[at + count, 2] = owner
        count += 1


@njit(cache=True, nogil=True, _nrt=False)
def _text_field(buf, pos, end, spans, column, i, fill, arena, cursors, region):
    vs, vn, escaped, pos = _string_copy(buf, _ws(buf, pos, end), end, arena, cursors, region)
    if fill:
        spans[column, i] = vs
        spans[column + 1, i] = vn
        if escaped:
            spans[ESCAPED, i] |= 1 << column
    return pos


@njit(cache=True, nogil=True, _nrt=False)
def _status(buf, pos, end, spans, i, fill, arena, cursors):
    pos = _open(buf, pos, end, 123)
    first = True
    seen = np.int64(0)
    while pos >= 0:
        key, ks, kn, pos = _key(buf, pos, end, first, STATUS_KEYS[0], STATUS_KEYS[1], STATUS_KEYS[0])
        first = False
        if pos < 0 or kn < 0:
            return pos
        twice, seen = _again(seen, key)
        if twice:
            return FAIL
        if key == KEY_CODE:
            code, pos = _enum(buf, pos, end, K_CODES)
            if fill:
                spans[CODE, i] = code
        elif key == KEY_MESSAGE:
            pos = _text_field(buf, pos, end, spans, MSG_S, i, fill, arena, cursors, A_OTHER)
        else:
            pos = _skip(buf, pos, end) if key >= KEY_FIRST_SKIPPABLE else FAIL
    return FAIL


@njit(cache=True, nogil=True, _nrt=False)
def _span(buf, pos, end, spans, i, attrs, a, events, e, links, ln, fill, flags, arena, cursors):
    """The span object at ``pos``: (attributes, events, links, position after or FAIL)."""
    pos = _open(buf, pos, end, 123)
    if pos < 0:
        return 0, 0, 0, FAIL
    if fill and i >= spans.shape[1]:
        flags[0] = 1
        return 0, 0, 0, FAIL
    if fill:
        for column in range(SPAN_COLUMNS):  # the arrays are reused: every field starts afresh
            spans[column, i] = 0
        for column in (TRACE_S, SPAN_S, PARENT_S, STATE_S, NAME_S, MSG_S):
            spans[column, i] = pos
    na = ne = nl = 0
    first = True
    key = KEY_UNKNOWN
    seen = np.int64(0)
    while True:
        # every key of the table (a span's first): a span reads some skippable ones
        key, ks, kn, pos = _key(buf, pos, end, first, SPAN_KEYS[0], len(KEY_NAMES), key + 1)
        first = False
        if pos < 0:
            return 0, 0, 0, FAIL
        if kn < 0:
            break
        twice, seen = _again(seen, key)
        if twice:
            return 0, 0, 0, FAIL
        if key >= 0 and SPAN_TEXT_COLUMN[key] >= 0:  # one call site for all: less code to compile
            column = SPAN_TEXT_COLUMN[key]
            vs, vn, escaped, pos = _string_copy_inline(buf, _ws(buf, pos, end), end, arena, cursors, SPAN_TEXT_ARENA[key])
            spans[column, i] = vs
            spans[column + 1, i] = vn
            if escaped:
                spans[ESCAPED, i] |= 1 << column
        elif key == KEY_START or key == KEY_END:
            value, pos = _integer(buf, pos, end)
            if fill:
                spans[START if key == KEY_START else END, i] = value
        elif key == KEY_KIND:
            kind, pos = _enum(buf, pos, end, K_KINDS)
            if fill:
                spans[KIND, i] = kind
        elif key == KEY_ATTRIBUTES:
            count, pos = _attributes(buf, pos, end, attrs, a + na, fill, flags, arena, cursors)
            na += count
        elif key == KEY_EVENTS:
            count, pos = _raw_items(buf, pos, end, events, e + ne, i, fill, flags)
            ne += count
        elif key == KEY_LINKS:
            count, pos = _raw_items(buf, pos, end, links, ln + nl, i, fill, flags)
            nl += count
        elif key == KEY_STATUS:
            pos = _status(buf, pos, end, spans, i, fill, arena, cursors)
        elif KEY_FLAGS <= key <= KEY_DROPPED_LINKS:  # uint32s, in FLAGS... in the keys' order
            value, pos = _integer(buf, pos, end)
            if value < 0 or value > 0xFFFFFFFF:
                return 0, 0, 0, FAIL  # the exact path rejects the span and names the field
            if fill:
                spans[FLAGS + key - KEY_FLAGS, i] = value
        else:
            pos = _skip(buf, pos, end) if key >= KEY_FIRST_SKIPPABLE else FAIL
        if pos < 0:
            return 0, 0, 0, FAIL
    if fill:
        spans[ATTR_COUNT, i] = na
        if not _span_fields_usual(spans, i):
            return 0, 0, 0, FAIL
    return na, ne, nl, pos


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _span_fields_usual(spans, i):
    """Whether span ``i`` has what a span needs, as the scan can tell: start and end above 0
    (absent is 0; the scan reads no number past int64), ids of a hex or base64 length (a trace
    and a span id, a parent id or none). Otherwise the line goes to the exact path, which
    rejects the span alone and names the field."""
    trace, span, parent = spans[TRACE_N, i], spans[SPAN_N, i], spans[PARENT_N, i]
    return (spans[START, i] > 0 and spans[END, i] > 0 and (trace == 32 or trace == 24)
            and (span == 16 or span == 12) and (parent == 0 or parent == 16 or parent == 12))


@njit(cache=True, nogil=True, _nrt=False)
def _object_slice(buf, pos, end, side, row, owner, fill):
    start = _ws(buf, pos, end)
    pos = _skip(buf, start, end)
    if fill and pos >= 0:
        side[row, 0] = start
        side[row, 1] = pos - start
        side[row, 2] = owner
    return pos


@njit(cache=True, nogil=True, _nrt=False)
def _url_slice(buf, pos, end, side, row, fill):
    """A resource's or scope's schemaUrl value as a raw slice in ``side[row, 3:5]``."""
    start = _ws(buf, pos, end)
    pos = _skip(buf, start, end)
    if fill and pos >= 0:
        side[row, 3] = start
        side[row, 4] = pos - start
    return pos


@njit(cache=True, nogil=True, _nrt=False)
def _line(buf, pos, end, counts, spans, attrs, resources, scopes, events, links, fill, flags, arena, cursors):
    """One request line; ``counts`` (spans, attrs, resources, scopes, events, links) advance
    only when it succeeds. Returns a LINE_* code."""
    i, a, r, s, e, ln = counts[0], counts[1], counts[2], counts[3], counts[4], counts[5]
    for region in range(ARENAS):  # the arenas' cursors too advance only when the line succeeds
        cursors[region] = counts[6 + region]
    found = False
    pos = _open(buf, pos, end, 123)
    first = True
    while pos >= 0:
        ks, kn, pos = _next_key(buf, pos, end, first)
        first = False
        if pos < 0:
            return LINE_FALLBACK
        if kn < 0:
            break
        if _eq(buf, ks, kn, K_RESOURCE_METRICS) or _eq(buf, ks, kn, K_RESOURCE_LOGS):
            return LINE_OTHER_SIGNAL
        if not _eq(buf, ks, kn, K_RESOURCE_SPANS) or found:
            return LINE_FALLBACK  # not a traces request as the scan knows it, or its key twice
        found = True
        pos = _open(buf, pos, end, 91)
        n_rs = 0
        while pos >= 0:
            item = _next_item(buf, pos, end, n_rs == 0)
            if item == FAIL:
                return LINE_FALLBACK
            if item <= -2:
                pos = -2 - item + 1
                break
            pos = _open(buf, item, end, 123)
            if fill and r >= resources.shape[0]:
                flags[0] = 1
                return LINE_FALLBACK
            if fill:
                resources[r, 0] = item
                resources[r, 1] = 0
                resources[r, 3] = 0
                resources[r, 4] = 0
            rs_first = True
            rs_seen = np.int64(0)
            while pos >= 0:
                ks, kn, pos = _next_key(buf, pos, end, rs_first)
                rs_first = False
                if pos < 0:
                    return LINE_FALLBACK
                if kn < 0:
                    break
                if _eq(buf, ks, kn, K_RESOURCE):
                    twice, rs_seen = _again(rs_seen, 0)
                    if twice:
                        return LINE_FALLBACK
                    pos = _object_slice(buf, pos, end, resources, r, r, fill)
                elif _eq(buf, ks, kn, K_SCHEMA_URL):
                    twice, rs_seen = _again(rs_seen, 2)
                    if twice:
                        return LINE_FALLBACK
                    pos = _url_slice(buf, pos, end, resources, r, fill)
                elif _eq(buf, ks, kn, K_SCOPE_SPANS):
                    twice, rs_seen = _again(rs_seen, 1)
                    if twice:
                        return LINE_FALLBACK
                    pos = _open(buf, pos, end, 91)
                    n_ss = 0
                    while pos >= 0:
                        item = _next_item(buf, pos, end, n_ss == 0)
                        if item == FAIL:
                            return LINE_FALLBACK
                        if item <= -2:
                            pos = -2 - item + 1
                            break
                        pos = _open(buf, item, end, 123)
                        if fill and s >= scopes.shape[0]:
                            flags[0] = 1
                            return LINE_FALLBACK
                        if fill:
                            scopes[s, 0] = item
                            scopes[s, 1] = 0
                            scopes[s, 2] = r
                            scopes[s, 3] = 0
                            scopes[s, 4] = 0
                        ss_first = True
                        ss_seen = np.int64(0)
                        while pos >= 0:
                            ks, kn, pos = _next_key(buf, pos, end, ss_first)
                            ss_first = False
                            if pos < 0:
                                return LINE_FALLBACK
                            if kn < 0:
                                break
                            if _eq(buf, ks, kn, K_SCOPE):
                                twice, ss_seen = _again(ss_seen, 0)
                                if twice:
                                    return LINE_FALLBACK
                                pos = _object_slice(buf, pos, end, scopes, s, r, fill)
                            elif _eq(buf, ks, kn, K_SCHEMA_URL):
                                twice, ss_seen = _again(ss_seen, 2)
                                if twice:
                                    return LINE_FALLBACK
                                pos = _url_slice(buf, pos, end, scopes, s, fill)
                            elif _eq(buf, ks, kn, K_SPANS):
                                twice, ss_seen = _again(ss_seen, 1)
                                if twice:
                                    return LINE_FALLBACK
                                pos = _open(buf, pos, end, 91)
                                n_sp = 0
                                while pos >= 0:
                                    item = _next_item(buf, pos, end, n_sp == 0)
                                    if item == FAIL:
                                        return LINE_FALLBACK
                                    if item <= -2:
                                        pos = -2 - item + 1
                                        break
                                    na, ne, nl, pos = _span(buf, item, end, spans, i, attrs, a, events, e, links, ln,
                                                            fill, flags, arena, cursors)
                                    if pos < 0:
                                        return LINE_FALLBACK
                                    if fill:
                                        spans[SCOPE, i] = s
                                        spans[RESOURCE, i] = r
                                    i += 1
                                    a += na
                                    e += ne
                                    ln += nl
                                    n_sp += 1
                            else:
                                pos = _skippable(buf, ks, kn, pos, end)
                        s += 1
                        n_ss += 1
                else:
                    pos = _skippable(buf, ks, kn, pos, end)
            r += 1
            n_rs += 1
    if pos < 0 or not found:
        return LINE_FALLBACK
    if _ws(buf, pos, end) != end:
        return LINE_FALLBACK  # trailing garbage after the object
    counts[0], counts[1], counts[2], counts[3], counts[4], counts[5] = i, a, r, s, e, ln
    for region in range(ARENAS):
        counts[6 + region] = cursors[region]
    return LINE_OK


@njit(cache=True, nogil=True, _nrt=False)
def scan(buf, starts, ends, first, status, counts, spans, attrs, resources, scopes, events, links, arena, flags,
         cursors):
    """Record the lines from ``first`` on; each line's LINE_* code goes to ``status`` (blank
    lines are LINE_BLANK and skipped).

    ``counts`` (spans, attributes, resources, scopes, events, links written so far, then the
    cursors of the ``ARENAS`` regions of ``arena``, absolute, each region ``buf.size + 16``
    long) advance with every line read; the strings' starts recorded are arena positions. Returns the index of a line that did not fit (the caller grows
    the arrays and calls again from there), or the number of lines when all are done.

    Compiled without reference counting, as the protobuf walk is (``_wire_kernel``): every
    array is the caller's for the whole call, so the caller gives the room, ``flags`` (one
    int64, 0) and ``cursors`` (``ARENAS`` int64s).
    """
    flags[0] = 0
    for line in range(first, starts.size):
        if _ws(buf, starts[line], ends[line]) == ends[line]:
            status[line] = LINE_BLANK
            continue
        status[line] = _line(buf, starts[line], ends[line], counts, spans, attrs, resources, scopes,
                             events, links, True, flags, arena, cursors)
        if flags[0]:
            return line
    return starts.size
