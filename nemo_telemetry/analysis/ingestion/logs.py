"""The logs table: OTLP log dumps in, one row per log record out, with the span it was logged in.

Inputs are what :class:`~nemo_telemetry.instrument.DumpLogExporter` and the Collector's file
exporter write: JSON lines of ``ExportLogsServiceRequest`` (``resourceLogs``), a single
OTLP/JSON document, or protobuf (length-prefixed requests, or one bare request), each optionally
gzip or zstd compressed. A file is a log dump when its content says so (``resourceLogs``, or a
protobuf log record, near its start; the name ``logs-*`` only when the content cannot tell);
lines of other signals in it are left to their own readers. A malformed line or record is counted and named (file,
line, field) and costs only itself. ``ingest`` writes the table to ``DATASET/logs/``.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import orjson
import pyarrow as pa

from nemo_telemetry.analysis.ingestion._columns import text_id_hex
from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES
from nemo_telemetry.analysis.ingestion._detect import (JsonLines, ReadBuffers, is_log_dump, iter_records,
                                                     json_with_oversized_numbers)
from nemo_telemetry.analysis.ingestion._otlp_json import camel_case
from nemo_telemetry.analysis.ingestion.anyvalue import json_value_string, json_value_type
from nemo_telemetry.analysis.model.schema import RESOURCE_OTLP_FIELDS, SCOPE_OTLP_FIELDS
from nemo_telemetry.errors import IngestError

__all__ = ["LOGS_SCHEMA", "LogReadResult", "DatasetLogFiles", "read_logs", "read_log_dumps", "log_dump_files",
           "dataset_log_files", "request_logs"]

_dict_str = pa.dictionary(pa.int32(), pa.string())
_attr_map = pa.map_(pa.string(), pa.string())

LOGS_SCHEMA = pa.schema([
    pa.field("trace_id", pa.string()),  # lowercase hex; null when logged outside any span
    pa.field("span_id", pa.string()),
    pa.field("time_ns", pa.int64(), nullable=False),  # the record's time, else when it was observed
    pa.field("observed_time_ns", pa.int64()),
    pa.field("severity_number", pa.int32()),
    pa.field("severity", _dict_str),  # severity text (INFO, WARN ...), else the number's name
    pa.field("body", pa.string()),
    pa.field("attributes", _attr_map),
    pa.field("service_name", _dict_str),
    pa.field("run_id", _dict_str),
    pa.field("rank", pa.int64()),
    pa.field("scope_name", _dict_str),
    pa.field("resource_attributes", _attr_map),
    # OTLP fields kept for the way back (nulls in files written before them)
    pa.field("flags", pa.uint32()),
    pa.field("event_name", _dict_str),
    pa.field("dropped_attributes_count", pa.uint32()),
    pa.field("attribute_types", _attr_map),  # the type of each attribute not a string (TYPE_TAGS)
    pa.field("body_type", _dict_str),  # the body's type, null for a string (TYPE_TAGS)
    pa.field("severity_text", _dict_str),  # severityText as written (``severity`` may be the number's name)
    pa.field("time_observed", pa.bool_()),  # the record had no timeUnixNano: time_ns is its observed time
    *RESOURCE_OTLP_FIELDS,
    pa.field("scope_version", _dict_str),
    *SCOPE_OTLP_FIELDS,
])
"""One row per log record. ``run_id`` = ``nemo.run.id``, ``rank`` = ``nv.dl.rank`` (from the resource);
the columns from ``flags`` on keep the OTLP fields only the way back to OTLP reads
(``docs/columns.md``)."""

_SEVERITY_NAMES = {1: "TRACE", 5: "DEBUG", 9: "INFO", 13: "WARN", 17: "ERROR", 21: "FATAL"}


@dataclass
class LogReadResult:
    """The table of some log dumps, the log requests read, and each problem (file:line: why).

    ``problems`` are bad records inside log requests; ``unreadable`` are lines or files that are
    not JSON requests at all (the trace reader reports those too, when it reads the same files).
    """

    table: pa.Table
    requests: int = 0
    problems: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DatasetLogFiles:
    """The dataset files :func:`dataset_log_files` made of log dumps (``(logs/<hash>.parquet,
    table)`` each, for the ingest's writer to stage), their records, the log requests they came in,
    and each bad record."""

    files: tuple[tuple[str, pa.Table], ...] = ()
    records: int = 0
    requests: int = 0
    problems: tuple[str, ...] = ()


@dataclass
class _Rows:
    columns: dict[str, list] = field(default_factory=lambda: {f.name: [] for f in LOGS_SCHEMA})

    def table(self) -> pa.Table:
        arrays = []
        for f in LOGS_SCHEMA:
            values = self.columns[f.name]
            if pa.types.is_dictionary(f.type):
                arrays.append(pa.array(values, pa.string()).dictionary_encode())
            else:
                arrays.append(pa.array(values, f.type))
        return pa.Table.from_arrays(arrays, schema=LOGS_SCHEMA)


# -- which files ------------------------------------------------------------------------------


def log_dump_files(source: str | Path | Iterable[str | Path]) -> list[Path]:
    """The log dumps among ``source``: files named, and files under directories (hidden ones skipped)."""
    items = [source] if isinstance(source, (str, Path)) else list(source)
    files: list[Path] = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.is_file()
                           and not any(part.startswith(".") for part in p.relative_to(item).parts))
            files.extend(p for p in found if is_log_dump(p))
        elif item.is_file():
            if is_log_dump(item):
                files.append(item)
        else:
            raise IngestError(f"{item}: no such file or directory. Pass a log dump (logs-*.jsonl), the "
                              "directory the dump exporter wrote, or a dataset directory.")
    return files


# -- reading ----------------------------------------------------------------------------------


def _documents(path: Path, problems: list[str], data: bytes | None = None,
               limit: int = DEFAULT_MAX_REQUEST_BYTES) -> Iterator[tuple[str, Any]]:
    """``(where, document)`` for each JSON document of ``path`` (``data``: its bytes, read already),
    read by the span reader's :func:`iter_records`: a line or document longer than ``limit`` once
    decompressed is named in ``problems`` without being held, and the file is read on."""
    buffers = ReadBuffers()
    records = iter_records(path, buffers=buffers, data=data, max_record_bytes=limit)
    try:
        first = next(records, None)
    except Exception as exc:  # OSError, IngestError: not OTLP, or not compressed as it claims
        problems.append(f"{path}: cannot be read ({exc})")
        return
    for record in itertools.chain([first] if first is not None else [], records):
        if record.kind == "json-lines":
            yield from _line_documents(record.payload, problems)
            buffers.give(record.payload.storage)
        elif record.kind == "rejected":
            problems.append(f"{record.where}: {record.payload}")
        elif record.kind == "protobuf-frames":
            for index in range(len(record.payload.starts)):
                yield from _proto_document(record.payload.where(index), record.payload.payload(index), problems)
            buffers.give(record.payload.storage)
        elif isinstance(record.payload, (bytes, bytearray, memoryview)):
            yield from _proto_document(record.where, bytes(record.payload), problems)
        elif not isinstance(record.payload, dict):
            problems.append(f"{record.where}: not an OTLP request object")
        else:
            yield record.where, record.payload


def _proto_document(where: str, payload: bytes, problems: list[str]) -> Iterator[tuple[str, Any]]:
    """A protobuf ``ExportLogsServiceRequest`` as its OTLP/JSON document (ids in base64, which
    the record decoder reads as it reads them in JSON), so that one decoder serves both."""
    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    try:
        request = ExportLogsServiceRequest.FromString(payload)
    except (DecodeError, RecursionError) as exc:
        problems.append(f"{where}: not a protobuf ExportLogsServiceRequest ({exc})")
        return
    doc = MessageToDict(request)
    doc.setdefault("resourceLogs", [])
    yield where, doc


def _line_documents(block: JsonLines, problems: list[str]) -> Iterator[tuple[str, Any]]:
    for index in range(len(block.starts)):
        where, line = block.line(index)
        if not line.strip():
            continue
        try:
            yield where, orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            # a number no double holds: its record alone is rejected (the span reader agrees)
            doc = json_with_oversized_numbers(line) if "number" in str(exc) else None
            if doc is None:
                problems.append(f"{where}: not JSON ({exc})")
            else:
                yield where, doc


def _get(obj: dict, key: str, default: Any = None) -> Any:
    """``obj[key]``, with ``default`` for a missing or null field."""
    value = obj.get(key)
    return default if value is None else value


def _any_text(value: Any) -> str | None:
    """An OTLP/JSON ``AnyValue`` as text, encoded as span attributes are (``schema.py``)."""
    return json_value_string(value)


def _attributes(kvs: Any, what: str = "attributes") -> list[tuple[str, str | None]]:
    return _typed_attributes(kvs, what)[0]


def _typed_attributes(kvs: Any, what: str = "attributes") -> tuple[list[tuple[str, str | None]], list[tuple[str, str]]]:
    """(key, value string) of each attribute and (key, type tag) of those not strings."""
    if not kvs:
        return [], []
    if not isinstance(kvs, list):
        raise ValueError(f"{what} is {type(kvs).__name__}, not a list")
    out, types = [], []
    for index, kv in enumerate(kvs):
        key = kv.get("key") if isinstance(kv, dict) else None
        if not isinstance(key, str):
            raise ValueError(f"{what}[{index}] has no string key")
        value = kv.get("value")
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{what}[{index}] ({key!r}): value is {type(value).__name__}, not an AnyValue object")
        try:
            out.append((key, _any_text(value)))
            tag = json_value_type(value)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ValueError(f"{what}[{index}] ({key!r}): {exc}") from None
        if tag is not None:
            types.append((key, tag))
    return out, types


def _uint32(record: dict, key: str) -> int:
    value = _int(_get(record, key, 0), key)
    if not 0 <= value < 1 << 32:
        raise ValueError(f"{key} {value!r} is outside 0..2^32-1")
    return value


def _hex_id(value: Any, length: int, what: str) -> str | None:
    """A trace/span id as lowercase hex (hex in any case, or base64); None when absent or all zero."""
    if not value:
        return None
    text = text_id_hex(str(value), length)
    if text is None:
        raise ValueError(f"{what} {value!r} is neither {length * 2} hex digits nor base64 of {length} bytes")
    return None if not text.strip("0") else text


def _int(value: Any, what: str) -> int:
    """An OTLP/JSON int64 (a number, or decimal digits as text); never rounded: 1.5, true or
    "1e3" are not integers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < (1 << 53):  # exact as a double
        value = int(value)
    if isinstance(value, str) and value.isascii() and value.lstrip("-").isdigit() and len(value) <= 21:
        value = int(value)
    if type(value) is not int:
        shown = value if not isinstance(value, str) or len(value) <= 40 else f"{value[:40]}..."
        raise ValueError(f"{what} {shown!r} is not an integer")
    number = value
    if not -(1 << 63) <= number < (1 << 63):
        raise ValueError(f"{what} {value!r} does not fit in int64")
    return number


def _severity_number(value: Any) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.startswith("SEVERITY_NUMBER_"):
        name = value[len("SEVERITY_NUMBER_"):]
        base = {v: k for k, v in _SEVERITY_NAMES.items()}
        letters, digits = name.rstrip("0123456789"), name[len(name.rstrip("0123456789")):]
        if letters not in base:
            raise ValueError(f"severityNumber {value!r} is not a severity")
        number = base[letters] + (int(digits) - 1 if digits and len(digits) <= 2 else 0 if not digits else 99)
        if not base[letters] <= number < base[letters] + 4:
            raise ValueError(f"severityNumber {value!r} is not a severity")
        return number
    number = _int(value, "severityNumber")
    if not 0 <= number <= 24:
        raise ValueError(f"severityNumber {value!r} is outside 0-24")
    return number


def _record_row(record: dict) -> dict:
    time_ns = _int(_get(record, "timeUnixNano", 0), "timeUnixNano")
    observed = _int(_get(record, "observedTimeUnixNano", 0), "observedTimeUnixNano")
    number = _severity_number(_get(record, "severityNumber"))
    text = _get(record, "severityText")
    if not isinstance(text, (str, type(None))):
        raise ValueError(f"severityText {text!r} is {type(text).__name__}, not a string")
    written = text or None
    text = text or (_SEVERITY_NAMES.get((number - 1) // 4 * 4 + 1) if number else None)
    event_name = _get(record, "eventName")
    if not isinstance(event_name, (str, type(None))):
        raise ValueError(f"eventName {event_name!r} is {type(event_name).__name__}, not a string")
    attributes, types = _typed_attributes(record.get("attributes"))
    return {
        "trace_id": _hex_id(_get(record, "traceId"), 16, "traceId"),
        "span_id": _hex_id(_get(record, "spanId"), 8, "spanId"),
        "time_ns": time_ns or observed,
        "observed_time_ns": observed or None,
        "severity_number": number,
        "severity": text,
        "body": _body(record.get("body")),
        "attributes": attributes,
        "flags": _uint32(record, "flags"),
        "event_name": event_name or None,
        "dropped_attributes_count": _uint32(record, "droppedAttributesCount"),
        "attribute_types": types,
        "body_type": _body_type(record.get("body")),
        "severity_text": written,
        "time_observed": not time_ns,
    }


def _body_type(value: Any) -> str | None:
    return json_value_type(value) if isinstance(value, dict) else None


def _body(value: Any) -> str | None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"body is {type(value).__name__}, not an AnyValue object")
    try:
        return _any_text(value)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise ValueError(f"body: {exc}") from None


def _scope_name(scope: Any) -> str | None:
    name = scope.get("name") if isinstance(scope, dict) else None
    if not isinstance(name, (str, type(None))):
        raise ValueError(f"scope.name {name!r} is {type(name).__name__}, not a string")
    return name or None


def _scope_columns(scope: Any, schema_url: Any) -> dict[str, Any]:
    """A scope's columns: name, version, attributes and their types, dropped count, schema URL."""
    if not isinstance(scope, dict):
        raise ValueError(f"scope is {type(scope).__name__}, not an object")
    version = scope.get("version")
    if not isinstance(version, (str, type(None))) or not isinstance(schema_url, (str, type(None))):
        raise ValueError("scope.version or schemaUrl is not a string")
    attributes, types = _typed_attributes(scope.get("attributes"), "scope.attributes")
    return {"scope_name": _scope_name(scope), "scope_version": version or None, "scope_attributes": attributes,
            "scope_attribute_types": types,
            "scope_dropped_attributes_count": _uint32(scope, "droppedAttributesCount"),
            "scope_schema_url": schema_url or None}


def _decode(doc: Any, where: str, rows: _Rows, problems: list[str], unreadable: list[str]) -> bool:
    """Rows for a ``resourceLogs`` request; False when ``doc`` is not one. A bad part is named and skipped."""
    if not isinstance(doc, dict):
        unreadable.append(f"{where}: not an OTLP request object")
        return False
    if "resource_logs" in doc:  # the protobuf field names, as some exporters write them
        doc = camel_case(doc)
    resources = _get(doc, "resourceLogs")
    if resources is None:
        return False
    for r_index, resource_logs in enumerate(resources if isinstance(resources, list) else [resources]):
        part = f"{where}: resourceLogs[{r_index}]"
        try:
            resource_object = resource_logs.get("resource") or {}
            resource, types = _typed_attributes(resource_object.get("attributes"), "resource.attributes")
            url = resource_logs.get("schemaUrl")
            if not isinstance(url, (str, type(None))):
                raise ValueError("schemaUrl is not a string")
            common = {**_resource_columns(resource), "resource_attribute_types": types,
                      "resource_dropped_attributes_count": _uint32(resource_object, "droppedAttributesCount"),
                      "resource_schema_url": url or None}
            scopes = _get(resource_logs, "scopeLogs") or ()
            scopes = [(s_index, scope, scope.get("scope") or {}, _get(scope, "logRecords") or ())
                      for s_index, scope in enumerate(scopes)]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{part}: not an OTLP ResourceLogs object ({exc})")
            continue
        for s_index, scope_logs, scope, records in scopes:
            if not isinstance(records, list):
                problems.append(f"{part}.scopeLogs[{s_index}].logRecords is {type(records).__name__}, not a list")
                continue
            for index, record in enumerate(records):
                try:
                    row = _record_row(record)
                    row.update(_scope_columns(scope, scope_logs.get("schemaUrl")))
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    problems.append(f"{part}.scopeLogs[{s_index}].logRecords[{index}]: {exc}")
                    continue
                if not row["time_ns"]:
                    problems.append(f"{part}.scopeLogs[{s_index}].logRecords[{index}]: "
                                    "no timeUnixNano or observedTimeUnixNano")
                    continue
                for key, value in {**row, **common}.items():
                    rows.columns[key].append(value)
    return True


def _resource_columns(resource: list[tuple[str, str | None]]) -> dict[str, Any]:
    by_key = dict(resource)
    try:
        rank = int(by_key["nv.dl.rank"]) if by_key.get("nv.dl.rank") is not None else None
    except ValueError:
        rank = None
    return {"service_name": by_key.get("service.name"), "run_id": by_key.get("nemo.run.id"), "rank": rank,
            "resource_attributes": resource}


def read_log_dumps(files: Iterable[str | Path], *, contents: Iterable[bytes | None] | None = None,
                   max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> LogReadResult:
    """The logs table of the given dump files, with the number of log requests and each problem;
    ``contents``: each file's bytes when the caller read them already. A line or document longer
    than ``max_record_bytes`` once decompressed (``collect``'s bound on a request) is unreadable,
    never held whole."""
    files = [Path(f) for f in files]
    rows, problems, unreadable, requests = _Rows(), [], [], 0
    for path, data in zip(files, [None] * len(files) if contents is None else contents):
        for where, doc in _documents(path, unreadable, data, max_record_bytes):
            requests += _decode(doc, where, rows, problems, unreadable)
    return LogReadResult(rows.table(), requests, problems, unreadable)


def read_logs(source: str | Path | Iterable[str | Path]) -> pa.Table:
    """The logs table (``LOGS_SCHEMA``) of a dataset directory, log dump files, or directories of them.

    Empty (with the schema) when the source has no logs. A malformed record is left out and
    warned about (a ``UserWarning``), naming the file, line and field.
    """
    import warnings

    from nemo_telemetry.analysis.store.dataset import read_dataset
    from nemo_telemetry.analysis.store.sources import split_sources

    datasets, raw = split_sources(source)
    tables = [read_dataset(d, "logs", schema=LOGS_SCHEMA) for d in datasets]
    if raw:
        result = read_log_dumps(log_dump_files(raw))
        problems = result.problems + result.unreadable
        if problems:
            warnings.warn(f"{len(problems)} log record(s) left out: {'; '.join(problems[:3])}",
                          UserWarning, stacklevel=2)
        tables.append(result.table)
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return LOGS_SCHEMA.empty_table()
    return pa.concat_tables(tables).sort_by([("time_ns", "ascending")])


def dataset_log_files(dumps: Iterable[tuple[Path, bytes]],
                      max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> DatasetLogFiles:
    """The records of log dumps (each ``(path, its bytes)``, read once by the ingest for its
    spans and logs) as the dataset files to stage, one per input.

    Named by the input's content hash, so re-ingesting a file replaces its records instead of
    adding them twice; the writer stages them into the ingest's final commit, so a reader sees
    them with the spans or not at all. A line past ``max_record_bytes`` is not among the problems:
    the ingest's span reader, reading the same bytes with the same bound, counts it.
    """
    out, written, requests, problems = [], 0, 0, []
    for path, data in dumps:
        result = read_log_dumps([path], contents=[data], max_record_bytes=max_record_bytes)
        requests += result.requests
        problems += result.problems
        if not result.table.num_rows:
            continue
        out.append((f"logs/{hashlib.sha1(data).hexdigest()[:20]}.parquet", result.table))
        written += result.table.num_rows
    return DatasetLogFiles(tuple(out), written, requests, tuple(problems))


def request_logs(body: bytes, *, json_body: bool) -> tuple[pa.Table, tuple[str, ...]]:
    """The log records of one ``ExportLogsServiceRequest`` body (``collect``'s ``/v1/logs``;
    ``json_body``: OTLP/JSON, else protobuf), and each bad record left out (as in a dump).
    ValueError naming the fault when the body is no logs request at all."""
    rows, problems, unreadable = _Rows(), [], []
    if json_body:
        try:
            docs = [("request", orjson.loads(body))]
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    else:
        docs = list(_proto_document("request", body, unreadable)) if body else []
    for where, doc in docs:
        _decode(doc, where, rows, problems, unreadable)
    if unreadable:
        raise ValueError(unreadable[0].removeprefix("request: "))
    return rows.table(), tuple(problems)
