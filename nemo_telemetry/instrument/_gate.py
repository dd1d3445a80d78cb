"""The gate and the tracer: process-wide state every instrumentation site reads.

The enabled span groups are one frozenset, replaced (never mutated) when telemetry starts or
stops, so a site's check is a single membership test with no lock. The tracer is looked up once,
when a provider is installed, never per call: a per-call ``get_tracer`` roughly doubles the cost
of an enabled span.
"""

from __future__ import annotations

from typing import Iterable

from opentelemetry import trace as trace_api

__all__ = [
    "is_span_group_enabled",
    "enabled_span_groups",
    "set_enabled_span_groups",
    "get_tracer",
    "get_tracer_provider",
    "set_tracer_provider",
    "telemetry_active",
    "GLOBAL_TRACER_PROVIDER",
]

TRACER_NAME = "nemo_telemetry"

_NOOP_TRACER = trace_api.NoOpTracer()

# Read directly (as ``_gate.enabled`` / ``_gate.tracer``) by the primitives' hot paths.
enabled: frozenset[str] = frozenset()
tracer: trace_api.Tracer = _NOOP_TRACER
provider: trace_api.TracerProvider | None = None


def is_span_group_enabled(group: str) -> bool:
    """Whether spans of ``group`` are emitted in this process: one frozenset membership test."""
    return group in enabled


def enabled_span_groups() -> frozenset[str]:
    """The resolved span groups of this process (empty while telemetry is off)."""
    return enabled


def set_enabled_span_groups(groups: Iterable[str] | str) -> frozenset[str]:
    """Replace the enabled set with these *resolved* group names (tests and advanced use).

    A string is split on commas; presets are not expanded here (use ``resolve`` for a spec).
    """
    global enabled
    names = groups.split(",") if isinstance(groups, str) else groups
    enabled = frozenset(n for n in (str(g).strip().lower() for g in names) if n)
    return enabled


def get_tracer() -> trace_api.Tracer:
    """The tracer of this process's telemetry provider, or a no-op tracer while telemetry is off."""
    return tracer


def get_tracer_provider() -> trace_api.TracerProvider | None:
    """The SDK provider nemo-telemetry installed (or was given), else None."""
    return provider


def telemetry_active() -> bool:
    """True while a tracer provider is installed (``span_cm`` emits only then)."""
    return provider is not None


def set_tracer_provider(new_provider: trace_api.TracerProvider | None) -> None:
    """Emit through ``new_provider`` from now on (None: back to the no-op tracer).

    ``init_telemetry_*`` call this; tests and applications that configure OpenTelemetry
    themselves may call it directly. It does not shut the previous provider down.
    """
    global provider, tracer
    if new_provider is None:
        provider, tracer = None, _NOOP_TRACER
        return
    provider = new_provider
    tracer = new_provider.get_tracer(TRACER_NAME, _version())


class _FollowingTracer(trace_api.Tracer):
    """A tracer that always emits through nemo-telemetry's *current* provider (no-op when none)."""

    def __init__(self, *args) -> None:
        self._args = args
        self._for: trace_api.TracerProvider | None = None
        self._tracer: trace_api.Tracer = _NOOP_TRACER

    def _current(self) -> trace_api.Tracer:
        current = provider
        if current is None:
            return _NOOP_TRACER
        if self._for is not current:
            self._tracer, self._for = current.get_tracer(*self._args), current
        return self._tracer

    def start_span(self, *args, **kwargs) -> trace_api.Span:
        return self._current().start_span(*args, **kwargs)

    def start_as_current_span(self, *args, **kwargs):
        return self._current().start_as_current_span(*args, **kwargs)


class _FollowingTracerProvider(trace_api.TracerProvider):
    """Installed as OpenTelemetry's global provider, so third-party instrumentation (aiohttp,
    FastAPI, vLLM) emits through whatever provider nemo-telemetry has now, across re-inits and
    shutdowns, even though the global itself can only be set once per process."""

    def get_tracer(self, instrumenting_module_name, instrumenting_library_version=None, schema_url=None,
                   attributes=None) -> trace_api.Tracer:
        return _FollowingTracer(instrumenting_module_name, instrumenting_library_version, schema_url, attributes)


GLOBAL_TRACER_PROVIDER = _FollowingTracerProvider()
"""What ``init_telemetry_*`` installs as the global provider (only if no one else has set one)."""


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("nemo-telemetry")
    except Exception:  # not installed as a distribution (a source checkout)
        return "0.0.0"
