"""The dump exporter writes Collector file-exporter OTLP/JSON that reads back intact."""

from __future__ import annotations

import json
import logging
import os
import re

from google.protobuf.json_format import ParseDict
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from nemo_telemetry.instrument import DumpSpanExporter
from nemo_telemetry.instrument._dump import otlp_json_ids_to_base64

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _provider(directory, service="trainer/driver 0") -> tuple[TracerProvider, DumpSpanExporter]:
    exporter = DumpSpanExporter(directory)
    provider = TracerProvider(resource=Resource.create({"service.name": service, "nemo.run.id": "run-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _emit(tracer) -> None:
    with tracer.start_as_current_span("rl.grpo.step", attributes={"rl.iteration": 3}) as step:
        with tracer.start_as_current_span(
            "rl.vllm.generate",
            kind=SpanKind.CLIENT,
            attributes={"rl.bucket": "productive", "rl.count": 2**40, "rl.ratio": 0.25, "rl.flag": True,
                        "rl.tags": ["a", "b"], "rl.sizes": [1, 2, 3]},
            links=[Link(step.get_span_context(), {"why": "test"})],
        ) as gen:
            gen.add_event("first_token", {"rl.tokens": 17})
            gen.set_status(Status(StatusCode.ERROR, "generation failed"))


def test_dump_round_trips_as_export_trace_service_requests(tmp_path):
    provider, exporter = _provider(tmp_path)
    _emit(provider.get_tracer("nemo_telemetry", "1.2.3"))
    provider.shutdown()

    (path,) = list(tmp_path.iterdir())
    lines = path.read_text().splitlines()
    assert len(lines) == 2  # SimpleSpanProcessor: one request per span, one line per request
    raw = [json.loads(line) for line in lines]
    spans = [s for req in raw for rs in req["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    by_name = {s["name"]: s for s in spans}
    gen, step = by_name["rl.vllm.generate"], by_name["rl.grpo.step"]

    # Collector file-exporter conventions: hex ids, int64 as strings, enums as ints.
    assert HEX32.match(gen["traceId"]) and HEX16.match(gen["spanId"]) and HEX16.match(gen["parentSpanId"])
    assert gen["parentSpanId"] == step["spanId"] and "parentSpanId" not in step
    assert gen["links"][0]["spanId"] == step["spanId"] and HEX32.match(gen["links"][0]["traceId"])
    assert isinstance(gen["startTimeUnixNano"], str) and gen["startTimeUnixNano"].isdigit()
    assert gen["kind"] == 3 and step["kind"] == 1
    assert gen["status"] == {"code": 2, "message": "generation failed"}
    attrs = {a["key"]: a["value"] for a in gen["attributes"]}
    assert attrs["rl.count"] == {"intValue": str(2**40)}
    assert attrs["rl.ratio"] == {"doubleValue": 0.25}
    assert attrs["rl.flag"] == {"boolValue": True}
    assert attrs["rl.tags"] == {"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": "b"}]}}
    resource = {a["key"]: a["value"] for a in raw[0]["resourceSpans"][0]["resource"]["attributes"]}
    assert resource["nemo.run.id"] == {"stringValue": "run-1"}
    assert raw[0]["resourceSpans"][0]["scopeSpans"][0]["scope"] == {"name": "nemo_telemetry", "version": "1.2.3"}

    # And every line parses as an ExportTraceServiceRequest with the same content.
    parsed = [ParseDict(otlp_json_ids_to_base64(json.loads(line)), ExportTraceServiceRequest()) for line in lines]
    pb_spans = {s.name: s for req in parsed for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans}
    pb_gen = pb_spans["rl.vllm.generate"]
    assert pb_gen.trace_id.hex() == gen["traceId"]
    assert pb_gen.parent_span_id == pb_spans["rl.grpo.step"].span_id
    assert pb_gen.end_time_unix_nano > pb_gen.start_time_unix_nano > 0
    assert pb_gen.status.code == 2 and pb_gen.status.message == "generation failed"
    assert [e.name for e in pb_gen.events] == ["first_token"]
    assert pb_gen.events[0].attributes[0].value.int_value == 17
    assert {a.key: a.value.int_value for a in pb_gen.attributes if a.key == "rl.count"} == {"rl.count": 2**40}
    assert [v.int_value for a in pb_gen.attributes if a.key == "rl.sizes" for v in a.value.array_value.values] \
        == [1, 2, 3]


def test_ids_and_times_match_the_sdk_spans(tmp_path):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider, _ = _provider(tmp_path)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _emit(provider.get_tracer("t"))
    provider.shutdown()
    (path,) = list(tmp_path.iterdir())
    dumped = {}
    for line in path.read_text().splitlines():
        req = ParseDict(otlp_json_ids_to_base64(json.loads(line)), ExportTraceServiceRequest())
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    dumped[s.name] = s
    assert dumped and set(dumped) == {span.name for span in memory.get_finished_spans()}
    for span in memory.get_finished_spans():
        pb = dumped[span.name]
        assert int.from_bytes(pb.trace_id, "big") == span.context.trace_id
        assert int.from_bytes(pb.span_id, "big") == span.context.span_id
        assert (pb.start_time_unix_nano, pb.end_time_unix_nano) == (span.start_time, span.end_time)


def test_one_file_per_process_named_after_service_and_pid(tmp_path):
    provider, exporter = _provider(tmp_path / "nested" / "dir")
    tracer = provider.get_tracer("t")
    for i in range(3):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    provider.shutdown()
    files = list((tmp_path / "nested" / "dir").iterdir())
    assert len(files) == 1
    assert re.fullmatch(rf"traces-trainer_driver_0-{os.getpid()}-[0-9a-f]{{8}}\.jsonl", files[0].name)
    assert exporter.path == str(files[0])
    assert len(files[0].read_text().splitlines()) == 3


def test_unwritable_directory_warns_once_and_the_run_goes_on(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    provider, _ = _provider(blocker / "dumps")
    tracer = provider.get_tracer("t")
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        for _ in range(3):
            with tracer.start_as_current_span("s"):
                pass
    provider.shutdown()
    warnings = [r for r in caplog.records if "cannot write span dumps" in r.getMessage()]
    assert len(warnings) == 1
    assert "NEMO_TELEMETRY_DUMP_DIR" in warnings[0].getMessage()
    assert trace.get_current_span() is trace.INVALID_SPAN
