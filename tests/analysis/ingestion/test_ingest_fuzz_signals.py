"""The seeded mutation fuzzer of ``test_ingest_fuzz`` over log and metrics dumps.

The base dumps: several requests (records), each of two resources of two scopes of three log
records or three metrics (a gauge, a cumulative sum, a histogram; two data points each), every
record or point tagged uniquely. A case mutates one request (never the first) with the same
mutations as the span fuzzer (JSON: bit flips, truncation, type swaps, deep nesting, duplicate
fields, splices; protobuf: bit flips, truncation, huge lengths and varints, wrong wire types,
duplicate fields, times past int64) and reads it as ingest does (``dataset_log_files``,
``dataset_metric_points``: what ingest's summary counts). Then:

- nothing is raised;
- every record or point of every request the mutation did not touch is kept exactly;
- nothing is kept twice, no time is 0, negative or wrapped;
- when the mutated request yields fewer rows than it holds, a problem is counted and named.

Logs are read from OTLP/JSON only (the log reader takes no protobuf); metrics from both.
"""

from __future__ import annotations

import json
import random
import struct

import orjson
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from test_ingest_fuzz import _all_fields, _mutate_json, _read_varint, _serialize, _varint

from nemo_telemetry.analysis.ingestion.anyvalue import MAX_VALUE_DEPTH
from nemo_telemetry.analysis.ingestion.logs import dataset_log_files
from nemo_telemetry.analysis.ingestion.metrics import dataset_metric_points

RECORDS = 4
CASES = 500  # per signal and format
SEED = 20261204
TOP = 1 << 63
T0 = 1_767_225_600_000_000_000


def _kv(key: str, value: dict) -> dict:
    return {"key": key, "value": value}


def _resource(res: int) -> dict:
    return {"attributes": [_kv("service.name", {"stringValue": f"svc-{res}"}),
                           _kv("nemo.run.id", {"stringValue": "fuzz-run"}), _kv("nv.dl.rank", {"intValue": str(res)})]}


def _attrs(tag: str) -> list[dict]:
    return [_kv("tag", {"stringValue": tag}), _kv("n", {"intValue": "7"}), _kv("ok", {"boolValue": True}),
            _kv("ratio", {"doubleValue": 0.5}), _kv("list", {"arrayValue": {"values": [{"stringValue": "a"}]}})]


def _log_requests() -> list[dict]:
    requests = []
    for r in range(RECORDS):
        resources = []
        for res in range(2):
            scopes = []
            for sc in range(2):
                records = [{
                    "timeUnixNano": str(T0 + r * 10**9 + ((res * 2 + sc) * 3 + k) * 10**6),
                    "observedTimeUnixNano": str(T0 + r * 10**9 + 5),
                    "severityNumber": 9 + 4 * (k % 2), "severityText": ["INFO", "WARN", "INFO"][k],
                    "body": {"stringValue": f"log r{r}.{res}.{sc}.{k}"},
                    "attributes": _attrs(f"r{r}.{res}.{sc}.{k}"),
                    "traceId": f"{r + 1:02x}" + "5e" * 15, "spanId": f"{r + 1:02x}{k:02x}" + "c3" * 6,
                } for k in range(3)]
                scopes.append({"scope": {"name": f"nemo.{sc}"}, "logRecords": records})
            resources.append({"resource": _resource(res), "scopeLogs": scopes})
        requests.append({"resourceLogs": resources})
    return requests


def _metric_requests() -> list[dict]:
    requests = []
    for r in range(RECORDS):
        resources = []
        for res in range(2):
            scopes = []
            for sc in range(2):
                def points(k: int, **value) -> list[dict]:
                    return [{"startTimeUnixNano": str(T0), "timeUnixNano": str(T0 + r * 10**9 + p * 10**6 + k),
                             "attributes": _attrs(f"r{r}.{res}.{sc}.{k}.{p}"), **value} for p in range(2)]
                metrics = [
                    {"name": "rl.gauge", "unit": "s", "gauge": {"dataPoints": points(0, asDouble=1.5)}},
                    {"name": "rl.sum", "sum": {"dataPoints": points(1, asInt="12"), "aggregationTemporality": 2,
                                               "isMonotonic": True}},
                    {"name": "rl.hist", "histogram": {"dataPoints": points(2, count="3", sum=4.5,
                                                                           bucketCounts=["1", "2"],
                                                                           explicitBounds=[1.0]),
                                                      "aggregationTemporality": 1}},
                ]
                scopes.append({"scope": {"name": f"nemo.{sc}"}, "metrics": metrics})
            resources.append({"resource": _resource(res), "scopeMetrics": scopes})
        requests.append({"resourceMetrics": resources})
    return requests


