"""The dataset back to OTLP: OTLP/JSON requests rebuilt from the spans, events and links tables (and
the logs and metrics tables), so that what ingest read can be handed to any OTLP tool again.

The tables keep every OTLP field (``model/schema.py``): the promoted columns go back into the
attributes they came from, each value takes its OTLP type again from the ``*attribute_types``
maps, and spans are grouped under their resource and scope as they came. What OTLP/JSON lets a
writer spell either way comes out in one spelling: ids as lowercase hex, int64 as decimal
strings, enums as numbers, bytes as base64, fields at their default left out. Spans whose
resource and scope are the same in every field share one ``ResourceSpans`` / ``ScopeSpans``.

Built in Python, one dict per span: an export of a run, not a step of an analysis.
"""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

from nemo_telemetry.analysis.ingestion.anyvalue import typed_value
from nemo_telemetry.analysis.model.schema import (
    ITERATION,
    PROMOTED_RESOURCE_ATTRIBUTES,
    PROMOTED_SPAN_ATTRIBUTES,
    SPAN_KINDS,
    STATUS_CODES,
)

__all__ = ["to_otlp_traces", "to_otlp_logs", "to_otlp_metrics"]

_INT_COLUMNS = (ITERATION, "rank")


def _column(table: pa.Table, name: str) -> list:
    """A column as Python values; all None where an older file's table lacks it."""
    if name in table.column_names:
        return table.column(name).to_pylist()
    return [None] * table.num_rows


def _attributes(pairs: Iterable[tuple[str, Any]] | None, types: Iterable[tuple[str, str]] | None,
                columns: Iterable[tuple[str, Any, bool]] = ()) -> list[dict]:
    """KeyValues of a map's ``pairs`` and the promoted ``columns`` ((key, value, is an integer
    column) each; None values left out), each typed by ``types``."""
    tags = dict(types or ())
    out = [{"key": key, "value": typed_value(value, tags.get(key))} for key, value in pairs or ()]
    for key, value, is_int in columns:
        if value is not None:
            tag = tags.get(key, "int" if is_int else None)
            out.append({"key": key, "value": typed_value(str(value), tag)})
    return out


def _set(target: dict, key: str, value: Any) -> None:
    """``target[key] = value`` unless ``value`` is its default (None, 0, "", empty)."""
    if value:
        target[key] = value


def _resource(attributes: list, dropped: Any) -> dict:
    resource: dict = {}
    _set(resource, "attributes", attributes)
    _set(resource, "droppedAttributesCount", dropped)
    return resource


def _scope(name: Any, version: Any, attributes: list, dropped: Any) -> dict:
    scope: dict = {}
    _set(scope, "name", name)
    _set(scope, "version", version)
    _set(scope, "attributes", attributes)
    _set(scope, "droppedAttributesCount", dropped)
    return scope


def _freeze(value: Any) -> Any:
    """A hashable form of a JSON-like value, to group equal resources and scopes."""
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class _Groups:
    """Items grouped under their resource and scope, both in order of first appearance."""

    def __init__(self, scope_key: str, items_key: str) -> None:
        self.scope_key, self.items_key = scope_key, items_key
        self.resources: dict = {}

    def add(self, resource: dict, resource_url: Any, scope: dict, scope_url: Any, item: dict) -> None:
        rkey = (_freeze(resource), resource_url)
        group = self.resources.get(rkey)
        if group is None:
            group = self.resources[rkey] = ({"resource": resource} | ({"schemaUrl": resource_url} if resource_url else {}), {})
        skey = (_freeze(scope), scope_url)
        scoped = group[1].get(skey)
        if scoped is None:
            scoped = group[1][skey] = {"scope": scope} | ({"schemaUrl": scope_url} if scope_url else {})
            scoped[self.items_key] = []
        scoped[self.items_key].append(item)

    def add_row(self, row: dict, item: dict, promoted: Iterable[tuple[str, Any, bool]] = ()) -> None:
        """``item`` under the resource and scope a row of a spans, logs or metrics table holds
        (``promoted``: the resource attributes that have columns of their own)."""
        resource = _resource(_attributes(row["resource_attributes"], row.get("resource_attribute_types"), promoted),
                             row.get("resource_dropped_attributes_count"))
        scope = _scope(row["scope_name"], row.get("scope_version"),
                       _attributes(row.get("scope_attributes"), row.get("scope_attribute_types")),
                       row.get("scope_dropped_attributes_count"))
        self.add(resource, row.get("resource_schema_url"), scope, row.get("scope_schema_url"), item)

    def request(self, resources_key: str) -> dict:
        out = []
        for head, scopes in self.resources.values():
            out.append(head | {self.scope_key: list(scopes.values())})
        return {resources_key: out}


