"""``rl.fleet.busy.seconds`` from the real engine's request stats (issue 31, item 3), on the session's one run.

``track_vllm_busy`` counts each finished request from being scheduled to its last token, ending
when the engine reports it. Every request is added and finished inside one ``rl.vllm.generate``
(or ``_generate_text``) call of the driver, so the busy union lies within the union of those spans.
"""

from __future__ import annotations

import numpy as np

from nemo_telemetry.instrument import BUSY_SECONDS
from nemo_telemetry.instrument.vllm import GENERATE_SPAN, GENERATE_TEXT_SPAN
from tests.vllm_engine.two_layer import BUSY_FLEET


def _union_seconds(starts, ends) -> float:
    order = np.argsort(starts)
    total, current_start, current_end = 0.0, None, None
    for s, e in zip(np.asarray(starts)[order], np.asarray(ends)[order]):
        if current_end is None or s > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = s, e
        else:
            current_end = max(current_end, e)
    if current_end is not None:
        total += current_end - current_start
    return total / 1e9


def _busy_points(run):
    return [r for r in run.metrics.to_pylist() if r["name"] == BUSY_SECONDS]


def test_the_engine_reports_a_cumulative_busy_series_for_its_fleet(vllm_run):
    points = _busy_points(vllm_run)
    assert points, "no rl.fleet.busy.seconds in the driver's metrics dump"
    assert {tuple(sorted(dict(p["attributes"]).items())) for p in points} == {
        (("rl.fleet", BUSY_FLEET), ("rl.fleet.activity", "generation"))}
    assert {(p["kind"], p["unit"], p["temporality"], p["is_monotonic"]) for p in points} == {
        ("sum", "s", "cumulative", True)}
    values = [p["value"] for p in sorted(points, key=lambda p: p["time_ns"])]
    assert values == sorted(values) and values[-1] > 0.0


def test_the_busy_time_lies_within_the_generate_calls(vllm_run):
    rows = [r for r in vllm_run.spans.to_pylist() if r["name"] in (GENERATE_SPAN, GENERATE_TEXT_SPAN)]
    assert len(rows) == len(vllm_run.calls)
    generating = _union_seconds([r["start_ns"] for r in rows], [r["end_ns"] for r in rows])
    busy = max(p["value"] for p in _busy_points(vllm_run))
    # Both are durations; the span clock (time_ns) and the union's (monotonic) may drift by parts per million.
    assert 0.0 < busy <= generating * (1 + 1e-4)
