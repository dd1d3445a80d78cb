"""Columns decoded from OTLP requests, turned into the spans, events and links tables.

Both decoders (JSON and protobuf) append plain per-span lists here, request after request;
:meth:`SpanColumns.to_tables` then builds the Arrow tables in bulk: ids to lowercase hex,
attribute promotion and the attribute maps are all columnar, so the per-span Python work is
the decoder's list comprehensions and nothing else.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.schema import (
    EVENTS_SCHEMA,
    LINKS_SCHEMA,
    PROMOTED_SPAN_ATTRIBUTES,
    SPAN_KINDS,
    STATUS_CODES,
)
from nemo_telemetry.analysis.ingestion._kernel_arrays import (
    empty_strings,
    zeros_array,
    grown_records,
    scratch_matrix,
    special_rows,
    string_array,
    string_offsets,
)
from nemo_telemetry.analysis.ingestion._promote import (
    AttributeRecords,
    TypeTags,
    distinct_owners,
    per_owner_dict,
    per_owner_map,
    per_owner_uint32,
    promote_records_with_types,
    promote_with_types,
    resource_columns,
    to_int,
)
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.tables import SPANS_TABLE_SCHEMA, OtlpTables
from nemo_telemetry.analysis.model.tree import hex_to_uint64, trace_keys

__all__ = ["SpanColumns", "SpanArrays", "AttributeRecords", "build_tables", "SPANS_TABLE_SCHEMA", "OtlpTables", "ids_to_hex", "string_array", "special_rows", "scratch_matrix", "text_id_hex",
           "grown_records", "string_offsets"]  # the kernel arrays' helpers, from _kernel_arrays

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@dataclass
class _Attrs:
    """Flat key/value lists plus how many belong to each owner (span, event, link, resource),
    and each value's type tag (``anyvalue``: None for strings)."""

    counts: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    types: list[Any] = field(default_factory=list)

    def extend(self, counts: list[int], keys: list[str], values: list[Any], types: list[Any]) -> None:
        self.counts.extend(counts)
        self.keys.extend(keys)
        self.values.extend(values)
        self.types.extend(types)


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
    flags: list = field(default_factory=list)
    dropped_attributes: list = field(default_factory=list)
    dropped_events: list = field(default_factory=list)
    dropped_links: list = field(default_factory=list)
    attrs: _Attrs = field(default_factory=_Attrs)
    # per scope (name, version, {key: value string}, {key: type tag}, dropped attribute count,
    # schema URL: see ``scope_fields``), per resource {key: value string} and beside it ({key:
    # type tag}, dropped attribute count, schema URL), indexed by the above.
    scopes: list = field(default_factory=list)
    resources: list = field(default_factory=list)
    resource_extras: list = field(default_factory=list)
    # events and links: owning span row, then their own fields
    event_span: list = field(default_factory=list)
    event_time: list = field(default_factory=list)
    event_name: list = field(default_factory=list)
    event_dropped: list = field(default_factory=list)
    event_attrs: _Attrs = field(default_factory=_Attrs)
    link_span: list = field(default_factory=list)
    link_trace_id: list = field(default_factory=list)
    link_span_id: list = field(default_factory=list)
    link_trace_state: list = field(default_factory=list)
    link_flags: list = field(default_factory=list)
    link_dropped: list = field(default_factory=list)
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
            attr_types=pa.array(self.attrs.types, pa.string()),
            flags=pa.array(self.flags, pa.uint32()),
            dropped_attributes_count=pa.array(self.dropped_attributes, pa.uint32()),
            dropped_events_count=pa.array(self.dropped_events, pa.uint32()),
            dropped_links_count=pa.array(self.dropped_links, pa.uint32()),
        )
        return build_tables(arrays, self)

    def _events_table(self, trace: pa.Array, span: pa.Array) -> pa.Table:
        if not self.event_span:
            return EVENTS_SCHEMA.empty_table()
        owner = pa.array(self.event_span, pa.int64())
        attributes, types = _promote_lists(self.event_attrs, len(self.event_span))
        arrays = [
            trace.take(owner),
            span.take(owner),
            _int64(self.event_time),
            _dict(pa.array(self.event_name, pa.string())),
            attributes,
            pa.array(self.event_dropped, pa.uint32()),
            types,
        ]
        return pa.Table.from_arrays(
            [a.cast(f.type) for a, f in zip(arrays, EVENTS_SCHEMA)], schema=EVENTS_SCHEMA
        )

    def _links_table(self, trace: pa.Array, span: pa.Array) -> pa.Table:
        if not self.link_span:
            return LINKS_SCHEMA.empty_table()
        owner = pa.array(self.link_span, pa.int64())
        attributes, types = _promote_lists(self.link_attrs, len(self.link_span))
        arrays = [
            trace.take(owner),
            span.take(owner),
            ids_to_hex(self.link_trace_id, 16),
            ids_to_hex(self.link_span_id, 8),
            _empty_to_null(pa.array(self.link_trace_state, pa.string())),
            attributes,
            pa.array(self.link_flags, pa.uint32()),
            pa.array(self.link_dropped, pa.uint32()),
            types,
        ]
        return pa.Table.from_arrays(
            [a.cast(f.type) for a, f in zip(arrays, LINKS_SCHEMA)], schema=LINKS_SCHEMA
        )


