"""Attribute promotion in one compiled pass over the flat key/value arrays (``_columns._promote``).

Per owner (span), each promoted key's last value becomes its column; integer columns keep
a value in the map when it is not a decimal integer (nothing is lost). One pass replaces a
compare, filter and scatter per promoted key.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def _matches(key_data, k0, k1, names, n0, n1):
    if k1 - k0 != n1 - n0:
        return False
    for j in range(k1 - k0):
        if key_data[k0 + j] != names[n0 + j]:
            return False
    return True


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def promote(counts, key_offsets, key_data, value_offsets, value_data, value_valid,
            name_offsets, names, is_int, keep, chosen, numbers, number_valid, kept_counts):
    """Fill ``keep`` (per attribute), ``chosen`` (promoted x owners: the row of the value, -1
    none), ``numbers``/``number_valid`` (the int columns) and ``kept_counts`` (per owner)."""
    promoted = name_offsets.size - 1
    last = np.empty(promoted, dtype=np.int64)
    row = 0
    for owner in range(counts.size):
        first, stop = row, row + counts[owner]
        row = stop
        last[:] = -1
        for j in range(first, stop):
            keep[j] = True
            for p in range(promoted):
                if _matches(key_data, key_offsets[j], key_offsets[j + 1], names, name_offsets[p], name_offsets[p + 1]):
                    last[p] = j
                    break
        for p in range(promoted):
            j = last[p]
            if j < 0:
                continue
            remove = True
            if is_int[p]:
                if value_valid[j]:
                    value, ok = _decimal(value_data, value_offsets[j], value_offsets[j + 1])
                    numbers[p, owner] = value
                    number_valid[p, owner] = ok
                    remove = ok  # not an integer: it stays in the map, lose nothing
            else:
                chosen[p, owner] = j
            if remove:
                for i in range(first, stop):
                    if _matches(key_data, key_offsets[i], key_offsets[i + 1], names, name_offsets[p],
                                name_offsets[p + 1]):
                        keep[i] = False
        kept = 0
        for j in range(first, stop):
            if keep[j]:
                kept += 1
        kept_counts[owner] = kept
