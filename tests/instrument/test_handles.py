"""Span handles: a span started in one callback and ended in another, as a callback-driven loop needs."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nemo_telemetry.instrument import (
    NOOP_HANDLE,
    RLSpanGroup,
    current_iteration,
    managed_span,
    set_enabled_span_groups,
    set_tracer_provider,
    start_span,
    start_step_span,
    start_umbrella_span,
)


@pytest.fixture()
def exported():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    set_tracer_provider(provider)
    set_enabled_span_groups(RLSpanGroup.resolve("per_step"))
    yield exporter
    set_enabled_span_groups(())
    set_tracer_provider(None)


class StepCallbacks:
    """A loop's hooks, the way a transformers TrainerCallback or a Lightning module is written."""

    def on_step_begin(self, step: int) -> None:
        self.step = start_step_span(step, "rl.sft.step")

    def on_pre_optimizer_step(self) -> None:
        self.optimizer = start_span(RLSpanGroup.POLICY_UPDATE, "rl.sft.optimizer_step")

    def on_optimizer_step(self) -> None:
        self.optimizer.end()

    def on_step_end(self) -> None:
        self.step.end()


def test_spans_opened_and_closed_in_separate_callbacks(exported):
    hooks = StepCallbacks()
    for step in (1, 2):
        hooks.on_step_begin(step)
        with managed_span(RLSpanGroup.POLICY_UPDATE, "rl.sft.forward"):  # ordinary code between the hooks
            pass
        hooks.on_pre_optimizer_step()
        hooks.on_optimizer_step()
        hooks.on_step_end()
    spans = {(s.name, s.attributes.get("rl.iteration")): s for s in exported.get_finished_spans()}
    assert set(spans) == {(name, i) for i in (1, 2) for name in ("rl.sft.step", "rl.sft.forward",
                                                                   "rl.sft.optimizer_step")}
    for i in (1, 2):
        step = spans[("rl.sft.step", i)]
        assert "rl.bucket" not in step.attributes
        for leaf in ("rl.sft.forward", "rl.sft.optimizer_step"):
            assert spans[(leaf, i)].parent.span_id == step.context.span_id
            assert spans[(leaf, i)].attributes["rl.bucket"] == "productive"
    assert current_iteration() is None  # every scope a handle held is restored


def test_end_with_an_error_marks_the_span_failed_and_end_is_idempotent(exported):
    handle = start_umbrella_span(RLSpanGroup.U_JOB, "rl.sft.job")
    handle.end(RuntimeError("boom"))
    handle.end()
    (span,) = exported.get_finished_spans()
    assert span.status.status_code.name == "ERROR" and "boom" in span.status.description
    assert not handle.is_open


def test_a_disabled_group_costs_nothing_but_the_step_keeps_its_iteration(exported):
    set_enabled_span_groups(frozenset({RLSpanGroup.POLICY_UPDATE}))
    assert start_span(RLSpanGroup.GENERATION, "rl.grpo.generate") is NOOP_HANDLE
    step = start_step_span(7, "rl.grpo.step")
    assert current_iteration() == 7
    leaf = start_span(RLSpanGroup.POLICY_UPDATE, "rl.grpo.forward")
    leaf.end()
    step.end()
    (span,) = exported.get_finished_spans()
    assert span.name == "rl.grpo.forward" and span.attributes["rl.iteration"] == 7
    assert current_iteration() is None


def test_without_telemetry_every_start_is_the_shared_noop():
    set_enabled_span_groups(())
    set_tracer_provider(None)
    assert start_step_span(1, "rl.sft.step") is NOOP_HANDLE
    assert start_span(RLSpanGroup.POLICY_UPDATE, "rl.sft.forward") is NOOP_HANDLE
    NOOP_HANDLE.end()


def test_a_handle_that_is_not_current_may_end_on_another_thread(exported, caplog):
    handle = start_span(RLSpanGroup.POLICY_UPDATE, "rl.sft.backward", current=False)
    thread = threading.Thread(target=handle.end)
    thread.start()
    thread.join()
    (span,) = exported.get_finished_spans()
    assert span.name == "rl.sft.backward" and span.end_time is not None
    assert not [r for r in caplog.records if "another thread" in r.getMessage()]


def test_a_current_handle_ended_on_another_thread_ends_and_warns(exported, caplog):
    handles = []
    thread = threading.Thread(target=lambda: handles.append(start_step_span(3, "rl.sft.step")))
    thread.start()
    thread.join()
    handles[0].end()
    (span,) = exported.get_finished_spans()
    assert span.name == "rl.sft.step" and span.end_time is not None
    assert current_iteration() is None  # this thread's scope was never touched
