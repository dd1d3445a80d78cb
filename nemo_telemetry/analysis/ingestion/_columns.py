"""Columns decoded from OTLP requests, turned into the spans, events and links tables.

Both decoders (JSON and protobuf) append plain per-span lists here, request after request;
:meth:`SpanColumns.to_tables` then builds the Arrow tables in bulk: ids to lowercase hex,
attribute promotion and the attribute maps are all columnar, so the per-span Python work is
the decoder's list comprehensions and nothing else.
"""

from __future__ import annotations

import base64
import binascii
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.schema import (
    EVENTS_SCHEMA,
    ID_KEY_FIELDS,
    ITERATION,
    LINKS_SCHEMA,
    PROMOTED_RESOURCE_ATTRIBUTES,
    PROMOTED_SPAN_ATTRIBUTES,
    SPAN_KINDS,
    SPANS_SCHEMA,
    STATUS_CODES,
)
from nemo_telemetry.analysis.model.tree import hex_to_uint64

__all__ = ["SpanColumns", "SpanArrays", "AttributeRecords", "build_tables", "SPANS_TABLE_SCHEMA", "OtlpTables", "ids_to_hex", "string_array", "special_rows", "scratch_matrix", "text_id_hex"]

# What ingest writes: the spans table plus the uint64 id keys tree walks join on.
SPANS_TABLE_SCHEMA = pa.schema(list(SPANS_SCHEMA) + list(ID_KEY_FIELDS))

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_INT_COLUMNS = {ITERATION, "rank"}


@dataclass(frozen=True)
class OtlpTables:
    """The three tables of one batch (or one whole input).

    ``span_words``: each span's (trace id high, trace id low, span id) as uint64 words, when
    the decoder read the ids as bytes; the deduplicator then need not parse the hex again.
    """

    spans: pa.Table
    events: pa.Table
    links: pa.Table
    span_words: np.ndarray | None = field(default=None, compare=False)

    @staticmethod
    def empty() -> "OtlpTables":
        return OtlpTables(
            SPANS_TABLE_SCHEMA.empty_table(), EVENTS_SCHEMA.empty_table(), LINKS_SCHEMA.empty_table()
        )

    @staticmethod
    def concat(parts: list["OtlpTables"]) -> "OtlpTables":
        if not parts:
            return OtlpTables.empty()
        if len(parts) == 1:  # a batch of one part: nothing to join (its words are not copied)
            return parts[0]
        words = [p.span_words for p in parts if p.spans.num_rows]
        return OtlpTables(
            pa.concat_tables([p.spans for p in parts]),
            pa.concat_tables([p.events for p in parts]),
            pa.concat_tables([p.links for p in parts]),
            np.concatenate(words) if words and all(w is not None for w in words) else None,
        )

    def keep_spans(self, mask: np.ndarray) -> "OtlpTables":
        """Only the spans ``mask`` marks, with their events and links (matched on trace and span id)."""
        if mask.all():
            return self
        spans = self.spans.filter(pa.array(mask))
        words = self.span_words[mask] if self.span_words is not None else None
        return OtlpTables(spans, _owned_by(self.events, spans), _owned_by(self.links, spans), words)


def _owned_by(table: pa.Table, spans: pa.Table) -> pa.Table:
    """Rows of an events/links table whose span is in ``spans``."""
    if table.num_rows == 0:
        return table
    owners = pc.binary_join_element_wise(spans.column("trace_id"), spans.column("span_id"), "/")
    keys = pc.binary_join_element_wise(table.column("trace_id"), table.column("span_id"), "/")
    return table.filter(pc.is_in(keys, value_set=owners.combine_chunks()))


@dataclass
class _Attrs:
    """Flat key/value lists plus how many belong to each owner (span, event, link, resource)."""

    counts: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)

    def extend(self, counts: list[int], keys: list[str], values: list[Any]) -> None:
        self.counts.extend(counts)
        self.keys.extend(keys)
        self.values.extend(values)


