"""One trace across a driver, Ray actors and the threads they start, on a real local Ray cluster.

One scenario runs per module (actors are slow to start on a small machine): the driver opens its
job span and dispatches sync, async and streaming actor methods with a carrier, one actor runs the
async-collector pattern (a loop thread and batch workers under the carrier it got at
construction), one call goes out without a carrier and one with the ``job`` group disabled.
Every process exports through the dump exporter; the driver flushes the actors before
``ray.kill``. The tests then read the dump files back as plain OTLP JSON lines.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
from opentelemetry.sdk.trace import SpanProcessor

from nemo_telemetry.analysis.lint import lint_paths
from nemo_telemetry.instrument import (
    RLSpanGroup,
    TelemetryFlushMixin,
    TraceCarrierThread,
    accepts_trace_context,
    current_trace_carrier,
    dispatch_with_trace_context,
    enabled_span_groups,
    flush_actors_telemetry,
    get_tracer_provider,
    init_telemetry_driver,
    init_telemetry_worker,
    managed_span,
    run_with_carrier,
    set_enabled_span_groups,
    shutdown_telemetry,
    trace_context_kwargs,
    umbrella_span,
)

pytestmark = pytest.mark.slow

BATCHES = 3
BURST = 40


class EndedSpans(SpanProcessor):
    """Counts every span this process ended: what it emitted, to compare with what was exported."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def on_end(self, span) -> None:
        with self._lock:
            self.count += 1


def _start_worker_telemetry(rank: int) -> EndedSpans:
    assert init_telemetry_worker(rank=rank, world_size=3), "telemetry did not start in the actor"
    ended = EndedSpans()
    get_tracer_provider().add_span_processor(ended)
    return ended


@ray.remote
class SyncActor(TelemetryFlushMixin):
    def __init__(self, rank: int, trace_carrier: dict | None = None) -> None:
        self.ended = _start_worker_telemetry(rank)
        self.carrier = trace_carrier or {}  # captured once, re-attached in every thread

    @accepts_trace_context
    def work(self, x: int) -> int:
        with managed_span(RLSpanGroup.REWARD, "actor.sync", **{"test.x": x}):
            return x

    @accepts_trace_context
    def stream(self, n: int):
        with umbrella_span(RLSpanGroup.U_ROLLOUT, "actor.stream"):
            for i in range(n):
                with managed_span(RLSpanGroup.GENERATION, "actor.stream.item", **{"test.i": i}):
                    pass
                yield i

    def run_collector(self, batches: int) -> None:
        """The async-collector pattern: a loop thread, and batch workers started from it."""

        def batch(b: int) -> None:
            with umbrella_span(RLSpanGroup.U_ROLLOUT, "collector.batch", **{"test.batch": b}):
                pass

        def loop() -> None:
            with managed_span(RLSpanGroup.EFFICIENCY, "collector.loop"):
                with ThreadPoolExecutor(max_workers=2) as pool:
                    list(pool.map(lambda b: run_with_carrier(self.carrier, batch, b), range(batches)))

        thread = TraceCarrierThread(target=loop, carrier=self.carrier, name="collection-loop")
        thread.start()
        thread.join()

    def burst(self, n: int) -> None:
        for i in range(n):
            with managed_span(RLSpanGroup.DATA_PLANE, "actor.burst"):
                pass

    def spans_ended(self) -> int:
        return self.ended.count


@ray.remote
class AsyncActor(TelemetryFlushMixin):
    def __init__(self, rank: int) -> None:
        self.ended = _start_worker_telemetry(rank)

    @accepts_trace_context
    async def awork(self, x: int) -> int:
        with managed_span(RLSpanGroup.REWARD, "actor.async"):
            await asyncio.sleep(0)
            return x

    @accepts_trace_context
    async def astream(self, n: int):
        with umbrella_span(RLSpanGroup.U_ROLLOUT, "actor.astream"):
            for i in range(n):
                with managed_span(RLSpanGroup.GENERATION, "actor.astream.item"):
                    await asyncio.sleep(0)
                yield i

    def spans_ended(self) -> int:
        return self.ended.count


@pytest.fixture(scope="module")
def scenario(ray_cluster, actor_env, read_dump_spans, tmp_path_factory):
    dump_dir = tmp_path_factory.mktemp("ray-dump")
    saved_env = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("NEMO_TELEMETRY_")]:
        del os.environ[key]
    try:
        yield _run_scenario(dump_dir, actor_env, read_dump_spans)
    finally:
        shutdown_telemetry()
        os.environ.clear()
        os.environ.update(saved_env)


