"""The spans, events and links tables: the one shape every analysis reads.

One row per span. Ids are lowercase hex strings; times are int64 Unix nanoseconds. The
promoted columns (``rl.bucket``, ``rl.iteration``, ``rl.efficiency.category``, ``rl.span_group``: the
span group a span was opened in, and from the
resource ``service_name``, ``run_id`` = ``nemo.run.id``, ``rank`` = ``nv.dl.rank``,
``span_groups`` = ``nemo.telemetry.span_groups``, ``span_groups_namespace`` =
``nemo.telemetry.namespace``) are taken out of the attribute maps; every
other span attribute is in ``attributes`` and every other resource attribute in
``resource_attributes``. ``span_groups`` has a column of its own so that ``check`` reads a
dictionary column instead of the resource map (every resource attribute of every span); a hand-built
table may hold the attribute in ``resource_attributes``, where the findings look for it too. Attribute values are strings: OTLP string
values as they are, ints in decimal, doubles as Python's ``repr``, bools ``true``/``false``,
bytes as lowercase hex, arrays and key-value lists as compact JSON. The value's OTLP type is kept
beside the string in the ``*attribute_types`` maps (:data:`TYPE_TAGS`): one entry per attribute whose
value is not stored in its natural type, so a table of string attributes carries no entry at all.
Strings that repeat are dictionary-encoded.

The OTLP fields no analysis reads are kept so that the trip OTLP -> dataset -> OTLP loses nothing
(:data:`OTLP_SPAN_COLUMNS`, dataset format 3; files of older formats read them as nulls): the span's
``flags`` and dropped attribute, event and link counts, the resource's dropped attribute count and
schema URL, the scope's attributes, dropped attribute count and schema URL, and the type maps.
``docs/columns.md`` lists every column; ``analysis.views.otlp`` is the way back.

The optional trailing columns ``trace_key``, ``span_key``, ``parent_key`` and ``trace_low``
(uint64: the span ids as numbers, 0 for no parent; the trace id's low half, and ``trace_key``, its
high half XOR a mix of the low half, :func:`nemo_telemetry.analysis.model.tree.trace_key_of`, so
the three are the span's whole identity) are what tree walks join on. Ingest writes
them so that analyses over large datasets never decode hex; a table without them gets them
from :func:`nemo_telemetry.analysis.model.tree.with_id_keys`.

A spans *file* of a dataset has one more column, ``parent_row`` (int32, :data:`PARENT_ROW`): the
row in that file of each span's parent, -1 for a span that names no parent, -2 for one whose
parent is not in the file (:func:`nemo_telemetry.analysis.model.keys.local_parent_rows`). It is
an index the file carries, not a column of the table: ``check`` joins only the references the
file does not answer itself, after checking it against the file's keys (it makes the file's row
order part of the dataset format: :mod:`nemo_telemetry.analysis.store.formats`). Readers of
whole tables leave it out.
"""

from __future__ import annotations

from typing import Any, Mapping

import pyarrow as pa

__all__ = [
    "REMOTE_PARENT_KINDS",
    "SPANS_SCHEMA",
    "RESOURCE_OTLP_FIELDS",
    "SCOPE_OTLP_FIELDS",
    "EVENTS_SCHEMA",
    "LINKS_SCHEMA",
    "BUCKET",
    "ITERATION",
    "EFFICIENCY_CATEGORY",
    "SPAN_GROUP",
    "PROMOTED_SPAN_ATTRIBUTES",
    "PROMOTED_RESOURCE_ATTRIBUTES",
    "promote_resource",
    "SPAN_KINDS",
    "STATUS_CODES",
    "empty_spans",
    "ID_KEY_FIELDS",
    "NO_RUN",
    "PARENT_ROW",
    "TYPE_TAGS",
    "OTLP_SPAN_COLUMNS",
]

_dict_str = pa.dictionary(pa.int32(), pa.string())
_attr_map = pa.map_(pa.string(), pa.string())

TYPE_TAGS = ("int", "double", "bool", "bytes", "array", "kvlist", "string")
"""The values of a ``*attribute_types`` map: the OTLP ``AnyValue`` type of the attribute of the
same key, for each attribute not stored in its natural type. An attribute kept in an attribute
map has no entry when its value is a string (or absent); otherwise ``int``, ``double``, ``bool``,
``bytes`` (the map holds lowercase hex), ``array`` or ``kvlist`` (compact JSON whose numbers,
strings, bools and nulls are the nested values' types). A promoted column (``rl.iteration``,
``rl.bucket``, ``rank``...) has an entry when the attribute's type is not the column's: ``string``
for an integer column fed by a string of digits, ``int``/``double``/``bool`` for a string column.
A nested value the compact JSON cannot tell apart (bytes inside an array or key-value list, a
key-value list repeating a key) is tagged with its whole OTLP/JSON ``AnyValue`` instead (text that
starts with ``{``)."""

BUCKET = "rl.bucket"
ITERATION = "rl.iteration"
EFFICIENCY_CATEGORY = "rl.efficiency.category"
SPAN_GROUP = "rl.span_group"  # the group a span was opened in (the instrument's gated sites record it)
# stands for "no run" (a null run_id) in keys that must hash, index, sort or cross tasks
NO_RUN = "\x00"
PARENT_ROW = "parent_row"  # a spans file's index of its spans' parents in the file (see above)

