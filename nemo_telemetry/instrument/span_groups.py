"""The ``nemo_rl`` namespace: the span groups an RL trainer emits, declared once.

Adding a group is one constant on :class:`RLSpanGroup` (``ALL_GROUPS`` is read off the class,
so a constant is registered the moment it exists), then a decision about which presets it
belongs in (:data:`PRESETS`). ``per_prompt`` goes in no preset: its span count scales with
the dataset, not the step count.

Buckets follow the seeds' "Span group -> rl.bucket" table. The efficiency group's spans take
their bucket from their category (:data:`EFFICIENCY_CATEGORY_BUCKET`), and the categories in
:data:`UNBUCKETED_SPAN_CATEGORIES` carry none: they run concurrently with bucketed work.
"""

from __future__ import annotations

from typing import ClassVar, Final

from nemo_telemetry.instrument._groups import Bucket, GroupName, group
from nemo_telemetry.instrument._registry import REGISTRY

__all__ = [
    "NAMESPACE",
    "RLSpanGroup",
    "PRESETS",
    "UMBRELLA_GROUP_VALUES",
    "EFFICIENCY_CATEGORY_BUCKET",
    "COLLECTOR_LOOP_CATEGORIES",
    "UNBUCKETED_SPAN_CATEGORIES",
    "TIMER_ONLY_CATEGORIES",
    "register_span_groups",
]

NAMESPACE: Final = "nemo_rl"


class RLSpanGroup:
    """Span group names for RL instrumentation (plain strings that also carry their declaration)."""

    JOB = group("job", umbrella=True, spans=("rl.<algo>.job", "rl.sft_v2.driver"),
                description="The whole run: one span wrapping everything from setup to teardown.")
    SETUP = group("setup", umbrella=True, spans=("rl.startup", "rl.setup.<phase>"),
                  description="Driver-side startup before the first step; nested and concurrent, so unbucketed.")
    CHECKPOINT = group(
        "checkpoint", bucket=Bucket.OVERHEAD,
        spans=("rl.<algo>.checkpointing", "rl.checkpoint.finalize"),
        unbucketed_spans=("rl.checkpoint.finalize",),
        description="Checkpoint staging (blocks the loop) and its asynchronous finalize tail (unbucketed).")
    EVALUATE = group("evaluate", umbrella=True, spans=("rl.<algo>.evaluate",),
                     description="Validation / evaluation passes; generation inside is overhead via bucket_scope.")
    MODEL_INIT = group(
        "model_init", umbrella=True,
        spans=("rl.vllm.load_model", "rl.policy.load_model", "rl.value.load_model"),
        description="Model construction and sharding inside a worker; root spans in the worker's process.")
    STEP = group("step", umbrella=True, spans=("rl.<algo>.step",),
                 description="One training step; its window is the denominator of the step's goodput.")
    ROLLOUT = group("rollout", umbrella=True, spans=("rl.<algo>.generation", "rl.gym.run_rollouts"),
                    description="Rollout collection; batches overlap, so the leaves inside carry the buckets.")
    GENERATION = group("generation", bucket=Bucket.PRODUCTIVE,
                       spans=("rl.vllm.generate", "rl.vllm.generate_text", "rl.<algo>.generate",
                              "rl.<algo>.sync_weights"),
                       description="Driver-side text generation calls (and a trainer's weight sync to its engine, "
                                   "overhead).")
    LOGPROB = group(
        "logprob", bucket=Bucket.OVERHEAD,
        spans=("rl.<algo>.policy_and_reference_logprobs", "rl.distillation.teacher_logprob_inference",
               "rl.sc.value_inference"),
        description="Policy and reference log-prob passes (and the distillation teacher's).")
    REWARD = group("reward", bucket=Bucket.PRODUCTIVE, spans=("rl.<algo>.reward_calculation",),
                   description="Reward computation.")
    ADVANTAGE = group("advantage", bucket=Bucket.OVERHEAD, spans=("rl.<algo>.advantage_calculation",),
                      description="Advantage computation.")
    POLICY_UPDATE = group(
        "policy_update", bucket=Bucket.PRODUCTIVE,
        spans=("rl.<algo>.policy_training", "rl.<algo>.value_training", "rl.sc.policy_optimizer_step",
               "rl.<algo>.forward", "rl.<algo>.backward", "rl.<algo>.optimizer_step"),
        description="Policy (and PPO value) gradient updates.")
    DATA_PROCESSING = group(
        "data_processing", bucket=Bucket.OVERHEAD,
        spans=("rl.<algo>.data_processing", "rl.sft_v2.read_batch", "rl.sft_v2.prepare_batch",
               "rl.sc.logprob_inference_prep", "rl.sc.value_inference_prep", "rl.sc.training_prep"),
        description="Data processing and batching.")
    DATA_PLANE = group("data_plane", bucket=Bucket.OVERHEAD, spans=("rl.data_plane.<op>",),
                       description="One span per transfer-queue operation from a batch-shaped caller.")
    PER_PROMPT = group(
        "per_prompt", umbrella=True,
        spans=("rl.sc.generate_and_push", "rl.data_plane.put", "rl.gym.run_rollouts"),
        description="Spans emitted once per prompt (and the HTTP hop); a cardinality axis, in no preset.")
    EFFICIENCY = group(
        "efficiency", bucket=Bucket.IDLE,
        spans=("rl.idle.buffer_starvation", "rl.idle.refit_bubble", "rl.idle.refit_event_wait",
               "rl.idle.generation_limit_pause", "rl.init.total"),
        unbucketed_spans=("rl.idle.refit_event_wait", "rl.idle.generation_limit_pause", "rl.init.total"),
        description="Async idle phases; the bucket comes from the category (driver waits idle, collector waits none).")

    # Umbrella aliases: spell the group this way at an umbrella_span / umbrella_trace_fn call site.
    U_JOB = JOB
    U_STEP = STEP
    U_MODEL_INIT = MODEL_INIT
    U_EVALUATE = EVALUATE
    U_ROLLOUT = ROLLOUT
    U_SETUP = SETUP
    U_PER_PROMPT = PER_PROMPT

    ALL_GROUPS: ClassVar[frozenset[str]]

    @classmethod
    def resolve(cls, spec) -> frozenset[str]:
        """Groups ``spec`` selects with this namespace's presets; unmatched names are dropped
        (see :meth:`resolve_with_pending` to report them)."""
        return REGISTRY.resolve(spec, namespace=NAMESPACE)

    @classmethod
    def resolve_with_pending(cls, spec) -> tuple[frozenset[str], frozenset[str]]:
        """``(enabled, pending)`` for ``spec`` with this namespace's presets: pending names matched
        nothing registered (in ``nemo_rl`` most likely a typo, which the driver reports)."""
        return REGISTRY.resolve_with_pending(spec, namespace=NAMESPACE)


