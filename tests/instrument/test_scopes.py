"""iteration_scope, bucket_scope and per_prompt_scope: what they stamp and how far they reach."""

from __future__ import annotations

import asyncio
import threading

from nemo_telemetry.instrument import (
    Bucket,
    RLSpanGroup,
    bucket_scope,
    current_bucket_scope,
    current_iteration,
    efficiency_span,
    in_per_prompt_scope,
    iteration_scope,
    managed_span,
    per_prompt_scope,
    set_enabled_span_groups,
    span_cm,
    umbrella_span,
)

G = RLSpanGroup


def _by_name(exporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_iteration_scope_stamps_every_span_opened_inside(exporter):
    with iteration_scope(412):
        assert current_iteration() == 412
        with umbrella_span(G.U_STEP, "rl.grpo.step"):
            with managed_span(G.POLICY_UPDATE, "rl.grpo.policy_training"):
                pass
            with efficiency_span("idle/refit_bubble"):
                pass
            with span_cm("rl.cold.path"):
                pass
    with managed_span(G.REWARD, "outside"):
        pass
    spans = _by_name(exporter)
    for name in ("rl.grpo.step", "rl.grpo.policy_training", "rl.idle.refit_bubble", "rl.cold.path"):
        assert spans[name].attributes["rl.iteration"] == 412, name
    assert "rl.iteration" not in spans["outside"].attributes
    assert current_iteration() is None


def test_caller_iteration_wins_over_the_scope(exporter):
    with iteration_scope(3):
        with umbrella_span(G.U_EVALUATE, "rl.grpo.evaluate", **{"rl.iteration": 0}):
            pass
    assert exporter.get_finished_spans()[0].attributes["rl.iteration"] == 0


def test_nested_iteration_scopes_restore_the_outer_value():
    with iteration_scope(1):
        with iteration_scope(2):
            assert current_iteration() == 2
        assert current_iteration() == 1


def test_scopes_reach_coroutines_but_not_threads(exporter):
    async def in_task():
        with managed_span(G.GENERATION, "in_task"):
            pass
        return current_iteration(), current_bucket_scope(), in_per_prompt_scope()

    def in_thread(out):
        with managed_span(G.GENERATION, "in_thread"):
            pass
        out.append((current_iteration(), current_bucket_scope(), in_per_prompt_scope()))

    thread_seen: list = []
    with iteration_scope(7), bucket_scope(Bucket.OVERHEAD):
        task_seen = asyncio.run(in_task())
        thread = threading.Thread(target=in_thread, args=(thread_seen,))
        thread.start()
        thread.join()
    spans = _by_name(exporter)
    assert task_seen == (7, Bucket.OVERHEAD, False)
    assert spans["in_task"].attributes["rl.iteration"] == 7
    assert spans["in_task"].attributes["rl.bucket"] == "overhead"
    assert thread_seen == [(None, None, False)]
    assert "rl.iteration" not in spans["in_thread"].attributes
    assert spans["in_thread"].attributes["rl.bucket"] == "productive"


def test_per_prompt_scope_moves_spans_into_the_per_prompt_group(exporter):
    set_enabled_span_groups([G.DATA_PLANE, G.PER_PROMPT, G.ROLLOUT])
    with managed_span(G.DATA_PLANE, "rl.data_plane.put", **{"rl.data_plane.op": "put"}):
        pass  # batch-shaped caller: data_plane, overhead
    with per_prompt_scope():
        assert in_per_prompt_scope()
        with managed_span(G.DATA_PLANE, "rl.data_plane.put"):
            pass
        with umbrella_span(G.U_ROLLOUT, "rl.gym.run_rollouts"):
            pass
    assert not in_per_prompt_scope()
    batch, rollout_put, gym = exporter.get_finished_spans()
    assert batch.attributes["rl.bucket"] == "overhead"
    assert "rl.bucket" not in rollout_put.attributes  # per_prompt is an umbrella
    assert "rl.bucket" not in gym.attributes


def test_per_prompt_scope_gates_on_per_prompt(exporter):
    set_enabled_span_groups([G.DATA_PLANE])  # per_prompt off
    with per_prompt_scope():
        with managed_span(G.DATA_PLANE, "rl.data_plane.put") as span:
            assert span is None
    set_enabled_span_groups([G.PER_PROMPT])  # data_plane off, per_prompt on
    with per_prompt_scope():
        with managed_span(G.DATA_PLANE, "rl.data_plane.put") as span:
            assert span is not None
    with managed_span(G.DATA_PLANE, "rl.data_plane.put") as span:
        assert span is None  # outside the scope the caller's own group decides again
    assert len(exporter.get_finished_spans()) == 1


def test_per_prompt_scope_reaches_tasks_created_inside_it(exporter):
    set_enabled_span_groups([G.PER_PROMPT])

    async def put():
        await asyncio.sleep(0)
        with managed_span(G.DATA_PLANE, "rl.data_plane.put"):
            pass

    async def main():
        with per_prompt_scope():
            task = asyncio.create_task(put())
        await task  # runs after the scope exited, in the context it was created with

    asyncio.run(main())
    assert [s.name for s in exporter.get_finished_spans()] == ["rl.data_plane.put"]


def test_efficiency_spans_keep_their_category_bucket_inside_a_bucket_scope(exporter):
    with bucket_scope(Bucket.PRODUCTIVE):
        with efficiency_span("idle/buffer_starvation"):
            pass
    assert exporter.get_finished_spans()[0].attributes["rl.bucket"] == "idle"
