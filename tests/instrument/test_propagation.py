"""Carriers in one process: capture, re-attach in another thread, and the harmless empty case."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from nemo_telemetry.instrument.propagation import (
    TRACE_CARRIER_KWARG,
    TraceCarrierThread,
    current_trace_carrier,
    remote_trace_context,
    run_with_carrier,
    trace_context_kwargs,
)


@pytest.fixture()
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture()
def tracer(exporter: InMemorySpanExporter) -> trace.Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def _by_name(exporter: InMemorySpanExporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


def _in_thread(fn):
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_carrier_is_empty_when_no_span_is_recording():
    assert current_trace_carrier() == {}
    assert trace_context_kwargs() == {TRACE_CARRIER_KWARG: {}}


def test_carrier_is_empty_under_a_sampled_out_span():
    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    with tracer.start_as_current_span("dropped"):
        assert current_trace_carrier() == {}


def test_carrier_names_the_active_span(tracer):
    with tracer.start_as_current_span("driver") as span:
        carrier = current_trace_carrier()
        assert trace_context_kwargs() == {TRACE_CARRIER_KWARG: carrier}
    ctx = span.get_span_context()
    version, trace_id, span_id, flags = carrier["traceparent"].split("-")
    assert (version, trace_id, span_id) == ("00", f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}")
    assert int(flags, 16) & 0x01  # sampled


def test_a_thread_joins_the_trace_only_with_the_carrier(tracer, exporter):
    def child(name, carrier):
        with remote_trace_context(carrier):
            with tracer.start_as_current_span(name):
                pass

    with tracer.start_as_current_span("parent") as parent:
        carrier = current_trace_carrier()
        _in_thread(lambda: child("with_carrier", carrier))
        _in_thread(lambda: child("without_carrier", {}))

    spans = _by_name(exporter)
    pctx = parent.get_span_context()
    assert spans["with_carrier"].parent.span_id == pctx.span_id
    assert spans["with_carrier"].context.trace_id == pctx.trace_id
    assert spans["without_carrier"].parent is None  # threads inherit no context
    assert spans["without_carrier"].context.trace_id != pctx.trace_id


@pytest.mark.parametrize("carrier", [None, {}, {"traceparent": "garbage"}, {"unrelated": "x"}])
def test_empty_or_malformed_carrier_keeps_the_ambient_parent(tracer, exporter, carrier):
    with tracer.start_as_current_span("ambient") as ambient:
        with remote_trace_context(carrier):
            with tracer.start_as_current_span("inner"):
                pass
    assert _by_name(exporter)["inner"].parent.span_id == ambient.get_span_context().span_id


def test_context_is_detached_on_exit_even_after_an_exception(tracer, exporter):
    with tracer.start_as_current_span("remote") as remote:
        carrier = current_trace_carrier()

    def body():
        with pytest.raises(RuntimeError):
            with remote_trace_context(carrier):
                raise RuntimeError("boom")
        return trace.get_current_span().get_span_context().is_valid

    assert _in_thread(body) is False
    assert remote.get_span_context().is_valid


def test_trace_carrier_thread_captures_the_constructing_span(tracer, exporter):
    def work():
        with tracer.start_as_current_span("thread_work"):
            pass

    with tracer.start_as_current_span("loop") as loop:
        thread = TraceCarrierThread(target=work, name="collector-loop")
    thread.start()
    thread.join()
    assert _by_name(exporter)["thread_work"].parent.span_id == loop.get_span_context().span_id


def test_trace_carrier_thread_takes_an_explicit_carrier(tracer, exporter):
    with tracer.start_as_current_span("job") as job:
        carrier = current_trace_carrier()
    with tracer.start_as_current_span("unrelated"):
        thread = TraceCarrierThread(target=lambda: tracer.start_span("batch").end(), carrier=carrier)
    thread.start()
    thread.join()
    assert _by_name(exporter)["batch"].parent.span_id == job.get_span_context().span_id


def test_run_with_carrier_parents_executor_jobs(tracer, exporter):
    def batch(i):
        with tracer.start_as_current_span(f"batch{i}"):
            return i * 2

    with tracer.start_as_current_span("collector") as collector:
        carrier = current_trace_carrier()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda i: run_with_carrier(carrier, batch, i), range(3)))
    assert results == [0, 2, 4]
    spans = _by_name(exporter)
    for i in range(3):
        assert spans[f"batch{i}"].parent.span_id == collector.get_span_context().span_id
