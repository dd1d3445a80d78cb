"""``rl.fleet.busy.seconds``: how long a process had work in flight, where no span can say it.

A fleet's busy time usually comes from its processes' spans. Some work has none: an async
engine's requests (``generate_async`` is dispatched one coroutine per sample, far too many to
span), or an engine nobody instrumented. Such a worker wraps each unit of work::

    async def generate_async(self, prompt):
        async with fleet_busy("generation"):
            return await self.engine.generate(prompt)

    @fleet_busy("generation")        # the same, as a decorator (sync or async)
    def generate(self, batch): ...

The series is a monotonic cumulative Sum (an ObservableCounter), unit ``s``, attributes
``rl.fleet`` (the process's fleet unless ``fleet=`` says otherwise; left out where neither says)
and ``rl.fleet.activity``. Its value is the wall-seconds during which at least one unit was in
flight since telemetry started: overlapping units count once (the union of their intervals, not
request-seconds), so ``busy / window`` is a utilisation between 0 and 1. Time still in flight is
counted up to each collection, so a worker busy for a whole run reports it step by step.

The value goes through the process's meter provider (``init_telemetry_*``), into the same dump
files or OTLP endpoint as every ``rl.*`` series. With telemetry off, ``fleet_busy`` hands back one
shared do-nothing scope. Nothing here raises into the caller.

vLLM reports its own requests: :func:`nemo_telemetry.instrument.vllm.track_vllm_busy` feeds each
finished request's prefill + decode interval into the same union.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import logging
import threading
import time
from typing import Any, Callable, Iterable

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument.metrics import get_meter

__all__ = [
    "BUSY_SECONDS",
    "FLEET_KEY",
    "ACTIVITY_KEY",
    "BusyUnion",
    "BusyScope",
    "fleet_busy",
    "busy_union",
]

_log = logging.getLogger("nemo_telemetry")

BUSY_SECONDS = "rl.fleet.busy.seconds"
FLEET_KEY = "rl.fleet"
ACTIVITY_KEY = "rl.fleet.activity"
DEFAULT_ACTIVITY = "generation"
# Closed intervals kept for merging intervals reported after the fact (a vLLM request is known
# when it finishes); older ones only keep their length. An interval reaching back past them would
# be counted again where it overlaps them, so the bound is far beyond any request's length in steps.
MAX_KEPT_INTERVALS = 512


class BusyUnion:
    """The length of the union of busy intervals, on one clock; thread-safe.

    Two ways in: :meth:`begin` / :meth:`end` around units of work (a count of units in flight;
    the busy stretch runs from the first begin to the last end), and :meth:`add_interval` for a
    stretch reported after it ended. :meth:`seconds` is the union of both up to now, and never
    decreases. ``clock`` is any monotonic seconds clock (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._inflight = 0
        self._since = 0.0
        self._starts: list[float] = []  # kept closed intervals: disjoint, sorted
        self._ends: list[float] = []
        self._closed = 0.0  # the union's length of every closed interval, kept or folded

    def begin(self) -> None:
        with self._lock:
            if self._inflight == 0:
                self._since = self._clock()
            self._inflight += 1

    def end(self) -> None:
        with self._lock:
            if self._inflight == 0:
                return  # an end without a begin: nothing was in flight
            self._inflight -= 1
            if self._inflight == 0:
                self._add_locked(self._since, self._clock())

    def add_interval(self, start: float, end: float) -> None:
        """Count ``[start, end]`` (on this union's clock); overlaps with what is counted count once."""
        if not end > start:
            return
        with self._lock:
            self._add_locked(float(start), float(end))

    def now(self) -> float:
        return self._clock()

    @property
    def in_flight(self) -> int:
        return self._inflight

    def seconds(self) -> float:
        """Busy seconds so far: the closed intervals, and the open stretch up to now where it adds."""
        with self._lock:
            if self._inflight == 0:
                return self._closed
            since, now = self._since, self._clock()
            return self._closed + max(0.0, now - since) - self._overlap_locked(since, now)

    def _overlap_locked(self, start: float, end: float) -> float:
        first = bisect.bisect_left(self._ends, start)
        return sum(max(0.0, min(e, end) - max(s, start))
                   for s, e in zip(self._starts[first:], self._ends[first:]))

    def _add_locked(self, start: float, end: float) -> None:
        lo = bisect.bisect_left(self._ends, start)  # first kept interval ending at or after start
        hi = bisect.bisect_right(self._starts, end)  # past the last one starting at or before end
        if lo < hi:
            removed = sum(e - s for s, e in zip(self._starts[lo:hi], self._ends[lo:hi]))
            start, end = min(start, self._starts[lo]), max(end, self._ends[hi - 1])
        else:
            removed = 0.0
        self._starts[lo:hi], self._ends[lo:hi] = [start], [end]
        self._closed += (end - start) - removed
        self._fold_locked()

    def _fold_locked(self) -> None:
        """Forget the oldest kept intervals beyond the bound, never one an open stretch could overlap."""
        excess = len(self._starts) - MAX_KEPT_INTERVALS
        if excess <= 0:
            return
        if self._inflight:
            excess = min(excess, bisect.bisect_left(self._ends, self._since))
        del self._starts[:excess], self._ends[:excess]


class BusyScope:
    """Units of work on one :class:`BusyUnion`: a ``with`` / ``async with`` block, or a decorator.

    It holds no per-entry state, so one scope may be entered by many threads and tasks at once.
    As a decorator it looks the process's scope up on every call: decorated at import time, a
    function records once telemetry starts.
    """

    __slots__ = ("activity", "fleet", "union")

    def __init__(self, union: BusyUnion | None, activity: str, fleet: str | None) -> None:
        self.union, self.activity, self.fleet = union, activity, fleet

    def __enter__(self) -> "BusyScope":
        if self.union is not None:
            self.union.begin()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.union is not None:
            self.union.end()

    async def __aenter__(self) -> "BusyScope":
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)

    def __call__(self, fn: Callable) -> Callable:
        activity, fleet = self.activity, self.fleet
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with fleet_busy(activity, fleet=fleet):
                    return await fn(*args, **kwargs)
            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with fleet_busy(activity, fleet=fleet):
                return fn(*args, **kwargs)
        return run