@dataclass
class SpanColumns:
    """Per-span lists appended by a decoder. Ids are raw ``bytes`` or text (hex or base64)."""

    trace_id: list = field(default_factory=list)
    span_id: list = field(default_factory=list)
    parent_span_id: list = field(default_factory=list)
    trace_state: list = field(default_factory=list)
    name: list = field(default_factory=list)
    kind: list = field(default_factory=list)
    start_ns: list = field(default_factory=list)
    end_ns: list = field(default_factory=list)
    status_code: list = field(default_factory=list)
    status_message: list = field(default_factory=list)
    scope_index: list = field(default_factory=list)
    resource_index: list = field(default_factory=list)
    attrs: _Attrs = field(default_factory=_Attrs)
    # (name, version) per scope and {key: value string} per resource, indexed by the above.
    scopes: list = field(default_factory=list)
    resources: list = field(default_factory=list)
    # events and links: owning span row, then their own fields
    event_span: list = field(default_factory=list)
    event_time: list = field(default_factory=list)
    event_name: list = field(default_factory=list)
    event_attrs: _Attrs = field(default_factory=_Attrs)
    link_span: list = field(default_factory=list)
    link_trace_id: list = field(default_factory=list)
    link_span_id: list = field(default_factory=list)
    link_trace_state: list = field(default_factory=list)
    link_attrs: _Attrs = field(default_factory=_Attrs)
    # one line per span a decoder rejected for a bad field ("span N rejected: field why"), in order
    rejected: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.span_id)

    def mark(self) -> dict[str, int]:
        """The length of every list, to :meth:`rollback` to if a request turns out malformed."""
        return {name: len(lst) for name, lst in self._lists()}

    def rollback(self, mark: dict[str, int]) -> None:
        for name, lst in self._lists():
            del lst[mark[name] :]

    def _lists(self):
        for name, value in vars(self).items():
            if isinstance(value, _Attrs):
                for sub, lst in vars(value).items():
                    yield f"{name}.{sub}", lst
            else:
                yield name, value

    def to_tables(self) -> OtlpTables:
        """The Arrow tables of everything appended so far."""
        if not self.span_id:
            return OtlpTables.empty()
        arrays = SpanArrays(
            trace_id=ids_to_hex(self.trace_id, 16),
            span_id=ids_to_hex(self.span_id, 8),
            parent_span_id=ids_to_hex(self.parent_span_id, 8),
            trace_state=pa.array(self.trace_state, pa.string()),
            name=pa.array(self.name, pa.string()),
            kind=pa.array(self.kind, pa.int64()),
            start_ns=_int64(self.start_ns),
            end_ns=_int64(self.end_ns),
            status_code=pa.array(self.status_code, pa.int64()),
            status_message=pa.array(self.status_message, pa.string()),
            scope_index=pa.array(self.scope_index, pa.int32()),
            resource_index=pa.array(self.resource_index, pa.int32()),
            attr_counts=np.asarray(self.attrs.counts, dtype=np.int64),
            attr_keys=pa.array(self.attrs.keys, pa.string()),
            attr_values=pa.array(self.attrs.values, pa.string()),
        )
        return build_tables(arrays, self)

    def _events_table(self, trace: pa.Array, span: pa.Array) -> pa.Table:
        if not self.event_span:
            return EVENTS_SCHEMA.empty_table()
        owner = pa.array(self.event_span, pa.int64())
        attributes, _ = _promote_lists(self.event_attrs, len(self.event_span))
        arrays = [
            trace.take(owner),
            span.take(owner),
            _int64(self.event_time),
            _dict(pa.array(self.event_name, pa.string())),
            attributes,
        ]
        return pa.Table.from_arrays(
            [a.cast(f.type) for a, f in zip(arrays, EVENTS_SCHEMA)], schema=EVENTS_SCHEMA
        )

    def _links_table(self, trace: pa.Array, span: pa.Array) -> pa.Table:
        if not self.link_span:
            return LINKS_SCHEMA.empty_table()
        owner = pa.array(self.link_span, pa.int64())
        attributes, _ = _promote_lists(self.link_attrs, len(self.link_span))
        arrays = [
            trace.take(owner),
            span.take(owner),
            ids_to_hex(self.link_trace_id, 16),
            ids_to_hex(self.link_span_id, 8),
            _empty_to_null(pa.array(self.link_trace_state, pa.string())),
            attributes,
        ]
        return pa.Table.from_arrays(
            [a.cast(f.type) for a, f in zip(arrays, LINKS_SCHEMA)], schema=LINKS_SCHEMA
        )


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


