"""Attribute promotion and per-owner maps in compiled passes (``_columns._promote``,
``_columns._per_owner_map``).

Per owner (span), each promoted key's last value becomes its column; integer columns keep
a value in the map when it is not a decimal integer (nothing is lost). One pass matches each
key once, writes the promoted string columns as dictionary codes (their values repeat: a few
buckets over millions of spans) and copies the attributes that stay into the map's buffers.
That replaces a compare, filter, take and dictionary cast per promoted key.
"""

from __future__ import annotations

import numpy as np
from numba import njit

DICTIONARY_SLOTS = 1 << 12  # per promoted string column: distinct values beyond half of it fall back
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(cache=True, nogil=True, inline="always")
def _equal(data_a, a0, a1, data_b, b0, b1):
    if a1 - a0 != b1 - b0:
        return False
    for j in range(a1 - a0):
        if data_a[a0 + j] != data_b[b0 + j]:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _decimal(data, start, end):
    """(value, ok): ``data[start:end]`` as ``-?[0-9]{1,18}``."""
    pos = start
    negative = pos < end and data[pos] == 45
    if negative:
        pos += 1
    digits = end - pos
    if digits < 1 or digits > 18:
        return np.int64(0), False
    value = np.int64(0)
    for j in range(pos, end):
        c = data[j]
        if c < 48 or c > 57:
            return np.int64(0), False
        value = value * 10 + (c - 48)
    return (-value if negative else value), True


@njit(cache=True, nogil=True, inline="always")
def _code(value_offsets, value_data, j, slots, entries, p):
    """(Inlined: a call passing arrays costs reference counting per span.) The dictionary code of value ``j`` in column ``p`` (added when new); -1 when full.
    ``slots[p]`` is an open-addressing table of entry numbers + 1; ``entries[p, d]`` is the
    value row of entry ``d`` and ``entries[p, -1]`` the number of entries."""
    v0, v1 = value_offsets[j], value_offsets[j + 1]
    h = _FNV_OFFSET
    for i in range(v0, v1):
        h = (h ^ np.uint64(value_data[i])) * _FNV_PRIME
    mask = slots.shape[1] - 1
    slot = np.int64(h & np.uint64(mask))
    while slots[p, slot] != 0:
        d = slots[p, slot] - 1
        e = entries[p, d]
        if _equal(value_data, v0, v1, value_data, value_offsets[e], value_offsets[e + 1]):
            return d
        slot = (slot + 1) & mask
    used = entries[p, entries.shape[1] - 1]
    if 2 * (used + 1) > slots.shape[1]:
        return -1
    entries[p, used] = j
    entries[p, entries.shape[1] - 1] = used + 1
    slots[p, slot] = used + 1
    return used


@njit(cache=True, nogil=True)
def promote(counts, key_offsets, key_data, value_offsets, value_data, value_valid, name_offsets, names, is_int,
            codes, numbers, number_valid, slots, entries, kept_key_offsets, kept_key_data, kept_value_offsets,
            kept_value_data, kept_value_valid, kept_counts):
    """One pass over the flat key/value arrays of ``counts.size`` owners. Fills, per owner and
    promoted key ``p``: ``codes[p]`` (dictionary code of a string column, -1 null),
    ``numbers[p]``/``number_valid[p]`` (integer columns); the dictionary (``entries``, see
    :func:`_code`); and the attributes that stay, copied into the ``kept_*`` buffers with
    ``kept_counts`` per owner. Returns how many stayed, or -1 when a column's dictionary is
    full (the caller then promotes without the kernel)."""
    promoted = name_offsets.size - 1
    last = np.empty(promoted, dtype=np.int64)
    remove = np.empty(promoted, dtype=np.bool_)
    which = np.empty(64, dtype=np.int64)  # the promoted key of each of an owner's attributes
    row = 0
    kept = 0
    kept_key_offsets[0] = 0
    kept_value_offsets[0] = 0
    for owner in range(counts.size):
        first, stop = row, row + counts[owner]
        row = stop
        if stop - first > which.size:
            which = np.empty(2 * (stop - first), dtype=np.int64)
        last[:] = -1
        for j in range(first, stop):
            match = -1
            k0, k1 = key_offsets[j], key_offsets[j + 1]
            for p in range(promoted):
                if _equal(key_data, k0, k1, names, name_offsets[p], name_offsets[p + 1]):
                    match = p
                    break
            which[j - first] = match
            if match >= 0:
                last[match] = j
        for p in range(promoted):
            j = last[p]
            remove[p] = True
            if j < 0:
                codes[p, owner] = -1
                continue
            if is_int[p]:
                if value_valid[j]:
                    value, ok = _decimal(value_data, value_offsets[j], value_offsets[j + 1])
                    numbers[p, owner] = value
                    number_valid[p, owner] = ok
                    remove[p] = ok  # not an integer: it stays in the map, lose nothing
            elif value_valid[j]:
                code = _code(value_offsets, value_data, j, slots, entries, p)
                if code < 0:
                    return -1
                codes[p, owner] = code
            else:
                codes[p, owner] = -1
        owner_kept = 0
        for j in range(first, stop):
            match = which[j - first]
            if match >= 0 and remove[match]:
                continue
            _append(kept_key_offsets, kept_key_data, kept, key_data, key_offsets[j], key_offsets[j + 1])
            _append(kept_value_offsets, kept_value_data, kept, value_data, value_offsets[j], value_offsets[j + 1])
            kept_value_valid[kept] = value_valid[j]
            kept += 1
            owner_kept += 1
        kept_counts[owner] = owner_kept
    return kept


@njit(cache=True, nogil=True, inline="always")
def _append(offsets, data, i, source, start, stop):
    """Element ``i`` of an (offsets, data) string buffer := ``source[start:stop]``."""
    at = offsets[i]
    for j in range(stop - start):
        data[at + j] = source[start + j]
    offsets[i + 1] = at + stop - start


@njit(cache=True, nogil=True)
def repeat_owner_strings(owner_offsets, owner_data, first, index, offsets, data):
    """Each span's owner's strings into (``offsets``, ``data``), sized by the caller: span
    ``i`` gets the strings ``first[index[i]]`` to ``first[index[i] + 1]`` of the owner arrays.

    Spans of one owner (resource) come in runs, and an owner's strings are contiguous, so a
    run is its owner's bytes copied once and then doubled in place: long copies, no per-span
    byte loop.
    """
    n = index.size
    offsets[0] = 0
    s = 0
    at = 0
    i = 0
    while i < n:
        r = index[i]
        run_end = i + 1
        while run_end < n and index[run_end] == r:
            run_end += 1
        a, b = first[r], first[r + 1]
        base = owner_offsets[a]
        size = owner_offsets[b] - base
        for copy in range(run_end - i):
            shift = at + copy * size - base
            for t in range(a, b):
                s += 1
                offsets[s] = owner_offsets[t + 1] + shift
        total = size * (run_end - i)
        for j in range(size):
            data[at + j] = owner_data[base + j]
        done = size
        while done < total:
            step = min(done, total - done)
            data[at + done : at + done + step] = data[at : at + step]
            done += step
        at += total
        i = run_end
