"""The metrics table: OTLP metric dumps in, one row per data point out; and metrics per training step.

Inputs are what :class:`~nemo_telemetry.instrument._metrics_dump.DumpMetricExporter` and the
Collector's file exporter write: JSON lines of ``ExportMetricsServiceRequest`` (``resourceMetrics``),
a single OTLP/JSON document, or protobuf (the Collector's length-prefixed requests, or one bare
request); each optionally gzip or zstd compressed. A directory means every metrics dump in it,
told by content whatever its name (:func:`~._detect.is_metrics_dump`). Lines of other signals
(``resourceSpans``, ``resourceLogs``) are skipped; a malformed line is counted and skipped (or
raised with ``strict=True``), never the end of the good ones. The counts are in the table's
schema metadata (:data:`SKIPPED_KEY`, :data:`MALFORMED_KEY`, :data:`FIRST_PROBLEM_KEY`).

Data points carry their *collection* time. :func:`metrics_by_step` attributes a point to the
latest step of its run that started at or before it, so the values a driver records and flushes
once per step (``flush_metrics``) land on that step; cumulative sums become per-step increases.
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES
from nemo_telemetry.analysis.ingestion._detect import (Record, ReadBuffers, is_metrics_dump, iter_records,
                                                     json_with_oversized_numbers)
from nemo_telemetry.analysis.ingestion.anyvalue import json_flag, proto_value_string, proto_value_type
from nemo_telemetry.analysis.model.schema import RESOURCE_OTLP_FIELDS, SCOPE_OTLP_FIELDS
from nemo_telemetry.errors import IngestError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "METRICS_SCHEMA",
    "STEP_WINDOWS_SCHEMA",
    "MALFORMED_KEY",
    "SKIPPED_KEY",
    "FIRST_PROBLEM_KEY",
    "read_metrics",
    "metrics_table",
    "step_windows",
    "metrics_by_step",
    "efficiency_by_step",
    "with_efficiency_columns",
    "metrics_for_source",
    "with_step_metrics",
    "dataset_metric_file",
    "MetricFilePoints",
    "dataset_metric_points",
    "request_points",
]

_dict_str = pa.dictionary(pa.int32(), pa.string())
_attr_map = pa.map_(pa.string(), pa.string())

METRICS_SCHEMA = pa.schema([
    pa.field("run_id", _dict_str),
    pa.field("service_name", _dict_str),
    pa.field("rank", pa.int64()),
    pa.field("name", _dict_str, nullable=False),
    pa.field("kind", _dict_str, nullable=False),  # gauge | sum | histogram | exponential_histogram | summary
    pa.field("unit", _dict_str),
    pa.field("temporality", _dict_str),  # cumulative | delta | unspecified (sums and histograms)
    pa.field("is_monotonic", pa.bool_()),
    pa.field("start_time_ns", pa.int64()),
    pa.field("time_ns", pa.int64(), nullable=False),
    pa.field("value", pa.float64()),  # gauges and sums: the value; histograms and summaries: the sum
    pa.field("count", pa.int64()),  # histograms and summaries: the number of observations
    pa.field("attributes", _attr_map),
    pa.field("resource_attributes", _attr_map),
    pa.field("scope_name", _dict_str),
    # OTLP fields kept for the way back (nulls in files written before them)
    pa.field("description", _dict_str),
    pa.field("metadata", _attr_map),  # the metric's metadata key-values
    pa.field("metadata_types", _attr_map),
    pa.field("value_int", pa.int64()),  # gauges and sums: the value, exactly, when it is an int (asInt)
    pa.field("flags", pa.uint32()),  # DataPointFlags
    pa.field("attribute_types", _attr_map),  # the type of each attribute not a string (TYPE_TAGS)
    pa.field("min", pa.float64()),  # histograms
    pa.field("max", pa.float64()),
    pa.field("bucket_counts", pa.list_(pa.uint64())),  # explicit histograms
    pa.field("explicit_bounds", pa.list_(pa.float64())),
    pa.field("scale", pa.int32()),  # exponential histograms
    pa.field("zero_count", pa.uint64()),
    pa.field("zero_threshold", pa.float64()),
    pa.field("positive_offset", pa.int32()),
    pa.field("positive_bucket_counts", pa.list_(pa.uint64())),
    pa.field("negative_offset", pa.int32()),
    pa.field("negative_bucket_counts", pa.list_(pa.uint64())),
    pa.field("quantile_values", pa.list_(pa.struct([("quantile", pa.float64()), ("value", pa.float64())]))),
    pa.field("exemplars", pa.list_(pa.struct([
        ("time_ns", pa.int64()), ("value", pa.float64()), ("value_int", pa.int64()), ("trace_id", pa.string()),
        ("span_id", pa.string()), ("filtered_attributes", _attr_map), ("attribute_types", _attr_map)]))),
    *RESOURCE_OTLP_FIELDS,
    pa.field("scope_version", _dict_str),
    *SCOPE_OTLP_FIELDS,
])
"""One row per data point. ``run_id`` = ``nemo.run.id``, ``rank`` = ``nv.dl.rank`` (from the resource);
the columns from ``description`` on keep the OTLP fields only the way back to OTLP reads
(``docs/columns.md``)."""

STEP_WINDOWS_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("iteration", pa.int64()),
    pa.field("start_ns", pa.int64()),
    pa.field("end_ns", pa.int64()),
])

MALFORMED_KEY = b"nemo.metrics.malformed_records"
SKIPPED_KEY = b"nemo.metrics.other_signal_records"
FIRST_PROBLEM_KEY = b"nemo.metrics.first_problem"

_KINDS = (("gauge", "gauge"), ("sum", "sum"), ("histogram", "histogram"),
          ("exponential_histogram", "exponential_histogram"), ("summary", "summary"))
_TEMPORALITY = {0: "unspecified", 1: "delta", 2: "cumulative"}
_BOOL_VALUE_KEYS = ("boolValue", "bool_value")
_OTHER_SIGNALS = ("resourceSpans", "resource_spans", "resourceLogs", "resource_logs")
_STEP_NAME = r"^rl\.[^.]+\.step$"


# -- reading ----------------------------------------------------------------------------------


@dataclass
class _Counts:
    malformed: int = 0
    skipped: int = 0
    first_problem: str = ""
    # bad parts of metrics requests that were read (points, metrics, headers): what an ingest
    # counts; a line or record that is no request at all its span reader counts already
    inside: list = field(default_factory=list)

    def bad(self, where: str, why: str, strict: bool, *, inside: bool = False) -> None:
        if strict:
            raise IngestError(f"{where}: {why}. Fix or remove that record, or read without strict=True "
                              "to skip it and keep the others.")
        self.malformed += 1
        self.first_problem = self.first_problem or f"{where}: {why}"
        if inside:
            self.inside.append(f"{where}: {why}")


@dataclass
class _Columns:
    rows: dict[str, list] = field(default_factory=lambda: {f.name: [] for f in METRICS_SCHEMA})

    def to_table(self, counts: _Counts) -> pa.Table:
        arrays = []
        for f in METRICS_SCHEMA:
            values = self.rows[f.name]
            if pa.types.is_dictionary(f.type):
                arrays.append(pa.array(values, pa.string()).dictionary_encode())
            else:
                arrays.append(pa.array(values, f.type))
        table = pa.Table.from_arrays(arrays, schema=METRICS_SCHEMA)
        return table.replace_schema_metadata({
            MALFORMED_KEY: str(counts.malformed).encode(),
            SKIPPED_KEY: str(counts.skipped).encode(),
            FIRST_PROBLEM_KEY: counts.first_problem.encode(),
        })


def read_metrics(source: str | Path | Iterable[str | Path], *, strict: bool = False,
                 contents: Iterable[bytes | None] | None = None,
                 max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> pa.Table:
    """The metrics table of ``source``: a dump file, a directory of metrics dumps, a dataset
    directory (the ``metrics/`` table ``ingest`` wrote), or several.

    Raises IngestError for a path that does not exist or cannot be read, and (with ``strict``)
    for the first malformed record, naming the file and line. Without ``strict`` a bad data
    point (a field of the wrong type, a time past int64) costs only itself. A line, record or
    document longer than ``max_record_bytes`` once decompressed (``collect``'s bound on a
    request) is a malformed record, never held whole.
    """
    if contents is None:
        from nemo_telemetry.analysis.store.sources import split_sources

        datasets, others = split_sources(source)
        if datasets:
            from nemo_telemetry.analysis.store.dataset import read_dataset

            raw = read_metrics(others, strict=strict, max_record_bytes=max_record_bytes) if others else None
            tables = [read_dataset(item, "metrics", schema=METRICS_SCHEMA) for item in datasets]
            table = pa.concat_tables(tables + ([raw] if raw is not None else []))
            return table.replace_schema_metadata(raw.schema.metadata if raw is not None else None)
    return _read(_expand(source), strict, contents, max_record_bytes)[0]


def _read(paths: list[Path], strict: bool, contents,
          limit: int = DEFAULT_MAX_REQUEST_BYTES) -> tuple[pa.Table, _Counts]:
    cols, counts = _Columns(), _Counts()
    for path, raw in zip(paths, [None] * len(paths) if contents is None else contents):
        for where, request in _requests(path, counts, strict, raw, limit):
            _decode_request(request, cols, where, counts, strict)
    return cols.to_table(counts), counts


def metrics_table(requests: Iterable[dict]) -> pa.Table:
    """The metrics table of OTLP/JSON request objects already in memory (tests, notebooks)."""
    cols, counts = _Columns(), _Counts()
    for i, request in enumerate(requests):
        _decode_request(_parse(request, f"request {i}"), cols, f"request {i}", counts, True)
    return cols.to_table(counts)


def _expand(source: str | Path | Iterable[str | Path]) -> list[Path]:
    sources = [source] if isinstance(source, (str, Path)) else list(source)
    paths: list[Path] = []
    for item in sources:
        path = Path(item)
        if path.is_dir():
            paths.extend(_metric_dump_files(path))
        elif path.is_file():
            paths.append(path)
        else:
            raise IngestError(f"{path}: no such file or directory. Pass a metrics dump file "
                              "(metrics-*.jsonl) or the directory the dump exporter wrote.")
    return paths


def _requests(path: Path, counts: _Counts, strict: bool, raw: bytes | None = None,
              limit: int = DEFAULT_MAX_REQUEST_BYTES) -> Iterator[tuple[str, Any]]:
    """``(where, ExportMetricsServiceRequest)`` for each metrics record in the file (``raw``: its bytes, read
    already), read by the span reader's :func:`iter_records`: a line, record or document longer than
    ``limit`` once decompressed is rejected and named without being held, and the file is read on."""
    buffers = ReadBuffers()
    records = iter_records(path, buffers=buffers, data=raw, max_record_bytes=limit)
    try:
        first = next(records, None)
    except IngestError as exc:  # not an OTLP dump, or not compressed as it claims
        counts.bad(f"{path}", str(exc).removeprefix(f"{path}: "), strict)
        return
    except OSError as exc:
        raise IngestError(f"{path}: cannot be read ({exc}). Check the file is a complete "
                          "(optionally gzip/zstd compressed) OTLP metrics dump.") from exc
    for record in itertools.chain([first] if first is not None else [], records):
        yield from _record_requests(path, record, counts, strict)
        storage = getattr(record.payload, "storage", None)
        if storage is not None:  # the block is decoded: its buffer reads the next one
            buffers.give(storage)


def _record_requests(path: Path, record: Record, counts: _Counts, strict: bool) -> Iterator[tuple[str, Any]]:
    """The metrics requests of one of :func:`iter_records`' records (a block of lines or frames,
    one request, or a rejected record, which the span reader of the same bytes counts too)."""
    kind, payload = record.kind, record.payload
    if kind == "json-lines":
        for index in range(len(payload.starts)):
            where, line = payload.line(index)
            if line.strip():
                yield from _json_doc_requests(_json_line(where, line, counts, strict), counts, strict)
    elif kind == "protobuf-frames":
        for index in range(len(payload.starts)):
            yield from _proto_request(f"{path}: record {payload.numbers[index]}", payload.payload(index),
                                      counts, strict)
    elif kind == "rejected":
        counts.bad(record.where, str(payload), strict)
    elif isinstance(payload, (bytes, bytearray, memoryview)):  # a zstd-compressed protobuf record
        yield from _proto_request(record.where, bytes(payload), counts, strict)
    else:  # a JSON document or record, of whichever signal
        yield from _json_doc_requests([(record.where, payload)], counts, strict)


def _json_line(where: str, line: bytes, counts: _Counts, strict: bool) -> list[tuple[str, Any]]:
    """``[(where, the line's JSON)]``, or ``[]`` (counted) when it is not JSON."""
    try:
        return [(where, json.loads(line.decode("utf-8")))]
    except UnicodeDecodeError:
        counts.bad(where, "not UTF-8 text", strict)
    except json.JSONDecodeError as exc:
        counts.bad(where, f"not JSON ({exc.msg})", strict)
    except RecursionError:
        counts.bad(where, "JSON nested too deep", strict)
    except ValueError:  # an integer of thousands of digits: its point alone is rejected
        return [(where, json_with_oversized_numbers(line))]
    return []


def _json_doc_requests(docs: list[tuple[str, Any]], counts: _Counts, strict: bool) -> Iterator[tuple[str, Any]]:
    for where, doc in docs:
        if not isinstance(doc, dict):
            counts.bad(where, "not an OTLP request object", strict)
        elif any(key in doc for key in _OTHER_SIGNALS):
            counts.skipped += 1
        elif not any(key in doc for key in ("resourceMetrics", "resource_metrics")):
            counts.bad(where, "no resourceMetrics: not an OTLP metrics request", strict)
        else:
            try:
                yield where, _parse(doc, where)
            except IngestError as exc:
                if strict:
                    counts.bad(where, str(exc), strict)
                yield where, _parse_each(doc, where, counts)


def _parse(doc: dict, where: str):
    from google.protobuf.json_format import ParseDict, ParseError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    if not any(key in doc for key in ("resourceMetrics", "resource_metrics")):
        raise IngestError("no resourceMetrics: not an OTLP metrics request")
    try:
        return ParseDict(_for_parse_dict(doc), ExportMetricsServiceRequest(), ignore_unknown_fields=True)
    except (ParseError, RecursionError) as exc:
        raise IngestError(f"not a valid OTLP metrics request ({_parse_problem(exc)})") from exc


_POINT_TYPES = {"gauge": "NumberDataPoint", "sum": "NumberDataPoint", "histogram": "HistogramDataPoint",
                "exponentialHistogram": "ExponentialHistogramDataPoint",
                "exponential_histogram": "ExponentialHistogramDataPoint", "summary": "SummaryDataPoint"}


def _parse_each(doc: dict, where: str, counts: _Counts):
    """A request protobuf's parser refused as a whole, parsed a part at a time: a bad data
    point costs only itself, a bad metric, scope or resource header only what it holds; each
    is counted and named by its path in the request."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.metrics.v1 import metrics_pb2

    request = ExportMetricsServiceRequest()
    for r, resource in _parts(doc, ("resourceMetrics", "resource_metrics"), where, "", counts):
        at = f"resourceMetrics[{r}]"
        head = _parsed_part(resource, ("scopeMetrics", "scope_metrics"), metrics_pb2.ResourceMetrics, where, at, counts)
        if head is None:
            continue
        for s, scope in _parts(resource, ("scopeMetrics", "scope_metrics"), where, at, counts):
            scope_at = f"{at}.scopeMetrics[{s}]"
            scope_head = _parsed_part(scope, ("metrics",), metrics_pb2.ScopeMetrics, where, scope_at, counts)
            if scope_head is None:
                continue
            for m, metric in _parts(scope, ("metrics",), where, scope_at, counts):
                metric_message = _parsed_metric(metric, where, f"{scope_at}.metrics[{m}]", counts, metrics_pb2)
                if metric_message is not None:
                    scope_head.metrics.append(metric_message)
            head.scope_metrics.append(scope_head)
        request.resource_metrics.append(head)
    return request


def _parts(doc: Any, keys: tuple[str, ...], where: str, at: str, counts: _Counts) -> Iterator[tuple[int, Any]]:
    """``(index, object)`` of the list ``doc`` holds under one of ``keys``; a list that is not one is named."""
    value = next((doc[k] for k in keys if isinstance(doc, dict) and doc.get(k) is not None), [])
    if not isinstance(value, list):
        counts.bad(where, f"{at + '.' if at else ''}{keys[0]} is {type(value).__name__}, not a list", False,
                   inside=True)
        return
    yield from enumerate(value)


def _parsed_part(doc: Any, children: tuple[str, ...], message_type, where: str, at: str, counts: _Counts):
    """``doc`` without its ``children`` list as a ``message_type`` message; None (counted) when it is bad."""
    from google.protobuf.json_format import ParseDict, ParseError

    if not isinstance(doc, dict):
        counts.bad(where, f"{at}: not an object", False, inside=True)
        return None
    try:
        return ParseDict(_for_parse_dict({k: v for k, v in doc.items() if k not in children}), message_type(),
                         ignore_unknown_fields=True)
    except (ParseError, ValueError, TypeError, RecursionError) as exc:
        counts.bad(where, f"{at}: {_parse_problem(exc)}", False, inside=True)
        return None


def _parsed_metric(metric: Any, where: str, at: str, counts: _Counts, metrics_pb2):
    """One metric, its data points parsed one by one (each bad one counted and left out)."""
    kind = next((k for k in _POINT_TYPES if isinstance(metric, dict) and k in metric), None)
    data = metric.get(kind) if kind else None
    if kind is None or not isinstance(data, dict):
        return _parsed_part(metric, (), metrics_pb2.Metric, where, at, counts)
    head = _parsed_part({**metric, kind: {k: v for k, v in data.items() if k not in ("dataPoints", "data_points")}},
                        (), metrics_pb2.Metric, where, at, counts)
    if head is None:
        return None
    points = getattr(head, head.WhichOneof("data")).data_points
    point_type = getattr(metrics_pb2, _POINT_TYPES[kind])
    for p, point in _parts(data, ("dataPoints", "data_points"), where, f"{at} {head.name!r}.{kind}", counts):
        parsed = _parsed_part(point, (), point_type, where, f"{at} {head.name!r}.dataPoints[{p}]", counts)
        if parsed is not None:
            points.append(parsed)
    return head


def _parse_problem(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "values nested too deep"
    text = str(exc).replace("Failed to parse ", "").replace(" field: ", ": ")
    if "'OversizedNumber'" in text:  # json_with_oversized_numbers' stand-in: no int64 or double holds it
        return f"{text.split(':')[0]}: a number of thousands of digits, past int64"
    return text


def _for_parse_dict(doc: Any) -> Any:
    """``doc`` as protobuf's JSON parser takes it: exemplars' ids as base64 (they are hex in the
    Collector's JSON, base64 to the parser), and a ``boolValue`` given as text made a bool, as
    the span and log readers take it (:func:`.anyvalue.json_flag`)."""
    if isinstance(doc, dict):
        return {k: json_flag(v) if k in _BOOL_VALUE_KEYS else
                [_exemplar_ids(e) for e in v] if k == "exemplars" and isinstance(v, list) else _for_parse_dict(v)
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [_for_parse_dict(v) for v in doc]
    return doc


def _exemplar_ids(exemplar: Any) -> Any:
    """An OTLP/JSON exemplar with its hex ids as base64 (ids already base64 are left as they are)."""
    if not isinstance(exemplar, dict):
        return exemplar
    out = _for_parse_dict(exemplar)
    for key, width in (("traceId", 16), ("spanId", 8), ("trace_id", 16), ("span_id", 8)):
        value = out.get(key)
        if isinstance(value, str) and len(value) == 2 * width:
            try:
                out[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                pass
    return out


def _proto_request(where: str, payload: bytes, counts: _Counts, strict: bool) -> Iterator[tuple[str, Any]]:
    """``(where, request)`` of one length-prefixed record's bytes, when it is a metrics request."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    request = ExportMetricsServiceRequest()
    try:
        request.ParseFromString(payload)
    except DecodeError as exc:
        counts.bad(where, f"not a protobuf ExportMetricsServiceRequest ({exc})", strict)
        return
    if not request.resource_metrics:
        counts.skipped += 1
        return
    yield where, request


def _attributes(kvs) -> list[tuple[str, str | None]]:
    return [(kv.key, proto_value_string(kv.value)) for kv in kvs]


def _types(kvs) -> list[tuple[str, str]]:
    return [(kv.key, tag) for kv in kvs if (tag := proto_value_type(kv.value)) is not None]


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _decode_request(request, cols: _Columns, where: str, counts: _Counts, strict: bool) -> None:
    """Append the data points of one request. A point with a bad field (a time or count past
    int64, attribute values nested too deep) costs only itself; a resource or scope whose own
    attributes cannot be encoded costs its points; each counted and named by its path."""
    rows = cols.rows
    for r, rm in enumerate(request.resource_metrics):
        try:
            resource = _attributes(rm.resource.attributes)
        except ValueError as exc:
            counts.bad(where, f"resourceMetrics[{r}].resource.attributes: {exc}", strict, inside=True)
            continue
        res = dict(resource)
        common = (res.get("nemo.run.id"), res.get("service.name"), _int_or_none(res.get("nv.dl.rank")))
        resource_extra = {"resource_attribute_types": _types(rm.resource.attributes),
                          "resource_dropped_attributes_count": rm.resource.dropped_attributes_count,
                          "resource_schema_url": rm.schema_url or None}
        for s, sm in enumerate(rm.scope_metrics):
            try:
                scope_extra = {"scope_version": sm.scope.version or None,
                               "scope_attributes": _attributes(sm.scope.attributes),
                               "scope_attribute_types": _types(sm.scope.attributes),
                               "scope_dropped_attributes_count": sm.scope.dropped_attributes_count,
                               "scope_schema_url": sm.schema_url or None, **resource_extra}
            except ValueError as exc:
                counts.bad(where, f"resourceMetrics[{r}].scopeMetrics[{s}].scope.attributes: {exc}", strict, inside=True)
                continue
            for m, metric in enumerate(sm.metrics):
                at = f"resourceMetrics[{r}].scopeMetrics[{s}].metrics[{m}] {metric.name!r}"
                kind = metric.WhichOneof("data")
                if kind is None:
                    counts.bad(where, f"metric {metric.name!r} has no data", strict, inside=True)
                    continue
                data = getattr(metric, kind)
                temporality = _TEMPORALITY.get(getattr(data, "aggregation_temporality", 0), "unspecified")
                fixed = (common[0], common[1], common[2], metric.name, kind, metric.unit or None,
                         temporality if kind not in ("gauge", "summary") else None,
                         data.is_monotonic if kind == "sum" else None)
                try:
                    metadata = list(getattr(metric, "metadata", ()))
                    metric_extra = {"description": metric.description or None, "metadata": _attributes(metadata),
                                    "metadata_types": _types(metadata), **scope_extra}
                except ValueError as exc:
                    counts.bad(where, f"{at}.metadata: {exc}", strict, inside=True)
                    continue
                for p, point in enumerate(data.data_points):
                    try:
                        values = _point_values(point, kind)
                        extra = _point_extras(point, kind)
                    except ValueError as exc:
                        counts.bad(where, f"{at}.dataPoints[{p}].{exc}", strict, inside=True)
                        continue
                    for name, value in zip(_POINT_COLUMNS, fixed + values + (resource, sm.scope.name or None)):
                        rows[name].append(value)
                    for name, value in {**metric_extra, **extra}.items():
                        rows[name].append(value)


_POINT_COLUMNS = ("run_id", "service_name", "rank", "name", "kind", "unit", "temporality", "is_monotonic",
                  "start_time_ns", "time_ns", "value", "count", "attributes", "resource_attributes", "scope_name")
_INT64_TOP = 1 << 63


def _point_values(point, kind: str) -> tuple:
    """``(start_time_ns, time_ns, value, count, attributes)`` of a data point; ValueError
    naming the field when one does not fit its column (uint64 on the wire, int64 here)."""
    if kind in ("gauge", "sum"):
        which = point.WhichOneof("value")
        value = float(getattr(point, which)) if which else None
        count = None
    else:
        value = float(point.sum) if kind == "summary" or point.HasField("sum") else None  # a summary's sum has no presence
        count = _fits("count", point.count)
    start = _fits("startTimeUnixNano", point.start_time_unix_nano)
    try:
        attributes = _attributes(point.attributes)
    except ValueError as exc:
        raise ValueError(f"attributes: {exc}") from None
    if not point.time_unix_nano:
        raise ValueError("timeUnixNano: missing (a data point needs its collection time)")
    return start or None, _fits("timeUnixNano", point.time_unix_nano), value, count, attributes


_EMPTY_EXTRAS = dict.fromkeys(("value_int", "min", "max", "bucket_counts", "explicit_bounds", "scale", "zero_count",
                               "zero_threshold", "positive_offset", "positive_bucket_counts", "negative_offset",
                               "negative_bucket_counts", "quantile_values"))


def _point_extras(point, kind: str) -> dict:
    """A data point's columns kept for the way back: flags, attribute types, buckets, quantiles,
    exemplars, an int value exactly; ValueError naming a field that cannot be read."""
    out = dict(_EMPTY_EXTRAS)
    out["flags"] = point.flags
    try:
        out["attribute_types"] = _types(point.attributes)
        out["exemplars"] = [_exemplar(e) for e in point.exemplars] if kind != "summary" else []
    except ValueError as exc:
        raise ValueError(f"attributes: {exc}") from None
    if kind in ("gauge", "sum"):
        out["value_int"] = point.as_int if point.WhichOneof("value") == "as_int" else None
    elif kind == "summary":
        out["quantile_values"] = [{"quantile": q.quantile, "value": q.value} for q in point.quantile_values]
    else:
        out["min"] = point.min if point.HasField("min") else None
        out["max"] = point.max if point.HasField("max") else None
        if kind == "histogram":
            out["bucket_counts"] = list(point.bucket_counts)
            out["explicit_bounds"] = list(point.explicit_bounds)
        else:
            out.update(scale=point.scale, zero_count=point.zero_count, zero_threshold=point.zero_threshold,
                       positive_offset=point.positive.offset, positive_bucket_counts=list(point.positive.bucket_counts),
                       negative_offset=point.negative.offset, negative_bucket_counts=list(point.negative.bucket_counts))
    return out


def _exemplar(exemplar) -> dict:
    which = exemplar.WhichOneof("value")
    return {"time_ns": _fits("timeUnixNano", exemplar.time_unix_nano),
            "value": exemplar.as_double if which == "as_double" else None,
            "value_int": exemplar.as_int if which == "as_int" else None,
            "trace_id": exemplar.trace_id.hex() or None, "span_id": exemplar.span_id.hex() or None,
            "filtered_attributes": _attributes(exemplar.filtered_attributes),
            "attribute_types": _types(exemplar.filtered_attributes)}


def _fits(name: str, number: int) -> int:
    if not 0 <= number < _INT64_TOP:
        raise ValueError(f"{name}: {number} does not fit in int64")
    return int(number)


# -- per step ---------------------------------------------------------------------------------


def step_windows(spans: pa.Table) -> pa.Table:
    """``(run_id, iteration, start_ns, end_ns)`` of each step: step spans sharing an iteration
    span from the earliest start to the latest end (the goodput denominator's window)."""
    names = pc.cast(spans["name"], pa.string())
    mask = pc.and_(pc.match_substring_regex(names, _STEP_NAME), pc.is_valid(spans["rl.iteration"]))
    steps = spans.filter(mask)
    table = pa.table({
        "run_id": pc.cast(steps["run_id"], pa.string()),
        "iteration": steps["rl.iteration"],
        "start_ns": steps["start_ns"],
        "end_ns": steps["end_ns"],
    })
    grouped = table.group_by(["run_id", "iteration"], use_threads=False).aggregate(
        [("start_ns", "min"), ("end_ns", "max")])
    out = pa.table({
        "run_id": grouped["run_id"], "iteration": grouped["iteration"],
        "start_ns": grouped["start_ns_min"], "end_ns": grouped["end_ns_max"],
    }, schema=STEP_WINDOWS_SCHEMA)
    return out.sort_by([("run_id", "ascending"), ("start_ns", "ascending")])


def metrics_by_step(metrics: pa.Table, steps: pa.Table, *, names: Iterable[str] | None = None) -> pa.Table:
    """The value of each series in each step: ``run_id, iteration, name, attributes, value``.

    ``steps`` is a :func:`step_windows` table (or any table with those four columns). A data
    point belongs to the latest step of its run that started at or before it; points before a
    run's first step are left out. Per series (run, process, name, attributes) and step: gauges
    give their last value, cumulative sums their increase since the previous point (the first
    point counts from zero), delta sums the sum of their points. Histograms are left out.
    """
    import pandas as pd  # only where there are metrics: goodput without them loads no pandas

    frame = _point_frame(metrics, names)
    if frame.empty or steps.num_rows == 0:
        return _empty_by_step()
    frame = _with_increments(frame)
    windows = steps.select(["run_id", "iteration", "start_ns"]).to_pandas()
    windows = windows.dropna(subset=["run_id"]).sort_values("start_ns", kind="stable")
    frame = frame.dropna(subset=["run_id"]).sort_values("time_ns", kind="stable")
    if frame.empty or windows.empty:
        return _empty_by_step()
    joined = pd.merge_asof(frame, windows, left_on="time_ns", right_on="start_ns", by="run_id",
                           direction="backward").dropna(subset=["iteration"])
    joined["is_gauge"] = joined["kind"] == "gauge"
    keys = ["run_id", "iteration", "name", "attributes_key"]
    last = joined[joined["is_gauge"]].groupby(keys, sort=True).agg(value=("value", "last"))
    summed = joined[~joined["is_gauge"]].groupby(keys, sort=True).agg(value=("increment", "sum"))
    result = pd.concat([last, summed]).reset_index().sort_values(keys, kind="stable")
    return pa.table({
        "run_id": pa.array(result["run_id"].astype(str), pa.string()),
        "iteration": pa.array(result["iteration"].astype("int64"), pa.int64()),
        "name": pa.array(result["name"].astype(str), pa.string()),
        "attributes": pa.array([[tuple(kv) for kv in json.loads(k)] for k in result["attributes_key"]], _attr_map),
        "value": pa.array(result["value"].astype("float64"), pa.float64()),
    })


def efficiency_by_step(metrics: pa.Table, steps: pa.Table) -> pa.Table:
    """``rl.efficiency.seconds`` per step: ``run_id, iteration, category, measurement, seconds``.

    Filter on ``measurement`` before adding categories: ``collector_wall_clock`` runs on another
    timeline and ``thread_seconds`` can exceed wall time.
    """
    by_step = metrics_by_step(metrics, steps, names=["rl.efficiency.seconds"])
    return pa.table({
        "run_id": by_step["run_id"],
        "iteration": by_step["iteration"],
        "category": _map_value(by_step["attributes"], "rl.efficiency.category"),
        "measurement": _map_value(by_step["attributes"], "rl.efficiency.measurement"),
        "seconds": by_step["value"],
    })


def with_efficiency_columns(steps: pa.Table, metrics: pa.Table) -> pa.Table:
    """``steps`` (e.g. ``RunGoodput.steps``) plus one ``efficiency/<category>_s`` column per category.

    What ``goodput`` shows beside a step's span buckets. Each added field's metadata names its
    ``rl.efficiency.measurement``; a step without a value for a category gets null.
    """
    import pandas as pd  # only where there are metrics: goodput without them loads no pandas

    eff = efficiency_by_step(metrics, steps).to_pandas()
    if eff.empty:
        return steps
    wide = eff.pivot_table(index=["run_id", "iteration"], columns="category", values="seconds", aggfunc="last")
    keys = pd.DataFrame({"run_id": pc.cast(steps["run_id"], pa.string()).to_pandas(),
                         "iteration": steps["iteration"].to_pandas()})
    joined = keys.merge(wide.reset_index(), on=["run_id", "iteration"], how="left")
    measurement = eff.groupby("category")["measurement"].last()
    out = steps
    for category in wide.columns:
        field = pa.field(f"efficiency/{category}_s", pa.float64(),
                         metadata={b"rl.efficiency.measurement": str(measurement[category]).encode()})
        out = out.append_column(field, pa.array(joined[category].to_numpy(dtype=float, na_value=np.nan),
                                                pa.float64(), from_pandas=True))
    return out


def _map_value(maps: pa.ChunkedArray, key: str) -> pa.ChunkedArray:
    if len(maps) == 0:
        return pa.chunked_array([], pa.string())
    return pc.map_lookup(maps, pa.scalar(key, pa.string()), "first")


def _point_frame(metrics: pa.Table, names: Iterable[str] | None) -> pd.DataFrame:
    kind = pc.cast(metrics["kind"], pa.string())
    mask = pc.is_in(kind, pa.array(["gauge", "sum"]))
    if names is not None:
        mask = pc.and_(mask, pc.is_in(pc.cast(metrics["name"], pa.string()), pa.array(list(names), pa.string())))
    table = metrics.filter(mask)
    attributes_key = [json.dumps(sorted(a), separators=(",", ":")) if a else "[]"
                      for a in table["attributes"].to_pylist()]
    import pandas as pd  # as metrics_by_step

    return pd.DataFrame({
        "run_id": pc.cast(table["run_id"], pa.string()).to_pandas(),
        "service_name": pc.cast(table["service_name"], pa.string()).to_pandas(),
        "rank": table["rank"].to_pandas(),
        "name": pc.cast(table["name"], pa.string()).to_pandas(),
        "kind": pc.cast(table["kind"], pa.string()).to_pandas(),
        "temporality": pc.cast(table["temporality"], pa.string()).to_pandas(),
        "time_ns": table["time_ns"].to_pandas(),
        "value": table["value"].to_pandas(),
        "attributes_key": attributes_key,
    })


def _with_increments(frame: pd.DataFrame) -> pd.DataFrame:
    """Per series, the increase each point adds: cumulative sums differenced, delta sums as they are."""
    series = ["run_id", "service_name", "rank", "name", "attributes_key"]
    frame = frame.sort_values("time_ns", kind="stable")
    previous = frame.groupby(series, dropna=False, sort=False)["value"].shift(1).fillna(0.0)
    cumulative = (frame["temporality"] == "cumulative").to_numpy()
    restarted = frame["value"].to_numpy() < previous.to_numpy()  # a counter that went down started over
    increment = np.where(cumulative & ~restarted, frame["value"] - previous, frame["value"])
    return frame.assign(increment=increment)


def _empty_by_step() -> pa.Table:
    return pa.table({
        "run_id": pa.array([], pa.string()), "iteration": pa.array([], pa.int64()),
        "name": pa.array([], pa.string()), "attributes": pa.array([], _attr_map),
        "value": pa.array([], pa.float64()),
    })


def _metric_dump_files(path: Path) -> list[Path]:
    """The metrics dumps in ``path`` (a directory; told by content) or ``path`` itself."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if is_metrics_dump(p) and p.is_file())
    return [path] if path.is_file() and is_metrics_dump(path) else []


def metrics_for_source(source: str | Path | Iterable[str | Path]) -> pa.Table | None:
    """The metrics that came with a spans ``source``, or None when it has none.

    A dataset directory keeps them in ``metrics/`` (written by ``ingest``); raw dumps have them
    in metrics dumps beside the trace dumps (``metrics-*`` files, or any told by content).
    """
    from nemo_telemetry.analysis.store.dataset import read_dataset
    from nemo_telemetry.analysis.store.sources import split_sources

    datasets, others = split_sources(source)
    tables = [read_dataset(item, "metrics", schema=METRICS_SCHEMA) for item in datasets]
    raw = [f for item in others for f in _metric_dump_files(item)]
    if raw:
        tables.append(read_metrics(raw))
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else None


@dataclass(frozen=True)
class MetricFilePoints:
    """What :func:`dataset_metric_points` made of one metrics dump: the dataset file to write
    (``(metrics/<hash>.parquet, points)``, None when it has no points) and each bad part of its
    requests (``file:line: path in the request: why``), which the ingest counts as rejected."""

    file: tuple[str, pa.Table] | None
    problems: tuple[str, ...] = ()


def dataset_metric_points(path: Path, data: bytes,
                          max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> MetricFilePoints:
    """The data points of one metrics dump (``data``: its bytes, read once by the ingest for
    its spans and metrics) as the dataset file to write, and the bad parts left out.

    Named by the input's content hash, so re-ingesting a file replaces its points instead of
    adding them twice. Lines or records that are no request at all are not among the problems:
    the ingest's span reader, which reads the same bytes with the same ``max_record_bytes``
    bound, counts those (a line or record past the bound among them).
    """
    import hashlib

    table, counts = _read([Path(path)], False, [data], max_record_bytes)
    relative = f"metrics/{hashlib.sha1(data).hexdigest()[:20]}.parquet"
    return MetricFilePoints((relative, table.replace_schema_metadata(None)) if table.num_rows else None,
                            tuple(counts.inside))


def request_points(body: bytes, *, json_body: bool) -> tuple[pa.Table, tuple[str, ...]]:
    """The data points of one ``ExportMetricsServiceRequest`` body (``collect``'s ``/v1/metrics``;
    ``json_body``: OTLP/JSON, else protobuf), and each bad part left out (a point with a bad field
    costs only itself, as in a dump). ValueError naming the fault when the body is no metrics
    request at all (not JSON, not protobuf, no ``resourceMetrics``)."""
    cols, counts = _Columns(), _Counts()
    where = "request"
    if json_body:
        docs = _json_line(where, body, counts, False)
        requests = list(_json_doc_requests(docs, counts, False)) if docs and docs[0][1] != {} else []
    else:
        requests = list(_proto_request(where, body, counts, False)) if body else []
    if counts.malformed > len(counts.inside):  # the body itself, not a part of it
        raise ValueError(counts.first_problem.removeprefix(f"{where}: "))
    for at, request in requests:
        _decode_request(request, cols, at, counts, False)
    return cols.to_table(counts).replace_schema_metadata(None), tuple(counts.inside)


def dataset_metric_file(path: Path, data: bytes) -> tuple[str, pa.Table] | None:
    """:func:`dataset_metric_points`' file alone: ``(metrics/<hash>.parquet, points)``, or None."""
    return dataset_metric_points(path, data).file


def with_step_metrics(runs: tuple, source) -> tuple:
    """``run_goodput`` results with each step's efficiency metrics (``efficiency/<category>_s``)
    beside its buckets, when ``source`` has metrics; unchanged otherwise."""
    import dataclasses

    metrics = metrics_for_source(source)
    if metrics is None:
        return runs
    return tuple(dataclasses.replace(run, steps=with_efficiency_columns(run.steps, metrics)) for run in runs)