@dataclass(frozen=True)
class SpanArrays:
    """One Arrow array (or numpy array) per span column, in span order, before assembly.

    Ids are lowercase hex ("" for none); enums are OTLP ints; attributes are flat keys and
    value strings with ``attr_counts`` per span.
    """

    trace_id: pa.Array
    span_id: pa.Array
    parent_span_id: pa.Array
    trace_state: pa.Array
    name: pa.Array
    kind: pa.Array
    start_ns: pa.Array
    end_ns: pa.Array
    status_code: pa.Array
    status_message: pa.Array
    scope_index: pa.Array
    resource_index: pa.Array
    attr_counts: np.ndarray
    attr_keys: pa.Array | None = None
    attr_values: pa.Array | None = None
    # instead of keys and values, where they lie in the decoder's buffer (the protobuf walk)
    attr_records: AttributeRecords | None = None
    id_keys: tuple | None = None  # (trace_key, span_key, parent_key) when the decoder has them
    span_words: np.ndarray | None = None  # (n, 3) uint64, see OtlpTables.span_words


def build_tables(arrays: SpanArrays, extras: SpanColumns) -> OtlpTables:
    """The three tables: spans from ``arrays``; scopes, resources, events, links from ``extras``."""
    trace, span = arrays.trace_id, arrays.span_id
    return OtlpTables(
        _spans_table(arrays, extras.scopes, extras.resources),
        extras._events_table(trace, span),
        extras._links_table(trace, span),
        arrays.span_words,
    )


def _spans_table(a: SpanArrays, scopes: list, resources: list) -> pa.Table:
    n = len(a.span_id)
    parent = _empty_to_null(a.parent_span_id)
    if a.attr_records is not None:
        attributes, promoted = _promote_records(a.attr_counts, a.attr_records, n, PROMOTED_SPAN_ATTRIBUTES)
    else:
        attributes, promoted = _promote(a.attr_counts, a.attr_keys, a.attr_values, n, PROMOTED_SPAN_ATTRIBUTES)
    columns = {
        "trace_id": a.trace_id,
        "span_id": a.span_id,
        "parent_span_id": parent,
        "name": _dict(a.name),
        "kind": _enum(a.kind, SPAN_KINDS),
        "start_ns": a.start_ns,
        "end_ns": a.end_ns,
        "duration_ns": pc.subtract(a.end_ns, a.start_ns),
        "status_code": _enum(a.status_code, STATUS_CODES),
        "status_message": _empty_to_null(a.status_message),
        **_resource_columns(resources, a.resource_index),
        **promoted,
        "trace_state": _empty_to_null(a.trace_state),
        "scope_name": _per_owner_dict([sc[0] for sc in scopes], a.scope_index),
        "scope_version": _per_owner_dict([sc[1] for sc in scopes], a.scope_index),
        "attributes": attributes,
        **_id_keys(a, parent),
    }
    arrays = [columns[f.name].cast(f.type) for f in SPANS_TABLE_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SPANS_TABLE_SCHEMA)


def _id_keys(a: SpanArrays, parent: pa.Array) -> dict[str, pa.Array]:
    keys = a.id_keys or (hex_to_uint64(a.trace_id), hex_to_uint64(a.span_id), hex_to_uint64(parent))
    return {name: pa.array(values, pa.uint64()) for name, values in zip(("trace_key", "span_key", "parent_key"), keys)}


def ids_to_hex(ids: list, width: int) -> pa.Array:
    """Lowercase hex strings from raw bytes, hex text (any case) or base64 text.

    ``width`` is the id's size in bytes (16 for traces, 8 for spans); empty ids stay empty.
    """
    if not ids:
        return pa.array([], pa.string())
    if isinstance(ids[0], (bytes, bytearray)):
        return _bytes_to_hex(ids, width)
    text = pa.array(ids, pa.string())
    lengths = pc.utf8_length(text)
    if pc.all(pc.or_(pc.equal(lengths, 2 * width), pc.equal(lengths, 0))).as_py():
        return pc.utf8_lower(text)
    # Protobuf's JSON mapping writes bytes as base64 (24 or 12 characters): decode those.
    return pa.array([_text_id_to_hex(s, width) for s in ids], pa.string())


