"""``rl.fleet.busy.seconds`` (issue 31, item 3): the union of a process's busy wall time, where no span says it.

The union is checked exactly on a fake clock; the series end to end through the real OpenTelemetry
SDK, the dump exporter and the metrics reader, with intervals whose union is known.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from nemo_telemetry.analysis import read_metrics
from nemo_telemetry.instrument import (
    BUSY_SECONDS,
    BusyScope,
    BusyUnion,
    busy_union,
    fleet_busy,
    flush_telemetry,
    init_telemetry_driver,
    init_telemetry_worker,
    shutdown_telemetry,
    track_vllm_busy,
)
from nemo_telemetry.instrument.busy import MAX_KEPT_INTERVALS
from nemo_telemetry.instrument.vllm import finished_request_intervals


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the union, on a fake clock ---------------------------------------------------------------


def test_overlapping_units_count_once():
    clock = Clock()
    union = BusyUnion(clock)
    union.begin()          # unit A from 0
    clock.now = 2.0
    union.begin()          # unit B from 2, overlapping A
    clock.now = 3.0
    union.end()            # A ends at 3
    clock.now = 5.0
    assert union.seconds() == 5.0  # B still in flight: counted up to now
    union.end()            # B ends at 5
    clock.now = 9.0        # idle 5..9
    union.begin()
    clock.now = 10.0
    union.end()
    assert union.seconds() == 6.0  # [0, 5] and [9, 10], not 3 + 3 + 1 request-seconds


def test_an_end_without_a_begin_counts_nothing():
    clock = Clock()
    union = BusyUnion(clock)
    union.end()
    clock.now = 4.0
    assert union.seconds() == 0.0 and union.in_flight == 0


def test_intervals_reported_after_the_fact_merge_with_the_rest():
    clock = Clock(20.0)
    union = BusyUnion(clock)
    union.add_interval(0.0, 2.0)
    union.add_interval(1.0, 3.0)        # overlaps the first
    union.add_interval(5.0, 6.0)
    assert union.seconds() == 4.0
    union.add_interval(-1.0, 5.5)       # reaches back over everything kept
    assert union.seconds() == 7.0       # [-1, 6]
    union.add_interval(6.0, 6.0)        # empty
    union.add_interval(7.0, 6.5)        # backwards
    assert union.seconds() == 7.0


def test_an_open_stretch_overlapping_reported_intervals_counts_once():
    clock = Clock(10.0)
    union = BusyUnion(clock)
    union.begin()                       # open from 10
    union.add_interval(8.0, 12.0)       # reported while open: 8..10 adds, 10..12 overlaps
    clock.now = 15.0
    assert union.seconds() == 7.0       # [8, 15]
    union.end()
    assert union.seconds() == 7.0


def test_seconds_never_decrease():
    clock = Clock()
    union = BusyUnion(clock)
    seen = []
    for step in range(40):
        clock.now = float(step)
        if step % 3 == 0:
            union.begin()
        if step % 4 == 0:
            union.end()
        if step % 5 == 0:
            union.add_interval(step - 7.5, step - 0.5)
        seen.append(union.seconds())
    assert seen == sorted(seen)


def test_old_intervals_are_folded_but_still_counted():
    union = BusyUnion(Clock(1e6))
    for i in range(MAX_KEPT_INTERVALS + 50):
        union.add_interval(2.0 * i, 2.0 * i + 1.0)
    assert union.seconds() == MAX_KEPT_INTERVALS + 50


def test_threads_in_flight_together_count_their_shared_stretch_once():
    clock = Clock()
    union = BusyUnion(clock)
    scope = BusyScope(union, "generation", None)  # one scope, entered by every thread
    release = threading.Event()

    def work() -> None:
        with scope:
            release.wait(10)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    while union.in_flight < 8:
        threading.Event().wait(0.001)
    clock.now = 5.0
    release.set()
    for thread in threads:
        thread.join(10)
    assert union.seconds() == 5.0


def test_asyncio_tasks_in_flight_together_count_their_shared_stretch_once():
    clock = Clock()
    union = BusyUnion(clock)
    scope = BusyScope(union, "generation", None)

    async def run() -> None:
        release = asyncio.Event()

        async def request() -> None:
            async with scope:
                await release.wait()

        tasks = [asyncio.create_task(request()) for _ in range(16)]
        while union.in_flight < 16:
            await asyncio.sleep(0)
        clock.now = 3.0
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(run())
    assert union.seconds() == 3.0


# -- off: one shared do-nothing scope -----------------------------------------------------------


def test_with_telemetry_off_the_scope_does_nothing_and_is_shared():
    scope = fleet_busy("generation")
    assert scope is fleet_busy("generation") and scope.union is None
    with scope:
        pass
    assert busy_union("generation") is None


def test_a_function_decorated_before_telemetry_starts_records_once_it_runs(tmp_path):
    seen = []

    def in_flight():
        union = busy_union("rollout", fleet="gym")
        seen.append(None if union is None else union.in_flight)

    @fleet_busy("rollout", fleet="gym")
    def work(x: int) -> int:
        in_flight()
        return x + 1

    @fleet_busy("rollout", fleet="gym")
    async def work_async(x: int) -> int:
        in_flight()
        return x + 2

    assert work(1) == 2  # telemetry off
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path)})
    assert work(1) == 2 and asyncio.run(work_async(1)) == 3
    in_flight()
    assert seen == [None, 1, 1, 0]


# -- end to end: the real SDK, the dump file, the reader ---------------------------------------


def _busy_points(dump_dir):
    table = read_metrics(dump_dir)
    return [r for r in table.to_pylist() if r["name"] == BUSY_SECONDS]


def test_the_dump_holds_the_series_with_its_attributes_and_the_process_resource(tmp_path):
    init_telemetry_driver({"enabled": True, "span_groups": "default", "exporter": "dump",
                           "dump_dir": str(tmp_path)}, algorithm="grpo")
    assert init_telemetry_worker(rank=0, world_size=1, fleet="generation", gpus=2)
    union = busy_union("generation")
    union.add_interval(100.0, 102.5)
    union.add_interval(101.0, 103.0)  # overlaps: 3.0 s in all
    with fleet_busy("validation"):
        pass
    assert flush_telemetry(timeout_s=5)
    union.add_interval(110.0, 111.0)
    shutdown_telemetry(timeout_s=5)

    points = _busy_points(tmp_path)
    generation = [p for p in points if dict(p["attributes"])["rl.fleet.activity"] == "generation"]
    assert [p["value"] for p in generation] == [3.0, 4.0]  # cumulative: flush, then shutdown's last collection
    point = generation[-1]
    assert dict(point["attributes"]) == {"rl.fleet": "generation", "rl.fleet.activity": "generation"}
    assert (point["kind"], point["unit"], point["temporality"], point["is_monotonic"]) == ("sum", "s",
                                                                                           "cumulative", True)
    resource = dict(point["resource_attributes"])
    assert resource["rl.fleet"] == "generation" and resource["nv.dl.gpu.count"] == "2"
    validation = [p for p in points if dict(p["attributes"])["rl.fleet.activity"] == "validation"]
    assert validation and validation[-1]["value"] >= 0.0


def test_an_explicit_fleet_wins_over_the_process_fleet(tmp_path):
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path)})
    busy_union("serving", fleet="reward").add_interval(0.0, 1.5)
    busy_union("serving").add_interval(0.0, 0.5)
    shutdown_telemetry(timeout_s=5)
    values = {tuple(sorted(dict(p["attributes"]).items())): p["value"] for p in _busy_points(tmp_path)}
    assert values == {(("rl.fleet", "reward"), ("rl.fleet.activity", "serving")): 1.5,
                      (("rl.fleet", "driver"), ("rl.fleet.activity", "serving")): 0.5}


def test_a_restarted_telemetry_counts_afresh(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(first)})
    busy_union("generation").add_interval(0.0, 2.0)
    shutdown_telemetry(timeout_s=5)
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(second)})
    busy_union("generation").add_interval(0.0, 1.0)
    shutdown_telemetry(timeout_s=5)
    assert [p["value"] for p in _busy_points(first)] == [2.0]
    assert [p["value"] for p in _busy_points(second)] == [1.0]


# -- vLLM: the engine's finished requests ------------------------------------------------------


def _stats(*lengths):
    return SimpleNamespace(finished_requests=[SimpleNamespace(prefill_time=p, decode_time=d) for p, d in lengths])


def test_finished_requests_become_intervals_ending_when_reported():
    assert finished_request_intervals(_stats((0.5, 1.5), (0.25, 0.0), (0.0, 0.0)), 10.0) == [(8.0, 10.0),
                                                                                              (9.75, 10.0)]
    assert finished_request_intervals(None, 10.0) == []


class _Manager:
    def __init__(self) -> None:
        self.calls = 0

    def record(self, scheduler_stats=None, iteration_stats=None, mm_cache_stats=None, engine_idx=0):
        self.calls += 1


def test_track_vllm_busy_counts_the_engines_requests_once_each_overlap(tmp_path, caplog):
    llm = SimpleNamespace(llm_engine=SimpleNamespace(logger_manager=_Manager()))
    manager = llm.llm_engine.logger_manager
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path)})
    assert track_vllm_busy(llm, fleet="generation") and track_vllm_busy(llm, fleet="generation")  # idempotent
    union = busy_union("generation", fleet="generation")
    manager.record(scheduler_stats=object(), iteration_stats=_stats((0.5, 1.5), (0.25, 0.75)))
    manager.record(object(), None)  # a step with no finished request
    assert manager.calls == 2
    assert union.seconds() == pytest.approx(2.0, abs=1e-9)  # [t-2, t] holds [t-1, t]
    assert not track_vllm_busy(SimpleNamespace(llm_engine=SimpleNamespace(logger_manager=None)))
    assert "disable_log_stats=False" in caplog.text


def test_track_vllm_busy_with_telemetry_off_still_calls_vllm():
    llm = SimpleNamespace(logger_manager=_Manager())
    assert track_vllm_busy(llm)
    llm.logger_manager.record(scheduler_stats=None, iteration_stats=_stats((1.0, 1.0)))
    assert llm.logger_manager.calls == 1
