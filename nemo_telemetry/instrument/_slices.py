"""Encoding an export batch in short slices, resting between them, so the training thread keeps the GIL.

An exporter's encoding is pure-Python work (the OTLP encoder builds one protobuf message per
span; ``MessageToDict`` walks them back). Run over a whole batch on the export thread, it takes
the GIL from the training thread whenever that thread lets go of it (a numpy call, a CUDA sync,
I/O) and keeps it until the interpreter forces a switch, one switch interval after the training
thread asked for it back: the step it lands in grows by most of the batch's encoding time.

:class:`SlicePacer` cuts a batch into slices each a fraction of the interpreter's switch interval
long (sized from the CPU time this thread spent per item in the previous slices, so no size is
fixed for a CPU) and, between slices, releases the GIL and rests, so a batch is spread over at
most as long as the exporter sat idle before it (and at most ``max_spread_s``): batches that
arrive every T seconds are each spread over about T/2. The rests shrink to nothing when batches
come back to back, so the export keeps pace with the rate they arrive at and pacing does not make
the queue overflow. A flush or shutdown does not wait on pacing: inside :func:`hurried` (which
the lifecycle's flush and shutdown enter) no pacer rests.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

__all__ = ["SlicePacer", "merge_requests", "sliced_span_exporter", "hurried"]

T = TypeVar("T")

FIRST_SLICE_ITEMS = 16
MAX_SLICE_ITEMS = 512

# Set while a flush or shutdown waits: every pacer stops resting (see :func:`hurried`).
_HURRY = threading.Event()
_hurry_lock = threading.Lock()
_hurry_depth = 0


@contextlib.contextmanager
def hurried() -> Iterator[None]:
    """While inside, no pacer rests between slices (a flush or shutdown should not wait on pacing)."""
    global _hurry_depth
    with _hurry_lock:
        _hurry_depth += 1
        _HURRY.set()
    try:
        yield
    finally:
        with _hurry_lock:
            _hurry_depth -= 1
            if _hurry_depth == 0:
                _HURRY.clear()


class SlicePacer:
    """Yields a batch in slices, resting (GIL released) between them; one per exporter.

    ``slice_fraction`` of the interpreter's switch interval is the time a slice aims at;
    ``min_items`` bounds a slice from below (an OTLP request per slice should carry more than a
    handful of spans). ``spread_fraction`` of the time since the previous batch was done, at most
    ``max_spread_s``, is the wall time a batch may be spread over: batches that come back to back
    (a backlog, a flush draining the queue) are not paced.
    """

    def __init__(self, *, slice_fraction: float = 0.2, min_items: int = 1, spread_fraction: float = 1.0,
                 max_spread_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 cpu_clock: Callable[[], float] = time.thread_time,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.slice_fraction = slice_fraction
        self.min_items = max(1, min_items)
        self.spread_fraction = spread_fraction
        self.max_spread_s = max_spread_s
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._sleep = sleep or _rest
        self._lock = threading.Lock()
        self._seconds_per_item: float | None = None
        self._previous_end = clock()
        self.slices_yielded = 0  # how many slices this pacer has handed out (for tests and benchmarks)

    def _slice_items(self) -> int:
        if self._seconds_per_item is None or self._seconds_per_item <= 0:
            return max(self.min_items, FIRST_SLICE_ITEMS)
        target_s = sys.getswitchinterval() * self.slice_fraction
        return max(self.min_items, min(MAX_SLICE_ITEMS, int(target_s / self._seconds_per_item)))

    def slices(self, items: Sequence[T]) -> Iterator[Sequence[T]]:
        """``items`` in consecutive slices, in order, each item exactly once."""
        if len(items) == 0:
            return
        with self._lock:
            start = self._clock()
            window = min(self.max_spread_s, max(0.0, (start - self._previous_end) * self.spread_fraction))
        try:
            yield from self._paced(items, start, window)
        finally:
            with self._lock:
                self._previous_end = self._clock()

    def _paced(self, items: Sequence[T], start: float, window: float) -> Iterator[Sequence[T]]:
        total, done = len(items), 0
        while done < total:
            size = self._slice_items()
            cpu_began = self._cpu_clock()
            chunk = items[done:done + size]
            self.slices_yielded += 1
            yield chunk
            # Sized by this thread's CPU time, not the wall clock: time spent waiting for the GIL
            # (or for a busy core) says nothing about how long a slice holds the GIL.
            cpu_s = self._cpu_clock() - cpu_began
            done += len(chunk)
            if cpu_s > 0:
                self._seconds_per_item = cpu_s / len(chunk)
            if done < total:
                # On schedule for the window: rest until this fraction of it has passed; at least
                # release the GIL once (sleep(0)), so a waiting thread takes it now.
                due = start + window * done / total
                self._sleep(max(0.0, due - self._clock()))


def _rest(seconds: float) -> None:
    """Sleep ``seconds`` (GIL released), cut short by :func:`hurried`; at least yield the GIL once."""
    if seconds <= 0 or _HURRY.is_set():
        time.sleep(0)
    else:
        _HURRY.wait(seconds)


def merge_requests(parts: Sequence[dict], resource_key: str, scope_key: str, items_key: str) -> dict:
    """One OTLP/JSON request from the requests of consecutive slices of one batch.

    Entries with the same resource (and, within it, the same scope) are joined in order of first
    appearance, items in slice order: the OTLP encoder's own grouping of the whole batch.
    """
    if len(parts) == 1:
        return parts[0]
    import orjson

    resources: dict[bytes, tuple[dict, dict[bytes, dict]]] = {}
    for part in parts:
        for resource_entry in part.get(resource_key, ()):
            resource_id = orjson.dumps({k: v for k, v in resource_entry.items() if k != scope_key},
                                       option=orjson.OPT_SORT_KEYS)
            if resource_id not in resources:
                merged = {k: ([] if k == scope_key else v) for k, v in resource_entry.items()}
                merged.setdefault(scope_key, [])
                resources[resource_id] = (merged, {})
            merged, scopes = resources[resource_id]
            for scope_entry in resource_entry.get(scope_key, ()):
                scope_id = orjson.dumps({k: v for k, v in scope_entry.items() if k != items_key},
                                        option=orjson.OPT_SORT_KEYS)
                if scope_id not in scopes:
                    scope_copy = dict(scope_entry)
                    scope_copy[items_key] = list(scope_entry.get(items_key, ()))
                    scopes[scope_id] = scope_copy
                    merged[scope_key].append(scope_copy)
                else:
                    scopes[scope_id][items_key].extend(scope_entry.get(items_key, ()))
    return {resource_key: [merged for merged, _ in resources.values()]}


@functools.cache
def sliced_span_exporter(exporter_class: type, **pacer_options) -> type:
    """A subclass of ``exporter_class`` (an OTLP span exporter) that sends each batch in paced slices.

    Each slice is one request of the parent's ``export``; the first slice that fails ends the
    batch (its rest is dropped, as a failed batch is), so a dead collector costs one request's
    retries per batch, not one per slice.
    """
    from opentelemetry.sdk.trace.export import SpanExportResult

    class SlicedSpanExporter(exporter_class):
        __doc__ = f"{exporter_class.__name__} sending each batch in paced slices (see nemo_telemetry's _slices)."

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.pacer = SlicePacer(**pacer_options)

        def export(self, spans):
            for chunk in self.pacer.slices(spans):
                result = super().export(chunk)
                if result is not SpanExportResult.SUCCESS:
                    return result
            return SpanExportResult.SUCCESS

    SlicedSpanExporter.__name__ = SlicedSpanExporter.__qualname__ = f"Sliced{exporter_class.__name__}"
    return SlicedSpanExporter
