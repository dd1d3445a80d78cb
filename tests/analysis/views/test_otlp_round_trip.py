"""OTLP -> dataset -> OTLP loses nothing: requests shaped as outside writers write them (every
field set, every AnyValue type, empty values, several resources and scopes, links and events) are
ingested (as OTLP/JSON lines and as length-prefixed protobuf; compiled decoders on and off) into a
dataset, re-encoded by ``to_otlp_traces`` and compared with the input field by field.

Only what OTLP/JSON lets a writer spell either way is normalised before comparing: int64 as a
string or a number, ids as hex or base64, enums as names or numbers, a field at its default
written or left out (0, "", [], {}), and the order of a span's attributes (a map in OTLP). Spans
are compared per (resource, scope), sorted by id: a dataset is partitioned by run, so the order
of spans across resources is the dataset's.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import struct
from pathlib import Path

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from nemo_telemetry.analysis import ingest, load_traces, read_events, read_links, read_spans, to_otlp_traces

T1, T2 = "5b8efff798038103d269b633813fc60c", "0af7651916cd43dd8448eb211c80319c"


def _kv(key, value):
    return {"key": key, "value": value}


# Every AnyValue type, spelled as writers spell them (int64 as numbers and as strings, doubles
# that are whole, non-finite doubles by name, bytes as base64), nested, and empty.
EVERY_VALUE = [
    _kv("s", {"stringValue": "text"}),
    _kv("s.empty", {"stringValue": ""}),
    _kv("s.digits", {"stringValue": "42"}),
    _kv("s.json", {"stringValue": "[1,2]"}),
    _kv("i.number", {"intValue": 7}),
    _kv("i.string", {"intValue": "-9223372036854775808"}),
    _kv("i.max", {"intValue": "9223372036854775807"}),
    _kv("d.whole", {"doubleValue": 2.0}),
    _kv("d.small", {"doubleValue": -1.5e-300}),
    _kv("d.nan", {"doubleValue": "NaN"}),
    _kv("d.inf", {"doubleValue": "-Infinity"}),
    _kv("b.true", {"boolValue": True}),
    _kv("b.false", {"boolValue": False}),
    _kv("bytes", {"bytesValue": base64.b64encode(b"\x00\xffab").decode()}),
    _kv("bytes.empty", {"bytesValue": ""}),
    _kv("empty", {}),
    _kv("a", {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "1"}, {"doubleValue": 1.0},
                                        {"boolValue": True}, {}]}}),
    _kv("a.empty", {"arrayValue": {}}),
    _kv("a.nested", {"arrayValue": {"values": [{"arrayValue": {"values": [{"intValue": 3}]}},
                                               {"kvlistValue": {"values": [_kv("k", {"stringValue": "v"})]}}]}}),
    _kv("a.bytes", {"arrayValue": {"values": [{"bytesValue": "AQI="}, {"stringValue": "0102"}]}}),
    _kv("kv", {"kvlistValue": {"values": [_kv("x", {"doubleValue": 0.5}), _kv("y", {"arrayValue": {}}),
                                          _kv("z", {"kvlistValue": {}})]}}),
    _kv("kv.empty", {"kvlistValue": {}}),
    _kv("kv.bytes", {"kvlistValue": {"values": [_kv("raw", {"bytesValue": "/w=="})]}}),
]


def _span(trace, span, name, parent="", **fields):
    out = {"traceId": trace, "spanId": span, "name": name, "startTimeUnixNano": "1700000000000000000",
           "endTimeUnixNano": 1700000001000000000}
    if parent:
        out["parentSpanId"] = parent
    out.update(fields)
    return out


def _corpus() -> list[dict]:
    """Two requests as a Collector and an SDK would send them."""
    full = _span(
        T1, "eee19b7ec3c1b174", "rl.grpo.step", kind="SPAN_KIND_SERVER", traceState="vendor=a,other=b",
        flags=769, droppedAttributesCount=2, droppedEventsCount=3, droppedLinksCount=4,
        attributes=[*EVERY_VALUE, _kv("rl.iteration", {"intValue": "3"}), _kv("rl.bucket", {"stringValue": "productive"}),
                    _kv("rl.span_group", {"stringValue": "per_step"}),
                    _kv("rl.efficiency.category", {"stringValue": "idle/wait"})],
        status={"code": "STATUS_CODE_ERROR", "message": "boom"},
        events=[{"timeUnixNano": "1700000000500000000", "name": "exception", "droppedAttributesCount": 1,
                 "attributes": [_kv("exception.type", {"stringValue": "ValueError"}), _kv("n", {"intValue": 1})]},
                {"name": "no time, no attributes"}],
        links=[{"traceId": T2, "spanId": "00f067aa0ba902b7", "traceState": "k=v", "flags": 1,
                "droppedAttributesCount": 5, "attributes": [_kv("link.kind", {"stringValue": "follows"}),
                                                            _kv("w", {"doubleValue": 0.25})]},
               {"traceId": T1.upper(), "spanId": "AAAAAAAAAAE="}],  # hex in capitals, base64
    )
    typed_promotions = _span(
        T1, "0000000000000002", "rollout", parent="eee19b7ec3c1b174", kind=3,
        attributes=[_kv("rl.iteration", {"stringValue": "5"}), _kv("rl.bucket", {"intValue": 4}),
                    _kv("rl.efficiency.category", {"boolValue": False})],
        status={"code": 1})
    plain = _span(T1, "0000000000000003", "", parent="0000000000000002", kind=5, status={})
    first = {"resourceSpans": [
        {"resource": {"attributes": [_kv("service.name", {"stringValue": "trainer"}),
                                     _kv("nemo.run.id", {"stringValue": "run-1"}), _kv("nv.dl.rank", {"intValue": "0"}),
                                     _kv("nemo.telemetry.span_groups", {"stringValue": "per_step,job"}),
                                     _kv("nemo.telemetry.namespace", {"stringValue": "nemo_rl"}),
                                     _kv("process.command_args", {"arrayValue": {"values": [{"stringValue": "python"}]}}),
                                     _kv("host.cpus", {"intValue": 8})],
                      "droppedAttributesCount": 1},
         "schemaUrl": "https://opentelemetry.io/schemas/1.24.0",
         "scopeSpans": [
             {"scope": {"name": "nemo_telemetry", "version": "1.2.3", "droppedAttributesCount": 2,
                        "attributes": [_kv("scope.flag", {"boolValue": True}), _kv("scope.s", {"stringValue": "x"})]},
              "schemaUrl": "https://opentelemetry.io/schemas/1.21.0", "spans": [full, typed_promotions]},
             {"scope": {}, "spans": [plain]},
         ]},
        {"resource": {"attributes": [_kv("service.name", {"stringValue": "worker"}),
                                     _kv("nemo.run.id", {"stringValue": "run-1"}),
                                     _kv("nv.dl.rank", {"stringValue": "2"})]},
         "scopeSpans": [{"scope": {"name": "vllm"},
                         "spans": [_span(T2, "00f067aa0ba902b7", "generate", parent="eee19b7ec3c1b174",
                                         kind="SPAN_KIND_CLIENT", flags=256,
                                         attributes=[_kv("tokens", {"intValue": 128})])]}]},
    ]}
    second = {"resourceSpans": [
        {"resource": {},
         "scopeSpans": [{"scope": {"name": "bare", "version": ""},
                         "spans": [_span(T2, "1111111111111111", "lonely", kind=0, droppedAttributesCount=0)]}]},
    ]}
    return [first, second]


# -- the normal form -------------------------------------------------------------------------


def _id(text: str | None, width: int) -> str | None:
    if not text:
        return None
    return text.lower() if len(text) == 2 * width else base64.b64decode(text).hex()


def _value(value: dict | None):
    if not value:
        return ("empty",)
    (kind, inner), = value.items()
    if kind == "stringValue":
        return ("s", inner)
    if kind == "intValue":
        return ("i", int(inner))
    if kind == "doubleValue":
        number = float(inner)
        return ("d", "nan" if math.isnan(number) else number)
    if kind == "boolValue":
        return ("b", inner)
    if kind == "bytesValue":
        return ("bytes", base64.b64decode(inner))
    if kind == "arrayValue":
        return ("a", tuple(_value(v) for v in (inner or {}).get("values", ())))
    assert kind == "kvlistValue", kind
    return ("kv", tuple((kv["key"], _value(kv.get("value"))) for kv in (inner or {}).get("values", ())))


def _attributes(kvs) -> tuple:
    return tuple(sorted(((kv["key"], _value(kv.get("value"))) for kv in kvs or ()), key=repr))


_KINDS = ["SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT",
          "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER"]
_CODES = ["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"]


def _enum(value, names) -> int:
    return names.index(value) if isinstance(value, str) else int(value or 0)


def _span_form(span: dict) -> dict:
    status = span.get("status") or {}
    return {
        "traceId": _id(span["traceId"], 16), "spanId": _id(span["spanId"], 8),
        "parentSpanId": _id(span.get("parentSpanId"), 8), "traceState": span.get("traceState") or None,
        "name": span.get("name") or "", "kind": _enum(span.get("kind"), _KINDS),
        "start": int(span["startTimeUnixNano"]), "end": int(span["endTimeUnixNano"]),
        "flags": int(span.get("flags") or 0), "attributes": _attributes(span.get("attributes")),
        "droppedAttributesCount": int(span.get("droppedAttributesCount") or 0),
        "droppedEventsCount": int(span.get("droppedEventsCount") or 0),
        "droppedLinksCount": int(span.get("droppedLinksCount") or 0),
        "status": (_enum(status.get("code"), _CODES), status.get("message") or None),
        "events": [(int(e.get("timeUnixNano") or 0), e.get("name") or "", _attributes(e.get("attributes")),
                    int(e.get("droppedAttributesCount") or 0)) for e in span.get("events") or ()],
        "links": [(_id(link["traceId"], 16), _id(link["spanId"], 8), link.get("traceState") or None,
                   _attributes(link.get("attributes")), int(link.get("droppedAttributesCount") or 0),
                   int(link.get("flags") or 0)) for link in span.get("links") or ()],
    }


def _normal(requests: list[dict]) -> list:
    """(resource, its schema URL, scope, its schema URL) -> spans sorted by id, over all requests."""
    groups: dict = {}
    for request in requests:
        for rs in request.get("resourceSpans") or ():
            resource = rs.get("resource") or {}
            rkey = (_attributes(resource.get("attributes")), int(resource.get("droppedAttributesCount") or 0),
                    rs.get("schemaUrl") or None)
            for ss in rs.get("scopeSpans") or ():
                scope = ss.get("scope") or {}
                skey = (scope.get("name") or None, scope.get("version") or None, _attributes(scope.get("attributes")),
                        int(scope.get("droppedAttributesCount") or 0), ss.get("schemaUrl") or None)
                groups.setdefault(repr((rkey, skey)), []).extend(_span_form(s) for s in ss.get("spans") or ())
    return sorted((key, sorted(spans, key=lambda s: (s["traceId"], s["spanId"]))) for key, spans in groups.items())


# -- the inputs --------------------------------------------------------------------------------


def _b64_ids(obj):
    """OTLP/JSON (hex ids) as protobuf's JSON mapping reads it (bytes as base64)."""
    if isinstance(obj, dict):
        return {k: (base64.b64encode(bytes.fromhex(_id(v, 16 if k == "traceId" else 8))).decode()
                    if k in ("traceId", "spanId", "parentSpanId") and v else _b64_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_b64_ids(v) for v in obj]
    return obj


def _write(tmp_path: Path, form: str, corpus: list[dict]) -> list[Path]:
    paths = []
    for i, request in enumerate(corpus):
        if form == "json":
            path = tmp_path / f"traces-{i}.jsonl"
            path.write_text(json.dumps(request) + "\n")
        else:
            payload = ParseDict(_b64_ids(request), ExportTraceServiceRequest()).SerializeToString()
            path = tmp_path / f"traces-{i}.pb"
            path.write_bytes(struct.pack(">I", len(payload)) + payload)
        paths.append(path)
    return paths


@pytest.fixture(params=["0", "1"], ids=["reference", "compiled"])
def decoders(request, monkeypatch):
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", request.param)
    return request.param


@pytest.mark.parametrize("form", ["json", "protobuf"])
def test_each_file_comes_back_field_by_field_from_a_dataset(tmp_path, form, decoders):
    corpus = _corpus()
    for i, path in enumerate(_write(tmp_path, form, corpus)):
        dataset = tmp_path / f"dataset-{i}"
        ingest([path], out=dataset)
        back = to_otlp_traces(read_spans(dataset), read_events(dataset), read_links(dataset))
        json.dumps(back)  # a JSON document as it stands
        assert _normal([back]) == _normal([corpus[i]])


def test_the_whole_corpus_comes_back_in_memory_and_through_its_own_output(tmp_path):
    """load_traces (no dataset) gives the same; the output is OTLP/JSON ingest reads again to the
    same tables."""
    corpus = _corpus()
    tables = load_traces(_write(tmp_path, "json", corpus))
    back = to_otlp_traces(tables.spans, tables.events, tables.links)
    assert _normal([back]) == _normal(corpus)
    again = tmp_path / "again.jsonl"
    again.write_text(json.dumps(back) + "\n")
    reread = load_traces([again])
    assert reread.spans.sort_by("span_id").equals(tables.spans.sort_by("span_id"))
    assert _normal([to_otlp_traces(reread.spans, reread.events, reread.links)]) == _normal(corpus)


def test_values_keep_their_type(tmp_path):
    """An int, a double, a bool and a string of the same text are told apart in the dataset."""
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [_span(T1, "0000000000000009", "typed", attributes=[
        _kv("as.int", {"intValue": 1}), _kv("as.string", {"stringValue": "1"}), _kv("as.double", {"doubleValue": 1.0}),
        _kv("as.bool", {"boolValue": True}), _kv("as.text", {"stringValue": "true"})])]}]}]}
    tables = load_traces(_write(tmp_path, "json", [request]))
    row = tables.spans.to_pylist()[0]
    assert dict(row["attributes"]) == {"as.int": "1", "as.string": "1", "as.double": "1.0", "as.bool": "true",
                                       "as.text": "true"}
    assert dict(row["attribute_types"]) == {"as.int": "int", "as.double": "double", "as.bool": "bool"}