def _rows(table: pa.Table, names: Iterable[str]) -> list[dict]:
    """The table's rows as dicts of ``names`` (None where an older file's table lacks one)."""
    columns = {name: _column(table, name) for name in names}
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def _by_owner(table: pa.Table | None) -> dict[tuple[str, str], list[dict]]:
    """Rows of an events or links table by their span's (trace id, span id), in order."""
    out: dict[tuple[str, str], list[dict]] = {}
    if table is None or table.num_rows == 0:
        return out
    for row in table.to_pylist():
        out.setdefault((row["trace_id"], row["span_id"]), []).append(row)
    return out


def _event(row: dict) -> dict:
    event: dict = {}
    _set(event, "timeUnixNano", str(row["time_ns"]) if row.get("time_ns") else None)
    _set(event, "name", row.get("name"))
    _set(event, "attributes", _attributes(row.get("attributes"), row.get("attribute_types")))
    _set(event, "droppedAttributesCount", row.get("dropped_attributes_count"))
    return event


def _link(row: dict) -> dict:
    link = {"traceId": row["linked_trace_id"], "spanId": row["linked_span_id"]}
    _set(link, "traceState", row.get("trace_state"))
    _set(link, "attributes", _attributes(row.get("attributes"), row.get("attribute_types")))
    _set(link, "droppedAttributesCount", row.get("dropped_attributes_count"))
    _set(link, "flags", row.get("flags"))
    return link


def _resource_columns(row: dict, columns: dict) -> list[tuple[str, Any, bool]]:
    return [(key, row[column], column in _INT_COLUMNS) for key, column in columns.items()]


def to_otlp_traces(spans: pa.Table, events: pa.Table | None = None, links: pa.Table | None = None) -> dict:
    """One OTLP/JSON ``ExportTraceServiceRequest`` (a dict, ``json.dumps``-ready) of a spans
    table (``read_spans``) and its events and links (``read_events``, ``read_links``)."""
    names = [f for f in ("trace_id", "span_id", "parent_span_id", "trace_state", "name", "kind", "start_ns", "end_ns",
                         "status_code", "status_message", "attributes", "attribute_types", "flags",
                         "dropped_attributes_count", "dropped_events_count", "dropped_links_count",
                         "resource_attributes", "resource_attribute_types", "resource_dropped_attributes_count",
                         "resource_schema_url", "scope_name", "scope_version", "scope_attributes",
                         "scope_attribute_types", "scope_dropped_attributes_count", "scope_schema_url",
                         *PROMOTED_SPAN_ATTRIBUTES, *PROMOTED_RESOURCE_ATTRIBUTES.values())]
    span_events, span_links = _by_owner(events), _by_owner(links)
    groups = _Groups("scopeSpans", "spans")
    for row in _rows(spans, names):
        groups.add_row(row, _span(row, span_events, span_links), _resource_columns(row, PROMOTED_RESOURCE_ATTRIBUTES))
    return groups.request("resourceSpans")


def _span(row: dict, events: dict, links: dict) -> dict:
    span = {"traceId": row["trace_id"], "spanId": row["span_id"]}
    _set(span, "traceState", row["trace_state"])
    _set(span, "parentSpanId", row["parent_span_id"])
    _set(span, "flags", row["flags"])
    span["name"] = row["name"] or ""
    _set(span, "kind", SPAN_KINDS.index(row["kind"]) if row["kind"] else None)
    span["startTimeUnixNano"] = str(row["start_ns"])
    span["endTimeUnixNano"] = str(row["end_ns"])
    promoted = [(key, row[key], key in _INT_COLUMNS) for key in PROMOTED_SPAN_ATTRIBUTES]
    _set(span, "attributes", _attributes(row["attributes"], row["attribute_types"], promoted))
    _set(span, "droppedAttributesCount", row["dropped_attributes_count"])
    own = (row["trace_id"], row["span_id"])
    _set(span, "events", [_event(e) for e in events.get(own, ())])
    _set(span, "droppedEventsCount", row["dropped_events_count"])
    _set(span, "links", [_link(link) for link in links.get(own, ())])
    _set(span, "droppedLinksCount", row["dropped_links_count"])
    status: dict = {}
    _set(status, "message", row["status_message"])
    _set(status, "code", STATUS_CODES.index(row["status_code"]) if row["status_code"] else None)
    span["status"] = status
    return span


def to_otlp_logs(logs: pa.Table) -> dict:
    """One OTLP/JSON ``ExportLogsServiceRequest`` (a dict) of a logs table (``read_logs``)."""
    groups = _Groups("scopeLogs", "logRecords")
    for row in _rows(logs, logs.schema.names):
        groups.add_row(row, _log_record(row))
    return groups.request("resourceLogs")


def _log_record(row: dict) -> dict:
    record: dict = {}
    written = row.get("time_observed") is not None  # a row of a reader that keeps every field
    _set(record, "timeUnixNano", None if row.get("time_observed") else str(row["time_ns"]))
    _set(record, "observedTimeUnixNano", str(row["observed_time_ns"]) if row["observed_time_ns"] else None)
    _set(record, "severityNumber", row["severity_number"])
    _set(record, "severityText", row.get("severity_text") if written else row["severity"])
    if row["body"] is not None or row.get("body_type"):
        record["body"] = typed_value(row["body"], row.get("body_type"))
    _set(record, "attributes", _attributes(row["attributes"], row.get("attribute_types")))
    _set(record, "droppedAttributesCount", row.get("dropped_attributes_count"))
    _set(record, "flags", row.get("flags"))
    _set(record, "traceId", row["trace_id"])
    _set(record, "spanId", row["span_id"])
    _set(record, "eventName", row.get("event_name"))
    return record


