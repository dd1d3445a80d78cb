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
wraparound test on every byte (about a fifth of the scan).

A line the scan does not understand (not JSON, another layout, snake_case names, ...) is
marked and left to the orjson path, which handles and reports it exactly; so is a line with a
span the scan sees is bad (a timestamp absent, 0, negative or not an integer, an id of a wrong
length, a name that is not a string): the orjson path rejects that span alone.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from nemo_telemetry.analysis.kernels._words import load8 as _load8, store8 as _store8

LINE_OK, LINE_OTHER_SIGNAL, LINE_FALLBACK, LINE_BLANK = 0, 1, 2, 3

# span columns: rows of an int64 (SPAN_COLUMNS, spans) matrix
(TRACE_S, TRACE_N, SPAN_S, SPAN_N, PARENT_S, PARENT_N, STATE_S, STATE_N, NAME_S, NAME_N, KIND,
 START, END, CODE, MSG_S, MSG_N, SCOPE, RESOURCE, ATTR_COUNT, ESCAPED) = range(20)
SPAN_COLUMNS = 20
# attribute columns: rows of an (ATTR_COLUMNS, attributes) matrix
KEY_S, KEY_N, VTYPE, VAL_S, VAL_N, VAL_INT, ANY_S, ANY_N, ATTR_ESCAPED = range(9)
ATTR_COLUMNS = 9
V_ABSENT, V_STRING, V_BOOL, V_INT, V_RARE = 0, 1, 2, 3, 9
SIDE_COLUMNS = 3  # (start, length, owner) of raw JSON slices: resources, scopes, events, links


def _k(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


K_RESOURCE_SPANS, K_RESOURCE_METRICS, K_RESOURCE_LOGS = _k("resourceSpans"), _k("resourceMetrics"), _k("resourceLogs")
K_RESOURCE, K_SCOPE_SPANS, K_SCOPE, K_SPANS = _k("resource"), _k("scopeSpans"), _k("scope"), _k("spans")
K_TRUE, K_FALSE = _k("true"), _k("false")
# enum names, index = OTLP value
K_KINDS = (_k("SPAN_KIND_UNSPECIFIED"), _k("SPAN_KIND_INTERNAL"), _k("SPAN_KIND_SERVER"),
           _k("SPAN_KIND_CLIENT"), _k("SPAN_KIND_PRODUCER"), _k("SPAN_KIND_CONSUMER"))
K_CODES = (_k("STATUS_CODE_UNSET"), _k("STATUS_CODE_OK"), _k("STATUS_CODE_ERROR"))

# string contents are copied, as the scan meets them, into one arena per column kind (rows of
# one flat array): the later passes then read short, dense runs instead of scattered bytes of
# the block, which cost a cache miss each
A_ID, A_NAME, A_KEY, A_VALUE, A_OTHER = range(5)
ARENAS = 5
COUNT_COLUMNS = 6 + ARENAS  # spans, attrs, resources, scopes, events, links, arena cursors

FAIL = -1

# The keys the scan knows inside a span, in one table: a key's id is its index. Ranges are the
# keys of one kind of object, in the order writers put them; the fields the scan may skip end
# the table (any other unknown field sends the line to the exact path).
KEY_NAMES = (
    "traceId", "spanId", "parentSpanId", "name", "kind", "startTimeUnixNano", "endTimeUnixNano",
    "attributes", "status", "traceState", "events", "links",  # a span's
    "key", "value",  # an attribute's
    "stringValue", "intValue", "boolValue",  # an AnyValue's (others are rare: raw slices)
    "code", "message",  # a status's
    "schemaUrl", "droppedAttributesCount", "droppedEventsCount", "droppedLinksCount", "flags",
)
(KEY_TRACE_ID, KEY_SPAN_ID, KEY_PARENT, KEY_NAME, KEY_KIND, KEY_START, KEY_END, KEY_ATTRIBUTES,
 KEY_STATUS, KEY_STATE, KEY_EVENTS, KEY_LINKS, KEY_KEY, KEY_VALUE, KEY_STRING_VALUE, KEY_INT_VALUE,
 KEY_BOOL_VALUE, KEY_CODE, KEY_MESSAGE, KEY_FIRST_SKIPPABLE) = range(20)
SPAN_KEYS, ATTRIBUTE_KEYS, VALUE_KEYS, STATUS_KEYS = (0, 12), (12, 14), (14, 17), (17, 19)
KEY_UNKNOWN = -1


def _key_table():
    """Each key as ``"key":`` in three little-endian words with their masks (keys too long for
    three words get an all-ones mask on a zero word: never matched that way), and as bytes."""
    words = np.zeros((len(KEY_NAMES), 3), dtype=np.uint64)
    masks = np.zeros((len(KEY_NAMES), 3), dtype=np.uint64)
    text = np.zeros((len(KEY_NAMES), 32), dtype=np.uint8)
    lengths = np.zeros(len(KEY_NAMES), dtype=np.int64)
    for key, name in enumerate(KEY_NAMES):
        pattern = b'"' + name.encode() + b'":'
        lengths[key] = len(name)
        text[key, : len(name)] = np.frombuffer(name.encode(), dtype=np.uint8)
        if len(pattern) <= 24:
            words[key] = np.frombuffer(pattern.ljust(24, b"\0"), dtype="<u8")
            masks[key] = np.frombuffer((b"\xff" * len(pattern)).ljust(24, b"\0"), dtype="<u8")
        else:
            masks[key] = np.uint64(0xFFFFFFFFFFFFFFFF)
    return words, masks, text, lengths


KEY_WORDS, KEY_MASKS, KEY_TEXT, KEY_LENGTHS = _key_table()
# a span's text fields: their column (-1 for other keys) and arena, by key id
SPAN_TEXT_COLUMN = np.full(len(KEY_NAMES), -1, dtype=np.int64)
SPAN_TEXT_ARENA = np.zeros(len(KEY_NAMES), dtype=np.int64)
for _key_id, _column, _arena in ((KEY_TRACE_ID, TRACE_S, A_ID), (KEY_SPAN_ID, SPAN_S, A_ID), (KEY_PARENT, PARENT_S, A_ID),
                                 (KEY_NAME, NAME_S, A_NAME), (KEY_STATE, STATE_S, A_OTHER)):
    SPAN_TEXT_COLUMN[_key_id], SPAN_TEXT_ARENA[_key_id] = _column, _arena

_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)
_BACKSLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
_SPACES = np.uint64(0x2020202020202020)


