"""What would make a goodput breakdown lie, as findings with stable codes.

Each finding names the run, trace, iteration and (up to ``max_span_ids``) spans it concerns and
says in one sentence what to do. Offending spans are found with vectorized masks over the whole
table; Python only loops over the groups of offending spans to write their messages, and at
most ``max_findings_per_code`` findings of one code are written (``counts`` has them all).

Which span names are umbrellas and which are declared unbucketed comes from the span-group
catalogue (:func:`nemo_telemetry.instrument.REGISTRY.catalogue`), the same declaration the
instrument side tags spans from, plus ``UNBUCKETED_SPAN_CATEGORIES`` for efficiency spans.

Severity: ``error`` when the breakdown itself is wrong (time counted twice or not at all, a
value no rollup understands); ``warning`` when spans are missing from, or cannot be placed in,
the steps; ``info`` for what is worth a look but expected (known coverage gaps, slow steps).

Decisions where the design leaves room:

- ``unstamped-span`` concerns bucketed spans only. Startup, model loads and the checkpoint
  finalize tail are unbucketed by declaration, so they never raise it; a bucketed span that
  walks up to an iteration with no step window (validation at iteration 0) is stamped, and
  goes to ``outside_steps`` without a finding.
- ``detached-trace`` needs a run that has a trace with a job or step span; a trace whose roots
  are all startup or model-load spans (``setup`` / ``model_init`` groups) is separate by design.
- ``bucketed-overlap`` and ``bucket-exceeds-wall`` look inside steps only; bucketed time
  outside steps is summed in ``outside_steps`` and not checked for overlap.
- ``bucketed-overlap`` is ``info`` for a step whose spans overlap each other by at most the
  overlap tolerance (default 1 ms: clock granularity), ``error`` once any two overlap by more.
- ``missing-group-spans`` is ``info`` where seed 000 lists a known coverage gap for the group
  (or the run's algorithm never opens it), ``warning`` otherwise; never ``error``.
"""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from nemo_telemetry.analysis.choices import SEVERITIES
from nemo_telemetry.analysis.model._arrays import (
    BUCKETS,
    NO_BUCKET,
    UNKNOWN_BUCKET,
    SpanArrays,
    code_mask,
    codes_matching,
    index_orphans,
    index_parents,
    isin_sorted,
    key_index,
    pairs_present,
    span_arrays,
    resource_pairs,
    sort_index,
)
from nemo_telemetry.analysis.model.intervals import merge_intervals
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.goodput.steps import JOB_SPAN_REGEX, STEP_SPAN_REGEX, Analysis, analyse, run_filter
from nemo_telemetry.analysis.goodput.steps import step_outliers
from nemo_telemetry.errors import NemoTelemetryError
from nemo_telemetry.instrument import REGISTRY, span_name_regex
from nemo_telemetry.instrument.span_groups import UNBUCKETED_SPAN_CATEGORIES

__all__ = ["FINDING_CODES", "SEVERITIES", "Finding", "CheckReport", "check_run", "SPAN_GROUPS_ATTRIBUTE",
           "DEFAULT_OVERLAP_TOLERANCE_S", "overlap_tolerance_ns", "report"]

FINDING_CODES: dict[str, str] = {  # code -> severity (missing-group-spans is info for a known gap)
    "bucketed-overlap": "error",
    "nested-bucket": "error",
    "umbrella-bucket": "error",
    "bucket-exceeds-wall": "error",
    "unknown-bucket": "error",
    "invalid-interval": "error",
    "unstamped-span": "warning",
    "orphan-span": "warning",
    "detached-trace": "warning",
    "unattributed-step-time": "warning",
    "missing-group-spans": "warning",
    "step-time-outlier": "info",
}
SPAN_GROUPS_ATTRIBUTE = "nemo.telemetry.span_groups"
# Overlaps of bucketed spans up to this long are clock granularity (the OpenTelemetry JS SDK records
# start times in whole milliseconds), reported at info severity.
DEFAULT_OVERLAP_TOLERANCE_S = 0.001

