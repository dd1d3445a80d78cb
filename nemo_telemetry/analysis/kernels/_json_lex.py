"""The JSON scan's string and number helpers (numba): whitespace, strings (passed over eight
bytes at a time, copied into an arena), values skipped, integers (eight digits in one step) and
enums.

Apart from the scan (``_json_kernel``) so that each stays readable; compiled into it (inlined
where marked), so this file is among the kernel sources that key the cache
(``compiled.KERNEL_HELPERS``).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from nemo_telemetry.analysis.kernels._json_layout import FAIL, KEY_FIRST_SKIPPABLE, KEY_LENGTHS, KEY_NAMES, KEY_TEXT
from nemo_telemetry.analysis.kernels._words import load8 as _load8, store8 as _store8

__all__ = [
    "specials", "skip_space", "equals", "skippable", "read_string", "copy_string_inline", "copy_string",
    "skip_value", "eight_digits", "read_integer", "read_enum",
]

_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_QUOTES = np.uint64(0x2222222222222222)
_BACKSLASHES = np.uint64(0x5C5C5C5C5C5C5C5C)
_SPACES = np.uint64(0x2020202020202020)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def specials(word):
    """A bit set at the top of the lowest byte of ``word`` that is a quote, a backslash or a
    control character (bits above it may be false alarms); 0 when there is none."""
    quote = word ^ _QUOTES
    backslash = word ^ _BACKSLASHES
    return (((quote - _ONES) & ~quote) | ((backslash - _ONES) & ~backslash) | ((word - _SPACES) & ~word)) & _HIGH


@njit(cache=True, nogil=True, _nrt=False)
def skip_space(buf, pos, end):
    while pos < end:
        c = buf[np.uint64(pos)]
        if c > 32 or (c != 32 and c != 10 and c != 13 and c != 9):
            return pos
        pos += 1
    return pos


@njit(cache=True, nogil=True, _nrt=False)
def equals(buf, start, length, key):
    if length != key.size:
        return False
    for j in range(length):
        if buf[np.uint64(start + j)] != key[j]:
            return False
    return True


@njit(cache=True, nogil=True, _nrt=False)
def skippable(buf, start, length, pos, end):
    """Position after the value of a known, unneeded field; FAIL for an unknown field."""
    for key in range(KEY_FIRST_SKIPPABLE, len(KEY_NAMES)):
        if equals(buf, start, length, KEY_TEXT[key, : KEY_LENGTHS[key]]):
            return skip_value(buf, pos, end)
    return FAIL


@njit(cache=True, nogil=True, _nrt=False)
def read_string(buf, pos, end):
    """At an opening quote: (content start, content length, escaped, position after) or FAIL.

    Eight bytes a step: a word with no quote, backslash or control character is passed over
    whole."""
    if pos >= end or buf[np.uint64(pos)] != 34:
        return 0, 0, False, FAIL
    start = pos + 1
    pos = start
    escaped = False
    while pos + 8 <= end:
        found = specials(_load8(buf, np.uint64(pos)))
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


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def copy_string_inline(buf, pos, end, arena, cursors, region):
    """Like :func:`read_string`, copying the content to ``arena`` at ``cursors[region]`` (which
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
        found = specials(word)
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


@njit(cache=True, nogil=True, _nrt=False)
def copy_string(buf, pos, end, arena, cursors, region):
    """:func:`copy_string_inline` as a call, for the rarer places (one copy of its code to compile)."""
    return copy_string_inline(buf, pos, end, arena, cursors, region)


@njit(cache=True, nogil=True, _nrt=False)
def skip_value(buf, pos, end):
    """Position after the JSON value at ``pos`` (any kind), or FAIL."""
    pos = skip_space(buf, pos, end)
    if pos >= end:
        return FAIL
    c = buf[np.uint64(pos)]
    if c == 34:
        return read_string(buf, pos, end)[3]
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
            pos = read_string(buf, pos, end)[3]
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


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def eight_digits(word):
    """The value of the eight ASCII digits of ``word`` (the first, lowest byte most significant)."""
    word = word - _ZEROS
    word = (word * np.uint64(10) + (word >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
    word = (word * np.uint64(100) + (word >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    return (word * np.uint64(10000) + (word >> np.uint64(32))) & np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True, _nrt=False)
def read_integer(buf, pos, end):
    """An int64 written as a number or a string of digits: (value, position after) or FAIL."""
    pos = skip_space(buf, pos, end)
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
        value = value * np.uint64(100000000) + eight_digits(word)
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


@njit(cache=True, nogil=True, _nrt=False)
def read_enum(buf, pos, end, names):
    """An enum as a number or as one of ``names``: (value, position after) or FAIL."""
    pos = skip_space(buf, pos, end)
    if pos < end and buf[np.uint64(pos)] == 34:
        start, length, escaped, after = read_string(buf, pos, end)
        if after < 0:
            return np.int64(0), FAIL
        for value in range(len(names)):
            if equals(buf, start, length, names[value]):
                return np.int64(value), after
        return np.int64(0), FAIL
    return read_integer(buf, pos, end)
