"""iteration_scope and bucket_scope: what they stamp and how far they reach (per_prompt_scope: test_data_plane_client)."""

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


def test_efficiency_spans_keep_their_category_bucket_inside_a_bucket_scope(exporter):
    with bucket_scope(Bucket.PRODUCTIVE):
        with efficiency_span("idle/buffer_starvation"):
            pass
    assert exporter.get_finished_spans()[0].attributes["rl.bucket"] == "idle"