def _text_id_to_hex(text: str | None, width: int) -> str:
    if not text:
        return ""
    hexed = text_id_hex(text, width)
    return hexed if hexed is not None else text.lower()  # not an id: the length guard drops it


def text_id_hex(text: str, width: int) -> str | None:
    """The id ``text`` (``2 * width`` hex digits, any case, or base64 of ``width`` bytes, as
    protobuf's JSON mapping writes bytes) as lowercase hex; None when it is neither."""
    try:
        raw = bytes.fromhex(text) if len(text) == 2 * width else base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == width else None  # fromhex skips spaces: count the bytes


def _bytes_to_hex(ids: list, width: int) -> pa.Array:
    """Hex through a lookup table over one contiguous buffer when every id has ``width`` bytes."""
    blob = b"".join(ids)
    if len(blob) != width * len(ids):
        return pa.array([bytes(i).hex() for i in ids], pa.string())
    raw = np.frombuffer(blob, dtype=np.uint8)
    out = np.empty(raw.size * 2, dtype=np.uint8)
    out[0::2] = _HEX[raw >> 4]
    out[1::2] = _HEX[raw & 15]
    offsets = np.arange(0, out.size + 1, 2 * width, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), len(ids), [None, pa.py_buffer(offsets), pa.py_buffer(out)])


_SCRATCH = threading.local()


def scratch_matrix(name: str, rows: int, columns: int) -> np.ndarray:
    """A C-contiguous (rows, columns) int64 matrix for a kernel to fill, reused by this thread
    from batch to batch: fresh pages cost a page fault each, a fifth of a decode's time. Its
    old contents are garbage; the kernels set every field of each record they write, and no
    table keeps a view of it (columns taken from it are copied).

    It grows to twice the size asked for: batches differ in size (by a request, or a block
    read short), and a new matrix for each batch a little bigger than any before would be
    fresh pages again; the room never written costs nothing (zeroed pages are mapped on first
    touch)."""
    size = rows * columns
    flat = getattr(_SCRATCH, name, None)
    if flat is None or flat.size < size:
        flat = np.zeros(2 * size, dtype=np.int64)
        setattr(_SCRATCH, name, flat)
    return flat[:size].reshape(rows, columns)


def grown_records(array: np.ndarray, used: int, axis: int) -> np.ndarray:
    """``array`` with twice the room along its record ``axis``, the ``used`` records copied (a
    kernel that ran out of room is run again on the bigger arrays)."""
    shape = list(array.shape)
    shape[axis] = 2 * shape[axis] + 16
    bigger = np.zeros(shape, dtype=array.dtype)
    index = (slice(None), slice(0, used)) if axis == 1 else (slice(0, used),)
    bigger[index] = array[index]
    return bigger


def string_array(
    offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None = None, *, utf8_checked: bool = False
) -> pa.Array:
    """A string array over a kernel's (offsets, bytes) output: ``string`` for int32 offsets,
    ``large_string`` for int64. UTF-8 is checked (``pa.ArrowInvalid`` otherwise) unless the
    bytes were cut from already checked strings (``utf8_checked``); ``valid`` False rows are null."""
    n = offsets.size - 1
    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    kind = pa.string() if offsets.dtype == np.int32 else pa.large_string()
    strings = pa.Array.from_buffers(kind, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])
    strings.validate(full=not utf8_checked)
    return strings


def string_offsets(count: int, total_bytes: int) -> np.ndarray:
    """Room for the offsets of ``count`` strings: int32 (Arrow ``string``, the table's type, so
    no cast copies them later) unless the bytes need int64."""
    return np.empty(count + 1, dtype=np.int32 if total_bytes < 2**31 - 1 else np.int64)


