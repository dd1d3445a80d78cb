"""Build a spans table from plain Python records: hand-built traces in tests and notebooks.

Not for bulk data (ingest builds columns directly); this is the readable way to write
"a step of 10 s with a 4 s generate span inside" down.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pyarrow as pa

from nemo_telemetry.analysis.model.schema import (
    BUCKET,
    EFFICIENCY_CATEGORY,
    ITERATION,
    PROMOTED_RESOURCE_ATTRIBUTES,
    SPAN_GROUP,
    SPANS_SCHEMA,
    promote_resource,
)

__all__ = ["spans_table"]

_SHORT_NAMES = {"bucket": BUCKET, "iteration": ITERATION, "efficiency_category": EFFICIENCY_CATEGORY,
                "span_group": SPAN_GROUP}
_DEFAULTS: Mapping[str, Any] = {
    "parent_span_id": None,
    "kind": "internal",
    "status_code": "unset",
    "status_message": None,
    "service_name": "driver",
    "run_id": "run-1",
    "rank": 0,
    "span_groups": None,
    "span_groups_namespace": None,
    BUCKET: None,
    ITERATION: None,
    EFFICIENCY_CATEGORY: None,
    SPAN_GROUP: None,
    "trace_state": None,
    "scope_name": "nemo_telemetry",
    "scope_version": None,
    "attributes": {},
    "resource_attributes": {},
}


def spans_table(records: Iterable[Mapping[str, Any]]) -> pa.Table:
    """A ``SPANS_SCHEMA`` table from dicts with at least trace_id, span_id, name, start_ns, end_ns.

    ``bucket``, ``iteration``, ``efficiency_category`` and ``span_group`` may be used as short names for the
    ``rl.*`` columns; ``duration_ns`` is computed; attribute maps are ``{str: str}`` dicts. A
    promoted resource attribute in ``resource_attributes`` (``nemo.telemetry.span_groups``...) goes
    to its column, as ingest puts it, unless the record gives that column itself (the attribute
    then stays in the map, where the findings read it too).
    """
    rows = []
    for i, record in enumerate(records):
        row = dict(_DEFAULTS)
        for key, value in record.items():
            row[_SHORT_NAMES.get(key, key)] = value
        missing = {"trace_id", "span_id", "name", "start_ns", "end_ns"} - row.keys()
        if missing:
            raise ValueError(f"span record {i}: missing {sorted(missing)}")
        unknown = row.keys() - set(SPANS_SCHEMA.names) - {"duration_ns"}
        if unknown:
            raise ValueError(f"span record {i}: unknown fields {sorted(unknown)}")
        row["duration_ns"] = row["end_ns"] - row["start_ns"]
        row["attributes"] = list(row["attributes"].items())
        resource = row["resource_attributes"]
        promoted, remaining = promote_resource(resource)
        for key, column in PROMOTED_RESOURCE_ATTRIBUTES.items():
            if column in record and key in resource:  # the record's own column: the attribute stays as given
                remaining[key] = resource[key]
            elif column not in record and promoted[column] is not None:
                row[column] = promoted[column]
        row["resource_attributes"] = list(remaining.items())
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=SPANS_SCHEMA)
