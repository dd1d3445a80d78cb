"""What would make a goodput breakdown lie, as findings with stable codes.

Each finding names the run, trace, iteration and (up to ``max_span_ids``) spans it concerns and
says in one sentence what to do. The rules are :mod:`findings.rules`' partials over a batch of
rows, merged; this module finishes them (:func:`finish` over a :class:`Merged`): Python only
loops over the groups of offending spans to write their messages, and at most
``max_findings_per_code`` findings of one code are written (``counts`` has them all). The
step-level codes read goodput's finished per-step table. :func:`check_run` is the one-batch case
(the whole table); :mod:`engines.partitioned_check` merges one batch per file, locally or on Ray.

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
- ``failed-step`` is a ``warning`` per failed step (goodput's ``failed``: its step span or a bucketed
  span attributed to it ended in error status), naming the first span that failed and its status
  message: the number is right (that time is wasted), the run is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.findings.groups import (
    SPAN_GROUPS_ATTRIBUTE,
    GroupPresence,
    group_presence,
    missing_group_findings,
)
from nemo_telemetry.analysis.findings.report import (
    DEFAULT_OVERLAP_TOLERANCE_S,
    FINDING_CODES,
    SEVERITIES,
    CheckReport,
    Finding,
    overlap_tolerance_ns,
    report,
)
from nemo_telemetry.analysis.findings.rules import (
    BATCH_FINDING_CODES,
    RowFacts,
    anchor_rows,
    batch_offenders,
    catalogue_name_sets,
    detached_counts,
    detached_traces,
    failed_partial,
    failed_spans,
    group_name_codes,
    loose_rows,
    offenders,
    overlap_partial,
    overlapping_steps,
    trace_pairs,
)
from nemo_telemetry.analysis.goodput.census import CENSUS_CODES, SpanCensus, census_of_arrays
from nemo_telemetry.analysis.goodput.numbering import (
    StepNumbers,
    arrays_unstamped_steps,
    number_arrays,
    numbered_spans,
    read_step_numbers,
)
from nemo_telemetry.analysis.goodput.steps import Analysis, analyse, run_filter
from nemo_telemetry.analysis.goodput.steps import step_outliers
from nemo_telemetry.analysis.decode import BUCKETS, NO_BUCKET, SpanArrays, SpanReader, span_arrays
from nemo_telemetry.analysis.model.columns import code_mask
from nemo_telemetry.analysis.model.grouping import Columns, find_keys, group_by, take
from nemo_telemetry.analysis.model.intervals import merge_intervals
from nemo_telemetry.analysis.model.tree import with_id_keys
from nemo_telemetry.analysis.settings.machine import ReadSettings

__all__ = ["FINDING_CODES", "SEVERITIES", "Finding", "CheckReport", "check_run", "SPAN_GROUPS_ATTRIBUTE",
           "DEFAULT_OVERLAP_TOLERANCE_S", "overlap_tolerance_ns", "report", "Merged", "finish", "merge_in_memory",
           "group_presence", "check_span_files", "check_batch", "Anchored", "anchored",
           "BATCH_FINDING_CODES", "check_arrays"]

# -- what the finish reads ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Merged:
    """What every engine hands :func:`finish`: the merged partials and the rows they name.

    In memory ``facts`` are the whole table; out of core, only the offending rows and the rows
    collected for the first ``max_findings_per_code`` overlapping steps and detached traces,
    coded with the dataset's codes and in dataset order. Every row array is ascending.
    """

    facts: RowFacts
    offenders: dict[str, np.ndarray]  # span-level code -> its rows
    steps: Any  # goodput's step windows (run, iteration, row of one step span)
    table: Columns  # goodput's finished per-step table (goodput.rules.step_frame)
    overlapping: np.ndarray  # steps with a cluster of overlapping bucketed spans
    deep: np.ndarray  # of those, the steps where two overlap by more than the tolerance
    overlap_rows: np.ndarray  # bucketed rows inside (at least) the first overlapping steps
    overlap_step: np.ndarray  # their steps
    detached: Columns  # every detached (run code, trace), sorted: columns run, trace (key), low (trace_low)
    detached_rows: np.ndarray  # rows (of anchored runs, outside anchored traces) of at least the first of them
    anchor_trace: dict  # run code -> trace id of its first job or step span
    presence: GroupPresence  # missing-group-spans' merged partial
    numbers: StepNumbers | None = None  # the step spans without rl.iteration (goodput.numbering)
    failed: Columns | None = None  # rules.failed_spans: per failed (run name, iteration), its first failing span
    census: SpanCensus | None = None  # what the source holds (goodput.census), merged


@dataclass(frozen=True)
class _Context:
    merged: Merged | _BatchRows  # the span-level findings read only its facts and offenders
    max_span_ids: int
    limit: int

    @property
    def arrays(self):
        return self.merged.facts.arrays

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
        values = np.unique(self.merged.facts.iteration_of(rows))
        return int(values[0]) if len(values) == 1 and values[0] >= 0 else None

    def finding(self, code: str, message: str, rows: np.ndarray, run: int, *, iteration: int | None = None,
                severity: str | None = None, trace_id: str | None = None) -> Finding:
        span_ids, _ = self.ids(rows) if len(rows) else ((), "")
        if trace_id is None and len(rows):
            trace_id = self.arrays.trace_id([int(rows[0])])[0]
        return Finding(code=code, severity=severity or FINDING_CODES[code], message=message, trace_id=trace_id,
                       span_ids=span_ids, iteration=iteration, run_id=self.run_name(run))

    def step_finding(self, code: str, message: str, step: int, iteration: int) -> Finding:
        """A finding about step ``step`` (goodput's order), naming its first step span."""
        steps = self.merged.steps
        return self.finding(code, message, np.array([steps.row[step]]), int(steps.run[step]), iteration=iteration)


def _groups(rows: np.ndarray, *keys: np.ndarray) -> tuple[int, Iterator[tuple[tuple, np.ndarray]]]:
    """(number of groups, iterator over (key, rows)) of ``rows`` grouped by ``keys`` (all over rows)."""
    if len(rows) == 0:
        return 0, iter(())
    groups = group_by(*keys)
    return len(groups), ((tuple(k[at] for k in keys), rows[idx]) for at, idx in zip(groups.first, groups.members()))


def _take(items: Iterator, limit: int) -> Iterator:
    for i, item in enumerate(items):
        if i >= limit:
            return
        yield item


def _bucket_name(ctx: _Context, rows: np.ndarray) -> str:
    values = {ctx.arrays.bucket_values[c] for c in ctx.arrays.bucket_raw[rows[:50]] if c >= 0}
    return "/".join(sorted(values))


# -- span-level findings -----------------------------------------------------------------------


def _per_group(ctx: _Context, code: str, keys, message, *, iteration: bool = True) -> tuple[int, list[Finding]]:
    """``code``'s offending rows grouped by ``keys(rows)`` (the run first): how many groups, and a
    finding for each of the first ``limit``, worded by ``message(key, members, more)``."""
    rows = ctx.merged.offenders[code]
    count, groups = _groups(rows, *keys(rows))
    out = []
    for key, members in _take(groups, ctx.limit):
        _, more = ctx.ids(members)
        out.append(ctx.finding(code, message(key, members, more), members, key[0],
                               iteration=ctx.common_iteration(members) if iteration else None))
    return count, out


def _invalid_interval(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    return _per_group(ctx, "invalid-interval", lambda rows: (a.run[rows], a.name[rows]), lambda key, members, more: (
        f"{len(members)} span(s) named {ctx.name(key[1])!r} end before they start{more}; they are left out of "
        "every sum: check the clock of the process that emitted them and that start/end are Unix nanoseconds"))


def _unknown_bucket(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    return _per_group(ctx, "unknown-bucket", lambda rows: (a.run[rows], a.bucket_raw[rows]), lambda key, members, more: (
        f"{len(members)} span(s) carry rl.bucket={a.bucket_values[key[1]]!r}{more}, which no rollup knows; "
        f"use one of {', '.join(BUCKETS)} (the Bucket enum) so their time is counted"))


def _umbrella_bucket(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    umbrella_only, _ = catalogue_name_sets(a.names)

    def message(key, members, more):
        why = ("only umbrella groups claim that name" if np.isin(key[1], umbrella_only)
               else "the catalogue declares it unbucketed (it runs concurrently with bucketed work)")
        return (f"{len(members)} span(s) named {ctx.name(key[1])!r} carry rl.bucket={_bucket_name(ctx, members)}"
                f"{more}, but {why}: open it with umbrella_span (or drop the rl.bucket kwarg) so only the leaves "
                "inside carry time")

    return _per_group(ctx, "umbrella-bucket", lambda rows: (a.run[rows], a.name[rows]), message)


def _nested_bucket(ctx: _Context, tolerance_ns: int) -> tuple[dict[str, int], list[Finding]]:
    """``nested-bucket`` per (run, name, bucketed ancestor's name): ``info`` for nested spans that
    last at most the overlap tolerance (they cannot count more than that twice), an error otherwise."""
    a, facts = ctx.arrays, ctx.merged.facts
    rows = ctx.merged.offenders["nested-bucket"]
    short = ((a.end[rows] - a.start[rows]) <= tolerance_ns).astype(np.int64)
    ancestor = facts.walked_ancestor[np.searchsorted(facts.walked, rows)]
    count, groups = _groups(rows, a.run[rows], short, a.name[rows], ancestor)
    counts = {"error": 0, "info": 0}
    out = []
    for i, (key, members) in enumerate(groups):
        severity = "info" if key[1] else "error"
        counts[severity] += 1
        if i >= ctx.limit:
            continue
        _, more = ctx.ids(members)
        if key[1]:
            message = (f"{len(members)} bucketed span(s) named {ctx.name(key[2])!r} sit under the bucketed "
                       f"{ctx.name(key[3])!r}{more}, each lasting at most the {tolerance_ns / 1e6:g} ms overlap "
                       "tolerance: at most that is counted twice (double_counted_s counts it); still, make the "
                       "outer span an umbrella (umbrella_span) or drop the inner span's bucket")
        else:
            message = (f"{len(members)} bucketed span(s) named {ctx.name(key[2])!r} sit under the bucketed "
                       f"{ctx.name(key[3])!r}{more}, so their time is counted twice: make the outer span an umbrella "
                       "(umbrella_span) or drop the inner span's bucket")
        out.append(ctx.finding("nested-bucket", message, members, key[0], severity=severity,
                               iteration=ctx.common_iteration(members)))
    return counts, out


def _unstamped(ctx: _Context) -> tuple[int, list[Finding]]:
    a = ctx.arrays
    return _per_group(ctx, "unstamped-span", lambda rows: (a.run[rows], a.name[rows]), lambda key, members, more: (
        f"{len(members)} bucketed span(s) named {ctx.name(key[1])!r} have no rl.iteration, on themselves or "
        f"any ancestor{more}, so their time is reported outside the steps: open them inside "
        "iteration_scope(n), or carry the trace context from a stamped span (dispatch_with_trace_context)"),
        iteration=False)


def _orphans(ctx: _Context) -> tuple[int, list[Finding]]:
    a, facts = ctx.arrays, ctx.merged.facts
    keys = lambda rows: (a.run[rows], facts.trace_of(rows), facts.low_of(rows))  # noqa: E731 (the whole trace id)
    return _per_group(ctx, "orphan-span", keys, lambda key, members, more: (
        f"{len(members)} span(s) of this trace name a parent that is not in the data{more} (first: "
        f"{ctx.name(a.name[members[0]])!r}): include every process's dump file, and flush workers "
        "(flush_telemetry) before they exit"))


def _remote_parents(ctx: _Context) -> tuple[int, list[Finding]]:
    a, facts = ctx.arrays, ctx.merged.facts
    keys = lambda rows: (a.run[rows], facts.trace_of(rows), facts.low_of(rows))  # noqa: E731
    return _per_group(ctx, "remote-parent", keys, lambda key, members, more: (
        f"{len(members)} server or consumer span(s) of this trace were called by a process whose spans are not in "
        f"the data (their parent is remote){more} (first: {ctx.name(a.name[members[0]])!r}): if that caller is "
        "instrumented, include its dump files; otherwise this is where the trace enters the data, and no span "
        "is lost"))


def _census(merged: Merged, code: str) -> tuple[int, list[Finding]]:
    """The census's finding of ``code`` (:data:`CENSUS_CODES`): what the source holds, where it is
    not an RL run with steps."""
    if merged.census is None:
        return 0, []
    out = [Finding(code=c, severity=FINDING_CODES[c], message=message, trace_id=None, span_ids=(), iteration=None,
                   run_id=run) for c, run, message in merged.census.notes() if c == code]
    return len(out), out


def _detached(ctx: _Context) -> tuple[int, list[Finding]]:
    a, facts, merged = ctx.arrays, ctx.merged.facts, ctx.merged
    shown = take(merged.detached, slice(0, ctx.limit))
    rows = merged.detached_rows
    if len(rows):
        low = shown["low"] if "low" in shown else np.zeros(len(shown["trace"]), np.uint64)
        wanted = find_keys((shown["run"].astype(np.int64), shown["trace"].astype(np.uint64), low.astype(np.uint64)),
                           (a.run[rows].astype(np.int64), facts.trace_of(rows), facts.low_of(rows)))
        rows = rows[wanted >= 0]
    _, groups = _groups(rows, a.run[rows], facts.trace_of(rows), facts.low_of(rows))
    collector = np.concatenate([group_name_codes(a.names, g) for g in ("rollout", "efficiency")])
    out = []
    for (run, _, _), members in groups:
        roots = members[~a.has_parent[members] | facts.orphan[members]]
        shown = sorted({ctx.name(c) for c in a.name[roots[:20]]})
        other = merged.anchor_trace[int(run)]
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
    return len(merged.detached["run"]), out


# -- step-level findings -----------------------------------------------------------------------


def _step_findings(ctx: _Context, code: str, steps: np.ndarray, message) -> tuple[int, list[Finding]]:
    """One ``code`` finding per step of ``steps`` (rows of the per-step table, up to the limit),
    worded by ``message(row, i)``; the count is of every such step."""
    t = ctx.merged.table
    out = []
    for i in steps[: ctx.limit]:
        row = _row(t, i)
        out.append(ctx.step_finding(code, message(row, i), int(i), int(row["iteration"])))
    return len(steps), out


def _row(table: Columns, i: int) -> dict[str, Any]:
    return {name: values[i] for name, values in table.items()}


def _steps_over_wall(ctx: _Context, tolerance_ns: int) -> tuple[dict[str, int], list[Finding]]:
    """``bucket-exceeds-wall`` per step: ``info`` where the excess is within the overlap tolerance
    (no two of its bucketed spans overlap by more, as ``bucketed-overlap`` decides, and its spans
    reach past the window by at most the tolerance in all), an error otherwise."""
    t, m = ctx.merged.table, ctx.merged
    over = np.flatnonzero(t["bucket_sum_ns"] > t["wall_ns"])
    within = ~np.isin(over, m.deep) & (t["union_ns"][over] - t["wall_ns"][over] <= tolerance_ns)
    out = []
    for i, is_within in _take(zip(over, within), ctx.limit):
        row = _row(t, int(i))
        if is_within:
            message = (f"step {int(row['iteration'])}: its buckets sum to {row['bucket_sum_ns'] / 1e9:.6f} s, more "
                       f"than its {row['wall_s']:.6f} s wall, by overlaps each within the "
                       f"{tolerance_ns / 1e6:g} ms overlap tolerance: clock granularity (an SDK that records whole "
                       "milliseconds), not double counting. Raise --overlap-tolerance only for a coarser clock")
            severity = "info"
        else:
            message = (f"step {int(row['iteration'])}: its buckets sum to {row['bucket_sum_ns'] / 1e9:.3f} s, more "
                       f"than its {row['wall_s']:.3f} s wall ({row['double_counted_s']:.3f} s counted twice): see "
                       "the bucketed-overlap and nested-bucket findings, and keep buckets on leaves that do not run "
                       "concurrently")
            severity = "error"
        out.append(replace(ctx.step_finding("bucket-exceeds-wall", message, int(i), int(row["iteration"])),
                           severity=severity))
    return {"error": int((~within).sum()), "info": int(within.sum())}, out


def _unattributed(ctx: _Context, threshold: float) -> tuple[int, list[Finding]]:
    t = ctx.merged.table
    wall = t["wall_s"]
    share = np.where(wall > 0, t["unattributed_s"] / np.where(wall > 0, wall, 1), 0.0)

    def message(row, i: int) -> str:
        return (f"step {int(row['iteration'])}: {share[i]:.0%} of its {row['wall_s']:.3f} s wall "
                f"({row['unattributed_s']:.3f} s) is under no bucketed span (threshold {threshold:.0%}): enable the "
                "leaf groups of the phases in between (per_step), or wrap the gap in a managed_span")

    return _step_findings(ctx, "unattributed-step-time", np.flatnonzero(share > threshold), message)


def _overlaps(ctx: _Context, tolerance_ns: int) -> tuple[dict[str, int], list[Finding]]:
    """``bucketed-overlap`` per step: an error where two spans overlap by more than the tolerance,
    info where every overlap is within it (clock granularity: an SDK recording whole milliseconds)."""
    m = ctx.merged
    shown = m.overlapping[: ctx.limit]
    pick = np.isin(m.overlap_step, shown)
    rows, step = m.overlap_rows[pick], m.overlap_step[pick]
    clusters = merge_intervals(ctx.arrays.start[rows], ctx.arrays.end[rows], step)
    crowded = clusters.members[clusters.cluster_of] > 1
    rows, step = rows[crowded], step[crowded]
    deep_set = {int(d) for d in m.deep}
    _, groups = _groups(np.arange(len(rows)), step)
    out = []
    t = m.table
    for (at,), idx in groups:
        members = rows[idx]
        names = sorted({ctx.name(c) for c in ctx.arrays.name[members[:50]]})
        _, more = ctx.ids(members)
        row = _row(t, int(at))
        if int(at) in deep_set:
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
        out.append(ctx.finding("bucketed-overlap", message, members, int(m.steps.run[int(at)]),
                               iteration=int(row["iteration"]), severity=severity))
    return {"error": len(m.deep), "info": len(m.overlapping) - len(m.deep)}, out


def _steps_without_iteration(ctx: _Context) -> tuple[dict[str, int], list[Finding]]:
    """``step-without-iteration`` per (run, process, name) of step spans that carry no rl.iteration:
    ``info`` where they were numbered in start order, ``warning`` where their process stamps its
    other step spans, so they were left out of the steps."""
    numbers = ctx.merged.numbers
    counts = {"info": 0, "warning": 0}
    if numbers is None or len(numbers) == 0:
        return counts, []
    spans = numbers.spans.to_pydict()
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(zip(spans["run_id"], spans["service_name"], spans["rank"], spans["name"],
                                (n >= 0 for n in spans["iteration"]))):
        groups.setdefault(key, []).append(i)
    out = []
    for (run, service, rank, name, numbered), members in sorted(groups.items(), key=lambda kv: (
            tuple("" if v is None else str(v) for v in kv[0]))):
        severity = "info" if numbered else "warning"
        counts[severity] += 1
        if len(out) >= ctx.limit:
            continue
        process = f"{service or '(no service.name)'} rank {'?' if rank is None else rank}"
        shown = members[: ctx.max_span_ids]
        more = f" (and {len(members) - len(shown)} more)" if len(members) > len(shown) else ""
        how = ("stamp each step with its trainer's number: open it inside iteration_scope(n), or with "
               "start_step_span(n, ...)")
        if numbered:
            first, last = spans["iteration"][members[0]], spans["iteration"][members[-1]]
            message = (f"{len(members)} {name} span(s) of {process} carry no rl.iteration{more}; they are numbered "
                       f"{first}..{last} in start order per run and process, and the spans under them are attributed "
                       f"to those steps: {how}")
        else:
            message = (f"{len(members)} {name} span(s) of {process} carry no rl.iteration{more} while its other step "
                       f"spans do, so they are left out of the steps (a guessed number could merge two steps): {how}")
        out.append(Finding(code="step-without-iteration", severity=severity, message=message,
                           trace_id=spans["trace_id"][members[0]], span_ids=tuple(spans["span_id"][i] for i in shown),
                           iteration=spans["iteration"][members[0]] if numbered and len(members) == 1 else None,
                           run_id=run))
    return counts, out


def _outliers(ctx: _Context) -> tuple[int, list[Finding]]:
    out = []
    steps, table = ctx.merged.steps, ctx.merged.table
    for run_code in np.unique(steps.run):
        for o in step_outliers(take(table, table["run"] == run_code)):
            i = int(np.flatnonzero((steps.run == run_code) & (steps.iteration == o.iteration))[0])
            out.append(ctx.step_finding("step-time-outlier", (
                f"step {o.iteration} took {o.wall_s:.3f} s, past the median {o.median_s:.3f} s + 3 MAD "
                f"({o.threshold_s:.3f} s); {o.bucket} grew most (+{o.grew_by_s:.3f} s): look at its spans in the "
                "waterfall of this step"), i, o.iteration))
    return len(out), out[: ctx.limit]


def _failed_steps(ctx: _Context) -> tuple[int, list[Finding]]:
    """``failed-step`` per step goodput reports failed, naming the first span that failed it."""
    t, steps, detail = ctx.merged.table, ctx.merged.steps, ctx.merged.failed
    failed = np.flatnonzero(np.asarray(t.get("failed", np.zeros(len(steps), bool)), bool))
    at = np.full(len(steps), -1, np.int64)
    if detail is not None and len(detail["run"]):
        runs = {name: i for i, name in enumerate(ctx.arrays.runs)}
        code = np.array([runs.get(r, -2) if r is not None else -1 for r in detail["run"]], np.int64)
        step = steps.index_of(code, detail["iteration"], code >= -1)
        at[step[step >= 0]] = np.flatnonzero(step >= 0)
    out = []
    for i in failed[: ctx.limit]:
        row = _row(t, int(i))
        it = int(row["iteration"])
        buckets = ", ".join(f"{b} {row[f'failed_{b}_s']:.3f} s" for b in BUCKETS if row[f"failed_{b}_s"])
        lost = f"its bucketed time ({buckets or 'none'}) is counted as wasted_s, kept in failed_buckets"
        how = f"fix what raised (its exception event: waterfall --step {it}); the step fed no update"
        if at[i] < 0:
            out.append(ctx.step_finding("failed-step", f"step {it} failed: its step span ended in error status; "
                                        f"{lost}: {how}", int(i), it))
            continue
        d = {k: v[at[i]] for k, v in detail.items()}
        said = f": {d['message']!r}" if d["message"] else " (no status message)"
        more = f" ({int(d['spans']) - 1} more of its spans failed too)" if d["spans"] > 1 else ""
        out.append(Finding(code="failed-step", severity=FINDING_CODES["failed-step"], message=(
            f"step {it} failed: span {d['name']!r} (span {d['span_id']}, trace {d['trace_id']}) ended in error status"
            f"{said}{more}; {lost}: {how}"), trace_id=d["trace_id"], span_ids=(d["span_id"],), iteration=it,
            run_id=ctx.run_name(int(steps.run[i]))))
    return len(failed), out


# The findings of BATCH_FINDING_CODES, which finish and check_batch both write.
_BATCH_PRODUCERS = {"invalid-interval": _invalid_interval, "unknown-bucket": _unknown_bucket,
                    "umbrella-bucket": _umbrella_bucket}


def _per_severity(counted: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Each producer's count as ``{severity: n}``: a bare number is a single-severity code's, at its
    severity (a code whose findings differ in severity returns its dict itself)."""
    return {code: dict(n) if isinstance(n, dict) else {FINDING_CODES[code]: int(n)} for code, n in counted.items()}


# -- entry points ------------------------------------------------------------------------------


def finish(merged: Merged, *, unattributed_threshold: float = 0.2, tolerance_ns: int = 1_000_000,
           max_span_ids: int = 10, max_findings_per_code: int = 100) -> CheckReport:
    """The report from the merged partials: every code's count and its first findings, errors first."""
    ctx = _Context(merged, max_span_ids, max_findings_per_code)
    producers = {
        **{code: (lambda code=code: _census(merged, code)) for code in CENSUS_CODES},
        **{code: (lambda produce=produce: produce(ctx)) for code, produce in _BATCH_PRODUCERS.items()},
        "nested-bucket": lambda: _nested_bucket(ctx, tolerance_ns),
        "bucketed-overlap": lambda: _overlaps(ctx, tolerance_ns),
        "bucket-exceeds-wall": lambda: _steps_over_wall(ctx, tolerance_ns),
        "unstamped-span": lambda: _unstamped(ctx),
        "unattributed-step-time": lambda: _unattributed(ctx, unattributed_threshold),
        "missing-group-spans": lambda: missing_group_findings(merged.presence, max_findings_per_code),
        "step-time-outlier": lambda: _outliers(ctx),
        "step-without-iteration": lambda: _steps_without_iteration(ctx),
        "orphan-span": lambda: _orphans(ctx),
        "remote-parent": lambda: _remote_parents(ctx),
        "detached-trace": lambda: _detached(ctx),
        "failed-step": lambda: _failed_steps(ctx),
    }
    findings: list[Finding] = []
    counted: dict[str, Any] = {}
    for code, produce in producers.items():
        counted[code], written = produce()
        findings.extend(written)
    return report(findings, _per_severity(counted), merged.census)


def check_run(
    spans: pa.Table,
    *,
    run_id: str | None = None,
    unattributed_threshold: float = 0.2,
    overlap_tolerance_s: float = DEFAULT_OVERLAP_TOLERANCE_S,
    max_span_ids: int = 10,
    max_findings_per_code: int = 100,
    settings: ReadSettings | None = None,
) -> CheckReport:
    """Every finding over ``spans`` (one run, or all runs), errors first: the rules' one-batch case.

    ``unattributed_threshold`` is the share of a step's wall that may be under no bucketed span
    before ``unattributed-step-time`` fires. Bucketed spans that overlap by at most
    ``overlap_tolerance_s`` (clock granularity) give a ``bucketed-overlap`` at info severity, not
    an error; ``double_counted_s`` counts them either way. ``settings``: what the decode may use
    (:meth:`ReadSettings.from_machine` by default).
    """
    table, numbers = numbered_spans(with_id_keys(spans))
    with SpanReader(settings) as read:
        return check_arrays(read.table(table), run_id=run_id, numbers=numbers,
                             unattributed_threshold=unattributed_threshold, overlap_tolerance_s=overlap_tolerance_s,
                             max_span_ids=max_span_ids, max_findings_per_code=max_findings_per_code)


def check_span_files(files: list[str], *, run_id: str | None = None, unattributed_threshold: float = 0.2,
                     overlap_tolerance_s: float = DEFAULT_OVERLAP_TOLERANCE_S, max_span_ids: int = 10,
                     max_findings_per_code: int = 100, batch_rows: int | None = None,
                     settings: ReadSettings | None = None) -> CheckReport:
    """:func:`check_run` over a dataset's spans files, decoded batch by batch (of ``batch_rows``) as
    they are read (:meth:`~nemo_telemetry.analysis.decode.SpanReader.files`; a file of a layout no
    dataset format reads is refused there)."""
    with SpanReader(settings) as read:
        arrays = read.files(files, batch_rows=batch_rows)
        # the decode tells whether a step span lacks rl.iteration; only then are the files read for numbers
        numbers = read_step_numbers(files, arrays_unstamped_steps(arrays))
        return check_arrays(number_arrays(arrays, numbers), run_id=run_id, numbers=numbers,
                             unattributed_threshold=unattributed_threshold, overlap_tolerance_s=overlap_tolerance_s,
                             max_span_ids=max_span_ids, max_findings_per_code=max_findings_per_code)


def check_arrays(arrays: SpanArrays, *, run_id: str | None, unattributed_threshold: float,
                  overlap_tolerance_s: float, max_span_ids: int, max_findings_per_code: int,
                  numbers: StepNumbers | None = None) -> CheckReport:
    """The findings over decoded ``arrays``. What reads neither the walks nor the orphan test (the
    census, the span groups the processes enabled, the anchors and the rows outside their traces)
    comes first, while the seam's workers may still be finding the parents."""
    tolerance_ns = overlap_tolerance_ns(overlap_tolerance_s)
    keep = run_filter(arrays, run_id)
    census = census_of_arrays(arrays, keep)
    presence = group_presence(arrays, keep)
    anchors = anchored(arrays, keep)
    analysis = analyse(arrays.table, run_id=run_id, ancestors=True, arrays=arrays)
    merged = replace(merge_in_memory(analysis, tolerance_ns, presence, anchors=anchors, numbers=numbers),
                     census=census)
    return finish(merged, unattributed_threshold=unattributed_threshold, tolerance_ns=tolerance_ns,
                  max_span_ids=max_span_ids, max_findings_per_code=max_findings_per_code)


def check_batch(spans: pa.Table, *, max_span_ids: int = 10, max_findings_per_code: int = 100) -> CheckReport:
    """The findings one batch of spans decides on its own (:data:`BATCH_FINDING_CODES`), worded as
    :func:`check_run` words them: what ``monitor`` shows while a run trains, without the walks, the
    key index and the step rules that need every batch (``counts`` has only these codes)."""
    arrays = span_arrays(spans)
    keep = np.ones(len(arrays), dtype=bool)
    found = batch_offenders(arrays, keep)
    # A finding names its spans' iteration: an unstamped bucketed offender's is its stamped ancestor's,
    # found by a walk in the batch (which builds the batch's key index only when there is one).
    offending = np.unique(np.concatenate(list(found.values())))
    walked = offending[(arrays.bucket[offending] != NO_BUCKET) & ~arrays.has_iteration[offending]]
    iteration, stamped, _ = arrays.walk_up(walked)
    facts = RowFacts(arrays=arrays, keep=keep, walked=walked, walked_stamped=stamped, walked_iteration=iteration,
                     walked_ancestor=np.full(len(walked), -1), orphan=np.zeros(len(arrays), dtype=bool))
    ctx = _Context(_BatchRows(facts, found), max_span_ids, max_findings_per_code)
    findings: list[Finding] = []
    counted: dict[str, Any] = {}
    for code, produce in _BATCH_PRODUCERS.items():
        counted[code], written = produce(ctx)
        findings.extend(written)
    return report(findings, _per_severity(counted))


@dataclass(frozen=True, eq=False)
class _BatchRows:
    """What the span-level findings read of a :class:`Merged`: the rows (not walked) and their offenders."""

    facts: RowFacts
    offenders: dict[str, np.ndarray]


@dataclass(frozen=True, eq=False)
class Anchored:
    """The job and step spans of the selected run (``anchors``), whose traces hold its steps, and
    the rows of anchored runs outside those traces (``loose``: where detached traces are)."""

    anchors: np.ndarray
    runs: np.ndarray  # run codes that have an anchor
    loose: np.ndarray


def anchored(arrays: SpanArrays, keep: np.ndarray) -> Anchored:
    """:class:`Anchored` of the ``keep`` rows (which reads neither the walks nor the orphan test)."""
    anchors = anchor_rows(arrays, keep)
    runs = np.unique(arrays.run[anchors])
    traces, lows = trace_pairs(arrays, anchors)
    return Anchored(anchors, runs, loose_rows(arrays, keep, traces, runs, lows))


def merge_in_memory(analysis: Analysis, tolerance_ns: int, presence: GroupPresence,
                    orphans_found: Callable[[], None] = lambda: None, anchors: Anchored | None = None,
                    numbers: StepNumbers | None = None) -> Merged:
    """The partials of the one batch that is the whole table, which merge to themselves.

    ``orphans_found()`` is called before the orphan test is first read (what reads no orphan is
    done before: the seam's workers may still be running it). ``anchors``: :func:`anchored`
    of the analysis' rows, when the caller found them already.
    """
    a = analysis.arrays
    ancestor = analysis.walked_ancestor
    facts = RowFacts(arrays=a, keep=analysis.keep, walked=analysis.walked, walked_stamped=analysis.walked_stamped,
                     walked_iteration=analysis.walked_iteration,
                     walked_ancestor=np.where(ancestor >= 0, a.name[np.maximum(ancestor, 0)], -1), orphan=None)
    inside = analysis.bucketed_step >= 0
    rows, step = analysis.bucketed[inside], analysis.bucketed_step[inside]
    clusters, deep = overlap_partial(a.start[rows], a.end[rows], step, rows, tolerance_ns)
    found = anchored(a, analysis.keep) if anchors is None else anchors
    anchors, anchored_runs, loose = found.anchors, found.runs, found.loose
    first_anchor = {int(r): int(anchors[a.run[anchors] == r][0]) for r in anchored_runs}
    orphans_found()
    facts = replace(facts, orphan=a.orphan)
    return Merged(facts=facts, offenders=offenders(facts), steps=analysis.steps,
                  table=analysis.table, overlapping=overlapping_steps([clusters]), deep=overlapping_steps([deep]),
                  overlap_rows=rows, overlap_step=step, detached=detached_traces(detached_counts(facts, loose)),
                  detached_rows=loose, anchor_trace={r: a.trace_id([row])[0] for r, row in first_anchor.items()},
                  presence=presence, numbers=numbers,
                  failed=failed_spans([failed_partial(a, analysis.keep, analysis.bucketed, analysis.bucketed_iteration,
                                                      analysis.bucketed_stamped)]))
