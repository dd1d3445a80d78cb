"""Compiled helpers for span deduplication: id keys straight from Arrow's string buffers and an
open-addressing hash set of (trace id, span id) as three uint64 words. ``_dedup_reference``
does the same without numba, on the same set.

A sorted array of 24-byte keys costs a sort and an ``np.insert`` of the whole history per
batch; the hash set costs one probe per span, whatever the history holds.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nemo_telemetry.analysis.kernels._dedup_reference import HEX_VALUE as _HEX_VALUE


@njit(cache=True, nogil=True)
def _hex_word(data, start, digits):
    """``digits`` hex digits at ``start`` as an integer; -1 when one is not a hex digit."""
    value = np.int64(0)
    bad = np.int64(0)
    for j in range(digits):
        v = _HEX_VALUE[data[start + j]]
        bad |= v
        value = (value << 4) | (v & 15)
    return np.uint64(value), bad >= 0


@njit(cache=True, nogil=True)
def id_words(trace_offsets, trace_data, span_offsets, span_data, out):
    """Fill ``out`` (n, 3) with (trace high, trace low, span) of 32/16-digit hex ids; returns
    a bool array marking the rows whose ids are not that (keyed another way by the caller)."""
    n = out.shape[0]
    odd = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        t0, t1 = trace_offsets[i], trace_offsets[i + 1]
        s0, s1 = span_offsets[i], span_offsets[i + 1]
        if t1 - t0 != 32 or s1 - s0 != 16:
            odd[i] = True
            continue
        hi, ok_hi = _hex_word(trace_data, t0, 16)
        lo, ok_lo = _hex_word(trace_data, t0 + 16, 16)
        span, ok_span = _hex_word(span_data, s0, 16)
        if not (ok_hi and ok_lo and ok_span):
            odd[i] = True
            continue
        out[i, 0] = hi
        out[i, 1] = lo
        out[i, 2] = span
    return odd


@njit(cache=True, nogil=True)
def _slot(a, b, c, mask):
    h = (a * np.uint64(0x9E3779B97F4A7C15)) ^ (b * np.uint64(0xC2B2AE3D27D4EB4F)) ^ c
    h ^= h >> np.uint64(29)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(32)
    return np.int64(h & np.uint64(mask))


@njit(cache=True, nogil=True)
def _find(table, used, a, b, c, mask):
    """The slot holding key (a, b, c), or the empty slot where its probe sequence ends."""
    slot = _slot(a, b, c, mask)
    while used[slot]:
        if table[slot, 0] == a and table[slot, 1] == b and table[slot, 2] == c:
            break
        slot = (slot + 1) & mask
    return slot


@njit(cache=True, nogil=True)
def admit(table, used, keys, fresh):
    """Insert each row of ``keys`` (n, 3) into the set (``table`` (cap, 3), ``used`` (cap,),
    cap a power of two with room for every key); ``fresh[i]`` says whether row ``i`` was new.
    Returns how many were new."""
    mask = table.shape[0] - 1
    added = 0
    for i in range(keys.shape[0]):
        a, b, c = keys[i, 0], keys[i, 1], keys[i, 2]
        slot = _find(table, used, a, b, c, mask)
        if used[slot]:
            fresh[i] = False
            continue
        used[slot] = True
        table[slot, 0] = a
        table[slot, 1] = b
        table[slot, 2] = c
        fresh[i] = True
        added += 1
    return added



@njit(cache=True, nogil=True)
def contains(table, used, keys, found):
    """``found[i]``: whether row ``i`` of ``keys`` is in the set; nothing is inserted."""
    mask = table.shape[0] - 1
    for i in range(keys.shape[0]):
        found[i] = used[_find(table, used, keys[i, 0], keys[i, 1], keys[i, 2], mask)]
    return keys.shape[0]

@njit(cache=True, nogil=True)
def rehash(table, used, bigger, bigger_used):
    """Move every key of one set into an empty larger one."""
    mask = bigger.shape[0] - 1
    for slot in range(table.shape[0]):
        if not used[slot]:
            continue
        a, b, c = table[slot, 0], table[slot, 1], table[slot, 2]
        target = _slot(a, b, c, mask)
        while bigger_used[target]:
            target = (target + 1) & mask
        bigger_used[target] = True
        bigger[target, 0] = a
        bigger[target, 1] = b
        bigger[target, 2] = c


@njit(cache=True, nogil=True)
def forget(table, used, keys):
    """Remove each row of ``keys`` from the set (rows not in it are left alone); returns how many
    were removed. Linear probing with backward shift: every key after a hole that may move into
    it does, so no tombstones and lookups stay one probe sequence."""
    mask = table.shape[0] - 1
    removed = 0
    for i in range(keys.shape[0]):
        slot = _find(table, used, keys[i, 0], keys[i, 1], keys[i, 2], mask)
        if not used[slot]:
            continue
        hole = slot
        j = (hole + 1) & mask
        while used[j]:
            home = _slot(table[j, 0], table[j, 1], table[j, 2], mask)
            if ((j - home) & mask) >= ((j - hole) & mask):  # the hole lies on j's probe path
                table[hole, 0] = table[j, 0]
                table[hole, 1] = table[j, 1]
                table[hole, 2] = table[j, 2]
                hole = j
            j = (j + 1) & mask
        used[hole] = False
        removed += 1
    return removed