def _group_values(*, umbrella: bool) -> frozenset[GroupName]:
    """Groups declared on RLSpanGroup, read off the class so none is forgotten in a list."""
    return frozenset(
        v for k, v in vars(RLSpanGroup).items()
        if isinstance(v, GroupName) and not k.startswith("U_") and v.umbrella == umbrella
    )


RLSpanGroup.ALL_GROUPS = _group_values(umbrella=True) | _group_values(umbrella=False)
UMBRELLA_GROUP_VALUES: Final[frozenset[str]] = _group_values(umbrella=True)

_G = RLSpanGroup
PRESETS: Final[dict[str, tuple[str, ...]]] = {
    "default": (_G.JOB, _G.CHECKPOINT, _G.EVALUATE, _G.SETUP, _G.MODEL_INIT),
    "per_step": (
        _G.JOB, _G.STEP, _G.CHECKPOINT, _G.EVALUATE, _G.SETUP, _G.MODEL_INIT, _G.ROLLOUT, _G.GENERATION,
        _G.LOGPROB, _G.REWARD, _G.ADVANTAGE, _G.POLICY_UPDATE, _G.DATA_PROCESSING, _G.DATA_PLANE,
        _G.EFFICIENCY,
    ),
}

# Efficiency categories (the trainer's Timer labels) -> bucket of the span that measures them.
EFFICIENCY_CATEGORY_BUCKET: Final[dict[str, Bucket]] = {
    "idle/buffer_starvation": Bucket.IDLE,
    "idle/refit_bubble": Bucket.IDLE,
    "idle/validation": Bucket.IDLE,
    "idle/buffer_full_backoff": Bucket.IDLE,
    "idle/refit_event_wait": Bucket.IDLE,
    "idle/generation_limit_pause": Bucket.IDLE,
    "wasted/failed_trajectory": Bucket.WASTED,
    "init/total": Bucket.OVERHEAD,
}
# Waits on the collector's own loop thread: honest durations, but on the collector's clock,
# which runs concurrently with the driver's, so their spans carry no bucket.
COLLECTOR_LOOP_CATEGORIES: Final[frozenset[str]] = frozenset(
    {"idle/refit_event_wait", "idle/generation_limit_pause"}
)
# init/total: the generation fleet's spans fill that window, so bucketing it would count it twice.
UNBUCKETED_SPAN_CATEGORIES: Final[frozenset[str]] = COLLECTOR_LOOP_CATEGORIES | {"init/total"}
# Categories measured by the trainer's Timer only, never as spans (seed 000): their seconds are
# reported as rl.efficiency.seconds; category -> why a span would make goodput lie.
TIMER_ONLY_CATEGORIES: Final[dict[str, str]] = {
    "idle/validation": (
        "the window it measures is already accounted as overhead: validation wraps its generation in "
        "bucket_scope(Bucket.OVERHEAD), so an idle span over the same interval would count the pass twice"),
    "idle/buffer_full_backoff": (
        "it is thread-seconds: several batch-worker threads accumulate at once, so the total can exceed the "
        "wall time it happened in"),
    "wasted/failed_trajectory": (
        "it is thread-seconds over batch-worker threads and covers the same window as the enclosing "
        "rl.grpo.generation span, so a span would duplicate an existing interval"),
}


def register_span_groups(*, allow_override: bool = True) -> None:
    """Declare the nemo_rl groups and presets; idempotent, called at import."""
    declared = _group_values(umbrella=True) | _group_values(umbrella=False)  # read afresh: one constant adds a group
    REGISTRY.register(NAMESPACE, sorted(declared), PRESETS, allow_override=allow_override)


register_span_groups()
