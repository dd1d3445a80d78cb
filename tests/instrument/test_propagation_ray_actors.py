"""@accepts_trace_context and dispatch_with_trace_context, in one process (no Ray cluster).

The cross-process behaviour is in tests/integration/test_ray_propagation.py; here each method
kind is called the way Ray's worker calls it (with the carrier keyword), from a thread with no
ambient context, and the signature Ray validates on the caller side is checked with Ray's own code.
"""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ray._common.signature import extract_signature, flatten_args

from nemo_telemetry.instrument.propagation import TRACE_CARRIER_KWARG, current_trace_carrier
from nemo_telemetry.instrument.ray_actors import accepts_trace_context, dispatch_with_trace_context

_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(_exporter))
tracer = _provider.get_tracer("test")


@pytest.fixture(autouse=True)
def _clear():
    _exporter.clear()


def _spans() -> dict:
    return {s.name: s for s in _exporter.get_finished_spans()}


def _in_thread(fn):
    out: list = []
    errors: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


class Actor:
    @accepts_trace_context
    def work(self, x, *, scale=1):
        with tracer.start_as_current_span("sync"):
            return x * scale

    @accepts_trace_context
    async def awork(self, x):
        with tracer.start_as_current_span("async"):
            await asyncio.sleep(0)
            return x + 1

    @accepts_trace_context
    def stream(self, n):
        with tracer.start_as_current_span("stream"):
            for i in range(n):
                with tracer.start_as_current_span(f"item{i}"):
                    pass
                yield i

    @accepts_trace_context
    async def astream(self, n):
        with tracer.start_as_current_span("astream"):
            for i in range(n):
                with tracer.start_as_current_span(f"aitem{i}"):
                    await asyncio.sleep(0)
                yield i

    @accepts_trace_context
    def with_kwargs(self, a, **extra):
        return a, extra


def _driver_carrier():
    with tracer.start_as_current_span("driver") as driver:
        carrier = current_trace_carrier()
    return driver.get_span_context(), carrier


def test_decorated_methods_keep_their_kind():
    assert not inspect.iscoroutinefunction(Actor.work) and not inspect.isgeneratorfunction(Actor.work)
    assert inspect.iscoroutinefunction(Actor.awork)
    assert inspect.isgeneratorfunction(Actor.stream)
    assert inspect.isasyncgenfunction(Actor.astream)
    assert Actor.work.__name__ == "work" and Actor.work.__nemo_telemetry_wrapped__.__name__ == "work"


@pytest.mark.parametrize("name", ["work", "awork", "stream", "astream", "with_kwargs"])
def test_ray_sees_the_carrier_keyword_in_the_signature(name):
    # Ray unwraps the method, extracts its signature dropping `self`, then binds .remote() args.
    method = inspect.unwrap(getattr(Actor, name))
    params = extract_signature(method, ignore_first=True)
    assert TRACE_CARRIER_KWARG in [p.name for p in params]
    flatten_args(params, (1,), {TRACE_CARRIER_KWARG: {"traceparent": "x"}})  # does not raise


def test_ray_still_rejects_a_misspelled_carrier_keyword():
    params = extract_signature(inspect.unwrap(Actor.work), ignore_first=True)
    with pytest.raises(TypeError):
        flatten_args(params, (1,), {"trace_carier": {}})


def test_carrier_parameter_is_placed_before_var_keyword():
    params = list(inspect.signature(Actor.with_kwargs).parameters)
    assert params == ["self", "a", TRACE_CARRIER_KWARG, "extra"]
    assert Actor().with_kwargs(1, trace_carrier={}, b=2) == (1, {"b": 2})


def test_sync_method_runs_under_the_carrier():
    driver, carrier = _driver_carrier()
    assert _in_thread(lambda: Actor().work(3, scale=2, trace_carrier=carrier)) == 6
    span = _spans()["sync"]
    assert span.parent.span_id == driver.span_id and span.context.trace_id == driver.trace_id


def test_without_a_carrier_the_spans_are_roots():
    assert _in_thread(lambda: Actor().work(3)) == 3
    assert _in_thread(lambda: Actor().work(3, trace_carrier={})) == 3
    assert _spans()["sync"].parent is None