def test_spans_files_without_the_otlp_columns_are_refused_with_the_fix(tmp_path):
    """Spans files without format 3's OTLP columns (an older layout, no commit record) are not
    read as if the fields had been empty: the dataset is refused, naming the columns it lacks and
    the fix (ingest again), so no export quietly drops what the dumps held."""
    import pyarrow.parquet as pq

    from nemo_telemetry.analysis.model.schema import OTLP_SPAN_COLUMNS
    from nemo_telemetry.analysis.store import dataset
    from nemo_telemetry.errors import DatasetFormatError

    spans = load_traces(_write(tmp_path, "json", copy.deepcopy(_corpus()[:1]))).spans
    root = tmp_path / "older"
    folder = root / "spans" / "run_id=run-1"
    folder.mkdir(parents=True)
    pq.write_table(dataset.with_parent_rows(spans).drop_columns(list(OTLP_SPAN_COLUMNS)), folder / "part-0.parquet")
    with pytest.raises(DatasetFormatError, match=r"has no flags, dropped_attributes_count.*re-run nemo-telemetry ingest"):
        read_spans(root)


# -- logs and metrics -------------------------------------------------------------------------


def _logs_corpus() -> dict:
    resource = {"attributes": [_kv("service.name", {"stringValue": "trainer"}), _kv("nv.dl.rank", {"intValue": 1}),
                               _kv("pid", {"intValue": "77"})], "droppedAttributesCount": 2}
    return {"resourceLogs": [{"resource": resource, "schemaUrl": "https://opentelemetry.io/schemas/1.24.0",
                              "scopeLogs": [
        {"scope": {"name": "app", "version": "2.0", "attributes": [_kv("s.b", {"boolValue": True})],
                   "droppedAttributesCount": 1}, "schemaUrl": "https://s",
         "logRecords": [
             {"timeUnixNano": "1700000000000000001", "observedTimeUnixNano": 1700000000000000002,
              "severityNumber": "SEVERITY_NUMBER_WARN2", "severityText": "warning",
              "body": {"kvlistValue": {"values": [_kv("msg", {"stringValue": "hi"}), _kv("n", {"intValue": 3})]}},
              "attributes": EVERY_VALUE, "droppedAttributesCount": 4, "flags": 1, "traceId": T1,
              "spanId": "eee19b7ec3c1b174", "eventName": "rl.step.done"},
             {"observedTimeUnixNano": "1700000000000000005", "severityNumber": 9, "body": {"intValue": "12"}},
             {"timeUnixNano": "1700000000000000006", "body": {"bytesValue": "AQID"}},
             {"timeUnixNano": "1700000000000000007", "body": {"stringValue": ""}},
             {"timeUnixNano": "1700000000000000008"},
         ]},
        {"scope": {}, "logRecords": [{"timeUnixNano": "1700000000000000009", "body": {"stringValue": "plain"}}]},
    ]}]}


