"""Every dump format round-trips to the same spans, events and links tables.

The spans come from the real OpenTelemetry SDK and its OTLP protobuf encoder; each format is
written the way its real writer writes it (protobuf's JSON mapping for OTLP/JSON).
"""

from __future__ import annotations

import base64
import gzip
import json

import orjson
import pytest
import zstandard
from google.protobuf.json_format import MessageToDict, MessageToJson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from nemo_telemetry.analysis import ingest, read_events, read_links, read_spans
from nemo_telemetry.analysis.model.schema import SPANS_SCHEMA
from nemo_telemetry.analysis.synthetic import write_json_lines, write_length_prefixed

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")


def make_sdk_spans(run_id: str = "run-a"):
    """Spans of two processes of one run: every attribute type, events, links, statuses."""
    finished = []
    for rank in (0, 1):
        exporter = InMemorySpanExporter()  # shutting a provider down shuts its exporter
        resource = Resource.create(
            {"service.name": f"svc-{rank}", "nemo.run.id": run_id, "nv.dl.rank": rank, "host.name": "node-0",
             "nemo.telemetry.span_groups": "generation,step" if rank == 0 else "step"}
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("nemo_telemetry.tests", "1.2.3")
        with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": 3}) as step:
            with tracer.start_as_current_span(
                "rl.generation.generate",
                kind=SpanKind.CLIENT,
                attributes={
                    "rl.bucket": "productive",
                    "rl.iteration": 3,
                    "ratio": 0.25,
                    "cached": True,
                    "tags": ["a", "b"],
                    "sizes": [1, 2],
                },
            ) as generate:
                generate.add_event("first_token", {"tokens": 12})
            with tracer.start_as_current_span(
                "rl.efficiency.wait",
                kind=SpanKind.SERVER,
                links=[Link(step.get_span_context(), {"why": "waits on"})],
                attributes={"rl.bucket": "idle", "rl.efficiency.category": "data_loader"},
            ) as wait:
                wait.set_status(Status(StatusCode.ERROR, "boom"))
        backwards = tracer.start_span("rl.clock.skew", start_time=2_000_000)
        backwards.end(end_time=1_000_000)
        provider.shutdown()
        finished.extend(exporter.get_finished_spans())
    return finished


def hex_ids(obj, upper: bool = False):
    """Protobuf's JSON mapping writes ids in base64; OTLP/JSON writers use hex."""
    if isinstance(obj, list):
        return [hex_ids(v, upper) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
            value = base64.b64decode(value).hex()
            value = value.upper() if upper else value
        out[key] = hex_ids(value, upper)
    return out


def numbers_and_enum_ints(obj):
    """int64 as JSON numbers and enums as ints, which protobuf's JSON parser also accepts."""
    if isinstance(obj, list):
        return [numbers_and_enum_ints(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        if key.endswith("UnixNano") or key == "intValue":
            value = int(value)
        elif key == "kind":
            value = ["SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT"].index(value)
        elif key == "code":
            value = ["STATUS_CODE_UNSET", "STATUS_CODE_OK", "STATUS_CODE_ERROR"].index(value)
        out[key] = numbers_and_enum_ints(value)
    return out


@pytest.fixture(scope="module")
def sdk_spans():
    return make_sdk_spans()


@pytest.fixture(scope="module")
def requests(sdk_spans):
    """The spans as two export requests (two batches), as the SDK exporter would send them."""
    return [encode_spans(sdk_spans[:4]), encode_spans(sdk_spans[4:])]


def _sorted(table):
    return table.sort_by([("trace_id", "ascending"), ("span_id", "ascending")]).to_pylist()


def _write_formats(requests, d):
    payloads = [r.SerializeToString() for r in requests]
    dicts = [MessageToDict(r) for r in requests]
    files = {
        "proto": write_length_prefixed(d / "traces.pb", payloads),
        "proto-zstd-records": write_length_prefixed(d / "zstd-records.pb", payloads, zstd_records=True),
        "proto.gz": write_length_prefixed(d / "traces.pb.gz", payloads, compress="gzip"),
        "jsonl": write_json_lines(d / "traces.jsonl", [hex_ids(x) for x in dicts]),
        "jsonl-upper-numbers": write_json_lines(
            d / "upper.jsonl", [numbers_and_enum_ints(hex_ids(x, upper=True)) for x in dicts]
        ),
        "jsonl-base64": write_json_lines(d / "base64.jsonl", dicts),
        "jsonl.zst": write_json_lines(d / "traces.jsonl.zst", [hex_ids(x) for x in dicts], compress="zstd"),
        "jsonl-snake-case": write_json_lines(
            d / "snake.jsonl", [hex_ids(MessageToDict(r, preserving_proto_field_name=True)) for r in requests]
        ),
    }
    document = {"resourceSpans": [rs for x in dicts for rs in x["resourceSpans"]]}
    (d / "request.json").write_text(json.dumps(hex_ids(document), indent=2))
    files["json-document"] = d / "request.json"
    # a compact document wrapped a span per line: its first line is no JSON by itself, nor is any other
    wrapped = json.dumps(hex_ids(document), separators=(",", ":")).replace('},{"traceId"', '},\n{"traceId"')
    assert wrapped.count("\n") >= 3
    (d / "wrapped.json").write_text(wrapped)
    files["json-document-wrapped"] = d / "wrapped.json"
    merged = requests[0].__class__()
    for r in requests:
        merged.resource_spans.extend(r.resource_spans)
    (d / "export.json.gz").write_bytes(gzip.compress(MessageToJson(merged, indent=4).encode()))
    files["json-document-base64.gz"] = d / "export.json.gz"
    return files


def test_every_format_reads_to_the_same_tables(requests, tmp_path):
    files = _write_formats(requests, tmp_path)
    reference = files.pop("proto")
    expected = _sorted(read_spans(reference))
    expected_events = read_events(reference).to_pylist()
    expected_links = read_links(reference).to_pylist()
    assert len(expected) == 8
    for name, path in files.items():
        assert _sorted(read_spans(path)) == expected, name
        assert read_events(path).to_pylist() == expected_events, name
        assert read_links(path).to_pylist() == expected_links, name


def test_spans_table_holds_what_the_sdk_recorded(sdk_spans, requests, tmp_path):
    path = write_length_prefixed(tmp_path / "t.pb", [r.SerializeToString() for r in requests])
    spans = read_spans(path)
    assert spans.schema.names[: len(SPANS_SCHEMA)] == SPANS_SCHEMA.names
    rows = {row["span_id"]: row for row in spans.to_pylist()}
    for sdk in sdk_spans:
        row = rows[f"{sdk.context.span_id:016x}"]
        assert row["trace_id"] == f"{sdk.context.trace_id:032x}"
        assert row["parent_span_id"] == (f"{sdk.parent.span_id:016x}" if sdk.parent else None)
        assert (row["start_ns"], row["end_ns"]) == (sdk.start_time, sdk.end_time)
        assert row["duration_ns"] == sdk.end_time - sdk.start_time
        assert row["run_id"] == "run-a"
        assert row["service_name"] == sdk.resource.attributes["service.name"]
        assert row["rank"] == sdk.resource.attributes["nv.dl.rank"]
        assert row["span_groups"] == sdk.resource.attributes["nemo.telemetry.span_groups"]
        assert "nemo.telemetry.span_groups" not in dict(row["resource_attributes"])  # promoted: one place
        assert row["scope_name"] == "nemo_telemetry.tests" and row["scope_version"] == "1.2.3"
    generate = next(r for r in rows.values() if r["name"] == "rl.generation.generate")
    assert generate["kind"] == "client"
    assert generate["rl.bucket"] == "productive" and generate["rl.iteration"] == 3
    assert dict(generate["attributes"]) == {
        "ratio": "0.25",
        "cached": "true",
        "tags": '["a","b"]',
        "sizes": "[1,2]",
    }
    resource = dict(generate["resource_attributes"])
    assert resource["host.name"] == "node-0" and "nemo.run.id" not in resource
    wait = next(r for r in rows.values() if r["name"] == "rl.efficiency.wait")
    assert (wait["status_code"], wait["status_message"], wait["kind"]) == ("error", "boom", "server")
    assert wait["rl.efficiency.category"] == "data_loader"
    assert [r["kind"] for r in rows.values() if r["name"] == "rl.grpo.step"] == ["internal", "internal"]


def test_end_before_start_spans_are_kept_with_negative_duration(requests, tmp_path):
    path = write_length_prefixed(tmp_path / "t.pb", [r.SerializeToString() for r in requests])
    skewed = [r for r in read_spans(path).to_pylist() if r["name"] == "rl.clock.skew"]
    assert len(skewed) == 2
    assert all(r["duration_ns"] == -1_000_000 for r in skewed)


def test_events_and_links_tables(sdk_spans, requests, tmp_path):
    path = write_length_prefixed(tmp_path / "t.pb", [r.SerializeToString() for r in requests])
    events = read_events(path).to_pylist()
    assert len(events) == 2
    assert events[0]["name"] == "first_token" and dict(events[0]["attributes"]) == {"tokens": "12"}
    generate = next(s for s in sdk_spans if s.name == "rl.generation.generate")
    assert events[0]["span_id"] == f"{generate.context.span_id:016x}"
    assert events[0]["time_ns"] == generate.events[0].timestamp
    links = read_links(path).to_pylist()
    assert len(links) == 2
    step = next(s for s in sdk_spans if s.name == "rl.grpo.step")
    assert links[0]["linked_span_id"] == f"{step.context.span_id:016x}"
    assert links[0]["linked_trace_id"] == f"{step.context.trace_id:032x}"
    assert dict(links[0]["attributes"]) == {"why": "waits on"}


def test_dataset_round_trip_equals_in_memory_read(requests, tmp_path):
    (tmp_path / "in").mkdir()
    files = _write_formats(requests, tmp_path / "in")
    summary = ingest([files["jsonl"]], out=tmp_path / "ds")
    assert (summary.files, summary.spans, summary.events, summary.links) == (1, 8, 2, 2)
    assert (summary.traces, summary.runs, summary.rejected_records) == (4, 1, 0)  # 2 steps + 2 skewed roots
    assert _sorted(read_spans(tmp_path / "ds")) == _sorted(read_spans(files["jsonl"]))
    assert read_events(tmp_path / "ds").num_rows == 2 and read_links(tmp_path / "ds").num_rows == 2
    assert [p.name for p in (tmp_path / "ds" / "spans").iterdir()] == ["run_id=run-a"]


def test_directory_of_rotated_files_is_read_as_one(requests, tmp_path):
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    for i, request in enumerate(requests):
        write_json_lines(rotated / f"traces-{i}.jsonl", [hex_ids(MessageToDict(request))])
    (rotated / ".hidden").write_text("not a dump")
    summary = ingest([rotated], out=tmp_path / "ds")
    assert (summary.files, summary.spans) == (2, 8)


def test_reingesting_the_same_file_drops_duplicates(requests, tmp_path):
    path = write_length_prefixed(tmp_path / "t.pb", [r.SerializeToString() for r in requests])
    first = ingest([path], out=tmp_path / "ds")
    again = ingest([path, path], out=tmp_path / "ds")
    assert (first.spans, first.duplicates_dropped) == (8, 0)
    assert (again.spans, again.events, again.duplicates_dropped) == (0, 0, 16)
    assert read_spans(tmp_path / "ds").num_rows == 8
    assert read_events(tmp_path / "ds").num_rows == 2


def test_spans_without_run_id_go_to_the_default_partition(tmp_path):
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "a" * 32, "spanId": "b" * 16, "name": "x", "startTimeUnixNano": 1, "endTimeUnixNano": 2}
    ]}]}]}
    path = tmp_path / "norun.jsonl"
    path.write_bytes(orjson.dumps(request) + b"\n")
    ingest([path], out=tmp_path / "ds")
    assert [p.name for p in (tmp_path / "ds" / "spans").iterdir()] == ["run_id=__HIVE_DEFAULT_PARTITION__"]
    row = read_spans(tmp_path / "ds").to_pylist()[0]
    assert (row["run_id"], row["service_name"], row["kind"], row["status_code"]) == (None, None, "unspecified", "unset")
    assert (row["parent_span_id"], row["parent_key"]) == (None, 0)


def test_list_of_sources_mixes_datasets_and_raw_files(requests, tmp_path):
    first = write_length_prefixed(tmp_path / "a.pb", [requests[0].SerializeToString()])
    second = write_length_prefixed(tmp_path / "b.pb", [requests[1].SerializeToString()])
    ingest([first], out=tmp_path / "ds")
    assert read_spans([tmp_path / "ds", second]).num_rows == 8


def test_zstd_frames_may_hold_json(requests, tmp_path):
    """The Collector's file exporter with compression writes length-prefixed zstd of any format."""
    payloads = [orjson.dumps(hex_ids(MessageToDict(r))) for r in requests]
    path = write_length_prefixed(tmp_path / "t.bin", payloads, zstd_records=True)
    assert zstandard.ZstdDecompressor().decompress(path.read_bytes()[4:], max_output_size=1 << 20)[:1] == b"{"
    assert read_spans(path).num_rows == 8
