"""Every span a gated site opens records the group it was opened in (``rl.span_group``), so the
analysis decides a group's presence by the group, not by the span's name; a disabled site stays
the shared no-op and an always-on ``span_cm`` records none."""

from __future__ import annotations

import pytest

from nemo_telemetry.instrument import (
    NOOP_HANDLE,
    NOOP_SPAN,
    SPAN_GROUP_KEY,
    RLSpanGroup as G,
    begin_checkpoint_finalize,
    checkpoint_span,
    efficiency_span,
    managed_span,
    set_enabled_span_groups,
    setup_span,
    span_cm,
    start_efficiency_span,
    start_span,
    start_step_span,
    start_umbrella_span,
    startup_span,
    trace_fn,
    traced_worker_init,
    umbrella_span,
    umbrella_trace_fn,
)


def _groups(exporter) -> dict[str, str | None]:
    return {s.name: s.attributes.get(SPAN_GROUP_KEY) for s in exporter.get_finished_spans()}


def test_each_primitive_records_its_group_as_a_plain_string(exporter):
    @trace_fn(G.REWARD, "rl.grpo.reward_calculation")
    def reward():
        return 1

    @umbrella_trace_fn(G.U_ROLLOUT, "rl.grpo.generation")
    async def rollout():
        return 2

    import asyncio

    with umbrella_span(G.U_STEP, "rl.grpo.step", **{"rl.iteration": 1}):
        with managed_span(G.GENERATION, "rl.trl.generate"):  # a name no catalogue pattern knows
            pass
        reward()
        asyncio.run(rollout())
        with efficiency_span("idle/refit_bubble"):
            pass
        start_efficiency_span("idle/buffer_starvation").end()
        with checkpoint_span("grpo"):
            begin_checkpoint_finalize("/ckpt/tmp_step_1").end()
        start_span(G.POLICY_UPDATE, "rl.sft.optimizer_step").end()
        start_umbrella_span(G.U_EVALUATE, "rl.grpo.evaluate").end()
        start_step_span(2, "rl.sft.step").end()
        with umbrella_span(G.LOGPROB, "rl.grpo.policy_and_reference_logprobs"):  # a leaf group: warns, emits a leaf
            pass
    with startup_span():
        with setup_span("ray_init"):
            pass
    with traced_worker_init("policy", backend="dtensor"):
        pass
    with span_cm("rl.untracked"):
        pass
    assert _groups(exporter) == {
        "rl.trl.generate": "generation", "rl.grpo.reward_calculation": "reward", "rl.grpo.generation": "rollout",
        "rl.idle.refit_bubble": "efficiency", "rl.idle.buffer_starvation": "efficiency",
        "rl.checkpoint.finalize": "checkpoint", "rl.grpo.checkpointing": "checkpoint",
        "rl.sft.optimizer_step": "policy_update", "rl.grpo.evaluate": "evaluate", "rl.sft.step": "step",
        "rl.grpo.policy_and_reference_logprobs": "logprob", "rl.grpo.step": "step",
        "rl.setup.ray_init": "setup", "rl.startup": "setup", "rl.policy.load_model": "model_init",
        "rl.untracked": None,
    }
    assert all(type(s.attributes[SPAN_GROUP_KEY]) is str for s in exporter.get_finished_spans()
               if SPAN_GROUP_KEY in s.attributes)


def test_the_callers_own_attributes_are_kept_beside_the_group(exporter):
    with managed_span(G.GENERATION, "rl.vllm.generate", **{"rl.bucket": "overhead", "k": "v"}):
        pass
    (span,) = exporter.get_finished_spans()
    assert dict(span.attributes) == {"rl.bucket": "overhead", "k": "v", SPAN_GROUP_KEY: "generation"}


@pytest.mark.parametrize("open_site", [
    lambda: managed_span(G.GENERATION, "rl.vllm.generate"),
    lambda: umbrella_span(G.U_STEP, "rl.grpo.step"),
])
def test_a_disabled_site_is_still_the_shared_noop(exporter, open_site):
    set_enabled_span_groups(())
    assert open_site() is NOOP_SPAN
    assert start_span(G.GENERATION, "rl.vllm.generate") is NOOP_HANDLE
    assert exporter.get_finished_spans() == ()