_TEMPORALITIES = {"unspecified": 0, "delta": 1, "cumulative": 2}
_DATA_KEYS = {"gauge": "gauge", "sum": "sum", "histogram": "histogram",
              "exponential_histogram": "exponentialHistogram", "summary": "summary"}


def to_otlp_metrics(metrics: pa.Table) -> dict:
    """One OTLP/JSON ``ExportMetricsServiceRequest`` (a dict) of a metrics table (``read_metrics``):
    data points grouped back into their metrics, under their resource and scope."""
    groups = _Groups("scopeMetrics", "metrics")
    for row in _rows(metrics, metrics.schema.names):
        groups.add_row(row, row)
    request = groups.request("resourceMetrics")
    for rm in request["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            sm["metrics"] = _metrics(sm["metrics"])
    return request


def _metrics(rows: list[dict]) -> list[dict]:
    """The rows of one scope as its metrics, each metric's points in order."""
    out: dict = {}
    for row in rows:
        kind = row["kind"]
        metadata = _attributes(row.get("metadata"), row.get("metadata_types"))
        key = (row["name"], row.get("description"), row["unit"], kind, row["temporality"], row["is_monotonic"],
               _freeze(metadata))
        metric = out.get(key)
        if metric is None:
            metric = out[key] = {"name": row["name"]}
            _set(metric, "description", row.get("description"))
            _set(metric, "unit", row["unit"])
            _set(metric, "metadata", metadata)
            data: dict = {"dataPoints": []}
            if kind in ("sum", "histogram", "exponential_histogram"):
                _set(data, "aggregationTemporality", _TEMPORALITIES.get(row["temporality"] or "unspecified"))
            if kind == "sum":
                _set(data, "isMonotonic", row["is_monotonic"])
            metric[_DATA_KEYS[kind]] = data
        metric[_DATA_KEYS[kind]]["dataPoints"].append(_point(row, kind))
    return list(out.values())


def _point(row: dict, kind: str) -> dict:
    point: dict = {}
    _set(point, "attributes", _attributes(row["attributes"], row.get("attribute_types")))
    _set(point, "startTimeUnixNano", str(row["start_time_ns"]) if row["start_time_ns"] else None)
    point["timeUnixNano"] = str(row["time_ns"])
    if kind in ("gauge", "sum"):
        if row.get("value_int") is not None:
            point["asInt"] = str(row["value_int"])
        elif row["value"] is not None:
            point["asDouble"] = typed_value(repr(row["value"]), "double")["doubleValue"]
    else:
        _set(point, "count", str(row["count"]) if row["count"] else None)
        if row["value"] is not None:
            point["sum"] = typed_value(repr(row["value"]), "double")["doubleValue"]
    if kind == "summary":
        _set(point, "quantileValues", [{k: v for k, v in q.items() if v} for q in row.get("quantile_values") or ()])
    if kind == "histogram":
        _set(point, "bucketCounts", [str(c) for c in row.get("bucket_counts") or ()])
        _set(point, "explicitBounds", row.get("explicit_bounds"))
    if kind == "exponential_histogram":
        _set(point, "scale", row.get("scale"))
        _set(point, "zeroCount", str(row["zero_count"]) if row.get("zero_count") else None)
        _set(point, "zeroThreshold", row.get("zero_threshold"))
        for side in ("positive", "negative"):
            buckets: dict = {}
            _set(buckets, "offset", row.get(f"{side}_offset"))
            _set(buckets, "bucketCounts", [str(c) for c in row.get(f"{side}_bucket_counts") or ()])
            _set(point, side, buckets)
    if kind in ("histogram", "exponential_histogram"):
        for name in ("min", "max"):
            if row.get(name) is not None:
                point[name] = row[name]
    _set(point, "exemplars", [_exemplar(e) for e in row.get("exemplars") or ()])
    _set(point, "flags", row.get("flags"))
    return point


def _exemplar(row: dict) -> dict:
    exemplar: dict = {}
    _set(exemplar, "filteredAttributes", _attributes(row["filtered_attributes"], row["attribute_types"]))
    _set(exemplar, "timeUnixNano", str(row["time_ns"]) if row["time_ns"] else None)
    if row["value_int"] is not None:
        exemplar["asInt"] = str(row["value_int"])
    elif row["value"] is not None:
        exemplar["asDouble"] = typed_value(repr(row["value"]), "double")["doubleValue"]
    _set(exemplar, "spanId", row["span_id"])
    _set(exemplar, "traceId", row["trace_id"])
    return exemplar