def _exemplar(value, trace=T1, span="eee19b7ec3c1b174"):
    return {"timeUnixNano": "1700000000000000003", **value, "traceId": trace, "spanId": span,
            "filteredAttributes": [_kv("user", {"stringValue": "u"}), _kv("n", {"intValue": 2})]}


def _metrics_corpus() -> dict:
    number = {"attributes": [_kv("rl.efficiency.category", {"stringValue": "idle"}), _kv("i", {"intValue": 5})],
              "startTimeUnixNano": "1700000000000000000", "timeUnixNano": "1700000001000000000"}
    return {"resourceMetrics": [{"resource": {"attributes": [_kv("service.name", {"stringValue": "trainer"}),
                                                            _kv("nemo.run.id", {"stringValue": "run-1"})],
                                              "droppedAttributesCount": 3},
                                 "schemaUrl": "https://r", "scopeMetrics": [
        {"scope": {"name": "nemo_telemetry", "version": "1.0", "attributes": [_kv("x", {"doubleValue": 1.5})]},
         "schemaUrl": "https://s", "metrics": [
             {"name": "g", "description": "a gauge", "unit": "s",
              "gauge": {"dataPoints": [{**number, "asDouble": 0.25, "flags": 1,
                                        "exemplars": [_exemplar({"asDouble": 0.5})]},
                                       {**number, "asInt": "9007199254740993"}]}},
             {"name": "c", "unit": "1", "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [
                 {**number, "asInt": 4, "exemplars": [_exemplar({"asInt": "7"})]}]}},
             {"name": "d", "sum": {"aggregationTemporality": "AGGREGATION_TEMPORALITY_DELTA", "dataPoints": [
                 {**number, "asDouble": -2.5}]}},
             {"name": "h", "description": "latency", "histogram": {"aggregationTemporality": 1, "dataPoints": [
                 {**number, "count": "6", "sum": 10.5, "bucketCounts": ["1", 2, "3"], "explicitBounds": [0.5, 1.0],
                  "min": 0.1, "max": 4.0, "exemplars": [_exemplar({"asDouble": 0.7})]},
                 {**number, "count": 0}]}},
             {"name": "e", "exponentialHistogram": {"aggregationTemporality": 2, "dataPoints": [
                 {**number, "count": "5", "sum": 3.5, "scale": -2, "zeroCount": "1", "zeroThreshold": 0.001,
                  "positive": {"offset": -3, "bucketCounts": ["2", "1"]}, "negative": {"offset": 1, "bucketCounts": [1]},
                  "min": -1.0, "max": 2.0}]}},
             {"name": "q", "summary": {"dataPoints": [
                 {**number, "count": 3, "sum": 6.0, "quantileValues": [{"quantile": 0.0, "value": 1.0},
                                                                       {"quantile": 0.5, "value": 2.0},
                                                                       {"quantile": 1.0, "value": 3.0}]}]}},
         ]},
    ]}]}