# Groups whose root spans are separate traces by design (seed 000: startup closes before the job
# opens; worker __init__ spans are opened before any call carries context).
_STANDALONE_GROUPS = ("setup", "model_init")

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


@dataclass(frozen=True)
class Finding:
    """One reason the breakdown might be wrong, and what to do about it."""

    code: str
    severity: str
    message: str
    trace_id: str | None
    span_ids: tuple[str, ...]
    iteration: int | None
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message, "trace_id": self.trace_id,
                "span_ids": list(self.span_ids), "iteration": self.iteration, "run_id": self.run_id}


@dataclass(frozen=True)
class CheckReport:
    """Every finding (at most ``max_findings_per_code`` written per code) and the full counts."""

    findings: tuple[Finding, ...]
    counts: dict[str, Any]  # {"error": n, "warning": n, "info": n, "by_code": {code: n}}

    def has(self, severity: str) -> bool:
        """Whether a finding at ``severity`` or worse exists."""
        worse = SEVERITIES[: SEVERITIES.index(severity) + 1]
        return any(self.counts[s] for s in worse)

    def to_dict(self) -> dict[str, Any]:
        return {"findings": [f.to_dict() for f in self.findings], "counts": self.counts}


# -- helpers -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Context:
    analysis: Analysis
    iteration: np.ndarray  # attributed where walked, else own; -1 where none
    max_span_ids: int
    limit: int

    @property
    def arrays(self):
        return self.analysis.arrays

    def run_name(self, code: int) -> str | None:
        return self.arrays.runs[code] if code >= 0 else None

    def name(self, code: int) -> str:
        return self.arrays.names[code] if code >= 0 else "(no name)"

    def ids(self, rows: np.ndarray) -> tuple[tuple[str, ...], str]:
        """Span ids of up to max_span_ids rows, and ' (and N more)' when there were more."""
        shown = rows[: self.max_span_ids]
        more = f" (and {len(rows) - len(shown)} more)" if len(rows) > len(shown) else ""
        return tuple(self.arrays.span_id(shown)), more

    def common_iteration(self, rows: np.ndarray) -> int | None:
        values = np.unique(self.iteration[rows])
        return int(values[0]) if len(values) == 1 and values[0] >= 0 else None

    def finding(self, code: str, message: str, rows: np.ndarray, run: int, *, iteration: int | None = None,
                severity: str | None = None, trace_row: int | None = None) -> Finding:
        span_ids, _ = self.ids(rows) if len(rows) else ((), "")
        trace_of = trace_row if trace_row is not None else (int(rows[0]) if len(rows) else None)
        return Finding(code=code, severity=severity or FINDING_CODES[code], message=message,
                       trace_id=self.arrays.trace_id([trace_of])[0] if trace_of is not None else None,
                       span_ids=span_ids, iteration=iteration, run_id=self.run_name(run))


def _groups(rows: np.ndarray, *keys: np.ndarray) -> tuple[int, Iterator[tuple[tuple, np.ndarray]]]:
    """(number of groups, iterator over (key, rows)) of ``rows`` grouped by ``keys`` (all over rows)."""
    if len(rows) == 0:
        return 0, iter(())
    frame = pd.DataFrame({f"k{i}": k for i, k in enumerate(keys)})
    grouped = frame.groupby(list(frame.columns), sort=True).indices
    return len(grouped), ((k if isinstance(k, tuple) else (k,), rows[idx]) for k, idx in grouped.items())


def _take(count: int, items: Iterator, limit: int) -> Iterator:
    for i, item in enumerate(items):
        if i >= limit:
            return
        yield item


def _bucket_name(ctx: _Context, rows: np.ndarray) -> str:
    values = {ctx.arrays.bucket_values[c] for c in ctx.arrays.bucket_raw[rows[:50]] if c >= 0}
    return "/".join(sorted(values))


