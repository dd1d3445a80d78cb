"""The JSON scan's objects and arrays (numba): keys (matched as words against the layout's key
table), array items, and attributes with their AnyValues (the usual
``{"key":"...","value":{"stringValue":...}}`` read in one go by word compares).

Apart from the scan (``_json_kernel``), which walks lines and spans with these; compiled into it,
so this file is among the kernel sources that key the cache (``compiled.KERNEL_HELPERS``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nemo_telemetry.analysis.kernels._json_layout import (
    KEY_S, KEY_N, VTYPE, VAL_S, VAL_N, VAL_INT, ANY_S, ANY_N, ATTR_ESCAPED, ATTR_COLUMNS, V_ABSENT, V_STRING,
    V_BOOL, V_INT, V_RARE, K_TRUE, K_FALSE, A_KEY, A_VALUE, FAIL, KEY_NAMES, KEY_KEY, KEY_VALUE,
    KEY_STRING_VALUE, KEY_INT_VALUE, KEY_BOOL_VALUE, KEY_FIRST_SKIPPABLE, ATTRIBUTE_KEYS, VALUE_KEYS,
    KEY_UNKNOWN, KEY_WORDS, KEY_MASKS, KEY_TEXT, KEY_LENGTHS,
)
from nemo_telemetry.analysis.kernels._json_lex import (
    skip_space, equals, read_string, copy_string_inline, copy_string, skip_value, read_integer,
)
from nemo_telemetry.analysis.kernels._words import load8 as _load8

__all__ = ["next_key", "known_key", "seen_again", "next_item", "open_at", "any_value", "read_attributes"]


@njit(cache=True, nogil=True, _nrt=False)
def next_key(buf, pos, end, first):
    """In an object, after '{' or a value: (key start, key length, position of its value).

    Key length -1 means the object closed (the position is after '}'); FAIL otherwise.
    """
    pos = skip_space(buf, pos, end)
    if pos >= end:
        return 0, 0, FAIL
    if buf[np.uint64(pos)] == 125:
        return 0, -1, pos + 1
    if not first:
        if buf[np.uint64(pos)] != 44:
            return 0, 0, FAIL
        pos = skip_space(buf, pos + 1, end)
    start, length, escaped, pos = read_string(buf, pos, end)
    if pos < 0 or escaped:
        return 0, 0, FAIL
    pos = skip_space(buf, pos, end)
    if pos >= end or buf[np.uint64(pos)] != 58:
        return 0, 0, FAIL
    return start, length, pos + 1


@njit(cache=True, nogil=True, _nrt=False)
def known_key(buf, pos, end, first, lo, hi, hint):
    """Like :func:`next_key`, naming the key: (id, key start, key length, position of its
    value). The id is one of ``lo..hi`` or a skippable key's, KEY_UNKNOWN for another key.

    A key written as ``"key":`` is matched as three words against the table, trying ``hint``
    (the key that usually comes next) first; anything else is read as a string."""
    pos = skip_space(buf, pos, end)
    if pos >= end:
        return KEY_UNKNOWN, 0, 0, FAIL
    c = buf[np.uint64(pos)]
    if c == 125:
        return KEY_UNKNOWN, 0, -1, pos + 1
    if not first:
        if c != 44:
            return KEY_UNKNOWN, 0, 0, FAIL
        pos = skip_space(buf, pos + 1, end)
    if pos + 24 <= end:
        w0 = _load8(buf, np.uint64(pos))
        w1 = _load8(buf, np.uint64(pos + 8))
        w2 = _load8(buf, np.uint64(pos + 16))
        key = hint if lo <= hint < hi else lo
        for _ in range(hi - lo):
            if ((w0 & KEY_MASKS[key, 0]) == KEY_WORDS[key, 0] and (w1 & KEY_MASKS[key, 1]) == KEY_WORDS[key, 1]
                    and (w2 & KEY_MASKS[key, 2]) == KEY_WORDS[key, 2]):
                return key, pos + 1, KEY_LENGTHS[key], pos + KEY_LENGTHS[key] + 3
            key = key + 1 if key + 1 < hi else lo
    start, length, escaped, pos = read_string(buf, pos, end)
    if pos < 0 or escaped:
        return KEY_UNKNOWN, 0, 0, FAIL
    pos = skip_space(buf, pos, end)
    if pos >= end or buf[np.uint64(pos)] != 58:
        return KEY_UNKNOWN, 0, 0, FAIL
    for key in range(lo, hi):
        if equals(buf, start, length, KEY_TEXT[key, : KEY_LENGTHS[key]]):
            return key, start, length, pos + 1
    for key in range(KEY_FIRST_SKIPPABLE, len(KEY_NAMES)):
        if equals(buf, start, length, KEY_TEXT[key, : KEY_LENGTHS[key]]):
            return key, start, length, pos + 1
    return KEY_UNKNOWN, start, length, pos + 1


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def seen_again(seen, key):
    """(whether key id ``key`` is in the bit set ``seen``, the set with it). A key given twice
    in one object is read by orjson as its last value: the scan leaves such a line to it."""
    if key < 0:
        return False, seen
    bit = np.int64(1) << np.int64(key)
    return (seen & bit) != 0, seen | bit


@njit(cache=True, nogil=True, _nrt=False)
def next_item(buf, pos, end, first):
    """In an array, after '[' or an item: (position of the next item, or -2 when it closed)."""
    pos = skip_space(buf, pos, end)
    if pos >= end:
        return FAIL
    if buf[np.uint64(pos)] == 93:
        return -2 - pos  # encoded: the array closed at pos
    if not first:
        if buf[np.uint64(pos)] != 44:
            return FAIL
        pos += 1
    return skip_space(buf, pos, end)


@njit(cache=True, nogil=True, _nrt=False)
def open_at(buf, pos, end, char):
    pos = skip_space(buf, pos, end)
    if pos >= end or buf[np.uint64(pos)] != char:
        return FAIL
    return pos + 1


@njit(cache=True, nogil=True, _nrt=False)
def any_value(buf, pos, end, attrs, a, fill, arena, cursors):
    """The AnyValue object at ``pos``; returns the position after it or FAIL."""
    start = skip_space(buf, pos, end)
    pos = open_at(buf, start, end, 123)
    if pos < 0:
        return FAIL
    first = True
    fields = 0
    while True:
        key, ks, kn, pos = known_key(buf, pos, end, first, VALUE_KEYS[0], VALUE_KEYS[1], VALUE_KEYS[0])
        first = False
        if pos < 0:
            return FAIL
        if kn < 0:
            break
        fields += 1
        if key == KEY_STRING_VALUE:
            vs, vn, escaped, pos = copy_string(buf, skip_space(buf, pos, end), end, arena, cursors, A_VALUE)
            if fill:
                attrs[VTYPE, a] = V_STRING
                attrs[VAL_S, a] = vs
                attrs[VAL_N, a] = vn
                attrs[ATTR_ESCAPED, a] |= 1 if escaped else 0
        elif key == KEY_INT_VALUE:
            value, pos = read_integer(buf, pos, end)
            if fill:
                attrs[VTYPE, a] = V_INT
                attrs[VAL_INT, a] = value
        elif key == KEY_BOOL_VALUE:
            vpos = skip_space(buf, pos, end)
            pos = skip_value(buf, vpos, end)
            if fill:  # JSON's true or false; anything else (a string, say) is left to orjson
                true = equals(buf, vpos, pos - vpos, K_TRUE)
                attrs[VTYPE, a] = V_BOOL if true or equals(buf, vpos, pos - vpos, K_FALSE) else V_RARE
                attrs[VAL_INT, a] = 1 if true else 0
        else:
            pos = skip_value(buf, pos, end)
            if fill:
                attrs[VTYPE, a] = V_RARE
        if pos < 0:
            return FAIL
    if fill:
        if fields > 1:  # more than one kind (not OTLP): the exact path decides
            attrs[VTYPE, a] = V_RARE
        attrs[ANY_S, a] = start
        attrs[ANY_N, a] = pos - start
    return pos


def _word(text: bytes, at: int = 0) -> np.uint64:
    return np.uint64(int.from_bytes(text[at : at + 8].ljust(8, b"\0"), "little"))


# an attribute as the Collector and the SDKs write it: {"key":"...","value":{"stringValue":"..."}}
W_KEY = _word(b'{"key":"')
W_VALUE = _word(b',"value":{"stringValue":')  # the 8 bytes every kind of value starts with
W_STRING_1, W_STRING_2 = _word(b',"value":{"stringValue":', 8), _word(b',"value":{"stringValue":', 16)
W_INT_1, W_INT_2 = _word(b',"value":{"intValue":', 8), _word(b',"value":{"intValue":', 16)
W_BOOL_1, W_BOOL_2 = _word(b',"value":{"boolValue":', 8), _word(b',"value":{"boolValue":', 16)
M_INT_2, M_BOOL_2 = np.uint64(0xFF_FFFF_FFFF), np.uint64(0xFFFF_FFFF_FFFF)  # 5 and 6 bytes


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _closes_twice(buf, pos, end):
    """Position after ``}}`` at ``pos``, or FAIL."""
    if pos + 2 <= end and buf[np.uint64(pos)] == 125 and buf[np.uint64(pos + 1)] == 125:
        return pos + 2
    return FAIL


@njit(cache=True, nogil=True, _nrt=False)
def _compact_attribute(buf, pos, end, attrs, row, arena, cursors):
    """The attribute object at ``pos`` when it is written exactly as writers write it (no
    spaces, ``key`` first, a string, int or bool value): its row filled and the position after
    it. FAIL, with the arenas as they were, for anything else (the caller reads it the long way)."""
    if pos + 8 > end or _load8(buf, np.uint64(pos)) != W_KEY:
        return FAIL
    key_cursor, value_cursor = cursors[A_KEY], cursors[A_VALUE]
    ks, kn, key_escaped, pos = copy_string_inline(buf, pos + 7, end, arena, cursors, A_KEY)
    if pos < 0 or pos + 24 > end or _load8(buf, np.uint64(pos)) != W_VALUE:
        cursors[A_KEY] = key_cursor
        return FAIL
    w1, w2 = _load8(buf, np.uint64(pos + 8)), _load8(buf, np.uint64(pos + 16))
    any_start = pos + 9
    vtype, vs, vn, number, value_escaped, after = V_ABSENT, 0, 0, np.int64(0), False, FAIL
    if w1 == W_STRING_1 and w2 == W_STRING_2:
        vtype = V_STRING
        vs, vn, value_escaped, after = copy_string_inline(buf, pos + 24, end, arena, cursors, A_VALUE)
    elif w1 == W_INT_1 and (w2 & M_INT_2) == W_INT_2:
        vtype = V_INT
        number, after = read_integer(buf, pos + 21, end)
    elif w1 == W_BOOL_1 and (w2 & M_BOOL_2) == W_BOOL_2:
        vtype = V_BOOL
        after = pos + 22
        if equals(buf, after, min(4, end - after), K_TRUE):
            number, after = np.int64(1), after + 4
        elif equals(buf, after, min(5, end - after), K_FALSE):
            after += 5
        else:
            after = FAIL
    if after >= 0:
        after = _closes_twice(buf, after, end)
    if after < 0:
        cursors[A_KEY], cursors[A_VALUE] = key_cursor, value_cursor
        return FAIL
    attrs[KEY_S, row] = ks
    attrs[KEY_N, row] = kn
    attrs[VTYPE, row] = vtype
    attrs[VAL_S, row] = vs
    attrs[VAL_N, row] = vn
    attrs[VAL_INT, row] = number
    attrs[ANY_S, row] = any_start
    attrs[ANY_N, row] = after - 1 - any_start
    attrs[ATTR_ESCAPED, row] = (2 if key_escaped else 0) | (1 if value_escaped else 0)
    return after


@njit(cache=True, nogil=True, _nrt=False)
def read_attributes(buf, pos, end, attrs, a, fill, flags, arena, cursors):
    """The attribute array at ``pos``: (count, position after) or (0, FAIL)."""
    pos = open_at(buf, pos, end, 91)
    if pos < 0:
        return 0, FAIL
    count = 0
    while True:
        item = next_item(buf, pos, end, count == 0)
        if item == FAIL:
            return 0, FAIL
        if item <= -2:
            return count, -2 - item + 1
        row = a + count
        if fill and row >= attrs.shape[1]:
            flags[0] = 1  # out of room: the caller grows the arrays and rereads the line
            return 0, FAIL
        pos = _compact_attribute(buf, item, end, attrs, row, arena, cursors)
        if pos >= 0:
            count += 1
            continue
        pos = open_at(buf, item, end, 123)
        if pos < 0:
            return 0, FAIL
        if fill:
            for column in range(ATTR_COLUMNS):  # the arrays are reused: every field starts afresh
                attrs[column, row] = 0
            attrs[KEY_S, row] = pos
            attrs[VTYPE, row] = V_ABSENT
            attrs[ANY_S, row] = pos
        first = True
        key = KEY_KEY
        seen = np.int64(0)
        while True:
            key, ks, kn, pos = known_key(buf, pos, end, first, ATTRIBUTE_KEYS[0], ATTRIBUTE_KEYS[1], key + 1 if not first else KEY_KEY)
            first = False
            if pos < 0:
                return 0, FAIL
            if kn < 0:
                break
            twice, seen = seen_again(seen, key)
            if twice:
                return 0, FAIL
            if key == KEY_KEY:
                vs, vn, escaped, pos = copy_string(buf, skip_space(buf, pos, end), end, arena, cursors, A_KEY)
                if fill:
                    attrs[KEY_S, row] = vs
                    attrs[KEY_N, row] = vn
                    attrs[ATTR_ESCAPED, row] |= 2 if escaped else 0
            elif key == KEY_VALUE:
                pos = any_value(buf, pos, end, attrs, row, fill, arena, cursors)
            else:
                pos = skip_value(buf, pos, end) if key >= KEY_FIRST_SKIPPABLE else FAIL
            if pos < 0:
                return 0, FAIL
        count += 1