def _owned(request: dict, signal: str, items: str):
    """Each item of an OTLP ``request`` (``signal``: Logs or Metrics; ``items``: their list's key)
    with its resource group, resource, scope group and scope."""
    for group in request.get(f"resource{signal}") or ():
        resource = group.get("resource") or {}
        for scoped in group.get(f"scope{signal}") or ():
            scope = scoped.get("scope") or {}
            for item in scoped.get(items) or ():
                yield group, resource, scoped, scope, item


def _log_form(request: dict) -> list:
    out = []
    for rl, resource, sl, scope, r in _owned(request, "Logs", "logRecords"):
        severity = r.get("severityNumber") or 0
        if isinstance(severity, str):  # SEVERITY_NUMBER_WARN2 -> 14
            base = {"TRACE": 1, "DEBUG": 5, "INFO": 9, "WARN": 13, "ERROR": 17, "FATAL": 21}
            name = severity.removeprefix("SEVERITY_NUMBER_")
            letters = name.rstrip("0123456789")
            severity = base[letters] + int(name[len(letters):] or 1) - 1
        out.append((
            _attributes(resource.get("attributes")), int(resource.get("droppedAttributesCount") or 0),
            rl.get("schemaUrl") or None, scope.get("name") or None, scope.get("version") or None,
            _attributes(scope.get("attributes")), int(scope.get("droppedAttributesCount") or 0),
            sl.get("schemaUrl") or None, int(r.get("timeUnixNano") or 0), int(r.get("observedTimeUnixNano") or 0),
            severity, r.get("severityText") or None, _value(r.get("body")) if "body" in r else None,
            _attributes(r.get("attributes")), int(r.get("droppedAttributesCount") or 0), int(r.get("flags") or 0),
            _id(r.get("traceId"), 16), _id(r.get("spanId"), 8), r.get("eventName") or None))
    return sorted(out, key=repr)