@njit(cache=True, nogil=True, inline="always")
def _specials(word):
    """A bit set at the top of the lowest byte of ``word`` that is a quote, a backslash or a
    control character (bits above it may be false alarms); 0 when there is none."""
    quote = word ^ _QUOTES
    backslash = word ^ _BACKSLASHES
    return (((quote - _ONES) & ~quote) | ((backslash - _ONES) & ~backslash) | ((word - _SPACES) & ~word)) & _HIGH


@njit(cache=True, nogil=True)
def _ws(buf, pos, end):
    while pos < end:
        c = buf[np.uint64(pos)]
        if c > 32 or (c != 32 and c != 10 and c != 13 and c != 9):
            return pos
        pos += 1
    return pos


@njit(cache=True, nogil=True)
def _eq(buf, start, length, key):
    if length != key.size:
        return False
    for j in range(length):
        if buf[np.uint64(start + j)] != key[j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _skippable(buf, start, length, pos, end):
    """Position after the value of a known, unneeded field; FAIL for an unknown field."""
    for key in range(KEY_FIRST_SKIPPABLE, len(KEY_NAMES)):
        if _eq(buf, start, length, KEY_TEXT[key, : KEY_LENGTHS[key]]):
            return _skip(buf, pos, end)
    return FAIL


@njit(cache=True, nogil=True)
def _string(buf, pos, end):
    """At an opening quote: (content start, content length, escaped, position after) or FAIL.

    Eight bytes a step: a word with no quote, backslash or control character is passed over
    whole."""
    if pos >= end or buf[np.uint64(pos)] != 34:
        return 0, 0, False, FAIL
    start = pos + 1
    pos = start
    escaped = False
    while pos + 8 <= end:
        found = _specials(_load8(buf, np.uint64(pos)))
        if found == 0:
            pos += 8
            continue
        pos += trailing_zeros(found) >> 3
        c = buf[np.uint64(pos)]
        if c == 34:
            return start, pos - start, escaped, pos + 1
        if c != 92:
            return 0, 0, False, FAIL  # raw control character: not JSON
        escaped = True
        pos += 2
    while pos < end:
        c = buf[np.uint64(pos)]
        if c == 34:
            return start, pos - start, escaped, pos + 1
        if c == 92:
            escaped = True
            pos += 2
        elif c < 32:
            return 0, 0, False, FAIL
        else:
            pos += 1
    return 0, 0, False, FAIL


@njit(cache=True, nogil=True, inline="always")
def _string_copy_inline(buf, pos, end, arena, cursors, region):
    """Like :func:`_string`, copying the content to ``arena`` at ``cursors[region]`` (which
    advances past it) as it goes: (arena start, length, escaped, position after) or FAIL.

    Each word is stored before it is looked at, so up to 8 bytes past the content are
    written too; an arena region as long as the block plus 16 bytes always has that room
    (its contents are disjoint pieces of the block, in order)."""
    if pos >= end or buf[np.uint64(pos)] != 34:
        return 0, 0, False, FAIL
    at = cursors[region]
    out = at
    pos += 1
    escaped = False
    while pos + 8 <= end:
        word = _load8(buf, np.uint64(pos))
        _store8(arena, np.uint64(out), word)
        found = _specials(word)
        if found == 0:
            pos += 8
            out += 8
            continue
        step = trailing_zeros(found) >> 3
        pos += step
        out += step
        c = buf[np.uint64(pos)]
        if c == 34:
            cursors[region] = out
            return at, out - at, escaped, pos + 1
        if c != 92 or pos + 1 >= end:
            return 0, 0, False, FAIL  # raw control character, or a cut escape: not JSON
        escaped = True
        arena[np.uint64(out)] = 92
        arena[np.uint64(out + 1)] = buf[np.uint64(pos + 1)]
        pos += 2
        out += 2
    while pos < end:
        c = buf[np.uint64(pos)]
        if c == 34:
            cursors[region] = out
            return at, out - at, escaped, pos + 1
        if c < 32 or (c == 92 and pos + 1 >= end):
            return 0, 0, False, FAIL
        arena[np.uint64(out)] = c
        pos += 1
        out += 1
        if c == 92:
            escaped = True
            arena[np.uint64(out)] = buf[np.uint64(pos)]
            pos += 1
            out += 1
    return 0, 0, False, FAIL


@njit(cache=True, nogil=True)
def _string_copy(buf, pos, end, arena, cursors, region):
    """:func:`_string_copy_inline` as a call, for the rarer places (one copy of its code to compile)."""
    return _string_copy_inline(buf, pos, end, arena, cursors, region)


@njit(cache=True, nogil=True)
def _skip(buf, pos, end):
    """Position after the JSON value at ``pos`` (any kind), or FAIL."""
    pos = _ws(buf, pos, end)
    if pos >= end:
        return FAIL
    c = buf[np.uint64(pos)]
    if c == 34:
        return _string(buf, pos, end)[3]
    if c != 123 and c != 91:  # number, true, false, null
        while pos < end:
            c = buf[np.uint64(pos)]
            if c == 44 or c == 125 or c == 93 or c == 32 or c == 10 or c == 13 or c == 9:
                break
            pos += 1
        return pos
    depth = 0
    while pos < end:
        c = buf[np.uint64(pos)]
        if c == 34:
            pos = _string(buf, pos, end)[3]
            if pos < 0:
                return FAIL
            continue
        if c == 123 or c == 91:
            depth += 1
        elif c == 125 or c == 93:
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return FAIL


_NIBBLE_HIGH = np.uint64(0xF0F0F0F0F0F0F0F0)
_ZEROS = np.uint64(0x3030303030303030)
_SIXES = np.uint64(0x0606060606060606)


@njit(cache=True, nogil=True, inline="always")
def _eight_digits(word):
    """The value of the eight ASCII digits of ``word`` (the first, lowest byte most significant)."""
    word = word - _ZEROS
    word = (word * np.uint64(10) + (word >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    word = (word * np.uint64(100) + (word >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    return (word * np.uint64(10000) + (word >> np.uint64(32))) & np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _integer(buf, pos, end):
    """An int64 written as a number or a string of digits: (value, position after) or FAIL."""
    pos = _ws(buf, pos, end)
    quoted = pos < end and buf[np.uint64(pos)] == 34
    if quoted:
        pos += 1
    negative = pos < end and buf[np.uint64(pos)] == 45
    if negative:
        pos += 1
    value = np.uint64(0)
    digits = 0
    while pos + 8 <= end and digits <= 8:  # eight digits a step while eight are there
        word = _load8(buf, np.uint64(pos))
        if (word & _NIBBLE_HIGH) != _ZEROS or ((word + _SIXES) & _NIBBLE_HIGH) != _ZEROS:
            break
        value = value * np.uint64(100000000) + _eight_digits(word)
        digits += 8
        pos += 8
    while pos < end and 48 <= buf[np.uint64(pos)] <= 57:
        if digits >= 19:
            return np.int64(0), FAIL  # past int64: leave it to the exact path
        value = value * np.uint64(10) + np.uint64(buf[np.uint64(pos)] - 48)
        digits += 1
        pos += 1
    if digits == 0 or value > np.uint64(9223372036854775807):
        return np.int64(0), FAIL
    if quoted:
        if pos >= end or buf[np.uint64(pos)] != 34:
            return np.int64(0), FAIL
        pos += 1
    return (-np.int64(value) if negative else np.int64(value)), pos


@njit(cache=True, nogil=True)
def _enum(buf, pos, end, names):
    """An enum as a number or as one of ``names``: (value, position after) or FAIL."""
    pos = _ws(buf, pos, end)
    if pos < end and buf[np.uint64(pos)] == 34:
        start, length, escaped, after = _string(buf, pos, end)
        if after < 0:
            return np.int64(0), FAIL
        for value in range(len(names)):
            if _eq(buf, start, length, names[value]):
                return np.int64(value), after
        return np.int64(0), FAIL
    return _integer(buf, pos, end)


@njit(cache=True, nogil=True)
def _next_key(buf, pos, end, first):
    """In an object, after '{' or a value: (key start, key length, position of its value).

    Key length -1 means the object closed (the position is after '}'); FAIL otherwise.
    """
    pos = _ws(buf, pos, end)
    if pos >= end:
        return 0, 0, FAIL
    if buf[np.uint64(pos)] == 125:
        return 0, -1, pos + 1
    if not first:
        if buf[np.uint64(pos)] != 44:
            return 0, 0, FAIL
        pos = _ws(buf, pos + 1, end)
    start, length, escaped, pos = _string(buf, pos, end)
    if pos < 0 or escaped:
        return 0, 0, FAIL
    pos = _ws(buf, pos, end)
    if pos >= end or buf[np.uint64(pos)] != 58:
        return 0, 0, FAIL
    return start, length, pos + 1


@njit(cache=True, nogil=True)
def _key(buf, pos, end, first, lo, hi, hint):
    """Like :func:`_next_key`, naming the key: (id, key start, key length, position of its
    value). The id is one of ``lo..hi`` or a skippable key's, KEY_UNKNOWN for another key.

    A key written as ``"key":`` is matched as three words against the table, trying ``hint``
    (the key that usually comes next) first; anything else is read as a string."""
    pos = _ws(buf, pos, end)
    if pos >= end:
        return KEY_UNKNOWN, 0, 0, FAIL
    c = buf[np.uint64(pos)]
    if c == 125:
        return KEY_UNKNOWN, 0, -1, pos + 1
    if not first:
        if c != 44:
            return KEY_UNKNOWN, 0, 0, FAIL
        pos = _ws(buf, pos + 1, end)
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
    start, length, escaped, pos = _string(buf, pos, end)
    if pos < 0 or escaped:
        return KEY_UNKNOWN, 0, 0, FAIL
    pos = _ws(buf, pos, end)
    if pos >= end or buf[np.uint64(pos)] != 58:
        return KEY_UNKNOWN, 0, 0, FAIL
    for key in range(lo, hi):
        if _eq(buf, start, length, KEY_TEXT[key, : KEY_LENGTHS[key]]):
            return key, start, length, pos + 1
    for key in range(KEY_FIRST_SKIPPABLE, len(KEY_NAMES)):
        if _eq(buf, start, length, KEY_TEXT[key, : KEY_LENGTHS[key]]):
            return key, start, length, pos + 1
    return KEY_UNKNOWN, start, length, pos + 1


@njit(cache=True, nogil=True, inline="always")
def _again(seen, key):
    """(whether key id ``key`` is in the bit set ``seen``, the set with it). A key given twice
    in one object is read by orjson as its last value: the scan leaves such a line to it."""
    if key < 0:
        return False, seen
    bit = np.int64(1) << np.int64(key)
    return (seen & bit) != 0, seen | bit


@njit(cache=True, nogil=True)
def _next_item(buf, pos, end, first):
    """In an array, after '[' or an item: (position of the next item, or -2 when it closed)."""
    pos = _ws(buf, pos, end)
    if pos >= end:
        return FAIL
    if buf[np.uint64(pos)] == 93:
        return -2 - pos  # encoded: the array closed at pos
    if not first:
        if buf[np.uint64(pos)] != 44:
            return FAIL
        pos += 1
    return _ws(buf, pos, end)


@njit(cache=True, nogil=True)
def _open(buf, pos, end, char):
    pos = _ws(buf, pos, end)
    if pos >= end or buf[np.uint64(pos)] != char:
        return FAIL
    return pos + 1


@njit(cache=True, nogil=True)
def _any_value(buf, pos, end, attrs, a, fill, arena, cursors):
    """The AnyValue object at ``pos``; returns the position after it or FAIL."""
    start = _ws(buf, pos, end)
    pos = _open(buf, start, end, 123)
    if pos < 0:
        return FAIL
    first = True
    fields = 0
    while True:
        key, ks, kn, pos = _key(buf, pos, end, first, VALUE_KEYS[0], VALUE_KEYS[1], VALUE_KEYS[0])
        first = False
        if pos < 0:
            return FAIL
        if kn < 0:
            break
        fields += 1
        if key == KEY_STRING_VALUE:
            vs, vn, escaped, pos = _string_copy(buf, _ws(buf, pos, end), end, arena, cursors, A_VALUE)
            if fill:
                attrs[VTYPE, a] = V_STRING
                attrs[VAL_S, a] = vs
                attrs[VAL_N, a] = vn
                attrs[ATTR_ESCAPED, a] |= 1 if escaped else 0
        elif key == KEY_INT_VALUE:
            value, pos = _integer(buf, pos, end)
            if fill:
                attrs[VTYPE, a] = V_INT
                attrs[VAL_INT, a] = value
        elif key == KEY_BOOL_VALUE:
            vpos = _ws(buf, pos, end)
            pos = _skip(buf, vpos, end)
            if fill:  # JSON's true or false; anything else (a string, say) is left to orjson
                true = _eq(buf, vpos, pos - vpos, K_TRUE)
                attrs[VTYPE, a] = V_BOOL if true or _eq(buf, vpos, pos - vpos, K_FALSE) else V_RARE
                attrs[VAL_INT, a] = 1 if true else 0
        else:
            pos = _skip(buf, pos, end)
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


@njit(cache=True, nogil=True, inline="always")
def _closes_twice(buf, pos, end):
    """Position after ``}}`` at ``pos``, or FAIL."""
    if pos + 2 <= end and buf[np.uint64(pos)] == 125 and buf[np.uint64(pos + 1)] == 125:
        return pos + 2
    return FAIL


@njit(cache=True, nogil=True)
def _compact_attribute(buf, pos, end, attrs, row, arena, cursors):
    """The attribute object at ``pos`` when it is written exactly as writers write it (no
    spaces, ``key`` first, a string, int or bool value): its row filled and the position after
    it. FAIL, with the arenas as they were, for anything else (the caller reads it the long way)."""
    if pos + 8 > end or _load8(buf, np.uint64(pos)) != W_KEY:
        return FAIL
    key_cursor, value_cursor = cursors[A_KEY], cursors[A_VALUE]
    ks, kn, key_escaped, pos = _string_copy_inline(buf, pos + 7, end, arena, cursors, A_KEY)
    if pos < 0 or pos + 24 > end or _load8(buf, np.uint64(pos)) != W_VALUE:
        cursors[A_KEY] = key_cursor
        return FAIL
    w1, w2 = _load8(buf, np.uint64(pos + 8)), _load8(buf, np.uint64(pos + 16))
    any_start = pos + 9
    vtype, vs, vn, number, value_escaped, after = V_ABSENT, 0, 0, np.int64(0), False, FAIL
    if w1 == W_STRING_1 and w2 == W_STRING_2:
        vtype = V_STRING
        vs, vn, value_escaped, after = _string_copy_inline(buf, pos + 24, end, arena, cursors, A_VALUE)
    elif w1 == W_INT_1 and (w2 & M_INT_2) == W_INT_2:
        vtype = V_INT
        number, after = _integer(buf, pos + 21, end)
    elif w1 == W_BOOL_1 and (w2 & M_BOOL_2) == W_BOOL_2:
        vtype = V_BOOL
        after = pos + 22
        if _eq(buf, after, min(4, end - after), K_TRUE):
            number, after = np.int64(1), after + 4
        elif _eq(buf, after, min(5, end - after), K_FALSE):
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


@njit(cache=True, nogil=True)
def _attributes(buf, pos, end, attrs, a, fill, flags, arena, cursors):
    """The attribute array at ``pos``: (count, position after) or (0, FAIL)."""
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
        row = a + count
        if fill and row >= attrs.shape[1]:
            flags[0] = 1  # out of room: the caller grows the arrays and rereads the line
            return 0, FAIL
        pos = _compact_attribute(buf, item, end, attrs, row, arena, cursors)
        if pos >= 0:
            count += 1
            continue
        pos = _open(buf, item, end, 123)
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
            key, ks, kn, pos = _key(buf, pos, end, first, ATTRIBUTE_KEYS[0], ATTRIBUTE_KEYS[1], key + 1 if not first else KEY_KEY)
            first = False
            if pos < 0:
                return 0, FAIL
            if kn < 0:
                break
            twice, seen = _again(seen, key)
            if twice:
                return 0, FAIL
            if key == KEY_KEY:
                vs, vn, escaped, pos = _string_copy(buf, _ws(buf, pos, end), end, arena, cursors, A_KEY)
                if fill:
                    attrs[KEY_S, row] = vs
                    attrs[KEY_N, row] = vn
                    attrs[ATTR_ESCAPED, row] |= 2 if escaped else 0
            elif key == KEY_VALUE:
                pos = _any_value(buf, pos, end, attrs, row, fill, arena, cursors)
            else:
                pos = _skip(buf, pos, end) if key >= KEY_FIRST_SKIPPABLE else FAIL
            if pos < 0:
                return 0, FAIL
        count += 1


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def _text_field(buf, pos, end, spans, column, i, fill, arena, cursors, region):
    vs, vn, escaped, pos = _string_copy(buf, _ws(buf, pos, end), end, arena, cursors, region)
    if fill:
        spans[column, i] = vs
        spans[column + 1, i] = vn
        if escaped:
            spans[ESCAPED, i] |= 1 << column
    return pos


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
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
        key, ks, kn, pos = _key(buf, pos, end, first, SPAN_KEYS[0], SPAN_KEYS[1], key + 1)
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
        else:
            pos = _skip(buf, pos, end) if key >= KEY_FIRST_SKIPPABLE else FAIL
        if pos < 0:
            return 0, 0, 0, FAIL
    if fill:
        spans[ATTR_COUNT, i] = na
        if not _span_fields_usual(spans, i):
            return 0, 0, 0, FAIL
    return na, ne, nl, pos


@njit(cache=True, nogil=True, inline="always")
def _span_fields_usual(spans, i):
    """Whether span ``i`` has what a span needs, as the scan can tell: start and end above 0
    (absent is 0; the scan reads no number past int64), ids of a hex or base64 length (a trace
    and a span id, a parent id or none). Otherwise the line goes to the exact path, which
    rejects the span alone and names the field."""
    trace, span, parent = spans[TRACE_N, i], spans[SPAN_N, i], spans[PARENT_N, i]
    return (spans[START, i] > 0 and spans[END, i] > 0 and (trace == 32 or trace == 24)
            and (span == 16 or span == 12) and (parent == 0 or parent == 16 or parent == 12))


@njit(cache=True, nogil=True)
def _object_slice(buf, pos, end, side, row, owner, fill):
    start = _ws(buf, pos, end)
    pos = _skip(buf, start, end)
    if fill and pos >= 0:
        side[row, 0] = start
        side[row, 1] = pos - start
        side[row, 2] = owner
    return pos


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def scan(buf, starts, ends, first, status, counts, spans, attrs, resources, scopes, events, links, arena):
    """Record the lines from ``first`` on; each line's LINE_* code goes to ``status`` (blank
    lines are LINE_BLANK and skipped).

    ``counts`` (spans, attributes, resources, scopes, events, links written so far, then the
    cursors of the ``ARENAS`` regions of ``arena``, absolute, each region ``buf.size + 16``
    long) advance with every line read; the strings' starts recorded are arena positions. Returns the index of a line that did not fit (the caller grows
    the arrays and calls again from there), or the number of lines when all are done.
    """
    flags = np.zeros(1, dtype=np.int64)
    cursors = np.zeros(ARENAS, dtype=np.int64)
    for line in range(first, starts.size):
        if _ws(buf, starts[line], ends[line]) == ends[line]:
            status[line] = LINE_BLANK
            continue
        status[line] = _line(buf, starts[line], ends[line], counts, spans, attrs, resources, scopes,
                             events, links, True, flags, arena, cursors)
        if flags[0]:
            return line
    return starts.size