LOGS = _log_requests()
METRICS = _metric_requests()


def _to_proto(request: dict) -> bytes:
    return ParseDict(request, ExportMetricsServiceRequest()).SerializeToString()


# ------------------------------------------------------------ protobuf mutations of metrics

# the message-typed fields of an ExportMetricsServiceRequest, by (message, field number)
_MESSAGES = {
    ("request", 1): "resource_metrics", ("resource_metrics", 1): "resource", ("resource_metrics", 2): "scope_metrics",
    ("resource", 1): "key_value", ("scope_metrics", 1): "scope", ("scope_metrics", 2): "metric",
    ("metric", 5): "gauge", ("metric", 7): "sum", ("metric", 9): "histogram",
    ("gauge", 1): "number_point", ("sum", 1): "number_point", ("histogram", 1): "histogram_point",
    ("number_point", 7): "key_value", ("histogram_point", 9): "key_value", ("key_value", 2): "any_value",
    ("any_value", 5): "array_value", ("array_value", 1): "any_value",
}
# fixed64 times and counts of the points: (message, field)
_FIXED_TIMES = {("number_point", 2), ("number_point", 3), ("histogram_point", 2), ("histogram_point", 3),
                ("histogram_point", 4)}


def _parse(data: bytes, message: str) -> list:
    """A valid message as [field, wire, value, message name]; sub-messages parsed in turn."""
    fields, pos = [], 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(data, pos)
        elif wire == 1:
            value, pos = data[pos: pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos: pos + 4], pos + 4
        else:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos: pos + length], pos + length
            if (message, field) in _MESSAGES:
                value = _parse(value, _MESSAGES[(message, field)])
        fields.append([field, wire, value])
        fields[-1].append(message)
    return fields


def _strip(fields: list) -> list:
    """The tree without the message names, as ``_serialize`` takes it (a length kept)."""
    return [[f, w, _strip(v) if isinstance(v, list) else v, *rest[1:]] for f, w, v, *rest in fields]


def _nested_any_value(depth: int) -> bytes:
    value = b"\x0a\x04deep"
    for _ in range(depth):
        values = b"\x0a" + _varint(len(value)) + value
        value = b"\x2a" + _varint(len(values)) + values
    return value


