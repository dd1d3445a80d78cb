"""Compiled string builders shared by the protobuf and JSON decoders (numba).

Each turns (start, length) records of a buffer into one Arrow-ready (offsets, bytes) pair:
plain cuts (:func:`gather`), hex-text ids lower-cased with their uint64 keys
(:func:`text_ids`), and attribute values as the schema's strings (:func:`value_strings`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nemo_telemetry.analysis.kernels._words import decimal_size, write_decimal

@njit(cache=True, nogil=True)
def gather(buf, starts, lengths):
    """Copy ``buf[start:start + length]`` of each element into one buffer: (offsets, data)."""
    n = starts.size
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] = offsets[i] + lengths[i]
    data = np.empty(offsets[n], dtype=np.uint8)
    for i in range(n):
        _copy(data, offsets[i], buf, starts[i], lengths[i])
    return offsets, data


@njit(cache=True, nogil=True, _nrt=False)
def gather_into(buf, starts, lengths, offsets, data):
    """:func:`gather` into the caller's ``offsets`` (int32 or int64: the Arrow string type it
    wants, so no cast copies them later) and ``data`` (sized to the total length)."""
    offsets[0] = 0
    for i in range(starts.size):
        offsets[i + 1] = offsets[i] + lengths[i]
        _copy(data, offsets[i], buf, starts[i], lengths[i])


@njit(cache=True, nogil=True, inline="always")
def _copy(dst, at, src, start, length):
    """``dst[at:at + length] = src[start:start + length]`` as a byte loop with unsigned
    indices: for short strings it beats a slice assignment, which pays for bounds and views."""
    at, start = np.uint64(at), np.uint64(start)
    for j in range(np.uint64(length)):
        dst[at + j] = src[start + j]


# a hex digit's value (0-15), 16 for any other byte: OR-ed over an id, >= 16 means not hex
_HEX_VALUE = np.full(256, 16, dtype=np.uint8)
_HEX_VALUE[np.frombuffer(b"0123456789", dtype=np.uint8)] = np.arange(10)
_HEX_VALUE[np.frombuffer(b"abcdef", dtype=np.uint8)] = np.arange(10, 16)
_HEX_VALUE[np.frombuffer(b"ABCDEF", dtype=np.uint8)] = np.arange(10, 16)


@njit(cache=True, nogil=True)
def text_ids(buf, starts, lengths, width):
    """Hex-text ids (any case) to lowercase hex and big-endian uint64 keys of the first 8
    bytes, like :func:`hex_ids`, and of the next 8 (``low``: 0 for 8-byte ids). ``ok`` is False
    when an id is not ``2 * width`` hex digits (base64 ids, say); the caller then converts the
    column another way.

    A hex digit lower-cases as ``c | 0x20`` (digits already have that bit), so the copy needs
    no table; the key is built from the first 16 digits, two per step."""
    n = starts.size
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    for i in range(n):
        if lengths[i] != 2 * width and lengths[i] != 0:
            return offsets, np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.uint64), False
        offsets[i + 1] = offsets[i] + lengths[i]
    text = np.empty(offsets[n], dtype=np.uint8)
    keys = np.zeros(n, dtype=np.uint64)
    low = np.zeros(n, dtype=np.uint64)
    table = _HEX_VALUE
    bad = np.uint8(0)
    for i in range(n):  # unsigned indices: no wraparound test per byte
        if lengths[i] == 0:
            continue
        start, out, length = np.uint64(starts[i]), np.uint64(offsets[i]), np.uint64(lengths[i])
        key = np.uint64(0)
        for j in range(np.uint64(0), np.uint64(16), np.uint64(2)):
            c0, c1 = buf[start + j], buf[start + j + np.uint64(1)]
            v0, v1 = table[np.uint64(c0)], table[np.uint64(c1)]
            bad |= v0 | v1
            text[out + j] = c0 | np.uint8(32)
            text[out + j + np.uint64(1)] = c1 | np.uint8(32)
            key = (key << np.uint64(8)) | (np.uint64(v0) << np.uint64(4)) | np.uint64(v1)
        key2 = np.uint64(0)
        for j in range(np.uint64(16), length):
            c0 = buf[start + j]
            v0 = table[np.uint64(c0)]
            bad |= v0
            text[out + j] = c0 | np.uint8(32)
            key2 = (key2 << np.uint64(4)) | np.uint64(v0)
        keys[i] = key
        low[i] = key2
    return offsets, text, keys, low, bad < 16


_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)


@njit(cache=True, nogil=True)
def value_strings(buf, kind, start, length, number, special, special_offsets, special_data,
                  string_kind, bool_kind, int_kind):
    """Each attribute value as the schema's string, in row order, in one buffer: strings cut
    from ``buf``, ints in decimal, bools ``true``/``false``, and where ``special[i] >= 0``
    the caller's own string number ``special[i]`` (rare kinds, escaped strings). Any other
    kind is null. Returns (offsets, data, valid)."""
    n = kind.size
    offsets = np.empty(n + 1, dtype=np.int64)
    valid = np.ones(n, dtype=np.bool_)
    offsets[0] = 0
    for i in range(n):
        size = 0
        j = special[i]
        if j >= 0:
            size = special_offsets[j + 1] - special_offsets[j]
        elif kind[i] == string_kind:
            size = length[i]
        elif kind[i] == int_kind:
            size = decimal_size(number[i])
        elif kind[i] == bool_kind:
            size = 4 if number[i] != 0 else 5
        else:
            valid[i] = False
        offsets[i + 1] = offsets[i] + size
    data = np.empty(offsets[n], dtype=np.uint8)
    true, false = _TRUE, _FALSE
    for i in range(n):
        out, end = offsets[i], offsets[i + 1]
        j = special[i]
        if j >= 0:
            _copy(data, out, special_data, special_offsets[j], end - out)
        elif kind[i] == string_kind:
            _copy(data, out, buf, start[i], length[i])
        elif kind[i] == int_kind:
            write_decimal(data, out, end, number[i])
        elif kind[i] == bool_kind:
            _copy(data, out, true if number[i] != 0 else false, 0, end - out)
    return offsets, data, valid
