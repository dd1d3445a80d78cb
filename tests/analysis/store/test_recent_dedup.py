"""The follower's duplicate filter: repeats within its window dropped, memory held to two windows."""

from __future__ import annotations

import pyarrow as pa
import pytest

from nemo_telemetry.analysis.store.dataset import RecentSpanDeduplicator, SpanDeduplicator

# Each test on both paths: the compiled kernels and the reference ones (auto's choice on inputs this small).
pytestmark = pytest.mark.usefixtures("kernel_path")


def _spans(start: int, count: int) -> pa.Table:
    ids = range(start, start + count)
    return pa.table({"trace_id": [f"{i // 100:032x}" for i in ids], "span_id": [f"{i:016x}" for i in ids]})


def test_repeats_within_the_window_are_dropped_as_the_full_set_drops_them():
    recent, full = RecentSpanDeduplicator(window=1000), SpanDeduplicator()
    for batch in (_spans(0, 600), _spans(300, 600), _spans(0, 900), _spans(850, 100)):
        assert recent.admit(batch).tolist() == full.admit(batch).tolist()


def test_keys_held_stay_under_two_windows_however_many_spans_pass():
    recent = RecentSpanDeduplicator(window=1000)
    admitted = 0
    for start in range(0, 50_000, 500):
        admitted += int(recent.admit(_spans(start, 500)).sum())
        assert recent.keys_held <= 2 * 1000
    assert admitted == 50_000
    assert not recent.admit(_spans(49_500, 500)).any()  # the newest are still remembered
    assert recent.admit(_spans(0, 10)).all()  # far older than the window: admitted again (documented)