def _mutate_proto(record: bytes, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice(["bit flips", "truncation", "huge length", "huge varint", "wrong wire type", "deep nesting",
                       "duplicate field", "fixed64 past int64", "fixed64 past int64"])
    if kind == "bit flips":
        data = bytearray(record)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return kind, bytes(data)
    if kind == "truncation":
        return kind, record[: rng.randrange(len(record))]
    tree = _parse(record, "request")
    entries = list(_all_fields(tree))
    path, owner, i = rng.choice(entries)
    entry = owner[i]
    if kind == "huge length":
        path, owner, i = rng.choice([(p, o, j) for p, o, j in entries if o[j][1] == 2])
        owner[i] = owner[i][:4] + [rng.choice([2**31, 2**32 + 3, 2**63, 2**64 - 1])]
    elif kind == "huge varint":
        varints = [(p, o, j) for p, o, j in entries if o[j][1] == 0]
        if varints:
            path, owner, i = rng.choice(varints)
            owner[i][2] = rng.choice([2**63, 2**64 - 1, 2**32])
    elif kind == "wrong wire type":
        entry[1] = rng.choice([w for w in range(8) if w != entry[1]])
        if entry[1] in (1, 5) and not isinstance(entry[2], bytes):
            entry[2] = b"\x00" * (8 if entry[1] == 1 else 4)
        elif entry[1] == 0 and not isinstance(entry[2], int):
            entry[2] = 1
        elif entry[1] in (2, 3, 4, 6, 7) and isinstance(entry[2], int):
            entry[2] = b"\x01"
    elif kind == "deep nesting":
        depth = rng.choice([MAX_VALUE_DEPTH, MAX_VALUE_DEPTH + 1, 48, 3000])
        values = [(p, o, j) for p, o, j in entries if o[j][3] == "key_value" and o[j][0] == 2]
        path, owner, i = rng.choice(values)
        owner[i][2] = _nested_any_value(depth)
        kind = f"{kind} {depth}"
    elif kind == "duplicate field":
        owner.insert(i + rng.choice([0, 1]), [*entry])
    else:
        fixed = [(p, o, j) for p, o, j in entries if o[j][1] == 1 and (o[j][3], o[j][0]) in _FIXED_TIMES]
        path, owner, i = rng.choice(fixed)
        owner[i][2] = struct.pack("<Q", rng.choice([2**63, 2**64 - 1, 2**63 + 7]))
    return f"{kind} at {path}", _serialize(_strip(tree))


# ------------------------------------------------------------ reading as ingest does


def _read_logs(path, data: bytes):
    files = dataset_log_files([(path, data)])
    rows = [row for _, table in files.files for row in table.to_pylist()]
    return rows, files.problems


def _read_metrics(path, data: bytes):
    points = dataset_metric_points(path, data)
    return (points.file[1].to_pylist() if points.file else []), points.problems


def _log_key(row: dict):
    return row["body"]


def _metric_key(row: dict):
    return dict(row["attributes"] or ()).get("tag")


def _by_key(rows: list, key) -> dict:
    out: dict = {}
    for row in rows:
        out.setdefault(key(row), []).append(row)
    return out


def _json_lines(records: list[bytes]) -> bytes:
    return b"".join(r + b"\n" for r in records)


def _frames(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


CASES_BY_NAME = {
    "logs-json": (LOGS, orjson.dumps, _json_lines, _mutate_json, _read_logs, _log_key, 12),
    "metrics-json": (METRICS, orjson.dumps, _json_lines, _mutate_json, _read_metrics, _metric_key, 24),
    "metrics-proto": (METRICS, _to_proto, _frames, _mutate_proto, _read_metrics, _metric_key, 24),
}


@pytest.mark.parametrize("name", list(CASES_BY_NAME))
def test_a_mutated_log_or_metrics_request_costs_only_itself(name, tmp_path):
    requests, encode, dump, mutate, read, key, per_request = CASES_BY_NAME[name]
    records = [encode(r) for r in requests]
    path = tmp_path / f"{name.split('-')[0]}-case.bin"
    base_rows, problems = read(path, dump(records))
    assert not problems and len(base_rows) == RECORDS * per_request
    baseline = _by_key(base_rows, key)
    assert all(len(rows) == 1 for rows in baseline.values())
    owners = [{key(row) for row in read(path, dump([record]))[0]} for record in records]
    rng = random.Random(f"{SEED}-{name}")
    for case in range(CASES):
        seed = rng.randrange(2**32)
        case_rng = random.Random(seed)
        target = case_rng.randrange(1, RECORDS)
        how, mutated = mutate(records[target], case_rng)
        where = f"{name} case {case} (seed {seed}): request {target + 1}, {how}"
        try:
            rows, problems = read(path, dump(records[:target] + [mutated] + records[target + 1:]))
        except Exception as exc:  # the finding: named with its case
            raise AssertionError(f"{where}: raised {type(exc).__name__}: {exc}") from exc
        found = _by_key(rows, key)
        untouched = set().union(*(owners[r] for r in range(RECORDS) if r != target))
        for tag in untouched:
            assert found.get(tag) == baseline[tag], f"{where}: untouched {tag!r} not kept exactly"
        for row in rows:
            assert 0 < row["time_ns"] < TOP, f"{where}: a time that is 0, negative or wrapped"
        from_mutated = [row for row in rows if key(row) not in untouched]
        held = _held(mutated, name)
        assert len(from_mutated) <= held, f"{where}: more rows than the request holds"
        if len(from_mutated) < held:
            assert problems, f"{where}: rows lost without a problem counted"
        assert all(":" in p and str(path) in p for p in problems), f"{where}: a problem that names no place"


def _held(record: bytes, name: str) -> int:
    """How many log records or data points a mutated request holds (objects in the lists where
    they belong). 0 for a record that is no request at all: the ingest's span reader, reading the
    same bytes, counts that one (tested by the span fuzzer), so the signal reader leaves it."""
    if name.endswith("proto"):
        try:
            request = ExportMetricsServiceRequest.FromString(record)
        except Exception:  # DecodeError, RecursionError
            return 0
        return sum(len(getattr(m, m.WhichOneof("data")).data_points) for rm in request.resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics if m.WhichOneof("data"))
    try:  # each reader's own JSON parser (the metrics reader's takes integers past 64 bits)
        doc = orjson.loads(record) if name.startswith("logs") else json.loads(record.decode("utf-8"))
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return 0
    if name.startswith("logs"):
        path = ("resourceLogs", "scopeLogs", "logRecords")
    else:
        path = ("resourceMetrics", "scopeMetrics", "metrics")
    level = [doc]
    for key in path:
        level = [item for node in level if isinstance(node, dict) and isinstance(node.get(key), list)
                 for item in node[key]]
    if name.startswith("logs"):
        return len(level)
    kinds = ("gauge", "sum", "histogram")
    return sum(len(m[k]["dataPoints"]) for m in level if isinstance(m, dict) for k in kinds
               if isinstance(m.get(k), dict) and isinstance(m[k].get("dataPoints"), list))