def _num(value) -> float:
    return float(value)


def _metric_point(point: dict) -> tuple:
    value = ("i", int(point["asInt"])) if "asInt" in point else ("d", _num(point["asDouble"])) if "asDouble" in point else None
    exemplars = tuple((int(e.get("timeUnixNano") or 0), ("i", int(e["asInt"])) if "asInt" in e else ("d", _num(e["asDouble"])),
                       _id(e.get("traceId"), 16), _id(e.get("spanId"), 8), _attributes(e.get("filteredAttributes")))
                      for e in point.get("exemplars") or ())
    buckets = {side: (int((point.get(side) or {}).get("offset") or 0),
                      tuple(int(c) for c in (point.get(side) or {}).get("bucketCounts") or ())) for side in ("positive", "negative")}
    return (_attributes(point.get("attributes")), int(point.get("startTimeUnixNano") or 0), int(point["timeUnixNano"]),
            value, int(point.get("count") or 0), _num(point["sum"]) if "sum" in point else None,
            tuple(int(c) for c in point.get("bucketCounts") or ()), tuple(_num(b) for b in point.get("explicitBounds") or ()),
            point.get("min"), point.get("max"), int(point.get("scale") or 0), int(point.get("zeroCount") or 0),
            _num(point.get("zeroThreshold") or 0), buckets["positive"], buckets["negative"],
            tuple((_num(q.get("quantile") or 0), _num(q.get("value") or 0)) for q in point.get("quantileValues") or ()),
            exemplars, int(point.get("flags") or 0))


