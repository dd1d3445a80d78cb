"""Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing) from a spans table.

One process per (service, rank) with ``process_name`` metadata; spans are complete ("X")
events. A track (tid) must hold properly nested events only: Perfetto drops or misplaces
complete events that overlap without nesting, which is exactly what concurrent rollouts, a
child that outlives its parent, or spans from two threads of one process look like. So tracks
are assigned by greedy interval packing: in start order (outer spans first on ties), a span
goes on its parent's track if it fits inside the innermost open span there, else on the
lowest-numbered empty track, else on a new one. A span whose end is before its start is drawn
with zero duration and ``invalid_interval`` in its args. Where a child runs in another process
than its parent, a flow arrow (``s``/``f`` events) joins them. Timestamps are microseconds (floats) from the earliest
span; the origin in Unix nanoseconds is in ``otherData``.
"""

from __future__ import annotations

import heapq

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION, SPAN_GROUP
from nemo_telemetry.analysis.views.waterfall import waterfall

__all__ = ["to_chrome_trace", "assign_tracks"]

# Chrome's reserved colour names for the bucket colours (Perfetto picks its own).
_CNAMES = {"productive": "good", "overhead": "yellow", "idle": "rail_idle", "wasted": "terrible"}


def to_chrome_trace(
    spans: pa.Table,
    *,
    run_id: str | None = None,
    trace_id: str | None = None,
    step: int | None = None,
) -> dict:
    """The trace-event document for the spans a waterfall with the same selection shows."""
    rows = waterfall(spans, run_id=run_id, trace_id=trace_id, step=step, collapse_threshold=None,
                     fold_steps=False).rows
    source = spans.take(rows.column("span_row"))
    start = rows.column("start_ns").to_numpy()
    invalid = rows.column("end_ns").to_numpy() < start
    end = np.maximum(rows.column("end_ns").to_numpy(), start)
    origin = int(start.min()) if len(start) else 0
    processes = _process_ids(rows)
    tracks = assign_tracks(processes, start, end, rows.column("parent").to_numpy())
    events = _metadata(rows, processes, tracks)
    events.extend(_span_events(rows, source, processes, tracks, start - origin, end - start, invalid))
    events.extend(_flow_events(rows, processes, tracks, start - origin, end - origin))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"origin_unix_ns": str(origin), "exporter": "nemo-telemetry"},
    }


def assign_tracks(process: np.ndarray, start: np.ndarray, end: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """A track number per span (from 1, per process) such that spans on one track nest properly."""
    n = len(start)
    tracks = np.zeros(n, dtype=np.int64)
    order = np.lexsort((np.arange(n), -end, start, process))
    state: dict[int, _Packer] = {}
    for i in order.tolist():
        packer = state.setdefault(int(process[i]), _Packer())
        preferred = int(tracks[parent[i]]) if parent[i] >= 0 and process[parent[i]] == process[i] else 0
        tracks[i] = packer.place(int(start[i]), int(end[i]), preferred)
    return tracks


class _Packer:
    """Tracks of one process: a stack of open span ends per track, and a heap of free tracks."""

    def __init__(self):
        self.stacks: dict[int, list[int]] = {}
        self.free: list[int] = []
        self.releases: list[tuple[int, int]] = []  # (end of the outermost span, track)

    def place(self, start: int, end: int, preferred: int) -> int:
        self._release(start)
        if preferred and self._fits(preferred, start, end):
            return self._push(preferred, end)
        track = heapq.heappop(self.free) if self.free else len(self.stacks) + 1
        return self._push(track, end)

    def _fits(self, track: int, start: int, end: int) -> bool:
        stack = self.stacks.get(track)
        while stack and stack[-1] <= start:
            stack.pop()
        return bool(stack) and stack[-1] >= end

    def _push(self, track: int, end: int) -> int:
        stack = self.stacks.setdefault(track, [])
        if not stack:
            heapq.heappush(self.releases, (end, track))
        stack.append(end)
        return track

    def _release(self, now: int) -> None:
        """Tracks whose outermost span has ended by ``now`` are empty: free them."""
        while self.releases and self.releases[0][0] <= now:
            _, track = heapq.heappop(self.releases)
            self.stacks[track].clear()
            heapq.heappush(self.free, track)


def _process_ids(rows: pa.Table) -> np.ndarray:
    """pid per row, one per (run, service, rank), numbered from 1 in order of first appearance."""
    keys = list(zip(rows.column("run_id").to_pylist(), rows.column("service_name").to_pylist(),
                    rows.column("rank").to_pylist()))
    ids: dict[tuple, int] = {}
    return np.array([ids.setdefault(k, len(ids) + 1) for k in keys], dtype=np.int64)


def _metadata(rows: pa.Table, processes: np.ndarray, tracks: np.ndarray) -> list[dict]:
    runs = rows.column("run_id").to_pylist()
    services = rows.column("service_name").to_pylist()
    ranks = rows.column("rank").to_pylist()
    events: list[dict] = []
    named: set[int] = set()
    several_runs = len(set(runs)) > 1
    for i, pid in enumerate(processes.tolist()):
        if pid in named:
            continue
        named.add(pid)
        label = f"{services[i] or 'unknown service'}" + (f" rank {ranks[i]}" if ranks[i] is not None else "")
        if several_runs:
            label += f" ({runs[i]})"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for pid, tid in sorted(set(zip(processes.tolist(), tracks.tolist()))):
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"spans {tid}"}})
    return events


