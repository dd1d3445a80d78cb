"""Union of time intervals per group, vectorized (the HTA merge, without touching the caller's data).

Sort by (group, start); keep a running maximum of the ends; a new merged interval starts
where a start is not strictly inside the running maximum (or the group changes); each merged
interval is then the min start / max end of its members. Everything is numpy on copies: the
caller's arrays and tables are never reordered.

The running maximum is taken per group without a Python loop by shifting each group onto its
own stretch of one monotone axis (times relative to the group's first start, plus the
lengths of the groups before it), so one ``np.maximum.accumulate`` serves every group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MergedIntervals", "merge_intervals", "union_length", "clipped_union_length"]


@dataclass(frozen=True)
class MergedIntervals:
    """Disjoint merged intervals, sorted by (group, start), and where each input row went."""

    group: np.ndarray  # group of each merged interval
    start: np.ndarray  # int64
    end: np.ndarray  # int64
    members: np.ndarray  # how many input intervals each merged interval holds
    cluster_of: np.ndarray  # for each input row (caller's order), its merged interval

    def __len__(self) -> int:
        return len(self.start)


def merge_intervals(
    starts: np.ndarray, ends: np.ndarray, groups: np.ndarray | None = None
) -> MergedIntervals:
    """Merge overlapping ``[start, end)`` intervals within each group (touching ones stay apart).

    ``groups`` are non-negative integer labels (default: one group). An interval whose end is
    before its start is read as empty at its start.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.maximum(np.asarray(ends, dtype=np.int64), starts)
    n = len(starts)
    groups = np.zeros(n, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return MergedIntervals(empty, empty, empty, empty, empty)

    order = np.argsort(starts, kind="stable")
    order = order[np.argsort(groups[order], kind="stable")]
    s, e, g = starts[order], ends[order], groups[order]

    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(g[1:], g[:-1], out=first[1:])
    prev_reach = _previous_running_max_end(s, e, first)
    new_cluster = first | (s >= prev_reach)

    cluster_sorted = np.cumsum(new_cluster) - 1
    heads = np.flatnonzero(new_cluster)
    cluster_of = np.empty(n, dtype=np.int64)
    cluster_of[order] = cluster_sorted
    return MergedIntervals(
        group=g[heads],
        start=s[heads],
        end=np.maximum.reduceat(e, heads),
        members=np.diff(np.append(heads, n)),
        cluster_of=cluster_of,
    )


def _previous_running_max_end(s: np.ndarray, e: np.ndarray, first: np.ndarray) -> np.ndarray:
    """For each sorted row, the max end of the rows before it in its group (garbage at group heads)."""
    heads = np.flatnonzero(first)
    group_of = np.cumsum(first) - 1
    base = s[heads][group_of]  # each group's first (smallest) start
    rel_end = e - base
    span = np.maximum.reduceat(rel_end, heads) + 1
    if float(span.sum()) >= 2.0**62:  # groups too far apart to share one axis: shift per group
        return _previous_running_max_end_by_group(e, heads)
    offset = np.concatenate(([0], np.cumsum(span)[:-1]))[group_of]
    reach = np.maximum.accumulate(rel_end + offset)
    prev = np.empty_like(reach)
    prev[0] = 0
    prev[1:] = reach[:-1]
    return prev - offset + base


def _previous_running_max_end_by_group(e: np.ndarray, heads: np.ndarray) -> np.ndarray:
    prev = np.empty_like(e)
    bounds = np.append(heads, len(e))
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # only for pathological inputs (centuries apart)
        reach = np.maximum.accumulate(e[lo:hi])
        prev[lo] = e[lo]
        prev[lo + 1 : hi] = reach[:-1]
    return prev


def union_length(merged: MergedIntervals, n_groups: int) -> np.ndarray:
    """Length of the union of each group's intervals (int64, indexed by group)."""
    return np.bincount(merged.group, weights=merged.end - merged.start, minlength=n_groups).astype(np.int64)


def clipped_union_length(
    merged: MergedIntervals, window_start: np.ndarray, window_end: np.ndarray
) -> np.ndarray:
    """Length of each group's union intersected with its window ``[window_start[g], window_end[g])``."""
    n_groups = len(window_start)
    if len(merged) == 0:
        return np.zeros(n_groups, dtype=np.int64)
    lo = np.maximum(merged.start, window_start[merged.group])
    hi = np.minimum(merged.end, window_end[merged.group])
    return np.bincount(merged.group, weights=np.maximum(hi - lo, 0), minlength=n_groups).astype(np.int64)
