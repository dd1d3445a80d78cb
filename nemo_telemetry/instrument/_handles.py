"""Span handles: a span started in one callback and ended in another, without ``with``.

Callback-driven loops (a ``transformers`` ``TrainerCallback``, Lightning hooks, Accelerate or
plain PyTorch loops written as ``on_step_begin`` / ``on_step_end``) cannot wrap a step in a
``with`` block. A handle is the same span as :func:`~nemo_telemetry.instrument.managed_span`'s,
opened by ``start_*`` and closed by :meth:`SpanHandle.end`:

    step = start_step_span(state.global_step, "rl.sft.step")     # on_step_begin
    opt = start_span(RLSpanGroup.POLICY_UPDATE, "rl.sft.optimizer_step")
    opt.end()                                                     # on_optimizer_step
    step.end()                                                    # on_step_end

A handle is made current while it is open (spans opened meanwhile are its children), and a step
handle also holds the ``iteration_scope`` of its step, so every span opened before ``end`` is
stamped with the iteration. Handles are ended on the thread that started them, innermost first,
as ``with`` blocks would be; ``end`` is idempotent, and an ``end`` from another thread still ends
the span (the starting thread's context is left as it is, with one warning). A handle started
with ``current=False`` holds no context and may end anywhere.
A disabled site returns :data:`NOOP_HANDLE` (a membership test, nothing else); a disabled step
group still holds the iteration scope, so the leaf spans of an enabled group keep their step.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from nemo_telemetry.instrument import _gate, _scopes
from nemo_telemetry.instrument._primitives import (
    SPAN_GROUP_KEY,
    LiveSpan,
    group_name,
    leaf_attributes,
    record_error,
    umbrella_attributes,
)
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["NOOP_HANDLE", "SpanHandle", "start_span", "start_step_span", "start_umbrella_span"]

_log = logging.getLogger("nemo_telemetry")
_warned_unrestored = False


class SpanHandle:
    """An open span (or only an iteration scope) that :meth:`end` closes; also a context manager."""

    __slots__ = ("_context_token", "_ended", "_iteration_token", "_thread", "span")

    def __init__(self, span: trace_api.Span | None, *, current: bool = True,
                 iteration: int | None = None) -> None:
        self.span = span
        self._context_token = None
        self._iteration_token = None
        self._ended = False
        self._thread = threading.get_ident()
        if iteration is not None:
            self._iteration_token = _scopes.ITERATION.set(int(iteration))
        if span is not None and current:
            self._context_token = context_api.attach(trace_api.set_span_in_context(span))

    @property
    def is_open(self) -> bool:
        return not self._ended

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the span (nothing when the site is disabled or the handle ended)."""
        if self.span is not None and not self._ended:
            try:
                self.span.set_attribute(key, value)
            except Exception:
                _log.warning("could not set %r on a span", key, exc_info=True)

    def end(self, error: BaseException | None = None) -> None:
        """End the span, with error status when ``error`` is given; restores what ``start`` set."""
        if self._ended:
            return
        self._ended = True
        self._restore()
        span = self.span
        if span is None:
            return
        try:
            if isinstance(error, BaseException):
                record_error(span, error)
            span.end()
        except Exception:
            _log.warning("could not end a span", exc_info=True)

    def _restore(self) -> None:
        global _warned_unrestored
        holds = self._context_token is not None or self._iteration_token is not None
        try:
            if holds and threading.get_ident() != self._thread:
                raise RuntimeError("ended on another thread")
            if self._context_token is not None:
                context_api.detach(self._context_token)
            if self._iteration_token is not None:
                _scopes.ITERATION.reset(self._iteration_token)
        except Exception:  # ended on another thread or context: the span still ends
            if not _warned_unrestored:
                _warned_unrestored = True
                _log.warning("a span handle was ended outside the thread or context that started it; its span "
                             "ends, but the current span and iteration there are left as they are (start it with "
                             "current=False to end it elsewhere)")
        self._context_token = self._iteration_token = None

    def __enter__(self) -> SpanHandle:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.end(exc if isinstance(exc, Exception) else None)

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        name = getattr(self.span, "name", None)
        return f"SpanHandle({name!r}, {state})"


class _NoopHandle(SpanHandle):
    """What a disabled site gets: ends without a trace, holds nothing."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(None, current=False)

    def end(self, error: BaseException | None = None) -> None:
        return None

    @property
    def is_open(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NOOP_HANDLE"


NOOP_HANDLE = _NoopHandle()
"""The one shared handle every disabled ``start_*`` site returns."""


def _started(name: str, attributes: dict[str, Any], tracer: trace_api.Tracer | None) -> trace_api.Span | None:
    """The span started as every enabled site starts one (a failure warns and gives None)."""
    return LiveSpan(tracer or _gate.tracer, name, attributes).start_detached()


def start_span(group: str, name: str, *, current: bool = True, tracer: trace_api.Tracer | None = None,
               **attributes: Any) -> SpanHandle:
    """Start a leaf span gated on ``group`` (its bucket and iteration as :func:`managed_span` gives them)."""
    if group not in _gate.enabled:
        return NOOP_HANDLE
    return SpanHandle(_started(name, leaf_attributes(group, name, attributes), tracer), current=current)


def start_umbrella_span(group: str, name: str, *, current: bool = True, tracer: trace_api.Tracer | None = None,
                        **attributes: Any) -> SpanHandle:
    """Start an unbucketed umbrella span gated on ``group`` (spell it ``RLSpanGroup.U_...``)."""
    if group not in _gate.enabled:
        return NOOP_HANDLE
    return SpanHandle(_started(name, umbrella_attributes(group, attributes), tracer), current=current)


def start_step_span(iteration: int, name: str, *, group: str = RLSpanGroup.U_STEP,
                    tracer: trace_api.Tracer | None = None, **attributes: Any) -> SpanHandle:
    """Start step ``iteration``'s span (``rl.<algo>.step``) and its ``iteration_scope`` until ``end``.

    With the step group disabled the handle still holds the scope, so leaf spans opened inside
    keep their ``rl.iteration``.
    """
    if group not in _gate.enabled:
        if _gate.provider is None:
            return NOOP_HANDLE
        return SpanHandle(None, current=False, iteration=iteration)
    attributes.setdefault("rl.iteration", int(iteration))
    attributes[SPAN_GROUP_KEY] = group_name(group)
    return SpanHandle(_started(name, attributes, tracer), iteration=iteration)
