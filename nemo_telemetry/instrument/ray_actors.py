"""Carrying a trace across a Ray actor call: the dispatch / receive pair, and the flush before a kill.

Ray does not propagate OpenTelemetry context, so an actor's spans start their own trace unless the
caller sends its context along. Both halves are required (seed 002, "Instrumenting inside a Ray
actor"):

- caller: ``dispatch_with_trace_context(actor.method, *args, **kwargs)`` (or ``.options(...)``
  on the method first) adds the carrier keyword to ``.remote()``; a worker group that forwards
  ``**kwargs`` takes ``**trace_context_kwargs()`` instead;
- receiver: ``@accepts_trace_context`` on the actor method pops the carrier and runs the method
  under it: around the call for functions and coroutines, around *each step* for generators and
  async generators, never across a ``yield`` (the consumer's context is not the producer's).
  A carrier reaching a process that records nothing and has no telemetry settings means the
  driver's settings never arrived (an attached cluster without ``telemetry_runtime_env``): the
  first such call warns, once.

Ray validates ``.remote()`` keyword arguments against the method's signature on the caller side,
after ``inspect.unwrap``. So the wrapper advertises the carrier keyword in its ``__signature__``
and deliberately keeps no ``__wrapped__`` (the original is ``__nemo_telemetry_wrapped__``).

``nemo-telemetry lint`` flags a decorated method that no call in the tree dispatches with a carrier:
only the decorator is visible at the definition, and a forgotten sender fails silently as root spans.

This module never imports Ray; it only calls ``.remote`` on what it is given.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Callable, Iterable, TypeVar

from opentelemetry import context as otel_context

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument.propagation import (
    TRACE_CARRIER_KWARG,
    context_from_carrier,
    current_trace_carrier,
)

__all__ = [
    "dispatch_with_trace_context",
    "accepts_trace_context",
    "TelemetryFlushMixin",
    "flush_actors_telemetry",
]

_log = logging.getLogger("nemo_telemetry")

_F = TypeVar("_F", bound=Callable[..., Any])


def dispatch_with_trace_context(method: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``method.remote(*args, **kwargs)`` with the caller's carrier added under ``trace_carrier``.

    ``method`` is ``actor.method`` or ``actor.method.options(...)``; the return value is whatever
    ``.remote()`` returns (an ObjectRef, or an ObjectRefGenerator for a streaming method). A
    carrier the caller passes explicitly wins.
    """
    kwargs.setdefault(TRACE_CARRIER_KWARG, current_trace_carrier())
    return method.remote(*args, **kwargs)


def accepts_trace_context(fn: _F) -> _F:
    """Decorate a Ray actor method so it runs under the carrier its caller dispatched.

    Works on plain functions, coroutines, generators and async generators. The carrier keyword
    (``trace_carrier``, keyword-only, default None) is added to the advertised signature; an
    absent or empty carrier leaves the method's spans as roots, exactly as without the decorator.
    """
    if inspect.isasyncgenfunction(fn):
        wrapper = _async_generator_wrapper(fn)
    elif inspect.isgeneratorfunction(fn):
        wrapper = _generator_wrapper(fn)
    elif inspect.iscoroutinefunction(fn):
        wrapper = _coroutine_wrapper(fn)
    else:
        wrapper = _function_wrapper(fn)
    functools.update_wrapper(wrapper, fn)
    del wrapper.__wrapped__  # Ray unwraps before reading the signature; keep ours visible
    wrapper.__nemo_telemetry_wrapped__ = fn
    wrapper.__signature__ = _signature_with_carrier(fn)
    return wrapper  # type: ignore[return-value]


_settings_checked = False


def _check_settings(carrier: Any) -> None:
    """The first carrier reaching a process without telemetry: warn if its settings never arrived."""
    global _settings_checked
    _settings_checked = True
    from nemo_telemetry.instrument._lifecycle import warn_worker_without_settings

    warn_worker_without_settings(carrier)


def _signature_with_carrier(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature plus ``*, trace_carrier=None`` (before any ``**kwargs``)."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    if TRACE_CARRIER_KWARG in signature.parameters:
        raise TypeError(
            f"{fn.__qualname__} already has a {TRACE_CARRIER_KWARG!r} parameter; "
            "@accepts_trace_context adds it itself, so remove it from the method"
        )
    carrier = inspect.Parameter(TRACE_CARRIER_KWARG, inspect.Parameter.KEYWORD_ONLY, default=None)
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    params.insert(at, carrier)
    return signature.replace(parameters=params)


class _StepContext:
    """The OpenTelemetry context of one generator, attached around each of its steps.

    It starts as the carrier's context and follows whatever the generator's own code attaches,
    so a span the body opens before a ``yield`` still parents what it opens after; between steps
    the consumer's context is left untouched.
    """

    __slots__ = ("_context", "_token")

    def __init__(self, context: otel_context.Context) -> None:
        self._context = context
        self._token: object | None = None

    def __enter__(self) -> None:
        self._token = otel_context.attach(self._context)

    def __exit__(self, *exc_info: Any) -> bool:
        self._context = otel_context.get_current()
        otel_context.detach(self._token)
        self._token = None
        return False


def _function_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, trace_carrier: Any = None, **kwargs: Any) -> Any:
        if trace_carrier and not _settings_checked and _gate.provider is None:
            _check_settings(trace_carrier)
        extracted = context_from_carrier(trace_carrier)
        if extracted is None:
            return fn(*args, **kwargs)
        token = otel_context.attach(extracted)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return wrapper


