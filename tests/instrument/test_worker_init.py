"""traced_worker_init: rl.<role>.load_model in the model_init group, with rl.backend (seed 000)."""

from __future__ import annotations

from nemo_telemetry.analysis import read_spans
from nemo_telemetry.instrument import (
    current_trace_carrier,
    init_telemetry_driver,
    shutdown_telemetry,
    span_cm,
    traced_worker_init,
)


def _start(dump_dir, span_groups: str) -> None:
    init_telemetry_driver({"enabled": True, "span_groups": span_groups, "exporter": "dump",
                           "dump_dir": str(dump_dir)})


def test_load_model_span_is_unbucketed_with_its_backend_and_joins_the_carriers_trace(tmp_path):
    _start(tmp_path, "default")
    with traced_worker_init("policy", backend="megatron", **{"rl.num_layers": 4}) as span:
        assert span is not None
    with span_cm("rl.setup.workers"):
        carrier = current_trace_carrier()
    with traced_worker_init("value", backend="automodel", trace_carrier=carrier):
        pass
    shutdown_telemetry(timeout_s=10)
    rows = {r["name"]: r for r in read_spans(tmp_path).to_pylist()}
    policy, value, workers = rows["rl.policy.load_model"], rows["rl.value.load_model"], rows["rl.setup.workers"]
    assert dict(policy["attributes"])["rl.backend"] == "megatron"
    assert dict(policy["attributes"])["rl.num_layers"] == "4"
    assert policy["parent_span_id"] is None and policy["rl.bucket"] is None  # a root: no context in __init__
    assert dict(value["attributes"])["rl.backend"] == "automodel"
    assert value["parent_span_id"] == workers["span_id"] and value["trace_id"] == workers["trace_id"]


def test_model_init_off_emits_nothing_and_the_body_runs(tmp_path):
    _start(tmp_path, "job")
    ran = []
    with traced_worker_init("policy", backend="megatron") as span:
        ran.append(span)
    shutdown_telemetry(timeout_s=10)
    assert ran == [None]
    assert not any(tmp_path.iterdir()) or read_spans(tmp_path).num_rows == 0
