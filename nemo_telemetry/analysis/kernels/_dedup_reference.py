"""Span deduplication without numba: the same functions as ``_dedup_kernel``, on the same hash
set, so the seam (``compiled``) may take either for any batch and the set stays one.

Ids become words with numpy over the whole batch; the set's probes are a Python loop (a few
µs a key), which the seam keeps to small batches (:data:`~.compiled.SMALL_ROWS`).
"""

from __future__ import annotations

import numpy as np

HEX_VALUE = np.full(256, -1, dtype=np.int64)
"""Each byte's value as a hex digit, -1 for a byte that is not one."""
HEX_VALUE[np.frombuffer(b"0123456789", dtype=np.uint8)] = np.arange(10)
HEX_VALUE[np.frombuffer(b"abcdef", dtype=np.uint8)] = np.arange(10, 16)
HEX_VALUE[np.frombuffer(b"ABCDEF", dtype=np.uint8)] = np.arange(10, 16)

_MASK64 = (1 << 64) - 1
_SHIFTS = np.arange(60, -1, -4, dtype=np.uint64)


def _words(data: np.ndarray, starts: np.ndarray, digits: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``digits``-digit hex numbers at ``starts`` (in chunks of 16 digits) and whether each is."""
    values = HEX_VALUE[data[starts[:, None] + np.arange(digits)]] if starts.size else np.zeros((0, digits), np.int64)
    ok = (values >= 0).all(axis=1)
    nibbles = (values & 15).astype(np.uint64).reshape(len(starts), digits // 16, 16)
    return np.bitwise_or.reduce(nibbles << _SHIFTS, axis=2), ok


def id_words(trace_offsets, trace_data, span_offsets, span_data, out):
    """``_dedup_kernel.id_words``: fill ``out`` (n, 3); True for the rows whose ids are odd."""
    n = out.shape[0]
    starts_t, starts_s = trace_offsets[:n], span_offsets[:n]
    regular = (trace_offsets[1 : n + 1] - starts_t == 32) & (span_offsets[1 : n + 1] - starts_s == 16)
    rows = np.flatnonzero(regular)
    trace, trace_ok = _words(trace_data, starts_t[rows], 32)
    span, span_ok = _words(span_data, starts_s[rows], 16)
    ok = trace_ok & span_ok
    out[rows[ok], :2] = trace[ok]
    out[rows[ok], 2] = span[ok, 0]
    odd = ~regular
    odd[rows[~ok]] = True
    return odd


def _slot(a: int, b: int, c: int, mask: int) -> int:
    """``_dedup_kernel._slot`` in Python integers."""
    h = ((a * 0x9E3779B97F4A7C15) ^ (b * 0xC2B2AE3D27D4EB4F) ^ c) & _MASK64
    h ^= h >> 29
    h = (h * 0xBF58476D1CE4E5B9) & _MASK64
    h ^= h >> 32
    return h & mask


def _find(table, used, key: tuple[int, int, int], mask: int) -> int:
    slot = _slot(*key, mask)
    while used[slot]:
        if tuple(table[slot].tolist()) == key:
            break
        slot = (slot + 1) & mask
    return slot


def admit(table, used, keys, fresh) -> int:
    """``_dedup_kernel.admit``: insert each row of ``keys``; ``fresh[i]`` whether row i was new."""
    mask = table.shape[0] - 1
    added = 0
    for i, key in enumerate(map(tuple, keys.tolist())):
        slot = _find(table, used, key, mask)
        fresh[i] = not used[slot]
        if fresh[i]:
            used[slot] = True
            table[slot] = key
            added += 1
    return added



def contains(table, used, keys, found) -> int:
    """``_dedup_kernel.contains``: ``found[i]`` whether row i of ``keys`` is in the set."""
    mask = table.shape[0] - 1
    for i, key in enumerate(map(tuple, keys.tolist())):
        found[i] = used[_find(table, used, key, mask)]
    return len(found)

def rehash(table, used, bigger, bigger_used) -> None:
    """``_dedup_kernel.rehash``: move every key into an empty larger set."""
    mask = bigger.shape[0] - 1
    for key in map(tuple, table[used].tolist()):
        target = _slot(*key, mask)
        while bigger_used[target]:
            target = (target + 1) & mask
        bigger_used[target] = True
        bigger[target] = key


def forget(table, used, keys) -> int:
    """``_dedup_kernel.forget``: remove each row of ``keys`` (backward shift, no tombstones)."""
    mask = table.shape[0] - 1
    removed = 0
    for key in map(tuple, keys.tolist()):
        slot = _find(table, used, key, mask)
        if not used[slot]:
            continue
        hole = slot
        j = (hole + 1) & mask
        while used[j]:
            home = _slot(*table[j].tolist(), mask)
            if ((j - home) & mask) >= ((j - hole) & mask):  # the hole lies on j's probe path
                table[hole] = table[j]
                hole = j
            j = (j + 1) & mask
        used[hole] = False
        removed += 1
    return removed