def _flow_events(rows: pa.Table, processes, tracks, start_rel, end_rel) -> list[dict]:
    """An arrow from parent to child wherever a child runs in another process (a carrier
    crossed a thread, actor or HTTP hop): flow start inside the parent, end at the child."""
    parent = rows.column("parent").to_numpy()
    crossing = np.nonzero((parent >= 0) & (processes != processes[np.maximum(parent, 0)]))[0]
    events = []
    for flow_id, child in enumerate(crossing.tolist(), start=1):
        up = int(parent[child])
        at_parent = min(max(int(start_rel[child]), int(start_rel[up])), int(end_rel[up])) / 1000.0
        common = {"name": "parent → child", "cat": "propagation", "id": flow_id}
        events.append({**common, "ph": "s", "pid": int(processes[up]), "tid": int(tracks[up]), "ts": at_parent})
        events.append({**common, "ph": "f", "bp": "e", "pid": int(processes[child]), "tid": int(tracks[child]),
                       "ts": int(start_rel[child]) / 1000.0})
    return events


def _span_events(rows, source, processes, tracks, start_rel, duration, invalid) -> list[dict]:
    names = rows.column("name").to_pylist()
    buckets = rows.column("bucket").to_pylist()
    fixed = {
        "trace_id": rows.column("trace_id").to_pylist(),
        "span_id": rows.column("span_id").to_pylist(),
        "parent_span_id": rows.column("parent_span_id").to_pylist(),
        BUCKET: buckets,
        ITERATION: rows.column("iteration").to_pylist(),
        EFFICIENCY_CATEGORY: source.column(EFFICIENCY_CATEGORY).to_pylist(),
        SPAN_GROUP: (source.column(SPAN_GROUP).to_pylist() if SPAN_GROUP in source.column_names
                     else [None] * len(names)),  # a table from before the column
        "status": source.column("status_code").to_pylist(),
        "status_message": source.column("status_message").to_pylist(),
        "orphan": rows.column("is_orphan").to_pylist(),
        "critical_path": rows.column("on_critical_path").to_pylist(),
        "invalid_interval": [True if bad else None for bad in invalid.tolist()],
    }
    attributes = source.column("attributes").to_pylist()
    ts = (start_rel / 1000.0).tolist()
    dur = (duration / 1000.0).tolist()
    pids, tids = processes.tolist(), tracks.tolist()
    events = []
    for i in range(len(names)):
        args = {k: v[i] for k, v in fixed.items() if v[i] is not None}
        args.update(attributes[i] or ())
        event = {"ph": "X", "name": names[i], "cat": buckets[i] or "unbucketed", "pid": pids[i], "tid": tids[i],
                 "ts": ts[i], "dur": dur[i], "args": args}
        if buckets[i] in _CNAMES:
            event["cname"] = _CNAMES[buckets[i]]
        events.append(event)
    return events