@dataclass(frozen=True)
class SpanArrays:
    """One Arrow array (or numpy array) per span column, in span order, before assembly.

    Ids are lowercase hex ("" for none); enums are OTLP ints; attributes are flat keys and
    value strings with ``attr_counts`` per span, and ``attr_types`` each value's type tag (null
    for strings). The OTLP counts and flags default to 0 where a decoder gives none.
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
    id_keys: tuple | None = None  # (trace_key, span_key, parent_key, trace_low) when the decoder has them
    span_words: np.ndarray | None = None  # (n, 3) uint64, see OtlpTables.span_words
    attr_types: pa.Array | TypeTags | None = None
    flags: pa.Array | None = None
    dropped_attributes_count: pa.Array | None = None
    dropped_events_count: pa.Array | None = None
    dropped_links_count: pa.Array | None = None


def build_tables(arrays: SpanArrays, extras: SpanColumns) -> OtlpTables:
    """The three tables: spans from ``arrays``; scopes, resources, events, links from ``extras``."""
    trace, span = arrays.trace_id, arrays.span_id
    return OtlpTables(
        _spans_table(arrays, extras.scopes, extras.resources, extras.resource_extras),
        extras._events_table(trace, span),
        extras._links_table(trace, span),
        arrays.span_words,
    )


def _spans_table(a: SpanArrays, scopes: list, resources: list, resource_extras: list) -> pa.Table:
    n = len(a.span_id)
    parent = _empty_to_null(a.parent_span_id)
    tags = TypeTags.of(a.attr_types) if a.attr_types is not None else None
    if a.attr_records is not None:
        attributes, promoted, types = promote_records_with_types(a.attr_counts, a.attr_records, n,
                                                                 PROMOTED_SPAN_ATTRIBUTES, tags)
    else:
        attributes, promoted, types = promote_with_types(a.attr_counts, a.attr_keys, a.attr_values, n,
                                                         PROMOTED_SPAN_ATTRIBUTES, tags)
    first, scope_index = distinct_owners([id(sc) for sc in scopes], a.scope_index)
    scopes = [scopes[i] for i in first]
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
        **resource_columns(resources, a.resource_index, resource_extras),
        **promoted,
        "trace_state": _empty_to_null(a.trace_state),
        "scope_name": per_owner_dict([sc[0] for sc in scopes], scope_index),
        "scope_version": per_owner_dict([sc[1] for sc in scopes], scope_index),
        "attributes": attributes,
        **_id_keys(a, parent),
        **_otlp_columns(a, n, scopes, scope_index, types),
    }
    arrays = [columns[f.name].cast(f.type) for f in SPANS_TABLE_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SPANS_TABLE_SCHEMA)


def _otlp_columns(a: SpanArrays, n: int, scopes: list, index: np.ndarray, types: pa.MapArray | None
                  ) -> dict[str, pa.Array]:
    """The columns only the way back to OTLP reads: flags, dropped counts, type tags, scope fields."""
    zeros = zeros_array(n, pa.uint32())
    if types is None:
        types = pa.MapArray.from_arrays(zeros_array(n + 1, pa.int32()), pa.array([], pa.string()),
                                        pa.array([], pa.string()))
    return {
        "flags": a.flags if a.flags is not None else zeros,
        "dropped_attributes_count": a.dropped_attributes_count if a.dropped_attributes_count is not None else zeros,
        "dropped_events_count": a.dropped_events_count if a.dropped_events_count is not None else zeros,
        "dropped_links_count": a.dropped_links_count if a.dropped_links_count is not None else zeros,
        "attribute_types": types,
        "scope_attributes": per_owner_map([list(sc[2].items()) for sc in scopes], index),
        "scope_attribute_types": per_owner_map([list(sc[3].items()) for sc in scopes], index),
        "scope_dropped_attributes_count": per_owner_uint32([sc[4] for sc in scopes], index),
        "scope_schema_url": per_owner_dict([sc[5] or None for sc in scopes], index),
    }


def _id_keys(a: SpanArrays, parent: pa.Array) -> dict[str, pa.Array]:
    if a.id_keys is not None:
        keys = a.id_keys
    else:
        trace_key, trace_low = trace_keys(a.trace_id)
        keys = (trace_key, hex_to_uint64(a.span_id), hex_to_uint64(parent), trace_low)
    return {name: pa.array(values, pa.uint64())
            for name, values in zip(("trace_key", "span_key", "parent_key", "trace_low"), keys)}


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


def _int64(values: list) -> pa.Array:
    """int64 from ints or decimal strings (protobuf's JSON mapping writes int64 as strings)."""
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    try:
        return pa.array(values, pa.string()).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([to_int(v) for v in values], pa.int64())


def _enum(codes: pa.Array, names: tuple[str, ...]) -> pa.Array:
    """Enum ints to their lowercase names; unknown ints (and nulls) to null."""
    values = codes.to_numpy(zero_copy_only=False)
    if codes.null_count:
        values = np.where(valid_rows(codes), values, -1)
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
    if offsets[-1] == offsets[0]:  # all empty: all null
        return empty_strings(len(arr), null=True, kind=arr.type)
    present = offsets[1:] != offsets[:-1]
    if present.all():
        return arr
    bitmap = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(arr.type, len(arr), [bitmap, pa.py_buffer(offsets), buffers[2]])


def _promote_lists(attrs: _Attrs, owners: int) -> tuple[pa.Array, pa.Array]:
    """An events or links table's attribute map and its types map."""
    counts = np.asarray(attrs.counts, dtype=np.int64)
    keys = pa.array(attrs.keys, pa.string())
    tags = TypeTags.of(pa.array(attrs.types, pa.string()))
    attributes, _, types = promote_with_types(counts, keys, pa.array(attrs.values, pa.string()), owners, (), tags)
    return attributes, types
