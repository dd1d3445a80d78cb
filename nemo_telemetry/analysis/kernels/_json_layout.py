"""The JSON scan's layout: the matrices it fills (one row per column), the arenas its strings
are copied to, the line statuses, and the table of the OTLP keys it knows.

Plain numpy, no numba: the scan's modules and the Python that builds columns from the
matrices (``_otlp_json_fast``, through ``_json_kernel``'s names) read one definition. Compiled
code freezes these arrays as constants, so this file is among the kernel sources that key the
cache (``compiled.KERNEL_HELPERS``).
"""

from __future__ import annotations

import numpy as np

LINE_OK, LINE_OTHER_SIGNAL, LINE_FALLBACK, LINE_BLANK = 0, 1, 2, 3

# span columns: rows of an int64 (SPAN_COLUMNS, spans) matrix
(TRACE_S, TRACE_N, SPAN_S, SPAN_N, PARENT_S, PARENT_N, STATE_S, STATE_N, NAME_S, NAME_N, KIND,
 START, END, CODE, MSG_S, MSG_N, SCOPE, RESOURCE, ATTR_COUNT, ESCAPED,
 FLAGS, DROPPED_ATTRIBUTES, DROPPED_EVENTS, DROPPED_LINKS) = range(24)
SPAN_COLUMNS = 24
# attribute columns: rows of an (ATTR_COLUMNS, attributes) matrix
KEY_S, KEY_N, VTYPE, VAL_S, VAL_N, VAL_INT, ANY_S, ANY_N, ATTR_ESCAPED = range(9)
ATTR_COLUMNS = 9
V_ABSENT, V_STRING, V_BOOL, V_INT, V_RARE = 0, 1, 2, 3, 9
# (start, length, owner) of raw JSON slices: resources, scopes, events, links; for resources
# and scopes also (start, length) of their schemaUrl's raw JSON value (length 0: none)
SIDE_COLUMNS = 5


def _k(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


K_RESOURCE_SPANS, K_RESOURCE_METRICS, K_RESOURCE_LOGS = _k("resourceSpans"), _k("resourceMetrics"), _k("resourceLogs")
K_RESOURCE, K_SCOPE_SPANS, K_SCOPE, K_SPANS = _k("resource"), _k("scopeSpans"), _k("scope"), _k("spans")
K_SCHEMA_URL = _k("schemaUrl")
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
    "schemaUrl", "flags", "droppedAttributesCount", "droppedEventsCount", "droppedLinksCount",
)
(KEY_TRACE_ID, KEY_SPAN_ID, KEY_PARENT, KEY_NAME, KEY_KIND, KEY_START, KEY_END, KEY_ATTRIBUTES,
 KEY_STATUS, KEY_STATE, KEY_EVENTS, KEY_LINKS, KEY_KEY, KEY_VALUE, KEY_STRING_VALUE, KEY_INT_VALUE,
 KEY_BOOL_VALUE, KEY_CODE, KEY_MESSAGE, KEY_FIRST_SKIPPABLE) = range(20)
# skippable everywhere but in a span, which reads them into FLAGS... (in this order)
KEY_FLAGS, KEY_DROPPED_LINKS = 20, 23
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
