"""The shipped namespaces against the seeds' own claims (seed 000, 001, 003)."""

from __future__ import annotations

import pickle

from nemo_telemetry.instrument import (
    REGISTRY,
    Bucket,
    GymSpanGroup,
    RLSpanGroup,
    group,
    resolve,
)
from nemo_telemetry.instrument import span_groups as rl

# Groups a shipped preset must reach; per_prompt is reachable only from `all` (seed 002, step 3).
EMITTED_GROUPS = {
    "job", "setup", "checkpoint", "evaluate", "model_init", "step", "rollout", "generation",
    "logprob", "reward", "advantage", "policy_update", "data_processing", "data_plane", "efficiency",
}
PER_PROMPT_GROUPS = {"per_prompt"}


def test_sixteen_groups_and_seven_umbrella_aliases():
    assert len(RLSpanGroup.ALL_GROUPS) == 16
    assert RLSpanGroup.ALL_GROUPS == EMITTED_GROUPS | PER_PROMPT_GROUPS
    aliases = {k: v for k, v in vars(RLSpanGroup).items() if k.startswith("U_")}
    assert set(aliases) == {"U_JOB", "U_STEP", "U_ROLLOUT", "U_MODEL_INIT", "U_EVALUATE", "U_SETUP",
                            "U_PER_PROMPT"}
    assert frozenset(aliases.values()) == rl.UMBRELLA_GROUP_VALUES
    assert all(v.umbrella for v in aliases.values())


def test_u_alias_is_the_same_plain_string():
    assert RLSpanGroup.U_ROLLOUT == RLSpanGroup.ROLLOUT == "rollout"
    assert hash(RLSpanGroup.U_ROLLOUT) == hash("rollout")
    assert "rollout" in frozenset({RLSpanGroup.ROLLOUT})
    assert RLSpanGroup.ROLLOUT in frozenset({"rollout"})
    assert type(pickle.loads(pickle.dumps(RLSpanGroup.ROLLOUT))) is str


def test_default_preset_is_coarse():
    assert resolve("default", namespace="nemo_rl") == {"job", "checkpoint", "evaluate", "setup", "model_init"}


def test_per_step_omits_per_prompt_and_includes_job():
    per_step = resolve("per_step", namespace="nemo_rl")
    assert "per_prompt" not in per_step
    assert "job" in per_step
    assert per_step == EMITTED_GROUPS


def test_per_prompt_is_asked_for_explicitly():
    assert resolve("per_step,per_prompt", namespace="nemo_rl") == EMITTED_GROUPS | PER_PROMPT_GROUPS


def test_every_emitted_group_is_reachable_from_a_shipped_preset_or_all():
    from_presets = set().union(*REGISTRY.presets("nemo_rl").values())
    assert EMITTED_GROUPS <= from_presets
    assert PER_PROMPT_GROUPS <= resolve("all") - from_presets
    assert RLSpanGroup.ALL_GROUPS <= resolve("all")


def test_buckets_follow_the_seed_table():
    expected = {
        "generation": Bucket.PRODUCTIVE, "reward": Bucket.PRODUCTIVE, "policy_update": Bucket.PRODUCTIVE,
        "data_processing": Bucket.OVERHEAD, "data_plane": Bucket.OVERHEAD, "checkpoint": Bucket.OVERHEAD,
        "logprob": Bucket.OVERHEAD, "advantage": Bucket.OVERHEAD, "efficiency": Bucket.IDLE,
    }
    for name, bucket in expected.items():
        assert REGISTRY.declaration(name).bucket is bucket, name
    for name in ("job", "step", "rollout", "model_init", "evaluate", "setup", "per_prompt"):
        assert REGISTRY.declaration(name).umbrella and REGISTRY.declaration(name).bucket is None


def test_unbucketed_spans_and_categories():
    assert RLSpanGroup.CHECKPOINT.unbucketed_spans == ("rl.checkpoint.finalize",)
    assert rl.COLLECTOR_LOOP_CATEGORIES == {"idle/refit_event_wait", "idle/generation_limit_pause"}
    assert rl.UNBUCKETED_SPAN_CATEGORIES == rl.COLLECTOR_LOOP_CATEGORIES | {"init/total"}
    assert rl.EFFICIENCY_CATEGORY_BUCKET["idle/buffer_starvation"] is Bucket.IDLE
    assert rl.EFFICIENCY_CATEGORY_BUCKET["wasted/failed_trajectory"] is Bucket.WASTED


def test_catalogue_names_the_per_algorithm_spans():
    matches = {
        "rl.grpo.step": {"step"},
        "rl.ppo.value_training": {"policy_update"},
        "rl.grpo.generation": {"rollout"},
        "rl.vllm.generate": {"generation"},
        "rl.data_plane.claim_meta": {"data_plane"},
        "rl.data_plane.put": {"data_plane", "per_prompt"},
        "rl.setup.ray_init": {"setup"},
        "rl.checkpoint.finalize": {"checkpoint"},
        "rl.idle.refit_bubble": {"efficiency"},
        "rl.distillation.teacher_logprob_inference": {"logprob"},
    }
    for name, groups in matches.items():
        assert REGISTRY.groups_for_span_name(name) >= groups, name


def test_gym_presets_keep_the_propagation_spine():
    default = resolve("default", namespace="nemo_gym")
    per_rollout = resolve("per_rollout", namespace="nemo_gym")
    for preset in (default, per_rollout):
        assert {"server", "http_client", "rollout"} <= preset
    assert default == {"server", "http_client", "rollout", "job"}
    assert per_rollout == {"server", "http_client", "rollout", "verify", "agent", "model_call"}
    assert "sandbox" not in default | per_rollout
    assert "sandbox" in resolve("all")


def test_gym_has_no_tool_call_or_dataset_group_and_training_groups_stay_resolvable():
    assert {"tool_call", "dataset"}.isdisjoint(GymSpanGroup.ALL_GROUPS | resolve("all"))
    assert resolve("checkpoint,step", namespace="nemo_gym") == {"checkpoint", "step"}


def test_gym_and_rl_share_job_and_rollout():
    (job,) = [r for r in REGISTRY.catalogue() if r.name == "job"]
    assert job.namespaces == ("nemo_gym", "nemo_rl")
    assert resolve("job") == {"job"}


def test_adding_a_group_is_one_constant(monkeypatch):
    """A constant added to RLSpanGroup is registered and reachable through `all` (seed 002)."""
    monkeypatch.setattr(RLSpanGroup, "COMPILE", group("compile", bucket=Bucket.OVERHEAD,
                                                      spans=("rl.<algo>.compile",)), raising=False)
    try:
        rl.register_span_groups()
        assert "compile" in resolve("all")
        assert REGISTRY.declaration("compile").bucket is Bucket.OVERHEAD
        assert REGISTRY.groups_for_span_name("rl.grpo.compile") == {"compile"}
    finally:
        monkeypatch.undo()
        rl.register_span_groups()
    assert "compile" not in resolve("all")
