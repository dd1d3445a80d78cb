"""Attribute promotion, the type maps beside it, and per-owner maps in compiled passes
(``_promote.promote``, ``_promote.per_owner_map``).

Per owner (span), each promoted key's last value becomes its column; integer columns keep
a value in the map when it is not a decimal integer (nothing is lost). One pass matches each
key once, writes the promoted string columns as dictionary codes (their values repeat: a few
buckets over millions of spans) and copies the attributes that stay into the map's buffers.
That replaces a compare, filter, take and dictionary cast per promoted key.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from nemo_telemetry.analysis.kernels._words import decimal_size, load8, magnitude, store8, write_decimal

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
def _promoted_key(key_data, k0, k1, names, name_offsets):
    """Which promoted name ``key_data[k0:k1]`` is (its index in ``name_offsets``), or -1."""
    for p in range(name_offsets.size - 1):
        if _equal(key_data, k0, k1, names, name_offsets[p], name_offsets[p + 1]):
            return p
    return -1


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
            kept_value_data, kept_value_valid, kept_offsets, tags, tag_offsets, tag_data, int_tag, string_tag,
            type_key_offsets, type_key_data, type_value_offsets, type_value_data, type_offsets):
    """One pass over the flat key/value arrays of ``counts.size`` owners. Fills, per owner and
    promoted key ``p``: ``codes[p]`` (dictionary code of a string column, -1 null),
    ``numbers[p]``/``number_valid[p]`` (integer columns); the dictionary (``entries``, see
    :func:`_code`); the attributes that stay, copied into the ``kept_*`` buffers with
    the map offsets ``kept_offsets`` (int32, one more than the owners); and the owner's type map
    (see :func:`_owner_types`) into the ``type_*`` buffers, its map offsets ``type_offsets``. Returns how many stayed, or -1 when a column's dictionary is
    full (the caller then promotes without the kernel)."""
    promoted = name_offsets.size - 1
    typed = 0
    type_key_offsets[0] = 0
    type_value_offsets[0] = 0
    last = np.empty(promoted, dtype=np.int64)
    remove = np.empty(promoted, dtype=np.bool_)
    which = np.empty(64, dtype=np.int64)  # the promoted key of each of an owner's attributes
    row = 0
    kept = 0
    kept_key_offsets[0] = 0
    kept_value_offsets[0] = 0
    kept_offsets[0] = 0
    type_offsets[0] = 0
    for owner in range(counts.size):
        first, stop = row, row + counts[owner]
        row = stop
        if stop - first > which.size:
            which = np.empty(2 * (stop - first), dtype=np.int64)
        last[:] = -1
        for j in range(first, stop):
            match = _promoted_key(key_data, key_offsets[j], key_offsets[j + 1], names, name_offsets)
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
        for j in range(first, stop):
            match = which[j - first]
            if match >= 0 and remove[match]:
                continue
            _append(kept_key_offsets, kept_key_data, kept, key_data, key_offsets[j], key_offsets[j + 1])
            _append(kept_value_offsets, kept_value_data, kept, value_data, value_offsets[j], value_offsets[j + 1])
            kept_value_valid[kept] = value_valid[j]
            kept += 1
        kept_offsets[owner + 1] = kept
        typed += _owner_types(owner, first, stop, which, key_data, key_offsets, key_offsets, True, names, name_offsets,
                              is_int, number_valid, tags, tag_offsets, tag_data, int_tag, string_tag,
                              type_key_offsets, type_key_data, type_value_offsets, type_value_data, typed)
        type_offsets[owner + 1] = typed
    return kept


@njit(cache=True, nogil=True, inline="always")
def _put(offsets, data, i, source, start, size):
    """Element ``i`` of an (offsets, data) string buffer := ``source[start:start + size]``."""
    at = offsets[i]
    _copy_words(data, at, source, start, size)
    offsets[i + 1] = at + size


@njit(cache=True, nogil=True, inline="always")
def _owner_types(owner, first, stop, which, key_source, key_start, key_second, offsets_mode, names, name_offsets,
                 is_int, number_valid, tags, tag_offsets, tag_data, int_tag, string_tag, type_key_offsets,
                 type_key_data, type_value_offsets, type_value_data, typed):
    """(Inlined, as :func:`_code`.) The type map of one owner's attributes ``first:stop``, as
    entries ``typed`` on of the ``type_*`` buffers; returns how many. ``tags[j]`` is attribute
    ``j``'s type tag, a string of (``tag_offsets``, ``tag_data``), or -1 for none (a string).
    Key ``j`` is ``key_source[key_start[j]:key_second[j + 1]]`` when ``offsets_mode``, else
    ``key_source[key_start[j]:key_start[j] + key_second[j]]``. As ``_promote.type_map``: every
    tagged attribute in order, except an int (``int_tag``) in its filled integer column (the
    column's type is its type); then, per filled integer column that no such int fed, its key
    tagged ``string_tag`` (the column's value came from a string of digits)."""
    count = 0
    from_int = np.uint64(0)  # bit p: an int on integer column p's key (at most 64 promoted keys)
    for j in range(first, stop):
        code = tags[j]
        if code < 0:
            continue
        match = which[j - first]
        if match >= 0 and code == int_tag and is_int[match]:
            from_int |= np.uint64(1) << np.uint64(match)
            if number_valid[match, owner]:
                continue
        k0 = key_start[j]
        size = key_second[j + 1] - k0 if offsets_mode else key_second[j]
        _put(type_key_offsets, type_key_data, typed + count, key_source, k0, size)
        t0 = tag_offsets[code]
        _put(type_value_offsets, type_value_data, typed + count, tag_data, t0, tag_offsets[code + 1] - t0)
        count += 1
    for p in range(name_offsets.size - 1):
        if not is_int[p] or not number_valid[p, owner] or from_int & (np.uint64(1) << np.uint64(p)):
            continue
        n0 = name_offsets[p]
        _put(type_key_offsets, type_key_data, typed + count, names, n0, name_offsets[p + 1] - n0)
        t0 = tag_offsets[string_tag]
        _put(type_value_offsets, type_value_data, typed + count, tag_data, t0, tag_offsets[string_tag + 1] - t0)
        count += 1
    return count


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


# ------------------------------------------------------------------ promotion over walk records
#
# The protobuf walk records where each attribute's key and value lie in the request buffer. The
# passes below promote straight from those records, so the attributes' keys and value strings
# are never built as whole arrays first (two fresh buffers per batch, a page fault per 4 KiB):
# values are written as the schema's strings only where they end up, in the map or a dictionary.

_TRUE = np.frombuffer(b"true", dtype=np.uint8)
_FALSE = np.frombuffer(b"false", dtype=np.uint8)
_DECIMAL_LIMIT = np.uint64(10**18)  # _decimal takes at most 18 digits
DICTIONARY_BYTES = 1 << 16  # per promoted string column: more distinct bytes fall back


@njit(cache=True, nogil=True, inline="always")
def _value_size(k, v, n, special_offsets, kinds):
    """Bytes of a value (kind ``k``, value ``v``, length ``n``: see ``AttributeRecords``) as the
    schema's string, as ``value_strings`` writes it; -1 when it is null."""
    string_kind, bool_kind, int_kind, special_kind = kinds
    if k >= special_kind:
        return special_offsets[k - special_kind + 1] - special_offsets[k - special_kind]
    if k == string_kind:
        return n
    if k == int_kind:
        return decimal_size(v)
    if k == bool_kind:
        return 4 if v != 0 else 5
    return -1


@njit(cache=True, nogil=True, inline="always")
def _present(k, kinds):
    """Whether a value of kind ``k`` is a string in the table (not null)."""
    return k >= kinds[3] or k == kinds[0] or k == kinds[1] or k == kinds[2]


@njit(cache=True, nogil=True, _nrt=False)
def value_bytes(kind, value, length, special_offsets, kinds):
    """The bytes of every attribute value as the schema's string, together (to size a buffer)."""
    total = 0
    for i in range(kind.size):
        size = _value_size(kind[i], value[i], length[i], special_offsets, kinds)
        if size > 0:
            total += size
    return total


_HIGH_BITS = np.uint64(0x8080808080808080)


@njit(cache=True, nogil=True, inline="always")
def _copy_words(out, at, source, start, size):
    """``out[at:at + size] = source[start:start + size]`` eight bytes a step; returns the OR
    of the bytes copied, as a word (any of ``_HIGH_BITS`` set: not ASCII)."""
    seen = np.uint64(0)
    k = 0
    while k + 8 <= size:
        word = load8(source, start + k)
        seen |= word
        store8(out, at + k, word)
        k += 8
    while k < size:
        c = source[start + k]
        seen |= np.uint64(c)
        out[at + k] = c
        k += 1
    return seen


@njit(cache=True, nogil=True, inline="always")
def _write_value(out, at, data, k, v, n, special_offsets, special_data, kinds):
    """A value's string (see :func:`_value_size`) at ``out[at:]``: (end, OR of the bytes read
    from ``data`` as a word, which is all that may not be ASCII)."""
    string_kind, bool_kind, int_kind, special_kind = kinds
    if k >= special_kind:
        first, stop = special_offsets[k - special_kind], special_offsets[k - special_kind + 1]
        _copy_words(out, at, special_data, first, stop - first)
        return at + stop - first, np.uint64(0)
    if k == string_kind:
        return at + n, _copy_words(out, at, data, v, n)
    if k == int_kind:
        end = at + decimal_size(v)
        write_decimal(out, at, end, v)
        return end, np.uint64(0)
    if k == bool_kind:
        word = _TRUE if v != 0 else _FALSE
        for j in range(word.size):
            out[at + j] = word[j]
        return at + word.size, np.uint64(0)
    return at, np.uint64(0)


@njit(cache=True, nogil=True, inline="always")
def _hash_bytes(source, start, size):
    """(hash, OR of the bytes as a word) of ``source[start:start + size]``: the hash from the
    length and the first and last eight bytes, as the walk hashes span names (the probe then
    compares whole strings), the OR over every byte."""
    h = np.uint64(size) * np.uint64(0x9E3779B97F4A7C15)
    seen = np.uint64(0)
    if size >= 8:
        k = 0
        while k + 8 <= size:
            seen |= load8(source, start + k)
            k += 8
        last = load8(source, start + size - 8)
        seen |= last
        h ^= load8(source, start) * np.uint64(0xC2B2AE3D27D4EB4F)
        h ^= last * np.uint64(0x165667B19E3779F9)
    else:
        for pos in range(start, start + size):
            c = np.uint64(source[pos])
            seen |= c
            h = (h ^ c) * _FNV_PRIME
    return h ^ (h >> np.uint64(29)), seen


@njit(cache=True, nogil=True, inline="always")
def _same_words(a, a0, b, b0, size):
    """Whether ``a[a0:a0 + size] == b[b0:b0 + size]``, eight bytes a step."""
    k = 0
    while k + 8 <= size:
        if load8(a, a0 + k) != load8(b, b0 + k):
            return False
        k += 8
    while k < size:
        if a[a0 + k] != b[b0 + k]:
            return False
        k += 1
    return True


@njit(cache=True, nogil=True, inline="always")
def _record_code(source, v0, v1, slots, dict_offsets, dict_data, dict_count, p):
    """(Inlined, as :func:`_code`.) (dictionary code, OR of the bytes as a word) of
    ``source[v0:v1]`` in column ``p``, added when new; code -1 when the dictionary is full.
    Column ``p``'s entries are bytes of ``dict_data`` from ``base = p * DICTIONARY_BYTES``:
    entry ``d`` is ``dict_data[base + dict_offsets[p, d]:base + dict_offsets[p, d + 1]]``, in
    the order they were added."""
    size = v1 - v0
    h, seen = _hash_bytes(source, v0, size)
    mask = slots.shape[1] - 1
    slot = np.int64(h & np.uint64(mask))
    base = p * DICTIONARY_BYTES
    while slots[p, slot] != 0:
        d = slots[p, slot] - 1
        e0 = dict_offsets[p, d]
        if dict_offsets[p, d + 1] - e0 == size and _same_words(dict_data, base + e0, source, v0, size):
            return d, seen
        slot = (slot + 1) & mask
    used = dict_count[p]
    at = dict_offsets[p, used]
    if 2 * (used + 1) > slots.shape[1] or at + size > DICTIONARY_BYTES:
        return -1, seen
    _copy_words(dict_data, base + at, source, v0, size)
    dict_offsets[p, used + 1] = at + size
    dict_count[p] = used + 1
    slots[p, slot] = used + 1
    return used, seen


@njit(cache=True, nogil=True, _nrt=False)
def promote_records(data, key_start, key_length, kind, value, length, special_offsets, special_data, kinds, counts,
                    name_offsets, names, is_int, codes, numbers, number_valid, slots, dict_offsets, dict_data,
                    dict_count, kept_key_offsets, kept_key_data, kept_value_offsets, kept_value_data,
                    kept_value_valid, kept_offsets, last, remove, which, tags, tag_offsets, tag_data, int_tag,
                    string_tag, type_key_offsets, type_key_data, type_value_offsets, type_value_data, type_offsets):
    """:func:`promote` over the walk's attribute records (``_promote.AttributeRecords``): keys
    are ``data[key_start:key_start + key_length]``, values as :func:`_value_size` reads them.
    The same columns and kept attributes come out, but each string column's dictionary is
    built in ``dict_*`` (see :func:`_record_code`), and nothing is UTF-8 checked: returns how
    many attributes stayed, -1 when a dictionary is full and -2 when a key or string value has
    a byte >= 0x80 (the caller then builds the string arrays, checks them, and calls
    :func:`promote`).

    Compiled without reference counting, as the walk is (every array is the caller's for the
    whole call; counting the arrays passed to inlined helpers would dominate the walk), so the
    caller gives the room: ``last`` and ``remove`` one per promoted key, ``which`` one per
    attribute of the owner with the most. The type map comes out as :func:`promote` writes it."""
    string_kind, special_kind = kinds[0], kinds[3]
    promoted = name_offsets.size - 1
    seen = np.uint64(0)
    row = 0
    kept = 0
    typed = 0
    kept_key_offsets[0] = 0
    kept_value_offsets[0] = 0
    type_key_offsets[0] = 0
    type_value_offsets[0] = 0
    kept_offsets[0] = 0
    type_offsets[0] = 0
    for owner in range(counts.size):
        first, stop = row, row + counts[owner]
        row = stop
        for p in range(promoted):
            last[p] = -1
        for j in range(first, stop):
            match = _promoted_key(data, key_start[j], key_start[j] + key_length[j], names, name_offsets)
            which[j - first] = match
            if match >= 0:
                last[match] = j
        for p in range(promoted):
            j = last[p]
            remove[p] = True
            if j < 0 or not _present(kind[j], kinds):  # null (an integer column: stays 0, invalid)
                if not is_int[p]:
                    codes[p, owner] = -1  # (an integer column's codes are never read: untouched)
                continue
            k, v, n = kind[j], value[j], length[j]
            if is_int[p]:
                if k >= special_kind:
                    s = k - special_kind
                    number, ok = _decimal(special_data, special_offsets[s], special_offsets[s + 1])
                elif k == string_kind:
                    number, ok = _decimal(data, v, v + n)
                elif k == kinds[2]:
                    ok = magnitude(v) < _DECIMAL_LIMIT
                    number = v if ok else np.int64(0)
                else:
                    number, ok = np.int64(0), False
                numbers[p, owner] = number
                number_valid[p, owner] = ok
                remove[p] = ok  # not an integer: it stays in the map, lose nothing
            else:
                if k == string_kind:
                    code, bits = _record_code(data, v, v + n, slots, dict_offsets, dict_data, dict_count, p)
                    seen |= bits
                else:  # written where the next kept value goes, and overwritten there
                    at = kept_value_offsets[kept]
                    end, bits = _write_value(kept_value_data, at, data, k, v, n, special_offsets, special_data, kinds)
                    code, bits = _record_code(kept_value_data, at, end, slots, dict_offsets, dict_data, dict_count, p)
                if code < 0:
                    return -1
                codes[p, owner] = code
        for j in range(first, stop):
            match = which[j - first]
            k, v, n = kind[j], value[j], length[j]
            if match >= 0 and remove[match]:
                if j != last[match] and k == string_kind:  # shadowed by a later value: only checked
                    seen |= _hash_bytes(data, v, n)[1]
                continue
            at = kept_key_offsets[kept]
            seen |= _copy_words(kept_key_data, at, data, key_start[j], key_length[j])
            kept_key_offsets[kept + 1] = at + key_length[j]
            end, bits = _write_value(kept_value_data, kept_value_offsets[kept], data, k, v, n, special_offsets,
                                     special_data, kinds)
            seen |= bits
            kept_value_offsets[kept + 1] = end
            kept_value_valid[kept] = _present(k, kinds)
            kept += 1
        kept_offsets[owner + 1] = kept
        typed += _owner_types(owner, first, stop, which, data, key_start, key_length, False, names, name_offsets,
                              is_int, number_valid, tags, tag_offsets, tag_data, int_tag, string_tag,
                              type_key_offsets, type_key_data, type_value_offsets, type_value_data, typed)
        type_offsets[owner + 1] = typed
        if seen & _HIGH_BITS:  # as soon as seen: the caller redoes the batch another way
            return -2
    return kept
