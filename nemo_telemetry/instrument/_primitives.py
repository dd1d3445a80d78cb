"""Span primitives: gated leaf and umbrella spans, their decorators, and always-on spans.

A disabled site costs one membership test and returns :data:`NOOP_SPAN`, one shared object whose
``__enter__`` returns None: no attribute dict is touched, nothing is formatted, no generator-based
context manager is built. An enabled site builds a small slotted object that starts the span with
``tracer.start_span`` and makes it current with one ``context.attach`` (the SDK's
``start_as_current_span`` stacks two generator-based context managers to do the same).

Every span a gated site opens records its group as ``rl.span_group`` (the analysis decides a
group's presence by it, not by the span's name); it is set in the attribute dict the enabled
site builds anyway, so a disabled site pays nothing for it. Attribute rules, in order: the caller's ``rl.bucket`` wins, else the innermost ``bucket_scope``,
else the group's declared default (an unregistered leaf group defaults to ``overhead``);
umbrella groups and span names a group declares unbucketed get none. Inside ``iteration_scope``
every span gets ``rl.iteration`` unless the caller passed one. ``per_prompt_scope`` changes
nothing here: a span keeps its group and bucket inside it (only the data-plane client consults it).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Callable, TypeVar

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.trace import Status, StatusCode

from nemo_telemetry.instrument import _gate, _scopes
from nemo_telemetry.instrument._groups import Bucket
from nemo_telemetry.instrument._registry import REGISTRY
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = [
    "NOOP_SPAN",
    "managed_span",
    "umbrella_span",
    "trace_fn",
    "umbrella_trace_fn",
    "span_cm",
    "startup_span",
    "setup_span",
]

_log = logging.getLogger("nemo_telemetry")

BUCKET_KEY = "rl.bucket"
ITERATION_KEY = "rl.iteration"
SPAN_GROUP_KEY = "rl.span_group"
SETUP_GROUP = str(RLSpanGroup.SETUP)


class _NoopSpan:
    """What a disabled site gets: enters to None, exits without a trace."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def __repr__(self) -> str:
        return "NOOP_SPAN"


NOOP_SPAN = _NoopSpan()
"""The one shared context manager every disabled site returns."""


