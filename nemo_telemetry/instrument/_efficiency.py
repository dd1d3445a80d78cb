"""Efficiency spans: waits measured as spans in the ``efficiency`` group, bucketed by category.

The bucket comes from the category (:data:`EFFICIENCY_CATEGORY_BUCKET`), not from the group,
any ``bucket_scope`` or an explicit ``rl.bucket``: the category names the phase measured, so
a caller cannot make ``idle/refit_bubble`` productive. Categories in
:data:`UNBUCKETED_SPAN_CATEGORIES` carry no bucket (they run concurrently with bucketed work).
Categories in :data:`TIMER_ONLY_CATEGORIES` (``idle/validation``, ``idle/buffer_full_backoff``,
``wasted/failed_trajectory``) emit no span at all, with one warning per category saying why:
their seconds belong in ``rl.efficiency.seconds`` (``tee_metrics("efficiency", timers)``).

Wrap a *wait*, never a phase that does instrumented work: a bucketed span must be a leaf.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace as trace_api

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument._groups import Bucket
from nemo_telemetry.instrument._primitives import (
    BUCKET_KEY,
    NOOP_SPAN,
    SPAN_GROUP_KEY,
    LiveSpan,
    record_error,
    stamp_iteration,
)
from nemo_telemetry.instrument.span_groups import (
    EFFICIENCY_CATEGORY_BUCKET,
    TIMER_ONLY_CATEGORIES,
    UNBUCKETED_SPAN_CATEGORIES,
    RLSpanGroup,
)

__all__ = ["efficiency_span", "start_efficiency_span", "EfficiencyWait", "efficiency_span_name"]

_log = logging.getLogger("nemo_telemetry")

CATEGORY_KEY = "rl.efficiency.category"
POLLS_KEY = "rl.idle.polls"
EFFICIENCY_GROUP = str(RLSpanGroup.EFFICIENCY)


def efficiency_span_name(category: str) -> str:
    """``idle/buffer_starvation`` -> ``rl.idle.buffer_starvation``: the span is named after its category."""
    return "rl." + category.replace("/", ".")


def _category_bucket(category: str) -> str | None:
    if category in UNBUCKETED_SPAN_CATEGORIES:
        return None
    bucket = EFFICIENCY_CATEGORY_BUCKET.get(category)
    if bucket is None:  # an undeclared category: its prefix if that names a bucket, else idle
        try:
            bucket = Bucket(category.split("/", 1)[0])
        except ValueError:
            bucket = Bucket.IDLE
    return bucket.value


def _efficiency_attributes(category: str, attributes: dict[str, Any]) -> dict[str, Any]:
    attributes[CATEGORY_KEY] = category
    attributes[SPAN_GROUP_KEY] = EFFICIENCY_GROUP
    bucket = _category_bucket(category)
    if bucket is None:
        attributes.pop(BUCKET_KEY, None)
    else:
        attributes[BUCKET_KEY] = bucket
    return stamp_iteration(attributes)


_warned_timer_only: set[str] = set()


def _timer_only(category: str) -> bool:
    """Whether ``category`` is Timer-only; warns once per category per process when it is."""
    reason = TIMER_ONLY_CATEGORIES.get(category)
    if reason is None:
        return False
    if category not in _warned_timer_only:
        _warned_timer_only.add(category)
        _log.warning(
            "efficiency_span(%r) emits no span: %r is Timer-only because %s. Its time stays in "
            "rl.efficiency.seconds: tee the trainer's timer with tee_metrics('efficiency', {%r: seconds})",
            category, category, reason, category)
    return True


def efficiency_span(category: str, name: str | None = None, *, tracer: trace_api.Tracer | None = None,
                    **attributes: Any):
    """``with efficiency_span("idle/refit_bubble"):`` -- one span around one wait (None when disabled).

    A Timer-only category (:data:`TIMER_ONLY_CATEGORIES`) yields None and emits nothing.
    """
    if EFFICIENCY_GROUP not in _gate.enabled or _timer_only(category):
        return NOOP_SPAN
    return LiveSpan(tracer or _gate.tracer, name or efficiency_span_name(category),
                    _efficiency_attributes(category, attributes))


class EfficiencyWait:
    """One poll-loop wait as one span: open on the first starved poll, ``poll()`` per retry, ``end()``.

    The span is never made current: held open across ``await`` points, a current span would be
    copied into every task created during the wait and adopt unrelated work as its children.
    ``end()`` sets ``rl.idle.polls`` and is idempotent; ``with`` ends it (recording an error).
    """

    __slots__ = ("span", "polls")

    def __init__(self, span: trace_api.Span | None) -> None:
        self.span = span
        self.polls = 0

    def poll(self) -> None:
        """Count one starved poll (call it on every retry, the first included)."""
        self.polls += 1

    def end(self, error: BaseException | None = None) -> None:
        """Close the wait: ``rl.idle.polls`` and the end time (and an error status if given)."""
        span, self.span = self.span, None
        if span is None:
            return
        try:
            span.set_attribute(POLLS_KEY, self.polls)
            if error is not None:
                record_error(span, error)
            span.end()
        except Exception:
            _log.warning("could not end efficiency span", exc_info=True)

    def __enter__(self) -> "EfficiencyWait":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.end(exc if isinstance(exc, Exception) else None)


class _NoopWait(EfficiencyWait):
    __slots__ = ()

    def poll(self) -> None:
        return None

    def end(self, error: BaseException | None = None) -> None:
        return None


NOOP_WAIT = _NoopWait(None)
"""What ``start_efficiency_span`` returns while the efficiency group is off."""


def start_efficiency_span(category: str, name: str | None = None, *, tracer: trace_api.Tracer | None = None,
                          **attributes: Any) -> EfficiencyWait:
    """Open a hand-managed efficiency span for a poll loop; see :class:`EfficiencyWait`.

    Parented on the span current at the call, not made current itself. Returns the shared
    :data:`NOOP_WAIT` (``poll``/``end`` do nothing) while the efficiency group is off, and for a
    Timer-only category.
    """
    if EFFICIENCY_GROUP not in _gate.enabled or _timer_only(category):
        return NOOP_WAIT
    scope = LiveSpan(tracer or _gate.tracer, name or efficiency_span_name(category),
                     _efficiency_attributes(category, attributes))
    span = scope.start_detached()
    return EfficiencyWait(span) if span is not None else NOOP_WAIT
