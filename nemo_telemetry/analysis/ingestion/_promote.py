"""Attribute promotion and the per-owner columns: attributes that have their own column
(``rl.iteration``, the resource's service, run, rank and span groups) taken out of the maps,
and each span's resource and scope values repeated from its owner's.

The rules that decide a span table's columns from attributes, in one place (compiled through
``_flatten_kernel``, with an Arrow-only path of the same result); apart from
:mod:`~nemo_telemetry.analysis.ingestion._columns`, which assembles the tables around them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.ingestion._kernel_arrays import TypeTags, string_array, string_offsets, zeros_array
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.schema import ITERATION, PROMOTED_RESOURCE_ATTRIBUTES, promote_resource

__all__ = ["AttributeRecords", "TypeTags", "promote", "promote_records", "promote_with_types",
           "promote_records_with_types", "promote_arrow", "per_owner_dict", "per_owner_map", "per_owner_uint32", "resource_columns", "distinct_owners",
           "string_buffers", "to_int", "type_map", "promoted_types"]

_INT_COLUMNS = {ITERATION, "rank"}
_MOST_PROMOTED = 64  # the kernels keep a bit per promoted key of an owner (``_flatten_kernel._owner_types``)


@dataclass(frozen=True)
class AttributeRecords:
    """Each attribute's key and value as a decoder found them in its buffer ``data``, so that
    promotion reads them there: no array of every key and value string is built first.

    Key ``i`` is ``data[key_start[i]:key_start[i] + key_length[i]]``. Value ``i`` by its kind
    ``kind[i]``, against ``kinds`` = (string, bool, int, special): a string is at
    ``data[value[i]:value[i] + length[i]]``, a bool or an int is ``value[i]``, and a kind
    ``special + s`` is the decoder's own string ``s`` of (``special_offsets``, ``special_data``)
    (rare kinds it wrote itself); any other kind is null. ``strings()`` builds the key and value
    string arrays after all (UTF-8 checked) for what the compiled pass leaves alone: non-ASCII
    text, a full dictionary. The arrays may be scratch that a thread reuses: nothing built from
    them keeps a view of them.
    """

    data: np.ndarray
    key_start: np.ndarray
    key_length: np.ndarray
    kind: np.ndarray
    value: np.ndarray
    length: np.ndarray
    special_offsets: np.ndarray
    special_data: np.ndarray
    kinds: tuple[int, int, int, int]
    strings: Any  # () -> (keys, values) string arrays


def to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def promote(
    counts: np.ndarray, keys: pa.Array, values: pa.Array, owners: int, promoted: tuple[str, ...]
) -> tuple[pa.Array, dict]:
    """The attribute map column without the promoted keys, and one column per promoted key.

    When a key repeats on one owner the last value wins for the promoted column (as the
    OpenTelemetry SDK does when a span sets an attribute twice). An integer column's value
    that is not a decimal integer stays in the map.
    """
    return promote_with_types(counts, keys, values, owners, promoted, None)[:2]


def promote_with_types(
    counts: np.ndarray, keys: pa.Array, values: pa.Array, owners: int, promoted: tuple[str, ...],
    tags: TypeTags | None,
) -> tuple[pa.Array, dict, pa.MapArray | None]:
    """:func:`promote`, and the ``attribute_types`` map of the attributes' ``tags`` (as
    :func:`type_map` builds it) written in the same pass; None for it when ``tags`` is None."""
    from nemo_telemetry.analysis.kernels import compiled as _compiled

    def reference():
        attributes, columns = promote_arrow(counts, keys, values, owners, promoted)
        return attributes, columns, _types_reference(counts, owners, tags, keys, promoted, columns)

    compiled = lambda fk: _promote_compiled(fk, counts, keys, values, owners, promoted, tags) or reference()  # noqa: E731
    return _compiled.run(("_flatten_kernel",), len(keys), compiled, reference, unit="rows", passes=(ValueError,))


def _types_reference(counts, owners: int, tags: TypeTags | None, keys: pa.Array, promoted, columns: dict):
    """:func:`type_map` of ``tags``, the reference of the kernels' type maps."""
    if tags is None:
        return None
    int_columns = {key: columns[key] for key in promoted if key in _INT_COLUMNS}
    return type_map(counts, owners, tags.array(), lambda rows: keys.take(pa.array(rows)), int_columns)


