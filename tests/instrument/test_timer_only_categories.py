"""Timer-only efficiency categories emit no span; their seconds stay in rl.efficiency.seconds (seed 000).

Spans are read back from the dump exporter and metrics from the metrics dump of a real driver.
"""

from __future__ import annotations

import logging
import time

import pytest

from nemo_telemetry.analysis import check_run, read_metrics, read_spans, run_goodput
from nemo_telemetry.instrument import (
    TIMER_ONLY_CATEGORIES,
    Bucket,
    RLSpanGroup as G,
    bucket_scope,
    efficiency_span,
    flush_metrics,
    init_telemetry_driver,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    start_efficiency_span,
    tee_metrics,
    umbrella_span,
)
from nemo_telemetry.instrument import _efficiency

TIMER_ONLY = ("idle/validation", "idle/buffer_full_backoff", "wasted/failed_trajectory")


def _start(dump_dir) -> None:
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(dump_dir)}, algorithm="grpo")


def test_the_three_seed_categories_are_timer_only():
    assert set(TIMER_ONLY_CATEGORIES) == set(TIMER_ONLY)


def test_timer_only_categories_emit_no_span_and_keep_their_seconds_in_the_metric(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(_efficiency, "_warned_timer_only", set())
    _start(tmp_path)
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        with iteration_scope(1), umbrella_span(G.U_STEP, "rl.grpo.step"):
            for category in TIMER_ONLY:
                for _ in range(2):  # the second use is silent: one warning per category
                    with efficiency_span(category) as span:
                        assert span is None
                    wait = start_efficiency_span(category)
                    wait.poll()
                    wait.end()
            with efficiency_span("idle/buffer_starvation"):
                pass
            tee_metrics("efficiency", {"idle/validation": 1.5, "idle/buffer_full_backoff": 0.25,
                                       "wasted/failed_trajectory": 0.75})
            flush_metrics()
    shutdown_telemetry(timeout_s=10)

    names = read_spans(tmp_path).column("name").to_pylist()
    assert sorted(names) == ["rl.grpo.step", "rl.idle.buffer_starvation"]
    warnings = [r.getMessage() for r in caplog.records if "Timer-only" in r.getMessage()]
    assert len(warnings) == 3
    assert any("idle/validation" in w and "count the pass twice" in w for w in warnings)
    assert all("rl.efficiency.seconds" in w for w in warnings)
    assert any("thread-seconds" in w for w in warnings if "buffer_full_backoff" in w)

    seconds = {dict(r["attributes"])["rl.efficiency.category"]: r["value"]
               for r in read_metrics(tmp_path).to_pylist() if r["name"] == "rl.efficiency.seconds"}
    assert seconds == {"idle/validation": 1.5, "idle/buffer_full_backoff": 0.25, "wasted/failed_trajectory": 0.75}


def test_validation_inside_a_step_is_counted_once_in_goodput(tmp_path):
    _start(tmp_path)
    with iteration_scope(1), umbrella_span(G.U_STEP, "rl.grpo.step"):
        with managed_span(G.POLICY_UPDATE, "rl.grpo.policy_training"):
            time.sleep(0.02)
        with bucket_scope(Bucket.OVERHEAD), efficiency_span("idle/validation"):
            with umbrella_span(G.U_EVALUATE, "rl.grpo.evaluate"):
                with managed_span(G.GENERATION, "rl.vllm.generate"):
                    time.sleep(0.03)
    shutdown_telemetry(timeout_s=10)

    spans = read_spans(tmp_path)
    by_name = {r["name"]: r for r in spans.to_pylist()}
    generate = by_name["rl.vllm.generate"]
    (step,) = run_goodput(spans)[0].steps.to_pylist()
    assert step["overhead_s"] == pytest.approx((generate["end_ns"] - generate["start_ns"]) / 1e9)
    assert step["idle_s"] == 0.0
    assert step["double_counted_s"] == 0.0
    assert step["overhead_s"] + step["productive_s"] <= step["wall_s"]
    codes = {f.code for f in check_run(spans).findings}
    assert not codes & {"bucketed-overlap", "nested-bucket", "bucket-exceeds-wall"}