# -- span-level findings -----------------------------------------------------------------------


def _invalid_interval(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    rows = np.flatnonzero(~a.valid_interval & ctx.analysis.keep)
    count, groups = _groups(rows, a.run[rows], a.name[rows])
    out = []
    for (run, name), members in _take(count, groups, ctx.limit):
        _, more = ctx.ids(members)
        out.append(ctx.finding("invalid-interval", (
            f"{len(members)} span(s) named {ctx.name(name)!r} end before they start{more}; they are left out of "
            "every sum: check the clock of the process that emitted them and that start/end are Unix nanoseconds"),
            members, run, iteration=ctx.common_iteration(members)))
    return count, out


def _unknown_bucket(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    rows = np.flatnonzero((a.bucket == UNKNOWN_BUCKET) & ctx.analysis.keep)
    count, groups = _groups(rows, a.run[rows], a.bucket_raw[rows])
    out = []
    for (run, raw), members in _take(count, groups, ctx.limit):
        _, more = ctx.ids(members)
        out.append(ctx.finding("unknown-bucket", (
            f"{len(members)} span(s) carry rl.bucket={a.bucket_values[raw]!r}{more}, which no rollup knows; "
            f"use one of {', '.join(BUCKETS)} (the Bucket enum) so their time is counted"),
            members, run, iteration=ctx.common_iteration(members)))
    return count, out


def _catalogue_name_sets(names: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Codes of names that only umbrella groups claim, and of names declared unbucketed."""
    catalogue = REGISTRY.catalogue()
    umbrella_only, unbucketed = [], []
    for code, name in enumerate(names):
        if name is None:
            continue
        claims = [info for info in catalogue if any(re.match(span_name_regex(p), name) for p in info.spans)]
        if claims and all(info.umbrella for info in claims):
            umbrella_only.append(code)
        if any(re.match(span_name_regex(p), name) for info in catalogue for p in info.unbucketed_spans):
            unbucketed.append(code)
    return np.array(umbrella_only, dtype=np.int32), np.array(unbucketed, dtype=np.int32)


def _umbrella_bucket(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    umbrella_only, unbucketed = _catalogue_name_sets(a.names)
    unbucketed_categories = np.array([i for i, c in enumerate(a.categories) if c in UNBUCKETED_SPAN_CATEGORIES],
                                     dtype=np.int32)
    bucketed = np.flatnonzero((a.bucket != NO_BUCKET) & ctx.analysis.keep)
    names, categories = a.name[bucketed], a.category[bucketed]
    flagged = (code_mask(names, umbrella_only, len(a.names)) | code_mask(names, unbucketed, len(a.names))
               | code_mask(categories, unbucketed_categories, len(a.categories)))
    rows = bucketed[flagged]
    count, groups = _groups(rows, a.run[rows], a.name[rows])
    out = []
    for (run, name), members in _take(count, groups, ctx.limit):
        _, more = ctx.ids(members)
        why = ("only umbrella groups claim that name" if np.isin(name, umbrella_only)
               else "the catalogue declares it unbucketed (it runs concurrently with bucketed work)")
        out.append(ctx.finding("umbrella-bucket", (
            f"{len(members)} span(s) named {ctx.name(name)!r} carry rl.bucket={_bucket_name(ctx, members)}{more}, "
            f"but {why}: open it with umbrella_span (or drop the rl.bucket kwarg) so only the leaves inside "
            "carry time"), members, run, iteration=ctx.common_iteration(members)))
    return count, out


def _nested_bucket(ctx: _Context) -> tuple[int, list[Finding]]:
    a, an = ctx.arrays, ctx.analysis
    has = an.walked_ancestor >= 0
    rows, ancestors = an.walked[has], an.walked_ancestor[has]
    count, groups = _groups(np.arange(len(rows)), a.run[rows], a.name[rows], a.name[ancestors])
    out = []
    for (run, name, above), idx in _take(count, groups, ctx.limit):
        members = rows[idx]
        _, more = ctx.ids(members)
        out.append(ctx.finding("nested-bucket", (
            f"{len(members)} bucketed span(s) named {ctx.name(name)!r} sit under the bucketed "
            f"{ctx.name(above)!r}{more}, so their time is counted twice: make the outer span an umbrella "
            "(umbrella_span) or drop the inner span's bucket"), members, run,
            iteration=ctx.common_iteration(members)))
    return count, out


def _unstamped(ctx: _Context) -> tuple[int, list[Finding]]:
    a, an = ctx.arrays, ctx.analysis
    rows = an.walked[~an.walked_stamped]
    count, groups = _groups(rows, a.run[rows], a.name[rows])
    out = []
    for (run, name), members in _take(count, groups, ctx.limit):
        _, more = ctx.ids(members)
        out.append(ctx.finding("unstamped-span", (
            f"{len(members)} bucketed span(s) named {ctx.name(name)!r} have no rl.iteration, on themselves or "
            f"any ancestor{more}, so their time is reported outside the steps: open them inside "
            "iteration_scope(n), or carry the trace context from a stamped span (dispatch_with_trace_context)"),
            members, run))
    return count, out


def _orphans(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    rows = np.flatnonzero(a.orphan & ctx.analysis.keep)
    trace_key = a.trace_keys[rows]
    count, groups = _groups(rows, a.run[rows], trace_key)
    out = []
    for (run, _), members in _take(count, groups, ctx.limit):
        _, more = ctx.ids(members)
        out.append(ctx.finding("orphan-span", (
            f"{len(members)} span(s) of this trace name a parent that is not in the data{more} (first: "
            f"{ctx.name(a.name[members[0]])!r}): include every process's dump file, and flush workers "
            "(flush_telemetry) before they exit"), members, run, iteration=ctx.common_iteration(members)))
    return count, out


def _outside_anchored_traces(ctx: _Context) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(job and step span rows, runs that have one, rows of those runs in a trace with none).

    The part of ``detached-trace`` that does not read the orphan test: check_run runs it
    while the orphan test is still running in other threads.
    """
    a, keep = ctx.arrays, ctx.analysis.keep
    anchor = np.flatnonzero(a.rows_of_names(f"{JOB_SPAN_REGEX}|{STEP_SPAN_REGEX}") & keep)
    anchored_traces = np.unique(a.trace_keys[anchor])
    anchored_runs = np.unique(a.run[anchor])
    loose = keep & code_mask(a.run, anchored_runs, len(a.runs))
    loose &= ~isin_sorted(a.trace_keys, anchored_traces)  # over every row: cheaper than gathering the run's rows
    return anchor, anchored_runs, np.flatnonzero(loose)


def _detached(ctx: _Context, outside: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
              ) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    trace_key = a.trace_keys
    anchor, anchored_runs, rows = _outside_anchored_traces(ctx) if outside is None else outside
    standalone = code_mask(a.name[rows], np.concatenate([_group_name_codes(a.names, g) for g in _STANDALONE_GROUPS]),
                           len(a.names))
    root = ~a.has_parent[rows] | a.orphan[rows]
    frame = pd.DataFrame({"run": a.run[rows], "trace": trace_key[rows], "designed": ~root | standalone})
    by_design = frame.groupby(["run", "trace"])["designed"].transform("all").to_numpy()
    rows = rows[~by_design]
    count, groups = _groups(rows, a.run[rows], trace_key[rows])
    collector = np.concatenate([_group_name_codes(a.names, g) for g in ("rollout", "efficiency")])
    anchor_trace_of_run = {int(r): int(anchor[a.run[anchor] == r][0]) for r in anchored_runs}
    out = []
    for (run, _), members in _take(count, groups, ctx.limit):
        roots = members[~a.has_parent[members] | a.orphan[members]]
        shown = sorted({ctx.name(c) for c in a.name[roots[:20]]})
        other = a.trace_id([anchor_trace_of_run[int(run)]])[0]
        if code_mask(a.name[members], collector, len(a.names)).any():
            hint = ("the async collector re-rooted: pass current_trace_carrier(), taken inside the job span, as its "
                    "trace_carrier and reopen it with remote_trace_context() in every thread (with the job group off "
                    "the carrier is empty)")
        else:
            hint = ("a Ray call, thread or HTTP hop started a new trace: dispatch with dispatch_with_trace_context / "
                    "@accepts_trace_context, or adopt traceparent on the server (known gap: SingleController "
                    "generation workers and non-presharded worker calls are separate traces by nemo.run.id)")
        out.append(ctx.finding("detached-trace", (
            f"{len(members)} span(s) (roots: {', '.join(shown)}) sit in a trace with no job or step span while "
            f"trace {other} holds the run's steps; {hint}"), roots, run,
            iteration=ctx.common_iteration(members)))
    return count, out


def _group_name_codes(names: tuple, group_name: str) -> np.ndarray:
    info = next((i for i in REGISTRY.catalogue() if i.name == group_name), None)
    if info is None or not info.spans:
        return np.zeros(0, dtype=np.int32)
    return codes_matching(names, "|".join(span_name_regex(p) for p in info.spans))


# -- step-level findings -----------------------------------------------------------------------


def _step_rows(ctx: _Context, mask: np.ndarray) -> list[int]:
    return [int(i) for i in np.flatnonzero(mask)]


def _steps_over_wall(ctx: _Context) -> tuple[int, list[Finding]]:
    t, steps = ctx.analysis.table, ctx.analysis.steps
    idx = _step_rows(ctx, (t["bucket_sum_ns"] > t["wall_ns"]).to_numpy())
    out = []
    for i in idx[: ctx.limit]:
        row = t.iloc[i]
        out.append(ctx.finding("bucket-exceeds-wall", (
            f"step {int(row['iteration'])}: its buckets sum to {row['bucket_sum_ns'] / 1e9:.3f} s, more than its "
            f"{row['wall_s']:.3f} s wall ({row['double_counted_s']:.3f} s counted twice): see the bucketed-overlap "
            "and nested-bucket findings, and keep buckets on leaves that do not run concurrently"),
            np.array([steps.row[i]]), int(steps.run[i]), iteration=int(row["iteration"])))
    return len(idx), out


def _unattributed(ctx: _Context, threshold: float) -> tuple[int, list[Finding]]:
    t, steps = ctx.analysis.table, ctx.analysis.steps
    share = (t["unattributed_s"] / t["wall_s"].where(t["wall_s"] > 0)).fillna(0).to_numpy()
    idx = _step_rows(ctx, share > threshold)
    out = []
    for i in idx[: ctx.limit]:
        row = t.iloc[i]
        out.append(ctx.finding("unattributed-step-time", (
            f"step {int(row['iteration'])}: {share[i]:.0%} of its {row['wall_s']:.3f} s wall "
            f"({row['unattributed_s']:.3f} s) is under no bucketed span (threshold {threshold:.0%}): enable the "
            "leaf groups of the phases in between (per_step), or wrap the gap in a managed_span"),
            np.array([steps.row[i]]), int(steps.run[i]), iteration=int(row["iteration"])))
    return len(idx), out


def _deep_steps(ctx: _Context, tolerance_ns: int) -> np.ndarray:
    """Steps where two bucketed spans overlap by more than ``tolerance_ns`` (sorted step indices).

    Shortening every interval by the tolerance keeps exactly the pairs that overlap by more than
    it; an interval no longer than the tolerance cannot, and is left out.
    """
    an = ctx.analysis
    inside = an.bucketed_step >= 0
    rows, step = an.bucketed[inside], an.bucketed_step[inside]
    start, end = ctx.arrays.start[rows], ctx.arrays.end[rows]
    longer = (end - start) > tolerance_ns
    deep = merge_intervals(start[longer], end[longer] - tolerance_ns, step[longer])
    return np.unique(deep.group[deep.members > 1])


def _overlaps(ctx: _Context, tolerance_ns: int = 0) -> tuple[dict[str, int], list[Finding]]:
    """``bucketed-overlap`` per step: an error where two spans overlap by more than the tolerance,
    info where every overlap is within it (clock granularity: an SDK recording whole milliseconds)."""
    an = ctx.analysis
    merged = an.merged
    if len(merged) == 0:
        return {"error": 0, "info": 0}, []
    inside = an.bucketed[an.bucketed_step >= 0]
    crowded = np.flatnonzero(merged.members > 1)
    rows = inside[np.isin(merged.cluster_of, crowded)]
    step_of = merged.group[merged.cluster_of[np.isin(merged.cluster_of, crowded)]]
    deep = _deep_steps(ctx, tolerance_ns)
    deep_set = {int(d) for d in deep}
    count, groups = _groups(np.arange(len(rows)), step_of)
    out = []
    t = an.table
    for (step,), idx in _take(count, groups, ctx.limit):
        members = rows[idx]
        names = sorted({ctx.name(c) for c in ctx.arrays.name[members[:50]]})
        _, more = ctx.ids(members)
        row = t.iloc[int(step)]
        if int(step) in deep_set:
            message = (f"step {int(row['iteration'])}: {len(members)} bucketed spans ({', '.join(names)}) overlap in "
                       f"time{more}, so {row['double_counted_s']:.3f} s is counted twice (double_counted_s): bucket one "
                       "enclosing leaf instead, or make the concurrent spans umbrellas")
            severity = "error"
        else:
            message = (f"step {int(row['iteration'])}: {len(members)} bucketed spans ({', '.join(names)}) overlap{more}, "
                       f"each by at most the {tolerance_ns / 1e6:g} ms overlap tolerance: clock granularity (an SDK "
                       f"that records whole milliseconds), not double counting; double_counted_s still counts its "
                       f"{row['double_counted_s']:.6f} s. Raise --overlap-tolerance only for a coarser clock")
            severity = "info"
        out.append(ctx.finding("bucketed-overlap", message, members, int(an.steps.run[int(step)]),
                               iteration=int(row["iteration"]), severity=severity))
    return {"error": len(deep), "info": count - len(deep)}, out


def _outliers(ctx: _Context) -> tuple[int, list[Finding]]:
    out = []
    steps, table = ctx.analysis.steps, ctx.analysis.table
    for run_code in np.unique(steps.run):
        for o in step_outliers(table[table["run"] == run_code]):
            i = int(np.flatnonzero((steps.run == run_code) & (steps.iteration == o.iteration))[0])
            out.append(ctx.finding("step-time-outlier", (
                f"step {o.iteration} took {o.wall_s:.3f} s, past the median {o.median_s:.3f} s + 3 MAD "
                f"({o.threshold_s:.3f} s); {o.bucket} grew most (+{o.grew_by_s:.3f} s): look at its spans in the "
                "waterfall of this step"), np.array([steps.row[i]]), int(run_code), iteration=o.iteration))
    return len(out), out[: ctx.limit]


# -- missing groups ----------------------------------------------------------------------------


def _group_presence(a: SpanArrays, keep: np.ndarray) -> tuple[dict[int, set[str]], list[tuple[int, int]]]:
    """What ``missing-group-spans`` compares: per run code, the union of the span groups its
    processes had enabled (resource attribute), and the (run, name) code pairs present.

    Reads nothing the analysis computes, so check_run runs it in a worker from the start.
    """
    enabled: dict[int, set[str]] = {}
    for run, spec in resource_pairs(a.table, SPAN_GROUPS_ATTRIBUTE, a.run, keep):
        enabled.setdefault(run, set()).update(g.strip().lower() for g in spec.split(",") if g.strip())
    if not enabled:
        return enabled, []
    pairs = (pairs_present(a.run, a.name, len(a.names)) if keep.all()
             else pairs_present(a.run[keep], a.name[keep], len(a.names)))
    return enabled, pairs


def _missing_groups(ctx: _Context, presence: tuple[dict[int, set[str]], list[tuple[int, int]]] | None = None
                    ) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    enabled, pairs = _group_presence(a, ctx.analysis.keep) if presence is None else presence
    if not enabled:
        return 0, []
    catalogue = {info.name: info for info in REGISTRY.catalogue()}
    regexes = {g: re.compile("|".join(span_name_regex(p) for p in info.spans)) for g, info in catalogue.items()
               if info.spans}
    out = []
    count = 0
    for run, groups_on in sorted(enabled.items()):
        present_names = [a.names[name] for r, name in pairs if r == run]
        present = {g for g, rx in regexes.items() if any(n is not None and rx.match(n) for n in present_names)}
        algorithms = {n.split(".")[1] for n in present_names if n and re.match(f"{STEP_SPAN_REGEX}|{JOB_SPAN_REGEX}", n)}
        for group_name in sorted((groups_on & catalogue.keys()) - present):
            count += 1
            if len(out) >= ctx.limit:
                continue
            never = [alg for alg in algorithms if alg in _ALGORITHM_GROUPS and group_name not in _ALGORITHM_GROUPS[alg]]
            if never:
                note, severity = f"rl.{never[0]} runs never open {group_name} spans (per-algorithm span names)", "info"
            elif group_name in _KNOWN_GAPS:
                note, severity = f"known coverage gap: {_KNOWN_GAPS[group_name]}", "info"
            else:
                note, severity = ("check that the code path that opens them ran and that its process initialised "
                                  "telemetry and flushed before exit"), "warning"
            patterns = ", ".join(catalogue[group_name].spans)
            out.append(Finding(
                code="missing-group-spans", severity=severity,
                message=f"group {group_name!r} was enabled but the run has none of its spans ({patterns}); {note}",
                trace_id=None, span_ids=(), iteration=None, run_id=ctx.run_name(run)))
    return count, out


# -- entry point -------------------------------------------------------------------------------


def check_run(
    spans: pa.Table,
    *,
    run_id: str | None = None,
    unattributed_threshold: float = 0.2,
    overlap_tolerance_s: float = DEFAULT_OVERLAP_TOLERANCE_S,
    max_span_ids: int = 10,
    max_findings_per_code: int = 100,
) -> CheckReport:
    """Every finding over ``spans`` (one run, or all runs), errors first.

    ``unattributed_threshold`` is the share of a step's wall that may be under no bucketed span
    before ``unattributed-step-time`` fires. Bucketed spans that overlap by at most
    ``overlap_tolerance_s`` (clock granularity) give a ``bucketed-overlap`` at info severity, not
    an error; ``double_counted_s`` counts them either way.
    """
    tolerance_ns = overlap_tolerance_ns(overlap_tolerance_s)
    # The id-key index and the orphan test are sorts and gathers, which numpy runs without the
    # GIL: two workers build the mixed keys, then sort the span index and the parent references
    # side by side, then run the orphan test; this thread decodes, analyses and writes the
    # other findings meanwhile.
    # A third worker reads the span groups the processes enabled (missing-group-spans), which
    # needs only the decoded names and runs.
    table = with_id_keys(spans)
    with ThreadPoolExecutor(max_workers=3) as pool:
        keys = pool.submit(key_index, table, sort=False)
        index = pool.submit(lambda: sort_index(keys.result()))
        parents = pool.submit(lambda: index_parents(keys.result()))
        orphans = pool.submit(lambda: index_orphans(index.result(), parents.result()))
        try:
            arrays = span_arrays(table)
            presence = pool.submit(_group_presence, arrays, run_filter(arrays, run_id))
            arrays.adopt_index(index.result())
            return _check(table, arrays, orphans, presence, run_id=run_id,
                          unattributed_threshold=unattributed_threshold, tolerance_ns=tolerance_ns,
                          max_span_ids=max_span_ids, max_findings_per_code=max_findings_per_code)
        finally:
            for pending in (parents, orphans):  # a bad run_id: do not wait for a test no one reads
                pending.cancel()


def _check(table: pa.Table, arrays: SpanArrays, orphans: Future, presence: Future, *, run_id: str | None,
           unattributed_threshold: float, tolerance_ns: int, max_span_ids: int,
           max_findings_per_code: int) -> CheckReport:
    analysis = analyse(table, run_id=run_id, ancestors=True, arrays=arrays)
    iteration = np.where(analysis.arrays.has_iteration, analysis.arrays.iteration, -1)
    iteration[analysis.walked] = np.where(analysis.walked_stamped, analysis.walked_iteration, -1)
    ctx = _Context(analysis, iteration, max_span_ids, max_findings_per_code)
    outside = _outside_anchored_traces(ctx)  # detached-trace's first half: before any wait on the workers
    producers = {
        "invalid-interval": lambda: _invalid_interval(ctx),
        "unknown-bucket": lambda: _unknown_bucket(ctx),
        "umbrella-bucket": lambda: _umbrella_bucket(ctx),
        "nested-bucket": lambda: _nested_bucket(ctx),
        "bucketed-overlap": lambda: _overlaps(ctx, tolerance_ns),
        "bucket-exceeds-wall": lambda: _steps_over_wall(ctx),
        "unstamped-span": lambda: _unstamped(ctx),
        "unattributed-step-time": lambda: _unattributed(ctx, unattributed_threshold),
        "missing-group-spans": lambda: _missing_groups(ctx, presence.result()),
        "step-time-outlier": lambda: _outliers(ctx),
        # these two read the orphan test, which the index thread runs meanwhile (numpy lets go of the GIL)
        "orphan-span": lambda: _orphans(ctx),
        "detached-trace": lambda: _detached(ctx, outside),
    }
    findings: list[Finding] = []
    counted: dict[str, Any] = {}
    for code, produce in producers.items():
        if code == "orphan-span":  # the first of the two that read the orphan test, which other threads run
            arrays.adopt_index(orphans.result())
        counted[code], written = produce()
        findings.extend(written)
    return report(findings, counted)


def overlap_tolerance_ns(overlap_tolerance_s: float) -> int:
    """The tolerance in ns; a negative or non-finite value is a clear error, not a silent zero."""
    if not (overlap_tolerance_s >= 0 and np.isfinite(overlap_tolerance_s)):
        raise NemoTelemetryError(f"overlap tolerance {overlap_tolerance_s!r} s: give a finite number of seconds >= 0 "
                                 f"(default {DEFAULT_OVERLAP_TOLERANCE_S})")
    return int(round(overlap_tolerance_s * 1e9))


def report(findings: list[Finding], counted: dict[str, Any]) -> CheckReport:
    """The report from each code's findings as written and its full count (errors first).

    ``counted[code]`` is a number at the code's severity, or ``{severity: number}`` for a code
    whose findings differ in severity; findings past the per-code cap still count, at theirs.
    """
    findings = sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
    counts: dict[str, Any] = {s: 0 for s in SEVERITIES}
    for f in findings:
        counts[f.severity] += 1
    by_code: dict[str, int] = {code: 0 for code in FINDING_CODES}
    for code, n in counted.items():
        per_severity = n if isinstance(n, dict) else {FINDING_CODES[code]: n}
        by_code[code] = sum(per_severity.values())
        for severity, total in per_severity.items():
            written = sum(1 for f in findings if f.code == code and f.severity == severity)
            counts[severity] += max(0, total - written)
    counts["by_code"] = by_code
    return CheckReport(findings=tuple(findings), counts=counts)
