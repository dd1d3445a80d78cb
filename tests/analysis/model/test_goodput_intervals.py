"""The vectorized interval union against a brute-force union, and its edge cases."""

from __future__ import annotations

import numpy as np

from nemo_telemetry.analysis.model.intervals import clipped_union_length, merge_intervals, union_length


def brute_union(intervals: list[tuple[int, int]], lo: int | None = None, hi: int | None = None) -> int:
    covered: set[int] = set()
    for a, b in intervals:
        a, b = (a if lo is None else max(a, lo)), (b if hi is None else min(b, hi))
        covered.update(range(a, max(a, b)))
    return len(covered)


def test_union_matches_brute_force_per_group_in_any_input_order():
    rng = np.random.default_rng(3)
    for _ in range(50):
        n, groups = int(rng.integers(1, 40)), int(rng.integers(1, 5))
        start = rng.integers(0, 100, n)
        end = start + rng.integers(0, 30, n)
        group = rng.integers(0, groups, n)
        windows = rng.integers(0, 60, groups), rng.integers(60, 130, groups)
        merged = merge_intervals(start, end, group)
        union = union_length(merged, groups)
        covered = clipped_union_length(merged, *windows)
        for g in range(groups):
            mine = [(a, b) for a, b, k in zip(start, end, group) if k == g]
            assert union[g] == brute_union(mine)
            assert covered[g] == brute_union(mine, windows[0][g], windows[1][g])


def test_members_and_cluster_of_tell_which_inputs_overlap():
    merged = merge_intervals(np.array([5, 0, 20, 2, 9]), np.array([8, 3, 30, 4, 10]))
    assert merged.start.tolist() == [0, 5, 9, 20] and merged.end.tolist() == [4, 8, 10, 30]
    assert merged.members.tolist() == [2, 1, 1, 1]
    assert merged.cluster_of.tolist() == [1, 0, 3, 0, 2]  # in the caller's order


def test_touching_intervals_stay_apart_and_inverted_ones_are_empty():
    merged = merge_intervals(np.array([0, 5, 7]), np.array([5, 10, 6]))
    assert merged.members.tolist() == [1, 2]  # [0,5) and [5,10) touch; [7,6) is empty inside [5,10)
    assert union_length(merged, 1).tolist() == [10]


def test_groups_far_apart_in_time_do_not_overflow():
    big = np.int64(2**62)
    merged = merge_intervals(np.array([0, big, 1, big + 1]), np.array([10, big + 10, 5, big + 20]),
                             np.array([0, 1, 0, 1]))
    assert union_length(merged, 2).tolist() == [10, 20]


def test_the_callers_arrays_are_left_as_they_were():
    start, end = np.array([3, 1, 2]), np.array([4, 5, 3])
    merge_intervals(start, end, np.array([1, 0, 1]))
    assert start.tolist() == [3, 1, 2] and end.tolist() == [4, 5, 3]