# -- the process's unions and the instrument that reports them --------------------------------

_lock = threading.Lock()
_meter: Any = None  # the meter the instrument was made on; a new one (telemetry restarted) starts afresh
_unions: dict[tuple[str | None, str], BusyUnion] = {}
_scopes: dict[tuple[str | None, str], BusyScope] = {}
_noops: dict[tuple[str | None, str], BusyScope] = {}
_process_fleet: dict[str, str] = {}  # activity -> the process fleet its points last carried


def fleet_busy(activity: str = DEFAULT_ACTIVITY, *, fleet: str | None = None) -> BusyScope:
    """A scope counting its units of work in ``rl.fleet.busy.seconds{rl.fleet, rl.fleet.activity}``.

    ``fleet`` defaults to this process's (``init_telemetry_worker(fleet=...)``, or the role
    ``traced_worker_init`` gave it). With telemetry off the scope does nothing.
    """
    key = (fleet, activity)
    if _gate.provider is None:
        noop = _noops.get(key)
        if noop is None:
            noop = _noops.setdefault(key, BusyScope(None, activity, fleet))
        return noop
    scope = _scopes.get(key)
    if scope is None or _meter_changed():
        scope = _bind(activity, fleet)
    return scope


def busy_union(activity: str = DEFAULT_ACTIVITY, *, fleet: str | None = None) -> BusyUnion | None:
    """The union ``fleet_busy(activity, fleet=fleet)`` counts in, for intervals reported after the
    fact (:meth:`BusyUnion.add_interval`); None while telemetry is off."""
    return fleet_busy(activity, fleet=fleet).union


def _meter_changed() -> bool:
    return get_meter() is not _meter


def _bind(activity: str, fleet: str | None) -> BusyScope:
    """This process's scope for ``(fleet, activity)``, the instrument made on the current meter."""
    global _meter
    key = (fleet, activity)
    try:
        meter = get_meter()
        with _lock:
            if meter is not _meter:
                _unions.clear()
                _scopes.clear()
                _process_fleet.clear()
                meter.create_observable_counter(BUSY_SECONDS, callbacks=[_observe], unit="s", description=(
                    "Wall-seconds this process had at least one unit of work in flight (overlaps count once), "
                    "by rl.fleet and rl.fleet.activity"))
                _meter = meter
            scope = _scopes.get(key)
            if scope is None:
                union = _unions.setdefault(key, BusyUnion())
                scope = _scopes[key] = BusyScope(union, activity, fleet)
        _attributes(fleet, activity)  # the process's fleet, known from the start
        return scope
    except Exception:
        _log.warning("rl.fleet.busy.seconds could not start; this work is not counted", exc_info=True)
        return BusyScope(None, activity, fleet)


def _attributes(fleet: str | None, activity: str) -> dict[str, str]:
    """The point's attributes; the process's fleet as last known (shutdown's final collection
    runs after the lifecycle has forgotten it)."""
    if fleet is None:
        from nemo_telemetry.instrument._lifecycle import current_fleet

        fleet = current_fleet() or _process_fleet.get(activity)
        if fleet:
            _process_fleet[activity] = fleet
    attributes = {ACTIVITY_KEY: activity}
    if fleet:
        attributes[FLEET_KEY] = fleet
    return attributes


def _observe(options: Any = None) -> Iterable[Any]:
    """The ObservableCounter's callback: every union's seconds at this collection."""
    from opentelemetry.metrics import Observation

    try:
        with _lock:
            unions = list(_unions.items())
        return [Observation(union.seconds(), _attributes(fleet, activity)) for (fleet, activity), union in unions]
    except Exception:
        _log.warning("rl.fleet.busy.seconds: a collection failed; it is skipped", exc_info=True)
        return []
