"""DumpMetricExporter: Collector file-exporter lines that the OTLP protobuf parses back."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from nemo_telemetry.instrument._metrics_dump import DumpMetricExporter
from nemo_telemetry.instrument.metrics import build_meter_provider, record_metrics, set_meter_provider, tee_metrics


def _provider(exporter: DumpMetricExporter, service: str = "grpo-driver") -> MeterProvider:
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    return MeterProvider(resource=Resource.create({"service.name": service, "nemo.run.id": "run-1"}),
                         metric_readers=[reader])


def test_each_collection_is_one_otlp_json_line(tmp_path):
    exporter = DumpMetricExporter(tmp_path)
    provider = _provider(exporter)
    set_meter_provider(provider)
    try:
        tee_metrics("efficiency", {"idle/refit_bubble": 0.5})
        provider.force_flush()
        record_metrics({"rl.vllm.generation_tokens": 7})
        provider.force_flush()
    finally:
        set_meter_provider(None)
        provider.shutdown()

    (name,) = os.listdir(tmp_path)
    assert re.fullmatch(rf"metrics-grpo_driver-{os.getpid()}-[0-9a-f]{{8}}\.jsonl", name)
    lines = (tmp_path / name).read_text().splitlines()
    assert len(lines) >= 2
    first = json.loads(lines[0])
    resource = {a["key"]: a["value"]["stringValue"] for a in first["resourceMetrics"][0]["resource"]["attributes"]}
    assert resource["nemo.run.id"] == "run-1"
    (metric,) = first["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
    assert metric["name"] == "rl.efficiency.seconds" and metric["unit"] == "s"
    (point,) = metric["gauge"]["dataPoints"]
    assert point["asDouble"] == 0.5 and isinstance(point["timeUnixNano"], str)
    for line in lines:  # the protobuf schema accepts every line as it is
        ParseDict(json.loads(line), ExportMetricsServiceRequest())


def test_a_gauge_is_exported_once_and_a_counter_every_time(tmp_path):
    """A value logged at step 3 must not reappear at step 4's collection (points are placed by time)."""
    exporter = DumpMetricExporter(tmp_path)
    provider = _provider(exporter)
    set_meter_provider(provider)
    try:
        tee_metrics("efficiency", {"idle/refit_bubble": 0.5})
        record_metrics({"rl.vllm.generation_tokens": 7})
        provider.force_flush()
        provider.force_flush()  # the next step logged nothing
    finally:
        set_meter_provider(None)
        provider.shutdown()
    (name,) = os.listdir(tmp_path)
    per_line = [[m["name"] for m in json.loads(line)["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]]
                for line in (tmp_path / name).read_text().splitlines()]
    assert per_line[0] == ["rl.efficiency.seconds", "rl.vllm.generation_tokens"]
    assert all(names == ["rl.vllm.generation_tokens"] for names in per_line[1:])


def test_nothing_recorded_leaves_no_file(tmp_path):
    provider = _provider(DumpMetricExporter(tmp_path))
    provider.force_flush()
    provider.shutdown()
    assert os.listdir(tmp_path) == []


def test_an_unwritable_directory_is_warned_about_once(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    exporter = DumpMetricExporter(blocker / "sub")
    provider = _provider(exporter)
    set_meter_provider(provider)
    try:
        with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
            record_metrics({"rl.setup.duration": 1.0}, attributes={"phase": "total_setup"})
            provider.force_flush()
            provider.force_flush()
    finally:
        set_meter_provider(None)
        provider.shutdown()
    assert caplog.text.count("cannot write") == 1


@pytest.mark.parametrize("exporter", ["dump", "none"])
def test_build_meter_provider_for_the_lifecycle(tmp_path, exporter):
    provider = build_meter_provider(Resource.create({"service.name": "w"}), exporter=exporter,
                                    dump_dir=str(tmp_path), export_interval_ms=3_600_000)
    set_meter_provider(provider)
    try:
        record_metrics({"rl.setup.duration": 2.0}, attributes={"phase": "ray_init"})
        provider.force_flush()
    finally:
        set_meter_provider(None)
        provider.shutdown()
    if exporter == "none":
        assert os.listdir(tmp_path) == []
        return
    (name,) = os.listdir(tmp_path)
    lines = (tmp_path / name).read_text().splitlines()
    request = ParseDict(json.loads(lines[0]), ExportMetricsServiceRequest())
    resource = {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "w"
    (metric,) = request.resource_metrics[0].scope_metrics[0].metrics
    assert metric.name == "rl.setup.duration"
    (point,) = metric.gauge.data_points
    assert point.as_double == 2.0
    assert {a.key: a.value.string_value for a in point.attributes} == {"phase": "ray_init"}