def test_coroutine_method_runs_under_the_carrier():
    driver, carrier = _driver_carrier()
    assert _in_thread(lambda: asyncio.run(Actor().awork(1, trace_carrier=carrier))) == 2
    assert _spans()["async"].parent.span_id == driver.span_id


def test_generator_is_under_the_carrier_per_step_and_the_consumer_is_not():
    driver, carrier = _driver_carrier()

    def consume():
        seen = []
        for value in Actor().stream(3, trace_carrier=carrier):
            # between steps the consumer's context is its own (here: none)
            seen.append((value, trace.get_current_span().get_span_context().is_valid))
        return seen

    assert _in_thread(consume) == [(0, False), (1, False), (2, False)]
    spans = _spans()
    assert spans["stream"].parent.span_id == driver.span_id
    for i in range(3):  # a span the body opened before a yield still parents what it opens after
        assert spans[f"item{i}"].parent.span_id == spans["stream"].context.span_id


def test_generator_send_throw_and_close_reach_the_body():
    events = []

    @accepts_trace_context
    def echo():
        try:
            while True:
                try:
                    got = yield trace.get_current_span().get_span_context().is_valid
                    events.append(("sent", got))
                except ValueError as exc:
                    events.append(("thrown", str(exc), trace.get_current_span().get_span_context().is_valid))
        finally:
            events.append(("closed", trace.get_current_span().get_span_context().is_valid))

    _, carrier = _driver_carrier()

    def drive():
        gen = echo(trace_carrier=carrier)
        first = next(gen)
        gen.send("hello")
        gen.throw(ValueError("bad"))
        gen.close()
        return first

    assert _in_thread(drive) is True
    assert events == [("sent", "hello"), ("thrown", "bad", True), ("closed", True)]


def test_generator_return_value_survives():
    @accepts_trace_context
    def gen():
        yield 1
        return "done"

    def drive():
        g = gen(trace_carrier=_driver_carrier()[1])
        next(g)
        with pytest.raises(StopIteration) as stop:
            next(g)
        return stop.value.value

    assert _in_thread(drive) == "done"


def test_async_generator_is_under_the_carrier_per_step():
    driver, carrier = _driver_carrier()

    async def consume():
        seen = []
        async for value in Actor().astream(2, trace_carrier=carrier):
            seen.append((value, trace.get_current_span().get_span_context().is_valid))
        return seen

    assert _in_thread(lambda: asyncio.run(consume())) == [(0, False), (1, False)]
    spans = _spans()
    assert spans["astream"].parent.span_id == driver.span_id
    assert spans["aitem1"].parent.span_id == spans["astream"].context.span_id


def test_async_generator_aclose_runs_the_body_cleanup():
    closed = []

    @accepts_trace_context
    async def agen():
        try:
            yield 1
            yield 2
        finally:
            closed.append(trace.get_current_span().get_span_context().is_valid)

    _, carrier = _driver_carrier()

    async def drive():
        gen = agen(trace_carrier=carrier)
        assert await gen.__anext__() == 1
        await gen.aclose()

    _in_thread(lambda: asyncio.run(drive()))
    assert closed == [True]


def test_decorating_a_method_that_already_takes_the_keyword_is_refused():
    with pytest.raises(TypeError, match=TRACE_CARRIER_KWARG):
        @accepts_trace_context
        def bad(self, trace_carrier=None):
            pass


class _RecordingMethod:
    """What dispatch_with_trace_context needs from `actor.method`: a `.remote`."""

    def __init__(self):
        self.calls = []

    def remote(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return "ref"


def test_dispatch_adds_the_callers_carrier_and_an_explicit_one_wins():
    method = _RecordingMethod()
    assert dispatch_with_trace_context(method, 1, k=2) == "ref"
    assert method.calls[-1] == ((1,), {"k": 2, TRACE_CARRIER_KWARG: {}})
    with tracer.start_as_current_span("driver"):
        carrier = current_trace_carrier()
        dispatch_with_trace_context(method, 1)
        assert method.calls[-1][1][TRACE_CARRIER_KWARG] == carrier
        dispatch_with_trace_context(method, trace_carrier={"traceparent": "explicit"})
        assert method.calls[-1][1][TRACE_CARRIER_KWARG] == {"traceparent": "explicit"}
