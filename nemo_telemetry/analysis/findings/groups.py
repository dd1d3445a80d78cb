"""``missing-group-spans``: span groups a run's processes enabled and none of its spans belong to.

The partial (:func:`group_presence`) is per run the groups enabled (the resource attribute every
process carries) and the (run, name) pairs present; merging is their union. Where seed 000 lists
a known coverage gap for the group, or the run's algorithm never opens it, the finding is
``info``; otherwise ``warning``.
"""

from __future__ import annotations

import re

import numpy as np

from nemo_telemetry.analysis.findings.report import Finding
from nemo_telemetry.analysis.goodput.steps import JOB_SPAN_REGEX, STEP_SPAN_REGEX
from nemo_telemetry.analysis.decode import SPAN_GROUPS_ATTRIBUTE as SPAN_GROUPS, SpanArrays
from nemo_telemetry.instrument import REGISTRY, span_name_regex

__all__ = ["SPAN_GROUPS_ATTRIBUTE", "group_presence", "missing_group_findings"]

SPAN_GROUPS_ATTRIBUTE = SPAN_GROUPS  # the resource attribute every process carries

# Known coverage gaps (seed 000, "Coverage gaps"): an enabled group that is legitimately empty.
_KNOWN_GAPS = {
    "generation": "only vLLM's synchronous generate path emits rl.vllm.generate; async runs (generate_async) "
                  "and SGLang / TRT-LLM / Megatron generation workers have no generation span",
    "per_prompt": "per-prompt spans exist only on the single-controller path (rl.sc.generate_and_push and its "
                  "rl.data_plane.put) and the Gym HTTP hop; the token-capture dispatch opens none",
    "efficiency": "efficiency spans are emitted only by async GRPO and the single controller's rollout pump",
    "data_plane": "data-plane spans come only from a transfer-queue client (single-controller actor, "
                  "TQPolicy / TQValue workers)",
    "model_init": "only vLLM, policy and value workers open rl.*.load_model; other backends are uninstrumented",
    "rollout": "rollout spans come from the driver's sync rollout or the async collector; SyncRolloutActor and "
               "grpo_sync.py emit none",
    "setup": "only some launchers open rl.startup; the others leave rl.setup.ray_init as a lone root, or nothing",
    "server": "a Gym server adopts traceparent only once its app calls instrument_fastapi",
    "http_client": "the aiohttp hop is instrumented by the NemoGym actor only, and gated on per_prompt",
    "checkpoint": "no checkpoint may have been due in the traced range (save_period, or checkpointing off)",
    "evaluate": "no validation may have been due in the traced range (val_period, val_at_start)",
}
# Groups an algorithm's loop never opens (seed 000, "Per-algorithm span names").
_ALGORITHM_GROUPS = {
    "sft": {"job", "step", "data_processing", "policy_update", "checkpoint", "evaluate", "setup", "model_init"},
    "dpo": {"job", "step", "policy_update", "checkpoint", "evaluate", "setup", "model_init"},
    "rm": {"job", "step", "checkpoint", "evaluate", "setup", "model_init"},
}


def group_presence(a: SpanArrays, keep: np.ndarray) -> tuple[dict[int, set[str]], list[tuple[int, int]]]:
    """``missing-group-spans``' partial: per run code, the union of the span groups its processes
    had enabled (resource attribute), and the (run, name) code pairs present. Merging is the union."""
    enabled: dict[int, set[str]] = {}
    for run, spec in a.run_resources(SPAN_GROUPS_ATTRIBUTE, keep):
        enabled.setdefault(run, set()).update(g.strip().lower() for g in spec.split(",") if g.strip())
    if not enabled:
        return enabled, []
    return enabled, a.run_names(keep)


def missing_group_findings(presence: tuple, names: tuple, runs: tuple,
                           limit: int) -> tuple[dict[str, int], list[Finding]]:
    """``missing-group-spans`` from the merged presence (run and name codes into ``runs`` / ``names``):
    how many (run, group) pairs at each severity, and the first ``limit`` findings."""
    enabled, pairs = presence
    counts: dict[str, int] = {}
    if not enabled:
        return counts, []
    catalogue = {info.name: info for info in REGISTRY.catalogue()}
    regexes = {g: re.compile("|".join(span_name_regex(p) for p in info.spans)) for g, info in catalogue.items()
               if info.spans}
    out = []
    for run, groups_on in sorted(enabled.items()):
        present_names = [names[name] for r, name in pairs if r == run]
        present = {g for g, rx in regexes.items() if any(n is not None and rx.match(n) for n in present_names)}
        algorithms = {n.split(".")[1] for n in present_names if n and re.match(f"{STEP_SPAN_REGEX}|{JOB_SPAN_REGEX}", n)}
        for group_name in sorted((groups_on & catalogue.keys()) - present):
            never = [alg for alg in algorithms if alg in _ALGORITHM_GROUPS and group_name not in _ALGORITHM_GROUPS[alg]]
            if never:
                note, severity = f"rl.{never[0]} runs never open {group_name} spans (per-algorithm span names)", "info"
            elif group_name in _KNOWN_GAPS:
                note, severity = f"known coverage gap: {_KNOWN_GAPS[group_name]}", "info"
            else:
                note, severity = ("check that the code path that opens them ran and that its process initialised "
                                  "telemetry and flushed before exit"), "warning"
            counts[severity] = counts.get(severity, 0) + 1
            if len(out) >= limit:
                continue
            patterns = ", ".join(catalogue[group_name].spans)
            out.append(Finding(
                code="missing-group-spans", severity=severity,
                message=f"group {group_name!r} was enabled but the run has none of its spans ({patterns}); {note}",
                trace_id=None, span_ids=(), iteration=None, run_id=runs[run] if run >= 0 else None))
    return counts, out