def special_rows(kind: np.ndarray, rows: np.ndarray, strings: list) -> tuple[list[bytes], np.ndarray]:
    """The encoded strings of ``rows`` and each row's index among them (-1: not special);
    a None string makes its row null (its ``kind`` is cleared)."""
    special = np.full(kind.size, -1, dtype=np.int64)
    null = [text is None for text in strings]
    if any(null):
        kind[rows[null]] = -1
        rows = rows[[not n for n in null]]
        strings = [text for text in strings if text is not None]
    special[rows] = np.arange(rows.size)
    return [text.encode() for text in strings], special


def _int64(values: list) -> pa.Array:
    """int64 from ints or decimal strings (protobuf's JSON mapping writes int64 as strings)."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    try:
        return pa.array(values, pa.string()).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([_to_int(v) for v in values], pa.int64())


def _to_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _enum(codes: pa.Array, names: tuple[str, ...]) -> pa.Array:
    """Enum ints to their lowercase names; unknown ints (and nulls) to null."""
    values = codes.to_numpy(zero_copy_only=False)
    if codes.null_count:
        values = np.where(codes.is_valid().to_numpy(zero_copy_only=False), values, -1)
    values = values.astype(np.int64, copy=False)
    known = (values >= 0) & (values < len(names))
    indices = values.astype(np.int32)
    indices = pa.array(indices) if known.all() else pa.array(indices, mask=~known)
    return pa.DictionaryArray.from_arrays(indices, pa.array(names, pa.string()))


def _dict(arr: pa.Array) -> pa.Array:
    return arr.dictionary_encode()


def _empty_to_null(arr: pa.Array) -> pa.Array:
    """Empty strings as nulls. Without nulls already, only a validity bitmap is added: the
    offsets and characters are shared, not copied (a copy costs page faults per span)."""
    string_types = {pa.string(): np.int32, pa.large_string(): np.int64}
    if arr.null_count or arr.type not in string_types or len(arr) == 0:
        return pc.if_else(pc.equal(pc.utf8_length(arr), 0), pa.scalar(None, arr.type), arr)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=string_types[arr.type])[arr.offset : arr.offset + len(arr) + 1]
    present = offsets[1:] != offsets[:-1]
    if present.all():
        return arr
    bitmap = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(arr.type, len(arr), [bitmap, pa.py_buffer(offsets), buffers[2]])


def _promote_lists(attrs: _Attrs, owners: int) -> tuple[pa.Array, dict]:
    counts = np.asarray(attrs.counts, dtype=np.int64)
    return _promote(counts, pa.array(attrs.keys, pa.string()), pa.array(attrs.values, pa.string()), owners, ())


def _promote(
    counts: np.ndarray, keys: pa.Array, values: pa.Array, owners: int, promoted: tuple[str, ...]
) -> tuple[pa.Array, dict]:
    """The attribute map column without the promoted keys, and one column per promoted key.

    When a key repeats on one owner the last value wins for the promoted column (as the
    OpenTelemetry SDK does when a span sets an attribute twice). An integer column's value
    that is not a decimal integer stays in the map.
    """
    from nemo_telemetry.analysis.kernels import _compiled

    reference = lambda: _promote_arrow(counts, keys, values, owners, promoted)  # noqa: E731
    compiled = lambda fk: _promote_compiled(fk, counts, keys, values, owners, promoted) or reference()  # noqa: E731
    return _compiled.run(("_flatten_kernel",), len(keys), compiled, reference, unit="rows", passes=(ValueError,))


def _promote_compiled(_flatten_kernel, counts, keys, values, owners, promoted):
    """:func:`_promote` by the compiled kernel; None when it cannot (a full dictionary)."""
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    names, name_offsets, is_int = _promoted_names(promoted)
    key_offsets, key_data, _ = _buffers(keys)
    value_offsets, value_data, value_valid = _buffers(values)
    codes, numbers, number_valid = _promoted_room(len(promoted), owners)
    slots = np.zeros((len(promoted), _flatten_kernel.DICTIONARY_SLOTS), dtype=np.int64)
    entries = np.zeros((len(promoted), _flatten_kernel.DICTIONARY_SLOTS // 2 + 1), dtype=np.int64)
    kept_keys = (string_offsets(len(keys), key_data.size), np.empty(key_data.size, dtype=np.uint8))
    kept_values = (string_offsets(len(keys), value_data.size), np.empty(value_data.size, dtype=np.uint8))
    kept_valid = np.empty(len(keys), dtype=np.bool_)
    kept_counts = np.empty(owners, dtype=np.int64)
    kept = _flatten_kernel.promote(
        counts, key_offsets, key_data, value_offsets, value_data, value_valid, name_offsets,
        names, is_int, codes, numbers, number_valid, slots, entries,
        *kept_keys, *kept_values, kept_valid, kept_counts,
    )
    if kept < 0:  # thousands of distinct values in a promoted string column: rare, not compiled
        return None
    dictionaries = [values.take(pa.array(entries[p, : entries[p, -1]])).cast(pa.string()) for p in range(len(promoted))]
    columns = _promoted_columns(promoted, is_int, codes, numbers, number_valid, dictionaries)
    return _kept_map(kept, kept_counts, kept_keys, kept_values, kept_valid), columns


def _promote_records(counts: np.ndarray, records: AttributeRecords, owners: int, promoted: tuple[str, ...]):
    """:func:`_promote` reading the attributes where the decoder found them (see
    :class:`AttributeRecords`); the same result, without the arrays of every key and value."""
    from nemo_telemetry.analysis.kernels import _compiled

    def reference():
        keys, values = records.strings()  # non-ASCII text, a full dictionary or no numba: rare
        return _promote(counts, keys, values, owners, promoted)

    compiled = lambda fk: _promote_records_compiled(fk, counts, records, owners, promoted) or reference()  # noqa: E731
    return _compiled.run(("_flatten_kernel",), int(records.kind.size), compiled, reference, unit="rows",
                         passes=(ValueError,))  # bad UTF-8: the decoder's own signal


def _promote_records_compiled(fk, counts, records: AttributeRecords, owners: int, promoted: tuple[str, ...]):
    """:func:`_promote_records` by the compiled kernel; None when it cannot."""
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
    kept_counts = np.empty(owners, dtype=np.int64)
    kept = fk.promote_records(
        r.data, r.key_start, r.key_length, r.kind, r.value, r.length, r.special_offsets, r.special_data, r.kinds,
        counts, name_offsets, names, is_int, codes, numbers, number_valid, slots, dict_offsets, dict_data,
        dict_count, *kept_keys, *kept_values, kept_valid, kept_counts, np.empty(len(promoted), dtype=np.int64),
        np.empty(len(promoted), dtype=np.bool_), np.empty(int(counts.max(initial=0)), dtype=np.int64),
    )
    if kept >= 0:
        room = fk.DICTIONARY_BYTES
        dictionaries = [  # copied: a few short strings, not the whole room
            string_array(dict_offsets[p, : used + 1].copy(), dict_data[p * room : p * room + dict_offsets[p, used]].copy(), utf8_checked=True)
            for p, used in enumerate(dict_count.tolist())
        ]
        columns = _promoted_columns(promoted, is_int, codes, numbers, number_valid, dictionaries)
        return _kept_map(kept, kept_counts, kept_keys, kept_values, kept_valid), columns
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


def _kept_map(kept: int, kept_counts, kept_keys, kept_values, kept_valid) -> pa.MapArray:
    """The attribute map column of the attributes a promote kernel kept (already UTF-8 checked)."""
    offsets = np.zeros(kept_counts.size + 1, dtype=np.int32)
    np.cumsum(kept_counts, out=offsets[1:])
    map_keys = string_array(kept_keys[0][: kept + 1], kept_keys[1][: kept_keys[0][kept]], utf8_checked=True)
    map_values = string_array(
        kept_values[0][: kept + 1], kept_values[1][: kept_values[0][kept]], kept_valid[:kept], utf8_checked=True
    )
    return pa.MapArray.from_arrays(pa.array(offsets), map_keys, map_values)


def _buffers(strings: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 offsets, bytes, validity) of a string array, for a kernel."""
    strings = strings.cast(pa.large_string())
    n = len(strings)
    offsets = np.frombuffer(strings.buffers()[1], dtype=np.int64)[strings.offset : strings.offset + n + 1]
    data = strings.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, dtype=np.uint8)
    valid = strings.is_valid().to_numpy(zero_copy_only=False) if strings.null_count else np.ones(n, dtype=np.bool_)
    return offsets, data, valid


