"""Fixtures for the instrument tests: an in-memory exporter wired in as the telemetry provider."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nemo_telemetry.instrument import resolve, set_enabled_span_groups, set_tracer_provider


@pytest.fixture()
def exporter() -> InMemorySpanExporter:
    """Spans land here; every registered group is enabled (narrow it with ``set_enabled_span_groups``)."""
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    set_tracer_provider(provider)
    set_enabled_span_groups(resolve("all"))
    yield exp
    provider.shutdown()