# span attribute -> column
PROMOTED_SPAN_ATTRIBUTES = (BUCKET, ITERATION, EFFICIENCY_CATEGORY, SPAN_GROUP)
# resource attribute -> column
PROMOTED_RESOURCE_ATTRIBUTES = {"service.name": "service_name", "nemo.run.id": "run_id", "nv.dl.rank": "rank",
                                "nemo.telemetry.span_groups": "span_groups",
                                "nemo.telemetry.namespace": "span_groups_namespace"}



def promote_resource(attributes: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One resource's promoted column values (every column of :data:`PROMOTED_RESOURCE_ATTRIBUTES`,
    None where absent) and the attributes left for ``resource_attributes``. ``rank`` takes a decimal
    integer only: any other value stays in the map, where it was."""
    remaining = dict(attributes)
    columns: dict[str, Any] = {}
    for key, column in PROMOTED_RESOURCE_ATTRIBUTES.items():
        value = remaining.pop(key, None)
        if column == "rank" and value is not None:
            try:
                value = int(value)
            except (TypeError, ValueError):
                remaining[key], value = value, None
        columns[column] = value
    return columns, remaining


# OTLP enum values, in enum order (index = OTLP integer value).
SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
# Kinds of span whose parent is in another process by OpenTelemetry's semantics (the caller's client
# or producer span): a missing parent of theirs is outside the data, not a lost in-process span.
REMOTE_PARENT_KINDS = ("server", "consumer")
STATUS_CODES = ("unset", "ok", "error")

RESOURCE_OTLP_FIELDS = (
    pa.field("resource_attribute_types", _attr_map),  # the types of its attributes not strings (TYPE_TAGS)
    pa.field("resource_dropped_attributes_count", pa.uint32()),
    pa.field("resource_schema_url", _dict_str),
)
"""The resource's OTLP fields kept for the way back, beside each span, log record and data point."""

SCOPE_OTLP_FIELDS = (
    pa.field("scope_attributes", _attr_map),
    pa.field("scope_attribute_types", _attr_map),
    pa.field("scope_dropped_attributes_count", pa.uint32()),
    pa.field("scope_schema_url", _dict_str),
)
"""The instrumentation scope's OTLP fields kept for the way back (its name and version have columns of their own)."""

SPANS_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("span_id", pa.string(), nullable=False),
        pa.field("parent_span_id", pa.string()),  # null for roots
        pa.field("name", _dict_str, nullable=False),
        pa.field("kind", _dict_str),  # one of SPAN_KINDS
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("duration_ns", pa.int64(), nullable=False),  # end - start; negative is kept and flagged
        pa.field("status_code", _dict_str),  # one of STATUS_CODES
        pa.field("status_message", pa.string()),
        pa.field("service_name", _dict_str),
        pa.field("run_id", _dict_str),
        pa.field("rank", pa.int64()),
        pa.field("span_groups", _dict_str),  # the process's enabled span groups, comma-separated
        pa.field("span_groups_namespace", _dict_str),  # the namespace the process resolved them in
        pa.field(BUCKET, _dict_str),
        pa.field(ITERATION, pa.int64()),
        pa.field(EFFICIENCY_CATEGORY, _dict_str),
        pa.field(SPAN_GROUP, _dict_str),
        pa.field("trace_state", pa.string()),
        pa.field("scope_name", _dict_str),
        pa.field("scope_version", _dict_str),
        pa.field("attributes", _attr_map),
        pa.field("resource_attributes", _attr_map),
        # OTLP fields kept for the way back (format 3: OTLP_SPAN_COLUMNS); nulls in older files
        pa.field("flags", pa.uint32()),  # W3C trace flags and the parent-is-remote bits
        pa.field("dropped_attributes_count", pa.uint32()),
        pa.field("dropped_events_count", pa.uint32()),
        pa.field("dropped_links_count", pa.uint32()),
        pa.field("attribute_types", _attr_map),  # the types of attributes and promoted columns (TYPE_TAGS)
        *RESOURCE_OTLP_FIELDS,
        *SCOPE_OTLP_FIELDS,
    ]
)

OTLP_SPAN_COLUMNS = tuple(SPANS_SCHEMA.names[SPANS_SCHEMA.get_field_index("flags"):])
"""The spans columns that hold OTLP fields only the way back reads (dataset format 3 added them)."""

ID_KEY_FIELDS = (
    pa.field("trace_key", pa.uint64()),
    pa.field("span_key", pa.uint64()),
    pa.field("parent_key", pa.uint64()),
    pa.field("trace_low", pa.uint64()),
)

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("span_id", pa.string(), nullable=False),
        pa.field("time_ns", pa.int64()),
        pa.field("name", _dict_str),
        pa.field("attributes", _attr_map),
        pa.field("dropped_attributes_count", pa.uint32()),
        pa.field("attribute_types", _attr_map),
    ]
)

LINKS_SCHEMA = pa.schema(
    [
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("span_id", pa.string(), nullable=False),
        pa.field("linked_trace_id", pa.string(), nullable=False),
        pa.field("linked_span_id", pa.string(), nullable=False),
        pa.field("trace_state", pa.string()),
        pa.field("attributes", _attr_map),
        pa.field("flags", pa.uint32()),
        pa.field("dropped_attributes_count", pa.uint32()),
        pa.field("attribute_types", _attr_map),
    ]
)


def empty_spans() -> pa.Table:
    """A spans table with no rows (what an empty input gives)."""
    return SPANS_SCHEMA.empty_table()