def _promote_compiled(_flatten_kernel, counts, keys, values, owners, promoted, tags):
    """:func:`promote_with_types` by the compiled kernel; None when it cannot (a full dictionary)."""
    if len(promoted) > _MOST_PROMOTED:
        return None
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    names, name_offsets, is_int = _promoted_names(promoted)
    key_offsets, key_data, _ = string_buffers(keys)
    value_offsets, value_data, value_valid = string_buffers(values)
    codes, numbers, number_valid = _promoted_room(len(promoted), owners)
    slots = np.zeros((len(promoted), _flatten_kernel.DICTIONARY_SLOTS), dtype=np.int64)
    entries = np.zeros((len(promoted), _flatten_kernel.DICTIONARY_SLOTS // 2 + 1), dtype=np.int64)
    kept_keys = (string_offsets(len(keys), key_data.size), np.empty(key_data.size, dtype=np.uint8))
    kept_values = (string_offsets(len(keys), value_data.size), np.empty(value_data.size, dtype=np.uint8))
    kept_valid = np.empty(len(keys), dtype=np.bool_)
    kept_offsets = np.empty(owners + 1, dtype=np.int32)
    room = _TypeRoom(tags, len(keys), int(key_data.size), owners, promoted, is_int)
    kept = _flatten_kernel.promote(
        counts, key_offsets, key_data, value_offsets, value_data, value_valid, name_offsets,
        names, is_int, codes, numbers, number_valid, slots, entries,
        *kept_keys, *kept_values, kept_valid, kept_offsets, *room.arguments(),
    )
    if kept < 0:  # thousands of distinct values in a promoted string column: rare, not compiled
        return None
    dictionaries = [values.take(pa.array(entries[p, : entries[p, -1]])).cast(pa.string()) for p in range(len(promoted))]
    columns = _promoted_columns(promoted, is_int, codes, numbers, number_valid, dictionaries)
    return _kept_map(kept, kept_offsets, kept_keys, kept_values, kept_valid), columns, room.types()


class _TypeRoom:
    """The type-map arguments of a promote kernel (tag codes and strings, and room for the map
    it writes), and the map from what it wrote. Entries: the tagged attributes, and at most one
    ``string`` per owner and integer column (see ``_flatten_kernel._owner_types``)."""

    def __init__(self, tags: TypeTags | None, attributes: int, key_bytes: int, owners: int,
                 promoted: tuple[str, ...], is_int: np.ndarray):
        self.wanted = tags is not None
        if tags is None:
            tags = TypeTags(np.full(attributes, -1, dtype=np.int32), ())
        dictionary = list(tags.dictionary)
        if "string" not in dictionary:
            dictionary.append("string")
        self.int_tag = dictionary.index("int") if "int" in dictionary else -2
        self.string_tag = dictionary.index("string")
        encoded = [tag.encode() for tag in dictionary]
        sizes = np.array([len(tag) for tag in encoded] + [0], dtype=np.int64)  # code -1 reads the last: 0
        self.tag_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(sizes[:-1], out=self.tag_offsets[1:])
        self.tag_data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.codes = np.ascontiguousarray(tags.codes, dtype=np.int32)
        int_names = [key for key, integer in zip(promoted, is_int.tolist()) if integer]
        entries = self.codes.size + owners * len(int_names)  # room never written costs nothing
        key_room = key_bytes + owners * sum(len(key.encode()) for key in int_names)
        longest = int(sizes.max())
        tagged = self.codes.size * longest if longest <= 16 else int(sizes[self.codes].sum())  # "{...}" tags: long
        value_room = tagged + owners * len(int_names) * len(b"string")
        self.keys = (string_offsets(entries, key_room), np.empty(key_room, dtype=np.uint8))
        self.values = (string_offsets(entries, value_room), np.empty(value_room, dtype=np.uint8))
        self.offsets = np.empty(owners + 1, dtype=np.int32)  # the map's, one per owner and one

    def arguments(self) -> tuple:
        return (self.codes, self.tag_offsets, self.tag_data, self.int_tag, self.string_tag,
                *self.keys, *self.values, self.offsets)

    def types(self) -> pa.MapArray | None:
        """The type map the kernel wrote (its keys were cut from checked strings or are ASCII)."""
        if not self.wanted:
            return None
        offsets = self.offsets
        used = int(offsets[-1])
        (key_offsets, key_data), (value_offsets, value_data) = self.keys, self.values
        keys = string_array(key_offsets[: used + 1], key_data[: key_offsets[used]], utf8_checked=True)
        values = string_array(value_offsets[: used + 1], value_data[: value_offsets[used]], utf8_checked=True)
        return pa.MapArray.from_arrays(pa.array(offsets), keys.cast(pa.string()), values.cast(pa.string()))


def promote_records(counts: np.ndarray, records: AttributeRecords, owners: int, promoted: tuple[str, ...]):
    """:func:`promote` reading the attributes where the decoder found them (see
    :class:`AttributeRecords`); the same result, without the arrays of every key and value."""
    return promote_records_with_types(counts, records, owners, promoted, None)[:2]


def promote_records_with_types(counts: np.ndarray, records: AttributeRecords, owners: int,
                               promoted: tuple[str, ...], tags: TypeTags | None):
    """:func:`promote_with_types` reading the attributes where the decoder found them (see
    :class:`AttributeRecords`)."""
    from nemo_telemetry.analysis.kernels import compiled as _compiled

    def reference():
        keys, values = records.strings()  # non-ASCII text, a full dictionary or no numba: rare
        return promote_with_types(counts, keys, values, owners, promoted, tags)

    compiled = lambda fk: _promote_records_compiled(fk, counts, records, owners, promoted, tags) or reference()  # noqa: E731
    return _compiled.run(("_flatten_kernel",), int(records.kind.size), compiled, reference, unit="rows",
                         passes=(ValueError,))  # bad UTF-8: the decoder's own signal


def _promote_records_compiled(fk, counts, records: AttributeRecords, owners: int, promoted: tuple[str, ...], tags):
    """:func:`promote_records_with_types` by the compiled kernel; None when it cannot."""
    if len(promoted) > _MOST_PROMOTED:
        return None
    r = records
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    names, name_offsets, is_int = _promoted_names(promoted)
    codes, numbers, number_valid = _promoted_room(len(promoted), owners)
    slots = np.zeros((len(promoted), fk.DICTIONARY_SLOTS), dtype=np.int64)
    dict_offsets = np.zeros((len(promoted), fk.DICTIONARY_SLOTS // 2 + 1), dtype=np.int32)
    dict_data = np.empty(len(promoted) * fk.DICTIONARY_BYTES, dtype=np.uint8)  # column p's from p * BYTES
    dict_count = np.zeros(len(promoted), dtype=np.int64)
    key_bytes = int(r.key_length.sum())
    value_bytes = fk.value_bytes(r.kind, r.value, r.length, r.special_offsets, r.kinds)
    kept_keys = (string_offsets(r.kind.size, key_bytes), np.empty(key_bytes, dtype=np.uint8))
    kept_values = (string_offsets(r.kind.size, value_bytes), np.empty(value_bytes, dtype=np.uint8))
    kept_valid = np.empty(r.kind.size, dtype=np.bool_)
    kept_offsets = np.empty(owners + 1, dtype=np.int32)
    typed = _TypeRoom(tags, int(r.kind.size), key_bytes, owners, promoted, is_int)
    kept = fk.promote_records(
        r.data, r.key_start, r.key_length, r.kind, r.value, r.length, r.special_offsets, r.special_data, r.kinds,
        counts, name_offsets, names, is_int, codes, numbers, number_valid, slots, dict_offsets, dict_data,
        dict_count, *kept_keys, *kept_values, kept_valid, kept_offsets, np.empty(len(promoted), dtype=np.int64),
        np.empty(len(promoted), dtype=np.bool_), np.empty(int(counts.max(initial=0)), dtype=np.int64),
        *typed.arguments(),
    )
    if kept >= 0:
        room = fk.DICTIONARY_BYTES
        dictionaries = [  # copied: a few short strings, not the whole room
            string_array(dict_offsets[p, : used + 1].copy(), dict_data[p * room : p * room + dict_offsets[p, used]].copy(), utf8_checked=True)
            for p, used in enumerate(dict_count.tolist())
        ]
        columns = _promoted_columns(promoted, is_int, codes, numbers, number_valid, dictionaries)
        return _kept_map(kept, kept_offsets, kept_keys, kept_values, kept_valid), columns, typed.types()
    return None


def _promoted_names(promoted: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The promoted keys' bytes end to end, their offsets, and which are integer columns."""
    names = [key.encode() for key in promoted]
    name_offsets = np.zeros(len(names) + 1, dtype=np.int64)
    np.cumsum([len(name) for name in names], out=name_offsets[1:])
    is_int = np.array([key in _INT_COLUMNS for key in promoted], dtype=np.bool_)
    return np.frombuffer(b"".join(names), dtype=np.uint8), name_offsets, is_int


def _promoted_room(promoted: int, owners: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, numbers, number_valid) for the promote kernels to fill."""
    codes = np.empty((promoted, owners), dtype=np.int32)
    return codes, np.zeros((promoted, owners), dtype=np.int64), np.zeros((promoted, owners), dtype=np.bool_)


def _promoted_columns(promoted, is_int, codes, numbers, number_valid, dictionaries) -> dict[str, pa.Array]:
    columns = {}
    for p, key in enumerate(promoted):
        if is_int[p]:
            columns[key] = pa.array(numbers[p], mask=~number_valid[p])
        else:
            columns[key] = pa.DictionaryArray.from_arrays(pa.array(codes[p], mask=codes[p] < 0), dictionaries[p])
    return columns


def _kept_map(kept: int, offsets, kept_keys, kept_values, kept_valid) -> pa.MapArray:
    """The attribute map column of the attributes a promote kernel kept (already UTF-8 checked),
    ``offsets`` the map's (int32) as the kernel wrote them."""
    map_keys = string_array(kept_keys[0][: kept + 1], kept_keys[1][: kept_keys[0][kept]], utf8_checked=True)
    map_values = string_array(
        kept_values[0][: kept + 1], kept_values[1][: kept_values[0][kept]], kept_valid[:kept], utf8_checked=True
    )
    return pa.MapArray.from_arrays(pa.array(offsets), map_keys, map_values)


def string_buffers(strings: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 offsets, bytes, validity) of a string array, for a kernel."""
    strings = strings.cast(pa.large_string())
    n = len(strings)
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int64)[strings.offset : strings.offset + n + 1]
    data = strings.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    valid = valid_rows(strings)
    return offsets, data, valid


def promote_arrow(
    counts: np.ndarray, keys: pa.Array, values: pa.Array, owners: int, promoted: tuple[str, ...]
) -> tuple[pa.Array, dict]:
    """:func:`promote` with Arrow compute only (without numba): the same result."""
    owner = np.repeat(np.arange(owners, dtype=np.int64), counts)
    keep = np.ones(len(keys), dtype=bool)
    columns = {}
    for key in promoted:
        hit = pc.equal(keys, key).to_numpy(zero_copy_only=False).copy() if len(keys) else keep[:0]
        column = _scatter(owners, owner[hit], values.filter(pa.array(hit)))
        if key in _INT_COLUMNS:
            column, convertible = _as_int(column)
            hit[hit] = convertible[owner[hit]]  # keep non-integer values in the map, lose nothing
        columns[key] = column
        keep &= ~hit
    kept_counts = np.bincount(owner[keep], minlength=owners) if owners else counts
    offsets = np.zeros(owners + 1, dtype=np.int32)
    np.cumsum(kept_counts, out=offsets[1:])
    mask = pa.array(keep)
    attributes = pa.MapArray.from_arrays(pa.array(offsets), keys.filter(mask), values.filter(mask))
    return attributes, columns


def _scatter(owners: int, rows: np.ndarray, values: pa.Array) -> pa.Array:
    """A column of ``owners`` rows with ``values`` at ``rows`` and null elsewhere."""
    index = np.full(owners, -1, dtype=np.int64)
    index[rows] = np.arange(len(rows), dtype=np.int64)
    take = pa.array(index, mask=index < 0)
    return values.take(take)


def _as_int(column: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """int64 of decimal strings; also which rows converted (null rows count as converted)."""
    valid = valid_rows(column)
    numeric = pc.match_substring_regex(column, r"^-?[0-9]{1,18}$")
    numeric = pc.fill_null(numeric, False).to_numpy(zero_copy_only=False)
    clean = pc.if_else(pa.array(numeric), column, pa.scalar(None, pa.string()))
    return clean.cast(pa.int64()), numeric | ~valid


def _indices(index) -> np.ndarray:
    """An owner-index column (resource or scope of each span) as an int64 numpy array."""
    if isinstance(index, pa.ChunkedArray):
        index = index.combine_chunks()
    if isinstance(index, pa.Array):
        index = index.to_numpy(zero_copy_only=False)
    return np.asarray(index, dtype=np.int64)


def per_owner_dict(values: list, index) -> pa.DictionaryArray:
    """A dictionary column of each span's owner value (resource or scope; few owners, many
    spans): the owners' values are encoded once and only the int32 indices are per span."""
    index = _indices(index)
    if all(value is None for value in values):  # no owner has one (schema URLs, mostly): shared zeros
        return pa.DictionaryArray.from_arrays(zeros_array(index.size, pa.int32(), null=True), pa.array([], pa.string()))
    if all(value is not None and value == values[0] for value in values):  # one value (a batch of one process's)
        return pa.DictionaryArray.from_arrays(zeros_array(index.size, pa.int32()), pa.array(values[:1], pa.string()))
    encoded = pa.array(values, pa.string()).dictionary_encode()
    owner_codes = encoded.indices.to_numpy(zero_copy_only=False)
    if encoded.null_count:
        owner_codes = np.where(valid_rows(encoded), owner_codes, -1)
    codes = owner_codes.astype(np.int32, copy=False)[index]
    return pa.DictionaryArray.from_arrays(_nullable(codes), encoded.dictionary, safe=False)  # codes of it


def _nullable(codes: np.ndarray) -> pa.Array:
    """Dictionary codes, -1 as null; without a validity bitmap when none is."""
    missing = codes < 0
    return pa.array(codes, mask=missing) if missing.any() else pa.array(codes)


def per_owner_uint32(values: list[int], index: np.ndarray) -> pa.Array:
    """A uint32 column of each span's owner value (a dropped attribute count), shared zeros
    when every owner's is 0."""
    if not any(values):
        return zeros_array(len(index), pa.uint32())
    return pa.array(np.asarray(values, dtype=np.uint32)[index])


def per_owner_map(entries: list[list], index: np.ndarray) -> pa.MapArray:
    """The owners' attribute maps repeated for each span. An owner's keys (and values) are
    contiguous, so each span's part is one byte copy (compiled) rather than a take per entry."""
    sizes = np.fromiter((len(e) for e in entries), dtype=np.int64, count=len(entries))
    if not sizes.any():  # no owner has an entry (scope attributes, most type maps): no strings to copy
        empty = pa.array([], pa.string())
        return pa.MapArray.from_arrays(zeros_array(len(index) + 1, pa.int32()), empty, empty)
    first = np.zeros(len(entries) + 1, dtype=np.int64)
    np.cumsum(sizes, out=first[1:])
    keys = pa.array([k for e in entries for k, _ in e], pa.large_string())
    values = pa.array([v for e in entries for _, v in e], pa.large_string())
    counts = sizes[index]
    offsets = np.zeros(len(index) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    from nemo_telemetry.analysis.kernels import compiled as _compiled

    def taken() -> pa.MapArray:
        # entry j of span i comes from first[index[i]] + j
        flat = np.repeat(first[:-1][index] - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        take = pa.array(flat)
        return pa.MapArray.from_arrays(pa.array(offsets), keys.take(take), values.take(take))

    if values.null_count:
        return taken()
    spans_of_owner = np.bincount(index, minlength=len(entries))

    def copied(fk) -> pa.MapArray:
        def repeated(strings: pa.Array) -> pa.Array:
            owner_offsets, owner_data, _ = string_buffers(strings)
            total = int(((owner_offsets[first[1:]] - owner_offsets[first[:-1]]) * spans_of_owner).sum())
            out_offsets, out_data = string_offsets(int(offsets[-1]), total), np.empty(total, dtype=np.uint8)
            fk.repeat_owner_strings(owner_offsets, owner_data, first, np.ascontiguousarray(index, dtype=np.int64), out_offsets, out_data)
            return string_array(out_offsets, out_data, utf8_checked=True)

        return pa.MapArray.from_arrays(pa.array(offsets), repeated(keys), repeated(values))

    return _compiled.run(("_flatten_kernel",), int(offsets[-1]), copied, taken, unit="rows", passes=(ValueError,))


def distinct_owners(identities: list, index) -> tuple[list[int], np.ndarray]:
    """The position of the first of each distinct owner (``identities``: the ``id`` of each
    owner's parsed objects; the decoders give the requests that repeat an owner's bytes one
    parsed object), and each span's ``index`` into the owners turned into an index into those.
    A batch of one process's requests repeats one resource and scope per request: each owner's
    columns are then built once, and the per-owner copies run over spans of one owner."""
    seen: dict = {}
    first: list[int] = []
    remap = np.empty(len(identities), dtype=np.int64)
    for i, key in enumerate(identities):
        j = seen.setdefault(key, len(first))
        if j == len(first):
            first.append(i)
        remap[i] = j
    return first, remap[_indices(index)]


def resource_columns(resources: list[dict], index: pa.Array, extras: list) -> dict[str, pa.Array]:
    """Promoted resource columns and the remaining resource attribute map, per span; from
    ``extras`` (per resource: its attributes' type tags, dropped attribute count and schema URL)
    the ``resource_attribute_types``, ``resource_dropped_attributes_count`` and
    ``resource_schema_url`` columns."""
    first, index = distinct_owners([(id(r), id(e)) for r, e in zip(resources, extras)], index)
    promoted: dict[str, list] = {column: [] for column in PROMOTED_RESOURCE_ATTRIBUTES.values()}
    rest, types = [], []
    for r in first:
        columns, remaining = promote_resource(resources[r])
        for column, value in columns.items():
            promoted[column].append(value)
        rest.append(list(remaining.items()))
        types.append(list(promoted_types(extras[r][0], columns, PROMOTED_RESOURCE_ATTRIBUTES).items()))
    extras = [extras[r] for r in first]
    out = {column: per_owner_dict(values, index) for column, values in promoted.items() if column != "rank"}
    ranks = promoted["rank"]
    if all(rank is None for rank in ranks) or all(rank == 0 for rank in ranks):  # shared zeros
        out["rank"] = zeros_array(index.size, pa.int64(), null=ranks[0] is None if ranks else True)
    else:
        out["rank"] = pa.array(ranks, pa.int64()).take(pa.array(index))
    out["resource_attributes"] = per_owner_map(rest, index)
    out["resource_attribute_types"] = per_owner_map(types, index)
    out["resource_dropped_attributes_count"] = per_owner_uint32([e[1] for e in extras], index)
    out["resource_schema_url"] = per_owner_dict([e[2] or None for e in extras], index)
    return out


def promoted_types(tags: dict, columns: dict, promoted: dict) -> dict:
    """One owner's type tags (key -> tag, its non-string attributes) as the types map keeps
    them, given the promoted ``columns`` (column -> value) its attributes gave (``promoted``:
    attribute key -> column): an integer column fed by an int needs no tag, one fed by a string
    of digits is tagged ``string``."""
    out = dict(tags)
    for key, column in promoted.items():
        if column not in _INT_COLUMNS or columns.get(column) is None:
            continue
        if out.get(key) == "int":
            del out[key]
        elif key not in out:
            out[key] = "string"
    return out


def type_map(counts: np.ndarray, owners: int, tags: pa.Array, keys_of, promoted: dict | None = None) -> pa.MapArray:
    """The ``attribute_types`` map of each owner (span, event, link): (key, tag) of each attribute
    whose ``tags`` entry (aligned with the flat attributes, ``counts`` per owner) is not null.
    ``keys_of(rows)``: the keys of those flat attribute rows. ``promoted``: the promoted integer
    columns (attribute key -> that column, one value per owner), whose int values need no tag and
    whose values from strings of digits are tagged ``string`` (as :func:`promoted_types`).

    Arrow only: the reference path of the map the compiled promote passes write
    (:func:`promote_with_types`), taken where they are not (numba off, a full dictionary, text
    that is not ASCII); ``tests/analysis/ingestion/test_ingest_type_map.py`` holds them equal."""
    if isinstance(tags, pa.ChunkedArray):
        tags = tags.combine_chunks()
    valid = valid_rows(tags)
    rows = np.flatnonzero(valid)
    row_owner = np.repeat(np.arange(owners, dtype=np.int32), counts)[rows]
    keys = keys_of(rows) if rows.size else pa.array([], pa.string())
    values = tags.take(pa.array(rows)).cast(pa.string()) if rows.size else pa.array([], pa.string())
    keep = np.ones(rows.size, dtype=np.bool_)
    extra_owner, extra_key = [], []
    for key, column in (promoted or {}).items():
        filled = valid_rows(column)
        hit = pc.equal(keys, key).to_numpy(zero_copy_only=False) if rows.size else keep[:0]
        from_int = hit & pc.equal(values, "int").to_numpy(zero_copy_only=False) if rows.size else keep[:0]
        from_int &= filled[row_owner]  # in the column: its type is the column's
        keep &= ~from_int
        fed = filled.copy()
        fed[row_owner[from_int]] = False
        strings = np.flatnonzero(fed)  # in the column, from a string of digits
        extra_owner.append(strings)
        extra_key.append(np.full(strings.size, key, dtype=object))
    owner = np.concatenate([row_owner[keep], *extra_owner])
    kept = pa.array(keep)
    out_keys = keys.filter(kept).cast(pa.string())
    out_values = values.filter(kept)
    offsets = np.zeros(owners + 1, dtype=np.int32)
    np.cumsum(np.bincount(owner, minlength=owners), out=offsets[1:])
    if any(k.size for k in extra_key):  # the owners' entries together: sort them by owner
        out_keys = pa.concat_arrays([out_keys, *(pa.array(k, pa.string()) for k in extra_key)])
        out_values = pa.concat_arrays([out_values, *(pa.array(["string"] * k.size, pa.string()) for k in extra_key)])
        take = pa.array(np.argsort(owner, kind="stable"))
        out_keys, out_values = out_keys.take(take), out_values.take(take)
    return pa.MapArray.from_arrays(pa.array(offsets), out_keys, out_values)

