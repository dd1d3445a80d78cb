"""Gated spans, their buckets and decorators: the emission rules of seeds 000 and 002."""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from nemo_telemetry.instrument import (
    NOOP_SPAN,
    Bucket,
    RLSpanGroup,
    bucket_scope,
    group,
    managed_span,
    register_span_groups,
    REGISTRY,
    set_enabled_span_groups,
    setup_span,
    span_cm,
    startup_span,
    trace_fn,
    umbrella_span,
    umbrella_trace_fn,
)

G = RLSpanGroup


def _by_name(exporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


# -- the gate -----------------------------------------------------------------------------------


def test_disabled_group_yields_none_and_emits_nothing(exporter):
    set_enabled_span_groups([G.STEP])
    with managed_span(G.GENERATION, "rl.vllm.generate") as span:
        assert span is None
    with umbrella_span(G.U_ROLLOUT, "rl.grpo.generation") as span:
        assert span is None
    assert exporter.get_finished_spans() == ()


def test_disabled_site_returns_the_shared_noop_without_reading_attributes():
    class Exploding:
        def __str__(self):
            raise AssertionError("attributes were read on the disabled path")

    cm = managed_span(G.GENERATION, "rl.vllm.generate", **{"rl.x": Exploding()})
    assert cm is NOOP_SPAN
    assert umbrella_span(G.U_JOB, "rl.grpo.job") is NOOP_SPAN


def test_enabled_span_is_current_inside_and_yields_the_span(exporter):
    with managed_span(G.GENERATION, "rl.vllm.generate") as span:
        assert span is trace.get_current_span()
        assert span.is_recording()
    assert trace.get_current_span() is trace.INVALID_SPAN
    assert [s.name for s in exporter.get_finished_spans()] == ["rl.vllm.generate"]


def test_spans_nest_under_the_enclosing_span(exporter):
    with umbrella_span(G.U_STEP, "rl.grpo.step"):
        with managed_span(G.POLICY_UPDATE, "rl.grpo.policy_training"):
            pass
    spans = _by_name(exporter)
    assert spans["rl.grpo.policy_training"].parent.span_id == spans["rl.grpo.step"].context.span_id
    assert spans["rl.grpo.step"].parent is None


# -- buckets: the seed-000 table, precedence, umbrellas, unknown groups -------------------------

LEAF_BUCKETS = {
    G.GENERATION: "productive",
    G.REWARD: "productive",
    G.POLICY_UPDATE: "productive",
    G.DATA_PROCESSING: "overhead",
    G.DATA_PLANE: "overhead",
    G.CHECKPOINT: "overhead",
    G.LOGPROB: "overhead",
    G.ADVANTAGE: "overhead",
}
UMBRELLAS = [G.U_JOB, G.U_STEP, G.U_ROLLOUT, G.U_MODEL_INIT, G.U_EVALUATE, G.U_SETUP, G.U_PER_PROMPT]


@pytest.mark.parametrize(("group_name", "bucket"), sorted(LEAF_BUCKETS.items()))
def test_leaf_group_default_bucket(exporter, group_name, bucket):
    with managed_span(group_name, "rl.grpo.phase"):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.attributes["rl.bucket"] == bucket


@pytest.mark.parametrize("group_name", UMBRELLAS)
def test_umbrella_groups_carry_no_bucket_even_inside_a_bucket_scope(exporter, group_name):
    with bucket_scope(Bucket.PRODUCTIVE):
        with umbrella_span(group_name, "rl.grpo.umbrella"):
            pass
        with managed_span(group_name, "rl.grpo.managed_on_umbrella"):  # correct output as well
            pass
    spans = exporter.get_finished_spans()
    assert sorted(span.name for span in spans) == ["rl.grpo.managed_on_umbrella", "rl.grpo.umbrella"]
    for span in spans:
        assert "rl.bucket" not in span.attributes, span.name


def test_bucket_precedence_explicit_over_scope_over_default(exporter):
    with managed_span(G.GENERATION, "default"):
        pass
    with bucket_scope(Bucket.OVERHEAD):
        with managed_span(G.GENERATION, "scoped"):
            pass
        with managed_span(G.GENERATION, "explicit", **{"rl.bucket": Bucket.WASTED}):
            pass
        with bucket_scope("idle"):
            with managed_span(G.GENERATION, "inner_scope"):
                pass
        with managed_span(G.GENERATION, "outer_again"):
            pass
    buckets = {s.name: s.attributes["rl.bucket"] for s in exporter.get_finished_spans()}
    assert buckets == {"default": "productive", "scoped": "overhead", "explicit": "wasted",
                       "inner_scope": "idle", "outer_again": "overhead"}
    assert all(type(b) is str for b in buckets.values())


def test_bad_bucket_scope_warns_and_is_ignored(exporter, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        with bucket_scope("goodput"):
            with managed_span(G.GENERATION, "rl.vllm.generate"):
                pass
    assert "not a bucket" in caplog.text
    assert exporter.get_finished_spans()[0].attributes["rl.bucket"] == "productive"


def test_unknown_leaf_group_defaults_to_overhead(exporter):
    set_enabled_span_groups(["my_custom_phase"])
    with managed_span("my_custom_phase", "my.phase"):
        pass
    assert exporter.get_finished_spans()[0].attributes["rl.bucket"] == "overhead"


def test_group_declared_unbucketed_span_name_gets_no_bucket(exporter):
    with managed_span(G.CHECKPOINT, "rl.checkpoint.finalize"):
        pass
    with managed_span(G.CHECKPOINT, "rl.grpo.checkpointing"):
        pass
    spans = _by_name(exporter)
    assert "rl.bucket" not in spans["rl.checkpoint.finalize"].attributes
    assert spans["rl.grpo.checkpointing"].attributes["rl.bucket"] == "overhead"


def test_bucket_defaults_follow_registry_changes(exporter):
    register_span_groups("test_ns", [group("late_group", bucket=Bucket.WASTED, spans=("late.span",))])
    try:
        set_enabled_span_groups(["late_group"])
        with managed_span("late_group", "late.span"):
            pass
        register_span_groups("test_ns", [group("late_group", bucket=Bucket.PRODUCTIVE, spans=("late.span",))])
        with managed_span("late_group", "late.span"):
            pass
    finally:
        REGISTRY.unregister("test_ns")
    assert [s.attributes["rl.bucket"] for s in exporter.get_finished_spans()] == ["wasted", "productive"]


# -- umbrella_span misuse ------------------------------------------------------------------------


def test_umbrella_span_on_a_leaf_group_warns_once_per_name_and_emits_a_leaf(exporter, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        for _ in range(3):
            with umbrella_span(G.GENERATION, "rl.test.misused_umbrella"):
                pass
        with umbrella_span(G.REWARD, "rl.test.misused_umbrella_2"):
            pass
    warnings = [r for r in caplog.records if "leaf group" in r.getMessage()]
    assert len(warnings) == 2
    assert [s.attributes["rl.bucket"] for s in exporter.get_finished_spans()] == ["productive"] * 4


# -- exceptions ----------------------------------------------------------------------------------


def test_exception_is_recorded_and_reraised(exporter):
    with pytest.raises(ValueError, match="boom"):
        with managed_span(G.REWARD, "rl.grpo.reward_calculation"):
            raise ValueError("boom")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError: boom"
    assert [e.name for e in span.events] == ["exception"]
    assert span.events[0].attributes["exception.type"] == "ValueError"


def test_bad_attribute_never_raises_into_the_caller(exporter):
    class Unprintable:
        def __str__(self):
            raise RuntimeError("no string form")

    ran = []
    with managed_span(G.REWARD, "rl.reward", **{"rl.bad": Unprintable()}):
        ran.append(True)
    assert ran == [True]
    with managed_span(G.REWARD, "rl.after"):  # telemetry still works afterwards
        pass
    assert "rl.after" in _by_name(exporter)


# -- span_cm, startup_span, setup_span ------------------------------------------------------------


def test_span_cm_is_ungated_but_needs_active_telemetry(exporter):
    set_enabled_span_groups(())
    with span_cm("rl.grpo.job", **{"rl.x": 1}) as span:
        assert span is not None
    (emitted,) = exporter.get_finished_spans()
    assert emitted.attributes == {"rl.x": 1}


def test_span_cm_without_telemetry_is_the_noop():
    assert span_cm("rl.grpo.job") is NOOP_SPAN


def test_startup_and_setup_spans_are_unbucketed_setup_group_umbrellas(exporter):
    with startup_span():
        with setup_span("ray_init", **{"rl.ray.cluster_source": "started_local"}):
            pass
        with setup_span("workers"):
            pass
    spans = _by_name(exporter)
    assert set(spans) == {"rl.startup", "rl.setup.ray_init", "rl.setup.workers"}
    assert all("rl.bucket" not in s.attributes for s in spans.values())
    assert spans["rl.setup.ray_init"].parent.span_id == spans["rl.startup"].context.span_id
    assert spans["rl.setup.ray_init"].attributes["rl.ray.cluster_source"] == "started_local"
    set_enabled_span_groups([G.STEP])
    assert startup_span() is NOOP_SPAN and setup_span("data") is NOOP_SPAN


def test_explicit_tracer_is_used(exporter):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    other = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(other))
    with managed_span(G.REWARD, "rl.reward", tracer=provider.get_tracer("mine")):
        pass
    assert exporter.get_finished_spans() == ()
    assert other.get_finished_spans()[0].instrumentation_scope.name == "mine"


# -- decorators on every kind of callable ---------------------------------------------------------


def test_trace_fn_on_a_function_defaults_the_name_and_reads_the_gate_per_call(exporter):
    @trace_fn(G.REWARD, **{"rl.k": "v"})
    def compute(x):
        return x * 2

    set_enabled_span_groups(())
    assert compute(2) == 4
    assert exporter.get_finished_spans() == ()
    set_enabled_span_groups([G.REWARD])
    assert compute(3) == 6
    (span,) = exporter.get_finished_spans()
    assert span.name == compute.__qualname__
    assert dict(span.attributes) == {"rl.k": "v", "rl.bucket": "productive", "rl.span_group": "reward"}
    assert compute.__name__ == "compute"


def test_trace_fn_on_a_coroutine_covers_the_awaited_body_not_its_creation(exporter):
    @trace_fn(G.GENERATION, "rl.vllm.generate")
    async def generate():
        inner = trace.get_current_span()
        await asyncio.sleep(0.02)
        return inner

    async def main():
        coro = generate()
        await asyncio.sleep(0.05)  # a created-but-not-awaited coroutine has no span running
        assert exporter.get_finished_spans() == ()
        return await coro

    inner = asyncio.run(main())
    (span,) = exporter.get_finished_spans()
    assert inner.get_span_context().span_id == span.context.span_id
    duration_s = (span.end_time - span.start_time) / 1e9
    assert 0.015 <= duration_s < 0.045


def test_trace_fn_on_a_generator_spans_the_iteration_and_does_not_leak_context(exporter):
    seen_inside: list = []

    @trace_fn(G.DATA_PROCESSING, "rl.grpo.data_processing")
    def batches(n):
        for i in range(n):
            seen_inside.append(trace.get_current_span())
            received = yield i
            if received is not None:
                seen_inside.append(received)
        return "done"

    gen = batches(3)
    assert exporter.get_finished_spans() == ()  # nothing runs before the first next()
    assert next(gen) == 0
    assert trace.get_current_span() is trace.INVALID_SPAN  # consumer code sees no generator span
    assert gen.send("hello") == 1
    with pytest.raises(StopIteration) as stop:
        next(gen), next(gen)
    assert stop.value.value == "done"
    (span,) = exporter.get_finished_spans()
    assert seen_inside[0].get_span_context().span_id == span.context.span_id
    assert "hello" in seen_inside


def test_trace_fn_generator_closed_early_ends_its_span_without_error(exporter):
    @trace_fn(G.DATA_PROCESSING, "rl.gen")
    def forever():
        while True:
            yield 1

    gen = forever()
    next(gen)
    gen.close()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET


def test_trace_fn_on_an_async_generator(exporter):
    @umbrella_trace_fn(G.U_ROLLOUT, "rl.grpo.generation")
    async def rollouts(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i, trace.get_current_span()

    async def main():
        got = []
        async for i, current in rollouts(3):
            got.append((i, current))
            assert trace.get_current_span() is trace.INVALID_SPAN
        return got

    got = asyncio.run(main())
    (span,) = exporter.get_finished_spans()
    assert [i for i, _ in got] == [0, 1, 2]
    assert all(c.get_span_context().span_id == span.context.span_id for _, c in got)
    assert "rl.bucket" not in span.attributes


@pytest.mark.parametrize("kind", ["function", "coroutine", "generator", "async_generator"])
def test_decorated_exceptions_are_recorded_and_reraised(exporter, kind):
    error = RuntimeError(kind)

    if kind == "function":
        @trace_fn(G.REWARD, "s")
        def fn():
            raise error

        call = fn
    elif kind == "coroutine":
        @trace_fn(G.REWARD, "s")
        async def coro():
            raise error

        def call():
            return asyncio.run(coro())
    elif kind == "generator":
        @trace_fn(G.REWARD, "s")
        def gen():
            yield 1
            raise error

        def call():
            return list(gen())
    else:
        @trace_fn(G.REWARD, "s")
        async def agen():
            yield 1
            raise error

        async def drain():
            return [x async for x in agen()]

        def call():
            return asyncio.run(drain())

    with pytest.raises(RuntimeError) as raised:
        call()
    assert raised.value is error
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.events[0].attributes["exception.message"] == kind


def test_decorated_generator_and_coroutine_yield_plain_results_when_disabled(exporter):
    set_enabled_span_groups(())

    @trace_fn(G.REWARD, "g")
    def gen():
        x = yield 1
        yield x

    @umbrella_trace_fn(G.U_STEP, "c")
    async def coro():
        return 5

    g = gen()
    assert next(g) == 1 and g.send(7) == 7
    assert asyncio.run(coro()) == 5
    assert exporter.get_finished_spans() == ()


# -- emitted names belong to the groups the catalogue declares ------------------------------------


def test_helper_span_names_match_their_groups_in_the_catalogue(exporter):
    from nemo_telemetry.instrument import begin_checkpoint_finalize, checkpoint_span, efficiency_span

    with startup_span():
        with setup_span("tokenizer"):
            pass
    with checkpoint_span("ppo"):
        begin_checkpoint_finalize("/c/tmp_step_1").end()
    for category in ("idle/buffer_starvation", "idle/refit_bubble", "idle/refit_event_wait",
                     "idle/generation_limit_pause", "init/total"):
        with efficiency_span(category):
            pass
    expected_group = {"rl.startup": G.SETUP, "rl.setup.tokenizer": G.SETUP, "rl.ppo.checkpointing": G.CHECKPOINT,
                      "rl.checkpoint.finalize": G.CHECKPOINT}
    for span in exporter.get_finished_spans():
        group_name = expected_group.get(span.name, G.EFFICIENCY)
        assert group_name in REGISTRY.groups_for_span_name(span.name), span.name