def _coroutine_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def wrapper(*args: Any, trace_carrier: Any = None, **kwargs: Any) -> Any:
        if trace_carrier and not _settings_checked and _gate.provider is None:
            _check_settings(trace_carrier)
        extracted = context_from_carrier(trace_carrier)
        if extracted is None:
            return await fn(*args, **kwargs)
        token = otel_context.attach(extracted)
        try:
            return await fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return wrapper


def _generator_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, trace_carrier: Any = None, **kwargs: Any) -> Any:
        if trace_carrier and not _settings_checked and _gate.provider is None:
            _check_settings(trace_carrier)
        extracted = context_from_carrier(trace_carrier)
        if extracted is None:
            return (yield from fn(*args, **kwargs))
        step = _StepContext(extracted)
        with step:
            gen = fn(*args, **kwargs)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            with step:
                try:
                    value = gen.send(to_send) if to_throw is None else gen.throw(to_throw)
                except StopIteration as stop:
                    return stop.value
            to_send, to_throw = None, None
            try:
                to_send = yield value
            except GeneratorExit:
                with step:
                    gen.close()
                raise
            except BaseException as exc:  # thrown in by the consumer: deliver it inside the context
                to_throw = exc

    return wrapper


def _async_generator_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
    async def wrapper(*args: Any, trace_carrier: Any = None, **kwargs: Any) -> Any:
        if trace_carrier and not _settings_checked and _gate.provider is None:
            _check_settings(trace_carrier)
        extracted = context_from_carrier(trace_carrier)
        if extracted is None:
            async for value in fn(*args, **kwargs):
                yield value
            return
        step = _StepContext(extracted)
        with step:
            agen = fn(*args, **kwargs)
        to_send: Any = None
        to_throw: BaseException | None = None
        while True:
            with step:
                try:
                    value = await (agen.asend(to_send) if to_throw is None else agen.athrow(to_throw))
                except StopAsyncIteration:
                    return
            to_send, to_throw = None, None
            try:
                to_send = yield value
            except GeneratorExit:
                with step:
                    await agen.aclose()
                raise
            except BaseException as exc:
                to_throw = exc

    return wrapper


class TelemetryFlushMixin:
    """Gives a Ray actor the ``flush_telemetry`` method the driver calls before ``ray.kill``.

    A killed actor runs no atexit handler, so spans still buffered in its processor are lost
    unless the driver asks it to flush first. The flush is terminal (it shuts the providers
    down), so :meth:`stop_telemetry_threads` runs first: override it to stop a collection loop
    and join its batch workers (bounded), or they would open spans against a dead processor.
    """

    def stop_telemetry_threads(self) -> None:
        """Stop and join the actor's own span-opening threads; nothing by default."""

    def flush_telemetry(self) -> bool:
        """Stop the actor's threads, then flush and shut its telemetry down; True when it flushed."""
        try:
            self.stop_telemetry_threads()
        except Exception:
            _log.warning("nemo_telemetry: stop_telemetry_threads failed before the flush", exc_info=True)
        try:
            from nemo_telemetry.instrument import shutdown_telemetry

            result = shutdown_telemetry()
            return True if result is None else bool(result)
        except Exception:
            _log.warning("nemo_telemetry: flushing telemetry before ray.kill failed", exc_info=True)
            return False


def flush_actors_telemetry(actors: Iterable[Any], *, timeout_s: float = 30.0, kill: bool = False) -> list[bool]:
    """Driver side: call ``flush_telemetry`` on every actor (bounded), then ``ray.kill`` them if asked.

    Returns each actor's flush result; an actor that failed or timed out reads ``False``. Never
    raises: a telemetry flush must not fail a run's teardown.
    """
    import ray  # lazily: this module is imported by processes that never use Ray

    actors = list(actors)
    refs = [actor.flush_telemetry.remote() for actor in actors]
    results: list[bool] = []
    for ref in refs:
        try:
            results.append(bool(ray.get(ref, timeout=timeout_s)))
        except Exception:
            _log.warning("nemo_telemetry: an actor's flush_telemetry failed or timed out", exc_info=True)
            results.append(False)
    if kill:
        for actor in actors:
            ray.kill(actor)
    return results
