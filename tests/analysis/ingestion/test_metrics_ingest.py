"""read_metrics over real dump files, bad records among good ones, and metrics attributed to steps."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from nemo_telemetry.analysis.ingestion.metrics import (
    FIRST_PROBLEM_KEY,
    MALFORMED_KEY,
    METRICS_SCHEMA,
    SKIPPED_KEY,
    efficiency_by_step,
    metrics_by_step,
    metrics_table,
    read_metrics,
    step_windows,
    with_efficiency_columns,
)
from nemo_telemetry.analysis.model.records import spans_table
from nemo_telemetry.errors import IngestError
from nemo_telemetry.instrument._metrics_dump import DumpMetricExporter
from nemo_telemetry.instrument.metrics import record_metrics, set_meter_provider, tee_metrics

S = 1_000_000_000


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory):
    """A real dump: two collections from a driver process (rank 0) of run-1."""
    directory = tmp_path_factory.mktemp("metrics")
    exporter = DumpMetricExporter(directory)
    provider = MeterProvider(
        resource=Resource.create({"service.name": "grpo-driver", "nemo.run.id": "run-1", "nv.dl.rank": 0}),
        metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)])
    set_meter_provider(provider)
    try:
        tee_metrics("efficiency", {"idle/refit_bubble": 0.5})
        record_metrics({"rl.vllm.generation_tokens": 100})
        provider.force_flush()
        tee_metrics("efficiency", {"idle/refit_bubble": 0.75})
        record_metrics({"rl.vllm.generation_tokens": 20})
        provider.force_flush()
    finally:
        set_meter_provider(None)
        provider.shutdown()
    return directory


def _request(name: str, points: list[tuple[int, float]], *, kind: str = "gauge", run: str = "run-1",
             attributes: dict | None = None) -> dict:
    """An OTLP/JSON metrics request with int64 fields as strings, as the Collector writes them."""
    attrs = [{"key": k, "value": {"stringValue": v}} for k, v in (attributes or {}).items()]
    data_points = [{"timeUnixNano": str(t), "asDouble": v, "attributes": attrs} for t, v in points]
    body = {"dataPoints": data_points}
    if kind == "sum":
        body.update(aggregationTemporality=2, isMonotonic=True)
    return {"resourceMetrics": [{
        "resource": {"attributes": [{"key": "nemo.run.id", "value": {"stringValue": run}},
                                    {"key": "service.name", "value": {"stringValue": "driver"}},
                                    {"key": "nv.dl.rank", "value": {"intValue": "0"}}]},
        "scopeMetrics": [{"scope": {"name": "nemo_telemetry"},
                          "metrics": [{"name": name, "unit": "s", kind: body}]}],
    }]}


def test_a_real_dump_reads_as_one_row_per_data_point(dump_dir):
    table = read_metrics(dump_dir)
    assert table.schema.remove_metadata() == METRICS_SCHEMA
    rows = table.to_pylist()
    effs = [r for r in rows if r["name"] == "rl.efficiency.seconds"]
    assert [r["value"] for r in effs] == [0.5, 0.75]  # gauges: exported once each (delta)
    assert effs[0]["kind"] == "gauge" and effs[0]["unit"] == "s"
    assert dict(effs[0]["attributes"]) == {"rl.efficiency.category": "idle/refit_bubble",
                                           "rl.efficiency.measurement": "driver_wall_clock"}
    assert (effs[0]["run_id"], effs[0]["service_name"], effs[0]["rank"]) == ("run-1", "grpo-driver", 0)
    tokens = [r for r in rows if r["name"] == "rl.vllm.generation_tokens"]
    assert [r["value"] for r in tokens] == [100, 120, 120]  # cumulative, as exported
    assert tokens[0]["temporality"] == "cumulative" and tokens[0]["is_monotonic"] is True
    assert effs[0]["time_ns"] < effs[1]["time_ns"]
    assert table.schema.metadata[MALFORMED_KEY] == b"0"


def test_a_malformed_line_is_counted_and_the_good_ones_kept(tmp_path):
    good = json.dumps(_request("rl.setup.duration", [(5 * S, 1.0)]))
    spans = json.dumps({"resourceSpans": []})
    path = tmp_path / "metrics-x.jsonl"
    path.write_text("\n".join([good, "{not json", spans, json.dumps({"resourceMetrics": [{"scopeMetrics": [
        {"metrics": [{"name": "rl.bad", "gauge": {"dataPoints": [{"timeUnixNano": "soon"}]}}]}]}]}), good]) + "\n")
    table = read_metrics(path)
    assert table.num_rows == 2
    meta = table.schema.metadata
    assert meta[MALFORMED_KEY] == b"2" and meta[SKIPPED_KEY] == b"1"
    assert meta[FIRST_PROBLEM_KEY].decode().startswith(f"{path}:2: not JSON")
    with pytest.raises(IngestError, match=rf"{path.name}:2: not JSON"):
        read_metrics(path, strict=True)


def test_gzip_single_document_and_length_prefixed_protobuf(tmp_path):
    request = _request("rl.setup.duration", [(5 * S, 2.0)], attributes={"phase": "total_setup"})
    (tmp_path / "metrics-a.json.gz").write_bytes(gzip.compress(json.dumps(request, indent=2).encode()))
    payload = ParseDict(request, ExportMetricsServiceRequest()).SerializeToString()
    (tmp_path / "metrics-b.binpb").write_bytes(len(payload).to_bytes(4, "big") + payload)
    (tmp_path / "traces-c.jsonl").write_text("ignored: not a metrics-* file")
    table = read_metrics(tmp_path)
    assert table.column("value").to_pylist() == [2.0, 2.0]
    assert [dict(a) for a in table.column("attributes").to_pylist()] == [{"phase": "total_setup"}] * 2


def test_snake_case_and_numeric_int64_are_accepted(tmp_path):
    doc = {"resource_metrics": [{"scope_metrics": [{"metrics": [
        {"name": "rl.x", "gauge": {"data_points": [{"time_unix_nano": 7, "as_int": 3}]}}]}]}]}
    (tmp_path / "metrics-s.jsonl").write_text(json.dumps(doc) + "\n")
    (row,) = read_metrics(tmp_path).to_pylist()
    assert (row["time_ns"], row["value"], row["run_id"]) == (7, 3.0, None)


def test_a_missing_path_is_an_ingest_error_naming_it(tmp_path):
    with pytest.raises(IngestError, match="nowhere"):
        read_metrics(tmp_path / "nowhere")


# -- per step ---------------------------------------------------------------------------------


def _steps(*windows: tuple[str, int, int, int]) -> pa.Table:
    run, it, start, end = zip(*windows)
    return pa.table({"run_id": list(run), "iteration": list(it), "start_ns": list(start), "end_ns": list(end)})


def test_a_gauge_gives_its_last_value_in_each_step():
    metrics = metrics_table([_request("rl.efficiency.seconds", [(1 * S, 9.0), (11 * S, 1.0), (15 * S, 2.0),
                                                                 (21 * S, 3.0)],
                                      attributes={"rl.efficiency.category": "idle/refit_bubble",
                                                  "rl.efficiency.measurement": "driver_wall_clock"})])
    steps = _steps(("run-1", 1, 10 * S, 19 * S), ("run-1", 2, 20 * S, 29 * S))
    eff = efficiency_by_step(metrics, steps).to_pylist()
    assert eff == [  # the point at 1 s is before the first step: left out
        {"run_id": "run-1", "iteration": 1, "category": "idle/refit_bubble",
         "measurement": "driver_wall_clock", "seconds": 2.0},
        {"run_id": "run-1", "iteration": 2, "category": "idle/refit_bubble",
         "measurement": "driver_wall_clock", "seconds": 3.0},
    ]


def test_a_cumulative_counter_becomes_per_step_increases():
    metrics = metrics_table([_request("rl.vllm.generation_tokens",
                                      [(11 * S, 100.0), (21 * S, 250.0), (31 * S, 40.0)], kind="sum")])
    steps = _steps(("run-1", 1, 10 * S, 19 * S), ("run-1", 2, 20 * S, 29 * S), ("run-1", 3, 30 * S, 39 * S))
    got = metrics_by_step(metrics, steps).to_pylist()
    assert [(r["iteration"], r["value"]) for r in got] == [(1, 100.0), (2, 150.0), (3, 40.0)]  # 3: a restart


def test_points_are_attributed_within_their_own_run():
    metrics = metrics_table([_request("rl.x.y", [(12 * S, 1.0)], run="run-a"),
                             _request("rl.x.y", [(12 * S, 2.0)], run="run-b")])
    steps = _steps(("run-a", 1, 10 * S, 19 * S), ("run-b", 7, 5 * S, 15 * S))
    got = {(r["run_id"], r["iteration"]): r["value"] for r in metrics_by_step(metrics, steps).to_pylist()}
    assert got == {("run-a", 1): 1.0, ("run-b", 7): 2.0}


def test_step_windows_span_every_step_span_of_an_iteration():
    spans = spans_table([
        {"trace_id": "a" * 32, "span_id": "1" * 16, "name": "rl.grpo.step", "start_ns": 10, "end_ns": 20,
         "iteration": 1},
        {"trace_id": "a" * 32, "span_id": "2" * 16, "name": "rl.grpo.step", "start_ns": 8, "end_ns": 15,
         "iteration": 1, "rank": 1},
        {"trace_id": "a" * 32, "span_id": "3" * 16, "name": "rl.grpo.generation", "start_ns": 10, "end_ns": 12,
         "iteration": 1},
        {"trace_id": "a" * 32, "span_id": "4" * 16, "name": "rl.grpo.step", "start_ns": 30, "end_ns": 40},
    ])
    assert step_windows(spans).to_pylist() == [{"run_id": "run-1", "iteration": 1, "start_ns": 8, "end_ns": 20}]


def test_no_steps_or_no_points_give_an_empty_table():
    metrics = metrics_table([_request("rl.x.y", [(12 * S, 1.0)])])
    assert metrics_by_step(metrics, _steps(("run-1", 1, 20 * S, 30 * S))).num_rows == 0
    assert efficiency_by_step(metrics, _steps(("run-1", 1, 0, 30 * S))).num_rows == 0


def test_goodput_steps_get_one_efficiency_column_per_category():
    def eff(category, measurement, points):
        return _request("rl.efficiency.seconds", points, attributes={
            "rl.efficiency.category": category, "rl.efficiency.measurement": measurement})

    metrics = metrics_table([eff("idle/refit_bubble", "driver_wall_clock", [(12 * S, 1.5), (22 * S, 0.5)]),
                             eff("idle/refit_event_wait", "collector_wall_clock", [(22 * S, 4.0)])])
    steps = pa.table({"run_id": ["run-1", "run-1"], "iteration": [1, 2], "start_ns": [10 * S, 20 * S],
                      "end_ns": [19 * S, 29 * S], "goodput": [0.5, 0.6]})
    out = with_efficiency_columns(steps, metrics)
    assert out.column_names[:5] == steps.column_names
    assert out["efficiency/idle/refit_bubble_s"].to_pylist() == [1.5, 0.5]
    assert out["efficiency/idle/refit_event_wait_s"].to_pylist() == [None, 4.0]
    field = out.schema.field("efficiency/idle/refit_event_wait_s")
    assert field.metadata[b"rl.efficiency.measurement"] == b"collector_wall_clock"
    assert with_efficiency_columns(steps, metrics_table([])) == steps


def test_read_metrics_of_a_dataset_is_what_ingest_wrote(dump_dir, tmp_path):
    """``read_metrics(DATASET)`` reads the dataset's ``metrics/`` table, the points of the dump ingested."""
    from nemo_telemetry.analysis import ingest

    dataset = tmp_path / "ds"
    ingest([dump_dir], out=dataset)
    assert list((dataset / "metrics").glob("*.parquet"))  # ingest wrote the points into the dataset
    from_dump = read_metrics(dump_dir)
    from_dataset = read_metrics(dataset)
    assert from_dump.num_rows >= 4
    key = repr
    assert sorted(from_dataset.to_pylist(), key=key) == sorted(from_dump.to_pylist(), key=key)
    both = read_metrics([dataset, dump_dir])  # a dataset beside a dump: both tables
    assert both.num_rows == 2 * from_dump.num_rows