_TEMPORALITY = ["AGGREGATION_TEMPORALITY_UNSPECIFIED", "AGGREGATION_TEMPORALITY_DELTA", "AGGREGATION_TEMPORALITY_CUMULATIVE"]


def _metric_form(request: dict) -> list:
    out = []
    for rm, resource, sm, scope, m in _owned(request, "Metrics", "metrics"):
        kind = next(k for k in ("gauge", "sum", "histogram", "exponentialHistogram", "summary") if k in m)
        data = m[kind]
        out.append((
            _attributes(resource.get("attributes")), int(resource.get("droppedAttributesCount") or 0),
            rm.get("schemaUrl") or None, scope.get("name") or None, scope.get("version") or None,
            _attributes(scope.get("attributes")), sm.get("schemaUrl") or None, m["name"],
            m.get("description") or None, m.get("unit") or None, kind,
            _enum(data.get("aggregationTemporality"), _TEMPORALITY), bool(data.get("isMonotonic")),
            tuple(_metric_point(p) for p in data["dataPoints"])))
    return sorted(out, key=repr)


def test_logs_come_back_field_by_field(tmp_path):
    from nemo_telemetry.analysis import read_logs
    from nemo_telemetry.analysis import to_otlp_logs

    corpus = _logs_corpus()
    path = tmp_path / "logs-0.jsonl"
    path.write_text(json.dumps(corpus) + "\n")
    for source in (path, ingest([path], out=tmp_path / "dataset") and tmp_path / "dataset"):
        back = to_otlp_logs(read_logs(source))
        json.dumps(back)
        assert _log_form(back) == _log_form(corpus)