def _promote_arrow(
    counts: np.ndarray, keys: pa.Array, values: pa.Array, owners: int, promoted: tuple[str, ...]
) -> tuple[pa.Array, dict]:
    """:func:`_promote` with Arrow compute only (without numba): the same result."""
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
    valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
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


def _per_owner_dict(values: list, index) -> pa.DictionaryArray:
    """A dictionary column of each span's owner value (resource or scope; few owners, many
    spans): the owners' values are encoded once and only the int32 indices are per span."""
    encoded = pa.array(values, pa.string()).dictionary_encode()
    owner_codes = encoded.indices.to_numpy(zero_copy_only=False)
    if encoded.null_count:
        owner_codes = np.where(encoded.is_valid().to_numpy(zero_copy_only=False), owner_codes, -1)
    codes = owner_codes.astype(np.int32, copy=False)[_indices(index)]
    return pa.DictionaryArray.from_arrays(_nullable(codes), encoded.dictionary)


def _nullable(codes: np.ndarray) -> pa.Array:
    """Dictionary codes, -1 as null; without a validity bitmap when none is."""
    missing = codes < 0
    return pa.array(codes, mask=missing) if missing.any() else pa.array(codes)


def _per_owner_map(entries: list[list], index: np.ndarray) -> pa.MapArray:
    """The owners' attribute maps repeated for each span. An owner's keys (and values) are
    contiguous, so each span's part is one byte copy (compiled) rather than a take per entry."""
    sizes = np.fromiter((len(e) for e in entries), dtype=np.int64, count=len(entries))
    first = np.zeros(len(entries) + 1, dtype=np.int64)
    np.cumsum(sizes, out=first[1:])
    keys = pa.array([k for e in entries for k, _ in e], pa.large_string())
    values = pa.array([v for e in entries for _, v in e], pa.large_string())
    counts = sizes[index]
    offsets = np.zeros(len(index) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    from nemo_telemetry.analysis.kernels import _compiled

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
            owner_offsets, owner_data, _ = _buffers(strings)
            total = int(((owner_offsets[first[1:]] - owner_offsets[first[:-1]]) * spans_of_owner).sum())
            out_offsets, out_data = string_offsets(int(offsets[-1]), total), np.empty(total, dtype=np.uint8)
            fk.repeat_owner_strings(owner_offsets, owner_data, first, np.ascontiguousarray(index, dtype=np.int64), out_offsets, out_data)
            return string_array(out_offsets, out_data, utf8_checked=True)

        return pa.MapArray.from_arrays(pa.array(offsets), repeated(keys), repeated(values))

    return _compiled.run(("_flatten_kernel",), int(offsets[-1]), copied, taken, unit="rows", passes=(ValueError,))


def _resource_columns(resources: list[dict], index: pa.Array) -> dict[str, pa.Array]:
    """Promoted resource columns and the remaining resource attribute map, per span."""
    promoted: dict[str, list] = {column: [] for column in PROMOTED_RESOURCE_ATTRIBUTES.values()}
    rest = []
    for attributes in resources:
        remaining = dict(attributes)
        for key, column in PROMOTED_RESOURCE_ATTRIBUTES.items():
            value = remaining.pop(key, None)
            if column == "rank" and value is not None:
                number = _to_int(value)
                if number is None:
                    remaining[key] = value  # not an integer: keep it where it was
                value = number
            promoted[column].append(value)
        rest.append(list(remaining.items()))
    index = _indices(index)
    out = {
        "service_name": _per_owner_dict(promoted["service_name"], index),
        "run_id": _per_owner_dict(promoted["run_id"], index),
        "rank": pa.array(promoted["rank"], pa.int64()).take(pa.array(index)),
        "resource_attributes": _per_owner_map(rest, index),
    }
    return out
