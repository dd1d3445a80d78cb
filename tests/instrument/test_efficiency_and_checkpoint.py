"""Efficiency spans (one per wait, bucketed by category) and the checkpoint span pair."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from nemo_telemetry.instrument import (
    COLLECTOR_LOOP_CATEGORIES,
    EFFICIENCY_CATEGORY_BUCKET,
    UNBUCKETED_SPAN_CATEGORIES,
    TIMER_ONLY_CATEGORIES,
    RLSpanGroup,
    begin_checkpoint_finalize,
    checkpoint_span,
    efficiency_span,
    iteration_scope,
    set_enabled_span_groups,
    start_efficiency_span,
    umbrella_span,
)
from nemo_telemetry.instrument import _checkpoint

G = RLSpanGroup


def _by_name(exporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


# -- efficiency_span --------------------------------------------------------------------------


@pytest.mark.parametrize("category", sorted(set(EFFICIENCY_CATEGORY_BUCKET) - set(TIMER_ONLY_CATEGORIES)))
def test_efficiency_span_name_category_and_bucket(exporter, category):
    with efficiency_span(category, **{"rl.bucket": "productive"}):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.name == "rl." + category.replace("/", ".")
    assert span.attributes["rl.efficiency.category"] == category
    if category in UNBUCKETED_SPAN_CATEGORIES:
        assert "rl.bucket" not in span.attributes
    else:
        assert span.attributes["rl.bucket"] == EFFICIENCY_CATEGORY_BUCKET[category].value


def test_seed_table_of_efficiency_buckets(exporter):
    for category in ("idle/buffer_starvation", "idle/refit_bubble", "idle/refit_event_wait",
                     "idle/generation_limit_pause", "init/total"):
        with efficiency_span(category):
            pass
    buckets = {s.name: s.attributes.get("rl.bucket") for s in exporter.get_finished_spans()}
    assert buckets == {
        "rl.idle.buffer_starvation": "idle",
        "rl.idle.refit_bubble": "idle",
        "rl.idle.refit_event_wait": None,
        "rl.idle.generation_limit_pause": None,
        "rl.init.total": None,
    }
    assert {"idle/refit_event_wait", "idle/generation_limit_pause"} == COLLECTOR_LOOP_CATEGORIES


def test_efficiency_span_is_gated_on_the_efficiency_group(exporter):
    set_enabled_span_groups([G.STEP])
    with efficiency_span("idle/refit_bubble") as span:
        assert span is None
    wait = start_efficiency_span("idle/buffer_starvation")
    wait.poll()
    wait.end()
    assert exporter.get_finished_spans() == ()


# -- start_efficiency_span ----------------------------------------------------------------------


def test_poll_loop_gives_one_span_per_wait_with_the_poll_count(exporter):
    with umbrella_span(G.U_STEP, "rl.sc.step") as step:
        for _wait in range(2):
            wait = start_efficiency_span("idle/buffer_starvation")
            assert trace.get_current_span() is step  # never made current
            for _ in range(5):
                wait.poll()
            wait.end()
            wait.end()  # idempotent
    waits = [s for s in exporter.get_finished_spans() if s.name == "rl.idle.buffer_starvation"]
    assert len(waits) == 2
    for span in waits:
        assert span.attributes["rl.idle.polls"] == 5
        assert span.attributes["rl.bucket"] == "idle"
        assert span.parent.span_id == step.get_span_context().span_id


def test_spans_opened_during_a_wait_do_not_nest_under_it(exporter):
    wait = start_efficiency_span("idle/buffer_starvation")
    with umbrella_span(G.U_PER_PROMPT, "rl.sc.generate_and_push"):
        pass
    wait.end()
    assert _by_name(exporter)["rl.sc.generate_and_push"].parent is None


def test_efficiency_wait_as_context_manager_records_errors(exporter):
    with pytest.raises(TimeoutError):
        with start_efficiency_span("idle/refit_bubble") as wait:
            wait.poll()
            raise TimeoutError("stuck")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["rl.idle.polls"] == 1


# -- checkpoint pair ----------------------------------------------------------------------------


def _checkpoint_in_thread(tmp_dir: str, *, fail: bool = False, delay_s: float = 0.05):
    """Stage inside the staging span, hand finalize to a thread that outlives it."""
    errors: list = []

    def finalize_worker(handle):
        try:
            with handle:
                time.sleep(delay_s)
                if fail:
                    raise OSError("disk full")
        except OSError as exc:
            errors.append(exc)

    with iteration_scope(9):
        with checkpoint_span("grpo"):
            handle = begin_checkpoint_finalize(tmp_dir)
            thread = threading.Thread(target=finalize_worker, args=(handle,))
            thread.start()
    thread.join()
    return errors


def test_finalize_is_a_child_of_staging_that_ends_after_it(exporter, tmp_path):
    _checkpoint_in_thread(str(tmp_path / "tmp_step_7"))
    spans = _by_name(exporter)
    staging, finalize = spans["rl.grpo.checkpointing"], spans["rl.checkpoint.finalize"]
    assert finalize.parent.span_id == staging.context.span_id
    assert finalize.context.trace_id == staging.context.trace_id
    assert finalize.end_time > staging.end_time
    assert staging.attributes["rl.bucket"] == "overhead"
    assert staging.attributes["rl.iteration"] == 9
    assert "rl.bucket" not in finalize.attributes
    assert finalize.attributes["rl.iteration"] == 7  # from tmp_step_7, not the scope
    assert finalize.status.status_code is StatusCode.UNSET


def test_failed_finalization_ends_with_error_status(exporter, tmp_path):
    errors = _checkpoint_in_thread(str(tmp_path / "tmp_step_3"), fail=True, delay_s=0)
    assert len(errors) == 1  # the checkpoint's own error still reaches the checkpoint code
    finalize = _by_name(exporter)["rl.checkpoint.finalize"]
    assert finalize.status.status_code is StatusCode.ERROR
    assert "disk full" in finalize.status.description


def test_finalize_end_with_error_argument(exporter):
    handle = begin_checkpoint_finalize("/ckpt/step_12")
    handle.end(error=RuntimeError("writer rank died"))
    handle.end()  # once only
    (span,) = exporter.get_finished_spans()
    assert span.attributes["rl.iteration"] == 12
    assert span.status.status_code is StatusCode.ERROR


def test_finalize_falls_back_to_the_iteration_scope_for_unparseable_names(exporter):
    with iteration_scope(4):
        begin_checkpoint_finalize("/ckpt/latest").end()
    assert exporter.get_finished_spans()[0].attributes["rl.iteration"] == 4


def test_instrumentation_failure_never_blocks_the_checkpoint(exporter, caplog, monkeypatch):
    class BrokenTracer:
        def start_span(self, *args, **kwargs):
            raise RuntimeError("tracer exploded")

    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        handle = begin_checkpoint_finalize("/ckpt/tmp_step_1", tracer=BrokenTracer())
    assert handle is _checkpoint.NOOP_FINALIZE
    assert "proceeds untraced" in caplog.text
    with handle:  # the finalize code path runs unchanged
        pass
    handle.end(error=ValueError("x"))


def test_checkpoint_group_off_means_neither_span(exporter):
    set_enabled_span_groups([G.STEP])
    with checkpoint_span("grpo") as span:
        assert span is None
        handle = begin_checkpoint_finalize("/ckpt/tmp_step_2")
    with handle:
        pass
    assert exporter.get_finished_spans() == ()