@pytest.mark.parametrize("form", ["json", "protobuf"])
def test_metrics_come_back_field_by_field(tmp_path, form):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from nemo_telemetry.analysis import read_metrics
    from nemo_telemetry.analysis import to_otlp_metrics

    corpus = _metrics_corpus()
    if form == "json":
        path = tmp_path / "metrics-0.jsonl"
        path.write_text(json.dumps(corpus) + "\n")
    else:
        payload = ParseDict(_b64_ids(corpus), ExportMetricsServiceRequest()).SerializeToString()
        path = tmp_path / "metrics-0.pb"
        path.write_bytes(struct.pack(">I", len(payload)) + payload)
    back = to_otlp_metrics(read_metrics(path))
    json.dumps(back)
    assert _metric_form(back) == _metric_form(corpus)


@pytest.mark.parametrize("bad", [-1, 2**32, "x", 1.5])
def test_a_span_with_bad_flags_or_counts_is_rejected_alone_by_both_decoders(tmp_path, decoders, bad):
    """A flags or dropped count that is no uint32 rejects its span, named; its neighbour is kept."""
    for field in ("flags", "droppedLinksCount"):
        request = {"resourceSpans": [{"scopeSpans": [{"spans": [
            _span(T1, "0000000000000001", "bad", **{field: bad}), _span(T1, "0000000000000002", "good", flags=1)]}]}]}
        path = tmp_path / f"traces-{field}.jsonl"
        path.write_text(json.dumps(request) + "\n")
        tables = load_traces([path])
        assert tables.spans.column("name").to_pylist() == ["good"]
        assert tables.summary.rejected_records == 1
        assert any(field in warning for warning in tables.summary.warnings)