def record_error(span: trace_api.Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` and mark it failed (the SDK's wording, so both read alike)."""
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class LiveSpan:
    """An enabled site: starts the span on ``__enter__``, makes it current, ends it on exit.

    An exception from the body is recorded and re-raised; a failure of telemetry itself is
    logged and the body runs without a span.
    """

    __slots__ = ("_tracer", "_name", "_attributes", "_span", "_token")

    def __init__(self, tracer: trace_api.Tracer, name: str, attributes: dict[str, Any]) -> None:
        self._tracer = tracer
        self._name = name
        self._attributes = attributes
        self._span = None
        self._token = None

    def start_detached(self) -> trace_api.Span | None:
        """Start the span without making it current (generator wrappers attach it per step)."""
        try:
            return self._tracer.start_span(self._name, attributes=self._attributes)  # nemo-telemetry-lint: allow raw-otel-span
        except Exception:
            _log.warning("could not start span %r; running without it", self._name, exc_info=True)
            return None

    def __enter__(self) -> trace_api.Span | None:
        span = self.start_detached()
        if span is not None:
            self._token = context_api.attach(trace_api.set_span_in_context(span))
            self._span = span
        return span

    def __exit__(self, exc_type, exc, tb) -> None:
        span = self._span
        if span is None:
            return None
        self._span = None
        try:
            context_api.detach(self._token)
            if isinstance(exc, Exception):  # not GeneratorExit / KeyboardInterrupt: not errors of the span
                record_error(span, exc)
            span.end()
        except Exception:
            _log.warning("could not end span %r", self._name, exc_info=True)
        return None


# -- bucket defaults, cached per registry state ------------------------------------------------

_UNKNOWN_GROUP: tuple[str | None, frozenset[str]] = (Bucket.OVERHEAD.value, frozenset())
_defaults: dict[str, tuple[str | None, frozenset[str]]] = {}
_defaults_version = -1  # REGISTRY.version the table was built from
_defaults_lock = threading.Lock()


def _refresh_defaults() -> None:
    global _defaults, _defaults_version
    with _defaults_lock:
        version = REGISTRY.version  # bumped on every (un)registration
        table: dict[str, tuple[str | None, frozenset[str]]] = {}
        for name, bucket in REGISTRY.default_buckets().items():
            decl = REGISTRY.declaration(name)
            unbucketed = frozenset(decl.unbucketed_spans) if decl is not None else frozenset()
            table[name] = (bucket.value if bucket is not None else None, unbucketed)
        _defaults, _defaults_version = table, version


def group_defaults(group: str) -> tuple[str | None, frozenset[str]]:
    """``(default bucket or None for umbrellas, span names declared unbucketed)`` for a group."""
    if REGISTRY.version != _defaults_version:
        _refresh_defaults()
    return _defaults.get(group, _UNKNOWN_GROUP)


def group_name(group: str) -> str:
    """``group`` as the plain string an attribute carries (a ``GroupName`` is a str subclass, which
    an exporter need not encode as a string)."""
    return group if type(group) is str else str(group)


def umbrella_attributes(group: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """``attributes`` (the call's own fresh kwargs dict) with the group and iteration filled in."""
    attributes[SPAN_GROUP_KEY] = group_name(group)
    return stamp_iteration(attributes)


def stamp_iteration(attributes: dict[str, Any]) -> dict[str, Any]:
    """Add the scope's ``rl.iteration`` unless the caller set one."""
    if ITERATION_KEY not in attributes:
        iteration = _scopes.ITERATION.get()
        if iteration is not None:
            attributes[ITERATION_KEY] = iteration
    return attributes


def leaf_attributes(group: str, name: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """``attributes`` (the call's own fresh kwargs dict) with group, bucket and iteration filled in."""
    attributes[SPAN_GROUP_KEY] = group_name(group)
    if BUCKET_KEY in attributes:
        explicit = attributes[BUCKET_KEY]
        if type(explicit) is not str:  # a Bucket member: export its value, not the enum
            attributes[BUCKET_KEY] = str(explicit)
    else:
        default, unbucketed = group_defaults(group)
        if default is not None and name not in unbucketed:
            attributes[BUCKET_KEY] = _scopes.BUCKET.get() or default
    return stamp_iteration(attributes)


# -- gated spans ------------------------------------------------------------------------------


def managed_span(group: str, name: str, *, tracer: trace_api.Tracer | None = None, **attributes: Any):
    """``with managed_span(G, "rl.x.y", **attrs) as span:`` -- a leaf span gated on ``group``.

    ``span`` is the OpenTelemetry span, or None when the group is disabled (the body runs
    either way, so guard ``span.set_attribute`` with ``if span is not None``).
    """
    if group not in _gate.enabled:
        return NOOP_SPAN
    return LiveSpan(tracer or _gate.tracer, name, leaf_attributes(group, name, attributes))


_warned_umbrella_names: set[str] = set()


def umbrella_span(group: str, name: str, *, tracer: trace_api.Tracer | None = None, **attributes: Any):
    """Like :func:`managed_span` for an umbrella group (spell it ``RLSpanGroup.U_...``): no bucket.

    Given a leaf group it warns once per span name and emits a leaf, so the phase keeps the
    bucket it actually has.
    """
    if group not in _gate.enabled:
        return NOOP_SPAN
    if group_defaults(group)[0] is not None:
        _warn_leaf_umbrella(group, name)
        return LiveSpan(tracer or _gate.tracer, name, leaf_attributes(group, name, attributes))
    return LiveSpan(tracer or _gate.tracer, name, umbrella_attributes(group, attributes))


def _warn_leaf_umbrella(group: str, name: str) -> None:
    if name in _warned_umbrella_names:
        return
    _warned_umbrella_names.add(name)
    _log.warning(
        "umbrella_span(%r, %r): %r is a leaf group, so the span is emitted as a leaf with its bucket; "
        "use managed_span for leaf groups and umbrella_span only with an RLSpanGroup.U_* group",
        str(group), name, str(group),
    )


def span_cm(name: str, *, tracer: trace_api.Tracer | None = None, **attributes: Any):
    """An ungated, unbucketed span, emitted whenever telemetry is active (cold, top-level paths)."""
    if tracer is None:
        if _gate.provider is None:
            return NOOP_SPAN
        tracer = _gate.tracer
    return LiveSpan(tracer, name, stamp_iteration(attributes))


def startup_span(*, tracer: trace_api.Tracer | None = None, **attributes: Any):
    """``rl.startup``: the setup-group umbrella across everything before the first step."""
    return umbrella_span(SETUP_GROUP, "rl.startup", tracer=tracer, **attributes)


def setup_span(phase: str, *, tracer: trace_api.Tracer | None = None, **attributes: Any):
    """``rl.setup.<phase>`` (``ray_init``, ``tokenizer``, ``data``, ``workers`` ...), unbucketed."""
    if SETUP_GROUP not in _gate.enabled:
        return NOOP_SPAN
    return umbrella_span(SETUP_GROUP, f"rl.setup.{phase}", tracer=tracer, **attributes)


# -- decorators -------------------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])
"""A decorated function: the wrapper keeps its signature (``functools.wraps``), so a type checker does too."""


def trace_fn(group: str, name: str | None = None, *, tracer: trace_api.Tracer | None = None,
             **attributes: Any) -> Callable[[F], F]:
    """Decorator form of :func:`managed_span` for functions, coroutines, generators, async generators.

    The gate is read at each call. The span covers the body as it runs: a coroutine's span
    starts when it is awaited, a generator's when it is first advanced.
    """
    return _decorator(managed_span, group, name, tracer, attributes)


def umbrella_trace_fn(group: str, name: str | None = None, *, tracer: trace_api.Tracer | None = None,
                      **attributes: Any) -> Callable[[F], F]:
    """Decorator form of :func:`umbrella_span` (e.g. ``@umbrella_trace_fn(RLSpanGroup.U_JOB, "rl.grpo.job")``)."""
    return _decorator(umbrella_span, group, name, tracer, attributes)


def _decorator(opener, group, name, tracer, attributes) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        span_name = name or fn.__qualname__

        def open_span():
            return opener(group, span_name, tracer=tracer, **attributes)

        if inspect.isasyncgenfunction(fn):
            return _wrap_async_generator(fn, open_span)
        if inspect.isgeneratorfunction(fn):
            return _wrap_generator(fn, open_span)
        if inspect.iscoroutinefunction(fn):
            return _wrap_coroutine(fn, open_span)
        return _wrap_function(fn, open_span)

    return decorate


def _wrap_function(fn, open_span):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with open_span():
            return fn(*args, **kwargs)

    return wrapper


def _wrap_coroutine(fn, open_span):
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        with open_span():  # runs when awaited, so the span covers the body, not coroutine creation
            return await fn(*args, **kwargs)

    return wrapper


def _started(open_span) -> tuple[trace_api.Span | None, context_api.Context | None]:
    scope = open_span()
    span = scope.start_detached() if scope is not NOOP_SPAN else None
    return span, (trace_api.set_span_in_context(span) if span is not None else None)


def _wrap_generator(fn, open_span):
    # The span is current only while the generator body runs, never in the consumer's code
    # between items (a ContextVar set inside a generator would otherwise leak to its caller).
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        span, ctx = _started(open_span)
        gen = fn(*args, **kwargs)
        sent, thrown = None, None
        try:
            while True:
                token = context_api.attach(ctx) if ctx is not None else None
                try:
                    item = gen.throw(thrown) if thrown is not None else gen.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    if token is not None:
                        context_api.detach(token)
                sent, thrown = None, None
                try:
                    sent = yield item
                except GeneratorExit:
                    gen.close()
                    raise
                except BaseException as exc:  # thrown in by the consumer: forward it to the body
                    thrown = exc
        except Exception as exc:
            if span is not None:
                record_error(span, exc)
            raise
        finally:
            if span is not None:
                span.end()

    return wrapper


def _wrap_async_generator(fn, open_span):
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        span, ctx = _started(open_span)
        agen = fn(*args, **kwargs)
        sent, thrown = None, None
        try:
            while True:
                token = context_api.attach(ctx) if ctx is not None else None
                try:
                    item = await (agen.athrow(thrown) if thrown is not None else agen.asend(sent))
                except StopAsyncIteration:
                    return
                finally:
                    if token is not None:
                        context_api.detach(token)
                sent, thrown = None, None
                try:
                    sent = yield item
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as exc:
                    thrown = exc
        except Exception as exc:
            if span is not None:
                record_error(span, exc)
            raise
        finally:
            if span is not None:
                span.end()

    return wrapper
