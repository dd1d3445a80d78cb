"""Trace-context carriers: how one trace crosses threads, processes and Ray actors.

OpenTelemetry context lives in a ContextVar, so it reaches nested calls and coroutines but not a
new thread, a Ray actor or another process. A *carrier* is the W3C ``traceparent`` /
``tracestate`` pair of the active span, as a plain ``dict[str, str]`` that pickles anywhere; the
receiving side re-attaches it with :func:`remote_trace_context`. Without a carrier the far side's
spans start their own traces and the rollouts "vanish from the waterfall" (seed 000).

Both halves are harmless when nothing records: :func:`current_trace_carrier` returns ``{}`` and
``remote_trace_context({})`` does nothing, so call sites need no ``if telemetry`` guard. Nothing
here raises into the caller: a malformed carrier is ignored with a debug log.

Only the OpenTelemetry API is used, so this works with whatever tracer provider is installed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "TRACE_CARRIER_KWARG",
    "current_trace_carrier",
    "remote_trace_context",
    "trace_context_kwargs",
    "run_with_carrier",
    "TraceCarrierThread",
]

_log = logging.getLogger("nemo_telemetry")

TRACE_CARRIER_KWARG = "trace_carrier"
"""The one keyword a carrier travels under: Ray actor methods, constructors and worker-group kwargs."""

PROPAGATOR = TraceContextTextMapPropagator()  # W3C only: a carrier is traceparent (+ tracestate)

_T = TypeVar("_T")


def current_trace_carrier() -> dict[str, str]:
    """The active span as a W3C carrier, or ``{}`` when no span is recording.

    An empty carrier is the documented "nothing to join" value: when the enclosing group (for
    example ``job``) is disabled, the far side falls back to root spans instead of failing.
    """
    try:
        if not trace.get_current_span().is_recording():
            return {}
        carrier: dict[str, str] = {}
        PROPAGATOR.inject(carrier)
        return carrier
    except Exception:  # telemetry never raises into a training run
        _log.debug("nemo_telemetry: could not capture a trace carrier", exc_info=True)
        return {}


def trace_context_kwargs() -> dict[str, dict[str, str]]:
    """``{TRACE_CARRIER_KWARG: current_trace_carrier()}``, to splat into a call's keyword arguments.

    The key is present even when the carrier is empty, so a receiver that forgot
    ``@accepts_trace_context`` fails the same way with telemetry off as with it on.
    """
    return {TRACE_CARRIER_KWARG: current_trace_carrier()}


class _NoopContext:
    """The shared do-nothing context manager for an empty or unusable carrier."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: Any) -> bool:
        return False


_NOOP = _NoopContext()


class _AttachedContext:
    """Attaches an extracted context on enter and detaches it on exit, in the same thread/task."""

    __slots__ = ("_context", "_token")

    def __init__(self, context: otel_context.Context) -> None:
        self._context = context
        self._token: object | None = None

    def __enter__(self) -> None:
        self._token = otel_context.attach(self._context)

    def __exit__(self, *exc_info: Any) -> bool:
        if self._token is not None:
            otel_context.detach(self._token)
            self._token = None
        return False


def context_from_carrier(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context a carrier describes, or None when it is empty or names no valid span.

    A malformed carrier yields None rather than an empty context: attaching an empty context
    would cut spans off from a parent that *is* ambient.
    """
    if not carrier:
        return None
    try:
        extracted = PROPAGATOR.extract(dict(carrier))
        if not trace.get_current_span(extracted).get_span_context().is_valid:
            _log.debug("nemo_telemetry: ignoring a trace carrier without a valid traceparent: %r", carrier)
            return None
        return extracted
    except Exception:
        _log.debug("nemo_telemetry: could not read trace carrier %r", carrier, exc_info=True)
        return None


def remote_trace_context(carrier: Mapping[str, str] | None):
    """Context manager: spans opened inside are children of the carrier's span.

    An empty, None or malformed carrier is a no-op (the ambient context is kept). Enter and exit
    in the same thread; use it once per thread, since threads inherit no OpenTelemetry context.
    """
    extracted = context_from_carrier(carrier)
    return _NOOP if extracted is None else _AttachedContext(extracted)


def run_with_carrier(carrier: Mapping[str, str] | None, fn: Callable[..., _T], /, *args: Any,
                     **kwargs: Any) -> _T:
    """Call ``fn(*args, **kwargs)`` inside ``remote_trace_context(carrier)``.

    The one-liner for a thread target or an executor job: ``pool.submit(run_with_carrier,
    self._carrier, self._run_batch, batch)`` puts the batch worker's spans under the carrier.
    """
    with remote_trace_context(carrier):
        return fn(*args, **kwargs)


class TraceCarrierThread(threading.Thread):
    """A thread whose target runs under a trace carrier (the async-collector pattern).

    ``carrier`` defaults to the carrier of the span active where the thread is *constructed*, so
    a thread started inside a span reads as its child. A Ray actor passes the carrier it captured
    at construction explicitly, since its methods run with no ambient context of their own.
    """

    def __init__(self, *args: Any, carrier: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trace_carrier: dict[str, str] = dict(carrier) if carrier is not None else current_trace_carrier()

    def run(self) -> None:
        with remote_trace_context(self.trace_carrier):
            super().run()