def _run_scenario(dump_dir: Path, actor_env, read_dump_spans) -> dict:
    init_telemetry_driver(
        {"enabled": True, "span_groups": "all", "exporter": "dump", "dump_dir": str(dump_dir)}, algorithm="grpo"
    )
    # Nothing leaves an actor's span buffer until the driver asks it to flush.
    options = {"runtime_env": {"env_vars": actor_env(OTEL_BSP_SCHEDULE_DELAY="600000")}}
    out: dict = {"dump_dir": dump_dir}
    with umbrella_span(RLSpanGroup.U_JOB, "rl.grpo.job"):
        collector = SyncActor.options(**options).remote(rank=1, **trace_context_kwargs())
        async_actor = AsyncActor.options(**options).remote(rank=2)
        out["sync"] = ray.get(dispatch_with_trace_context(collector.work, 1))
        out["stream"] = [ray.get(r) for r in dispatch_with_trace_context(collector.stream.options(name="s"), 3)]
        out["async"] = ray.get(dispatch_with_trace_context(async_actor.awork, 1))
        out["astream"] = [ray.get(r) for r in dispatch_with_trace_context(async_actor.astream, 2)]
        ray.get(collector.run_collector.remote(BATCHES))
        out["bare"] = ray.get(collector.work.remote(2))  # no carrier: lint flags this line

    all_groups = enabled_span_groups()
    set_enabled_span_groups(all_groups - {RLSpanGroup.JOB})
    try:
        with umbrella_span(RLSpanGroup.U_JOB, "rl.grpo.job") as job:
            out["job_disabled_span"] = job
            out["job_disabled_carrier"] = current_trace_carrier()
            out["job_disabled"] = ray.get(dispatch_with_trace_context(collector.work, 3))
    finally:
        set_enabled_span_groups(all_groups)

    ray.get(collector.burst.remote(BURST))
    actors = {1: collector, 2: async_actor}
    out["emitted"] = {rank: ray.get(actor.spans_ended.remote()) for rank, actor in actors.items()}
    out["flushed"] = flush_actors_telemetry(actors.values(), timeout_s=60, kill=True)
    shutdown_telemetry()
    out["spans"] = read_dump_spans(dump_dir)
    return out


def _one(spans: list[dict], name: str, **attributes) -> dict:
    matches = [s for s in spans if s["name"] == name
               and all(s["attributes"].get(k) == v for k, v in attributes.items())]
    assert len(matches) == 1, f"expected one {name} {attributes}, got {len(matches)}"
    return matches[0]


def _all(spans: list[dict], name: str) -> list[dict]:
    found = [s for s in spans if s["name"] == name]
    assert found, f"no {name} span was exported"
    return found


def test_methods_return_normally(scenario):
    assert scenario["sync"] == 1 and scenario["async"] == 1 and scenario["bare"] == 2
    assert scenario["stream"] == [0, 1, 2] and scenario["astream"] == [0, 1]


def test_actor_method_spans_are_children_of_the_driver_span(scenario):
    spans = scenario["spans"]
    job = _one(spans, "rl.grpo.job")
    for name, kwargs in (("actor.sync", {"test.x": 1}), ("actor.async", {}), ("actor.stream", {}),
                         ("actor.astream", {})):
        span = _one(spans, name, **kwargs)
        assert (span["trace_id"], span["parent"]) == (job["trace_id"], job["span_id"]), name


def test_streaming_steps_nest_under_the_generator_span(scenario):
    spans = scenario["spans"]
    for outer, inner, count in (("actor.stream", "actor.stream.item", 3), ("actor.astream", "actor.astream.item", 2)):
        parent = _one(spans, outer)
        items = _all(spans, inner)
        assert len(items) == count
        assert {(s["trace_id"], s["parent"]) for s in items} == {(parent["trace_id"], parent["span_id"])}


def test_collector_threads_join_the_trace_through_the_construction_carrier(scenario):
    spans = scenario["spans"]
    job = _one(spans, "rl.grpo.job")
    loop = _one(spans, "collector.loop")
    batches = _all(spans, "collector.batch")
    assert sorted(s["attributes"]["test.batch"] for s in batches) == list(range(BATCHES))
    for span in [loop, *batches]:
        assert (span["trace_id"], span["parent"]) == (job["trace_id"], job["span_id"])


def test_each_process_reports_its_own_rank(scenario):
    spans = scenario["spans"]
    assert _one(spans, "rl.grpo.job")["rank"] == 0
    assert _one(spans, "actor.sync", **{"test.x": 1})["rank"] == 1
    assert _one(spans, "collector.loop")["rank"] == 1
    assert _one(spans, "actor.async")["rank"] == 2
    ranks_by_pid: dict = {}
    for span in spans:
        ranks_by_pid.setdefault(span["pid"], set()).add(span["rank"])
    assert sorted(ranks_by_pid.values(), key=min) == [{0}, {1}, {2}]


def test_without_a_carrier_the_actor_span_is_a_root_and_lint_flags_the_call(scenario):
    spans = scenario["spans"]
    bare = _one(spans, "actor.sync", **{"test.x": 2})
    assert bare["parent"] is None
    assert bare["trace_id"] != _one(spans, "rl.grpo.job")["trace_id"]

    source = Path(__file__).read_text().splitlines()
    flagged_line = next(i for i, line in enumerate(source, 1) if line.rstrip().endswith("# no carrier: lint flags this line"))
    findings = lint_paths([Path(__file__)])
    assert [(f.line, f.code) for f in findings] == [(flagged_line, "undispatched-carrier")]


def test_with_job_disabled_the_carrier_is_empty_and_the_call_still_works(scenario):
    assert scenario["job_disabled_span"] is None
    assert scenario["job_disabled_carrier"] == {}
    assert scenario["job_disabled"] == 3
    span = _one(scenario["spans"], "actor.sync", **{"test.x": 3})
    assert span["parent"] is None
    assert len(_all(scenario["spans"], "rl.grpo.job")) == 1


def test_flush_before_kill_loses_no_span(scenario):
    assert scenario["flushed"] == [True, True]
    spans = scenario["spans"]
    assert len(_all(spans, "actor.burst")) == BURST
    for rank, emitted in scenario["emitted"].items():
        exported = sum(1 for s in spans if s["rank"] == rank)
        assert exported == emitted, f"rank {rank}: emitted {emitted}, exported {exported}"
