"""The goodput rules, each written once as partial -> merge -> finish (DESIGN.md, "analysis: semantics").

- a *step span* is named ``rl.<algo>.step`` and carries ``rl.iteration``; a step's window runs
  from the earliest start to the latest end of its step spans;
- a bucketed span's iteration is its own ``rl.iteration``, else its nearest stamped ancestor's
  (:mod:`model.walk`), else it is *unstamped*;
- per step: ``<bucket>_s`` are plain sums of the durations of the bucketed spans attributed to
  it (no clipping: a checkpoint staging span that ends after its step still counts whole);
  ``wall_s`` is the window; ``covered_s`` the union of their intervals inside the window;
  ``unattributed_s = wall_s - covered_s``; ``double_counted_s`` = (sum over buckets) - (length
  of the union of their intervals); ``goodput = productive_s / wall_s``.

A step is *failed* when its step span, or a bucketed span attributed to it, ended in error status
(``status_code`` error): its bucketed time is reported as ``wasted_s`` (``productive_s``,
``overhead_s`` and ``idle_s`` become 0, so its ``goodput`` is 0) and the buckets it would have
had are kept beside it in ``failed_<bucket>_s``: a step whose reward function raised fed no
update, and its generation must not read as good time. ``covered_s``, ``unattributed_s`` and
``double_counted_s`` are interval figures and stay as they are.

Per run (``nemo.run.id``) the total sums the steps (``goodput = sum(productive) / sum(wall)``).
Bucketed time that no step window takes is reported apart, in ``outside_steps``: unstamped spans,
and spans attributed to an iteration that has no step span (validation at iteration 0, or a run
whose step group was off). The job span (``rl.<algo>.job``) gives ``job_wall_s``. Step-time
outliers follow Google's ml-goodput-measurement: a step is anomalous when its wall exceeds the
median plus 3 median absolute deviations of the run's step walls; the bucket (or the unattributed
gap) that grew most over its median names the cause.

The three stages, so that every engine gets the same numbers by only scheduling them:

1. :func:`goodput_partial` (one batch of spans, its walks already attributed) gives
   ``PARTIAL_SCHEMA`` rows, per (run, iteration): the step window (min start, max end of its
   step spans), per-bucket duration sums in integer nanoseconds, the union of its bucketed
   intervals (touching intervals coalesced); per run, the job spans' bounds; per (run, iteration),
   how many of its step spans and attributed bucketed spans ended in error (:func:`failing_rows`).
2. :class:`GoodputAccumulator` merges partials by min / max / sum / union, as they arrive.
3. :func:`finish` turns the merged rows into each run's :class:`RunGoodput`.

The in-memory path is the one-batch case; ``--by rank`` is :mod:`goodput.ranks`, in the same three stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.decode import BUCKETS, SpanArrays, span_arrays
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.grouping import Columns, find_keys, group_by, string_codes, take
from nemo_telemetry.analysis.model.intervals import clipped_union_length, merge_intervals, union_length
from nemo_telemetry.analysis.model.status import error_rows
from nemo_telemetry.analysis.model.walk import KeyIndex
from nemo_telemetry.analysis.model.tree import key_column, low_column
from nemo_telemetry.errors import NemoTelemetryError

__all__ = [
    "STEP_SPAN_REGEX", "JOB_SPAN_REGEX", "BUCKETS", "STEP_COLUMNS", "RANK_COLUMNS", "BY", "FLEET_BY", "check_by", "StepOutlier", "RunGoodput",
    "Steps", "step_windows", "bucketed_rows", "PARTIAL_SCHEMA", "STEP", "SUM", "UNION", "JOB", "goodput_partial", "batch_attribution", "partial_of",
    "coalesced_union", "partial_rows", "partial_columns", "GoodputAccumulator", "MergedSteps", "merged_steps", "finish",
    "step_frame", "empty_step_frame", "steps_table", "run_total", "outside_summary", "step_outliers",
    "FAIL", "FAILED_COLUMNS", "failing_rows", "ASYNC", "ASYNC_CAVEAT", "async_span_regex",
]

STEP_SPAN_REGEX = r"^rl\.[^.]+\.step$"
JOB_SPAN_REGEX = r"^rl\.[^.]+\.job$"
_NS = 1e9
_SUM_KEYS = ("wall_s", *(f"{b}_s" for b in BUCKETS), "covered_s", "unattributed_s", "double_counted_s")
FAILED_COLUMNS = ("failed", *(f"failed_{b}_s" for b in BUCKETS))
"""Per step: whether it failed, and (null where it did not) the bucket sums it would have had."""
STEP_COLUMNS = ("run_id", "iteration", "start_ns", "end_ns", *_SUM_KEYS, "goodput", *FAILED_COLUMNS)
RANK_COLUMNS = ("run_id", "service_name", "rank", "steps", *_SUM_KEYS, "goodput")
_GREW_CANDIDATES = (*(f"{b}_s" for b in BUCKETS), "unattributed_s")


BY = ("step", "rank", "fleet", "fleet,step")  # what run_goodput's ``by`` may say
FLEET_BY = ("fleet", "fleet,step")  # the ``by`` values of goodput.fleets' GPU-seconds per fleet


def check_by(by: str) -> None:
    """A ``by`` other than :data:`BY` is a clear error, before any data is read."""
    if by not in BY:
        raise NemoTelemetryError(f"by={by!r}: choose 'step', 'rank', 'fleet' or 'fleet,step'")


@dataclass(frozen=True)
class StepOutlier:
    """A step slower than median + 3 MAD of its run's steps, and the bucket that grew most."""

    iteration: int
    wall_s: float
    median_s: float
    threshold_s: float
    bucket: str  # "productive" ... "wasted", or "unattributed"
    grew_by_s: float


@dataclass(frozen=True)
class RunGoodput:
    """One run's goodput: a row per step, the total, what fell outside the steps, the job's wall."""

    run_id: str | None
    steps: pa.Table  # STEP_COLUMNS
    total: dict[str, Any]
    outside_steps: dict[str, Any]
    job_wall_s: float | None
    outliers: tuple[StepOutlier, ...] = ()
    ranks: pa.Table | None = None  # RANK_COLUMNS, when asked for by="rank"
    caveats: tuple[str, ...] = ()  # what the number does not mean (ASYNC_CAVEAT on an async run)
    fleets: Any = None  # goodput.fleets.FleetGoodput, when asked for by="fleet" or "fleet,step"


@dataclass(frozen=True, eq=False)
class Steps:
    """Step windows, one per (run, iteration), sorted; ``row`` is one step span of each (for ids)."""

    run: np.ndarray
    iteration: np.ndarray
    start: np.ndarray
    end: np.ndarray
    row: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    def index_of(self, run: np.ndarray, iteration: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """Step index of each (run, iteration), -1 where there is no such step or ``valid`` is False."""
        if len(self) == 0 or len(run) == 0:
            return np.full(len(run), -1, dtype=np.int64)
        found = find_keys((self.run, self.iteration), (np.asarray(run, np.int64), np.asarray(iteration, np.int64)))
        return np.where(valid, found, -1).astype(np.int64)


def step_windows(arrays: SpanArrays, keep: np.ndarray) -> Steps:
    """The step windows of the ``keep`` rows: per (run, iteration) of the stamped step spans with a
    valid interval, the earliest start and the latest end."""
    rows = np.flatnonzero(arrays.rows_of_names(STEP_SPAN_REGEX))
    rows = rows[arrays.has_iteration[rows] & arrays.valid_interval[rows] & keep[rows]]
    run, iteration = arrays.run[rows].astype(np.int64), arrays.iteration[rows].astype(np.int64)
    start, end = arrays.start[rows].astype(np.int64), arrays.end[rows].astype(np.int64)
    order = np.lexsort((start, iteration, run))  # a step's first row: its earliest start, then row order
    run, iteration, start, end, rows = run[order], iteration[order], start[order], end[order], rows[order]
    windows = group_by(run, iteration)
    return Steps(windows.key(run), windows.key(iteration), windows.reduce(np.minimum, start),
                 windows.reduce(np.maximum, end), windows.key(rows).astype(np.int64))


# -- 1. partial -------------------------------------------------------------------------------

# One table shape for every partial row; ``kind`` says which fields mean what.
STEP, SUM, UNION, JOB, FAIL, ASYNC = 0, 1, 2, 3, 4, 5
PARTIAL_SCHEMA = pa.schema([
    pa.field("kind", pa.int8()),  # STEP: a=min start, b=max end | SUM: a=ns, count=spans | FAIL: a=min start, count=spans
    pa.field("run", pa.string()),  # UNION: [a, b) one interval  | JOB: a=min start, b=max end (valid), count=spans
    # ASYNC: per run, count = its spans of the async-only efficiency phases (async_span_regex)
    pa.field("iteration", pa.int64()),  # null: unstamped (SUM) or not applicable (JOB)
    pa.field("bucket", pa.int8()),
    pa.field("a", pa.int64()),
    pa.field("b", pa.int64()),
    pa.field("count", pa.int64()),
])


def _keep_run(arrays, run_id: str | None) -> np.ndarray:
    if run_id is None:
        return np.ones(len(arrays), dtype=bool)
    if run_id not in arrays.runs:
        return np.zeros(len(arrays), dtype=bool)
    return arrays.run == arrays.runs.index(run_id)


def bucketed_rows(arrays, run_id: str | None) -> np.ndarray:
    """goodput's bucketed rows: a known bucket, a valid interval, in the selected run."""
    return (arrays.bucket >= 0) & arrays.valid_interval & _keep_run(arrays, run_id)


def goodput_partial(batch: pa.Table, *, attributed: KeyIndex, run_id: str | None = None) -> pa.Table:
    """The partial aggregates (``PARTIAL_SCHEMA``) of one batch of spans; ``attributed`` maps the
    (trace_key, parent_key, trace_low) of each unstamped bucketed span's walk to the iteration it met
    (:func:`partials.resolve_attribution`)."""
    return partial_of(*batch_attribution(batch, attributed=attributed, run_id=run_id))


def batch_attribution(batch: pa.Table, *, attributed: KeyIndex, run_id: str | None = None) -> tuple:
    """(arrays, keep, bucketed rows, their iteration, stamped) of one batch, what a partial reads:
    each unstamped bucketed span takes the iteration ``attributed`` holds for its walk."""
    arrays = span_arrays(batch)
    rows = np.flatnonzero(bucketed_rows(arrays, run_id))
    iteration, stamped = _attributed(arrays, rows, attributed)
    return arrays, _keep_run(arrays, run_id), rows, iteration, stamped


def partial_of(arrays: SpanArrays, keep: np.ndarray, rows: np.ndarray, iteration: np.ndarray, stamped: np.ndarray,
               *, steps: "Steps | None" = None) -> pa.Table:
    """The partial of decoded spans: ``rows`` are the bucketed spans (known bucket, valid interval,
    kept), with their attributed ``iteration`` where ``stamped``; ``keep`` the rows of the run asked
    for; ``steps`` the batch's :func:`step_windows` when the caller has them already."""
    runs = np.array(list(arrays.runs) + [None], dtype=object)  # code -1 -> None
    parts = [_step_rows(arrays, keep, runs, steps), _job_rows(arrays, keep, runs), _async_rows(arrays, keep, runs)]
    run, bucket = arrays.run[rows].astype(np.int64), arrays.bucket[rows].astype(np.int64)
    iteration = np.where(stamped, iteration, 0)
    order, heads = _group_starts(run, stamped, iteration, bucket)
    first = order[heads]
    parts.append(partial_rows(SUM, runs[run[first]], iteration[first], stamped[first], bucket=bucket[first],
                       a=_reduce(np.add, (arrays.end[rows] - arrays.start[rows])[order], heads),
                       count=np.diff(np.append(heads, len(order)))))
    parts.append(_union_rows(runs, run[stamped], iteration[stamped], arrays.start[rows][stamped],
                             arrays.end[rows][stamped]))
    parts.append(_fail_rows(arrays, runs, *failing_rows(arrays, keep, rows, iteration, stamped)))
    return pa.concat_tables(parts)


def failing_rows(arrays: SpanArrays, keep: np.ndarray, rows: np.ndarray, iteration: np.ndarray,
                 stamped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, their iteration) of the spans that fail a step: the stamped step spans (valid interval,
    kept) and the attributed bucketed ``rows`` (``iteration`` where ``stamped``) whose status is
    error. The one rule goodput (``FAIL`` partial rows) and the ``failed-step`` finding read."""
    error = error_rows(arrays.table)
    if not error.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    steps = np.flatnonzero(error & arrays.has_iteration & keep)
    steps = steps[arrays.rows_of_names(STEP_SPAN_REGEX)[steps] & arrays.valid_interval[steps]]
    bucketed = np.flatnonzero(error[rows] & stamped)
    return (np.concatenate([steps, rows[bucketed]]).astype(np.int64),
            np.concatenate([arrays.iteration[steps], iteration[bucketed]]).astype(np.int64))


def _fail_rows(arrays, runs: np.ndarray, rows: np.ndarray, iteration: np.ndarray) -> pa.Table:
    """``FAIL`` rows: per (run, iteration), how many spans of ``rows`` failed it, the first start."""
    run = arrays.run[rows].astype(np.int64)
    order, heads = _group_starts(run, iteration)
    first = order[heads]
    return partial_rows(FAIL, runs[run[first]], iteration[first], np.ones(len(heads), bool),
                        a=_reduce(np.minimum, arrays.start[rows][order].astype(np.int64), heads),
                        count=np.diff(np.append(heads, len(order))))



def _attributed(arrays, rows: np.ndarray, attributed: KeyIndex) -> tuple[np.ndarray, np.ndarray]:
    iteration = arrays.iteration[rows].copy()
    stamped = arrays.has_iteration[rows].copy()
    walked = np.flatnonzero(~stamped)
    if walked.size and len(attributed.key):
        table = arrays.table
        parent = key_column(table, "parent_key")[rows[walked]]
        parent = np.where(parent == key_column(table, "span_key")[rows[walked]], 0, parent)  # its own parent: no walk
        hit = attributed.find(key_column(table, "trace_key")[rows[walked]], parent, low_column(table)[rows[walked]])
        found = hit >= 0
        iteration[walked[found]] = attributed.values[hit[found]]
        stamped[walked[found]] = True
    return iteration, stamped


def _group_starts(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row order, start of each group in that order) of rows grouped by equal ``keys``."""
    n = len(keys[0])
    order = np.lexsort(keys[::-1])
    change = np.zeros(n, dtype=bool)
    if n:
        change[0] = True
        for key in keys:
            k = key[order]
            change[1:] |= k[1:] != k[:-1]
    return order, np.flatnonzero(change)


def _step_rows(arrays, keep: np.ndarray, runs: np.ndarray, steps: "Steps | None") -> pa.Table:
    if steps is None and not (arrays.has_iteration & keep).any():  # no step span can be here: skip the groupby
        return PARTIAL_SCHEMA.empty_table()
    steps = step_windows(arrays, keep) if steps is None else steps
    return partial_rows(STEP, runs[steps.run], steps.iteration, np.ones(len(steps), bool), a=steps.start, b=steps.end)


def _job_rows(arrays, keep: np.ndarray, runs: np.ndarray) -> pa.Table:
    # As goodput: a job span names its run as present; the wall comes from valid ones.
    rows = np.flatnonzero(arrays.rows_of_names(JOB_SPAN_REGEX) & keep)
    valid = arrays.valid_interval[rows]
    start = np.where(valid, arrays.start[rows], np.iinfo(np.int64).max)
    end = np.where(valid, arrays.end[rows], np.iinfo(np.int64).min)
    run = arrays.run[rows].astype(np.int64)
    order, heads = _group_starts(run)
    return partial_rows(JOB, runs[run[order[heads]]], np.zeros(len(heads), np.int64), np.zeros(len(heads), bool),
                 bucket=_reduce(np.maximum, valid[order].astype(np.int64), heads), a=_reduce(np.minimum, start[order], heads),
                 b=_reduce(np.maximum, end[order], heads), count=np.diff(np.append(heads, len(order))))


def async_span_regex() -> str:
    """Span names only an async run opens: the efficiency group's phases (the async driver's
    buffer starvation and refit bubble, the collector's waits, the initial buffer fill), from the
    span-group catalogue the instrument tags spans from."""
    from nemo_telemetry.instrument import REGISTRY, span_name_regex

    spans = [p for info in REGISTRY.catalogue() if info.name == "efficiency" for p in info.spans]
    return "|".join(span_name_regex(p) for p in spans) if spans else r"[^\s\S]"  # none: matches nothing


ASYNC_CAVEAT = (
    "async run: this goodput has no productive generation term. Generation runs as a continuously "
    "batched pipeline beside training and the driver opens no productive generation span, so its "
    "contribution is a utilization question (fleet metrics), not a span duration: do not read the "
    "ratio as 'generation contributed nothing'.")
"""The caveat a run with spans of :func:`async_span_regex` carries (seed 000, "Async rollout spans")."""


def _async_rows(arrays, keep: np.ndarray, runs: np.ndarray) -> pa.Table:
    """``ASYNC`` rows: per run, how many of its spans only an async run opens."""
    rows = np.flatnonzero(arrays.rows_of_names(async_span_regex()) & keep)
    run = arrays.run[rows].astype(np.int64)
    order, heads = _group_starts(run)
    return partial_rows(ASYNC, runs[run[order[heads]]], np.zeros(len(heads), np.int64), np.zeros(len(heads), bool),
                        count=np.diff(np.append(heads, len(order))))


def _reduce(ufunc, values: np.ndarray, heads: np.ndarray) -> np.ndarray:
    return ufunc.reduceat(values, heads) if len(heads) else np.zeros(0, values.dtype)


def _union_rows(runs: np.ndarray, run: np.ndarray, iteration: np.ndarray, start: np.ndarray,
                end: np.ndarray) -> pa.Table:
    """The union of the intervals of each (run code, iteration), touching intervals coalesced
    (``runs``: each run code's name, code -1 last)."""
    pairs = group_by(run, iteration)
    group, lo, hi = coalesced_union(pairs.codes, start, end)
    return partial_rows(UNION, runs[pairs.key(run)[group]], pairs.key(iteration)[group], np.ones(len(group), bool),
                        a=lo, b=hi)


def coalesced_union(group: np.ndarray, start: np.ndarray, end: np.ndarray):
    """(group, start, end) of the union of each group's intervals, touching intervals coalesced."""
    merged = merge_intervals(start, end, group)
    if len(merged) == 0:
        return merged.group, merged.start, merged.end
    new = np.ones(len(merged), dtype=bool)
    new[1:] = (merged.group[1:] != merged.group[:-1]) | (merged.start[1:] != merged.end[:-1])
    heads = np.flatnonzero(new)
    return merged.group[heads], merged.start[heads], np.maximum.reduceat(merged.end, heads)


def partial_rows(kind: int, run, iteration, has_iteration, *, bucket=None, a=None, b=None, count=None) -> pa.Table:
    """``PARTIAL_SCHEMA`` rows of one ``kind`` (``run``: names, None for no run)."""
    n = len(iteration)
    zeros = np.zeros(n, np.int64)
    return pa.table([
        pa.array(np.full(n, kind, np.int8)), pa.array(np.asarray(run, dtype=object), pa.string()),
        pa.array(np.asarray(iteration, np.int64), mask=~np.asarray(has_iteration, bool)),
        pa.array(np.asarray(zeros if bucket is None else bucket).astype(np.int8)),
        pa.array(np.asarray(zeros if a is None else a, np.int64)), pa.array(np.asarray(zeros if b is None else b, np.int64)),
        pa.array(np.asarray(zeros if count is None else count, np.int64)),
    ], schema=PARTIAL_SCHEMA)


# -- 2. merge ---------------------------------------------------------------------------------

@dataclass
class GoodputAccumulator:
    """Merges partial tables as they arrive; its state stays a few rows per step."""

    compact_rows: int = 1 << 20
    _state: list = field(default_factory=list)
    _pending_rows: int = 0
    _state_rows: int = 0
    partials: int = 0

    def add(self, partial: pa.Table) -> None:
        self._state.append(partial)
        self._pending_rows += partial.num_rows
        self.partials += 1
        if self._pending_rows >= max(self.compact_rows, 2 * self._state_rows):
            self._compact()

    def _compact(self) -> pa.Table:
        merged = _merge(pa.concat_tables(self._state) if self._state else PARTIAL_SCHEMA.empty_table())
        self._state = [merged]
        self._pending_rows = self._state_rows = merged.num_rows
        return merged

    def merged(self) -> pa.Table:
        """Every partial added so far, merged (``PARTIAL_SCHEMA``): one STEP / SUM / JOB row per
        key, disjoint UNIONs."""
        return self._compact()

    def result(self, run_order: Sequence[str | None]) -> tuple[RunGoodput, ...]:
        """The runs' goodput; ``run_order`` is the order the in-memory path reports runs in."""
        return finish(self._compact(), run_order)


def partial_columns(table: pa.Table, run_order: Sequence[str | None] | None = None) -> tuple[Columns, tuple]:
    """A ``PARTIAL_SCHEMA`` table as numpy columns, and the run names its ``run`` codes number:
    ``run_order`` when given (a run not in it, or no run: -1), else first appearance (no run: -1).
    ``stamped`` says where ``iteration`` (0 elsewhere) is set."""
    def ints(name: str, dtype=np.int64) -> np.ndarray:
        return np.asarray(table.column(name).to_numpy(), dtype)

    run, runs = string_codes(table.column("run"), run_order)
    iteration = table.column("iteration")
    columns = {"kind": ints("kind", np.int8), "run": run,
               "stamped": np.asarray(valid_rows(iteration), bool),
               "iteration": np.asarray(pc.fill_null(iteration, 0).to_numpy(), np.int64),
               "bucket": ints("bucket"), "a": ints("a"), "b": ints("b"), "count": ints("count")}
    return columns, runs


def _merge(table: pa.Table) -> pa.Table:
    """Partial rows merged: one STEP / SUM / JOB row per key, UNION rows disjoint per key."""
    rows, runs = partial_columns(table)
    names = np.array([*runs, None], dtype=object)  # run code -1 -> None
    parts = []
    for kind, by_bucket, bucket, a, b in ((STEP, True, None, np.minimum, np.maximum), (SUM, True, None, np.add, np.add),
                                           (JOB, False, np.maximum, np.minimum, np.maximum),
                                           (FAIL, False, np.maximum, np.minimum, np.maximum),
                                           (ASYNC, False, np.maximum, np.minimum, np.maximum)):
        part = take(rows, rows["kind"] == kind)
        keys = (part["run"], part["stamped"], part["iteration"], *((part["bucket"],) if by_bucket else ()))
        groups = group_by(*keys)
        parts.append(partial_rows(
            kind, names[groups.key(part["run"])], groups.key(part["iteration"]), groups.key(part["stamped"]),
            bucket=groups.key(part["bucket"]) if bucket is None else groups.reduce(bucket, part["bucket"]),
            a=groups.reduce(a, part["a"]), b=groups.reduce(b, part["b"]), count=groups.reduce(np.add, part["count"])))
    unions = take(rows, rows["kind"] == UNION)
    pairs = group_by(unions["run"], unions["iteration"])
    group, lo, hi = coalesced_union(pairs.codes, unions["a"], unions["b"])
    parts.append(partial_rows(UNION, names[pairs.key(unions["run"])[group]], pairs.key(unions["iteration"])[group],
                              np.ones(len(group), bool), a=lo, b=hi))
    return pa.concat_tables(parts)


# -- 3. finish --------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class MergedSteps:
    """The merged partials as goodput's per-step analysis: the merged rows (:func:`partial_columns`,
    runs coded by the caller's run order), the step windows, the per-step table (:func:`step_frame`),
    and the SUM rows with whether each belongs to a step."""

    merged: Columns
    steps: Steps
    table: Columns
    sums: Columns
    inside: np.ndarray


def merged_steps(merged: pa.Table, run_order: Sequence[str | None]) -> MergedSteps:
    """Steps and ``step_frame`` from merged partials (``run_order[i]`` gets code i, no run -1)."""
    rows, _ = partial_columns(merged, run_order)
    step_rows = take(rows, rows["kind"] == STEP)
    step_rows = take(step_rows, np.lexsort((step_rows["iteration"], step_rows["run"])))
    steps = Steps(step_rows["run"], step_rows["iteration"], step_rows["a"], step_rows["b"],
                  np.zeros(len(step_rows["run"]), np.int64))
    sums_part = take(rows, rows["kind"] == SUM)
    step_of_sum = steps.index_of(sums_part["run"], sums_part["iteration"], sums_part["stamped"])
    inside = step_of_sum >= 0
    sums = np.zeros((len(steps), len(BUCKETS)), dtype=np.int64)
    np.add.at(sums, (step_of_sum[inside], sums_part["bucket"][inside]), sums_part["a"][inside])
    unions = take(rows, rows["kind"] == UNION)
    step_of_union = steps.index_of(unions["run"], unions["iteration"], np.ones(len(unions["run"]), bool))
    keep = step_of_union >= 0
    intervals = merge_intervals(unions["a"][keep], unions["b"][keep], step_of_union[keep])
    fails = take(rows, rows["kind"] == FAIL)
    step_of_fail = steps.index_of(fails["run"], fails["iteration"], fails["stamped"])
    failed = np.zeros(len(steps), bool)
    failed[step_of_fail[step_of_fail >= 0]] = True
    table = step_frame(steps, sums.astype(np.float64), intervals, failed=failed)
    return MergedSteps(rows, steps, table, sums_part, inside)


def step_frame(steps: Steps, sums: np.ndarray, merged, *, failed: np.ndarray | None = None) -> Columns:
    """The per-step table (columns: ``run`` code, ``iteration``, ``start_ns``, ``end_ns``, the sums
    of ``STEP_COLUMNS`` in seconds, ``bucket_sum_ns``, ``wall_ns``, ``union_ns``) from each step's bucket sums
    (ns, shape steps x BUCKETS) and the merged intervals of its bucketed spans (grouped by step index).

    Only the union's length and its length inside the window are read, so merged partial unions
    give the same numbers as the whole batch's. The ``failed`` steps' bucket sums move to
    ``wasted_s`` (kept in ``failed_<bucket>_s``, NaN for the other steps); their goodput is 0.
    """
    n = len(steps)
    union = union_length(merged, n)
    covered = clipped_union_length(merged, steps.start, steps.end)
    wall = (steps.end - steps.start).astype(np.float64)
    frame = {"run": steps.run, "iteration": steps.iteration, "start_ns": steps.start, "end_ns": steps.end,
             "wall_s": wall / _NS}
    for i, b in enumerate(BUCKETS):
        frame[f"{b}_s"] = sums[:, i] / _NS
    frame["covered_s"] = covered / _NS
    frame["unattributed_s"] = (wall - covered) / _NS
    frame["double_counted_s"] = (sums.sum(axis=1) - union) / _NS
    frame["goodput"] = np.where(wall > 0, sums[:, 0] / np.where(wall > 0, wall, 1), np.nan)
    failed = np.zeros(n, bool) if failed is None else np.asarray(failed, bool)
    frame["failed"] = failed
    for i, b in enumerate(BUCKETS):
        frame[f"failed_{b}_s"] = np.where(failed, frame[f"{b}_s"], np.nan)
        frame[f"{b}_s"] = np.where(failed, sums.sum(axis=1) / _NS if b == "wasted" else 0.0, frame[f"{b}_s"])
    frame["goodput"] = np.where(failed & (wall > 0), 0.0, frame["goodput"])
    frame["bucket_sum_ns"] = sums.sum(axis=1)
    frame["wall_ns"] = steps.end - steps.start
    frame["union_ns"] = union  # the bucketed time counted once: bucket_sum_ns less what overlaps
    return frame


def empty_step_frame() -> Columns:
    """A :func:`step_frame` of no steps."""
    none = np.zeros(0, np.int64)
    return step_frame(Steps(none, none, none, none, none), np.zeros((0, len(BUCKETS))),
                      merge_intervals(none, none, none))


def finish(merged: pa.Table, run_order: Sequence[str | None]) -> tuple[RunGoodput, ...]:
    """Each run's goodput from merged partials (``run_order[i]`` gets code i: the runs' report order)."""
    done = merged_steps(merged, run_order)
    rows, steps, table, sums_part, inside = done.merged, done.steps, done.table, done.sums, done.inside
    jobs = take(rows, rows["kind"] == JOB)
    asynchronous = set(rows["run"][(rows["kind"] == ASYNC) & (rows["count"] > 0)].tolist())
    present = set(steps.run.tolist()) | set(sums_part["run"].tolist()) | set(jobs["run"].tolist())
    out = []
    for code in sorted(present):
        name = run_order[code] if code >= 0 else None
        frame = take(table, table["run"] == code)
        outside = take(sums_part, (sums_part["run"] == code) & ~inside)
        outside_sums = np.zeros(len(BUCKETS), np.int64)
        np.add.at(outside_sums, outside["bucket"], outside["a"])
        out.append(RunGoodput(
            run_id=name, steps=steps_table(frame, name), total=run_total(frame),
            outside_steps=outside_summary(
                outside_sums, int(outside["count"].sum()), int(outside["count"][~outside["stamped"]].sum()),
                np.unique(outside["iteration"][outside["stamped"]])),
            job_wall_s=_job_wall(take(jobs, jobs["run"] == code)), outliers=step_outliers(frame),
            caveats=(ASYNC_CAVEAT,) if code in asynchronous else ()))
    return tuple(out)


def _job_wall(jobs: Columns) -> float | None:
    valid = jobs["bucket"] > 0
    if not valid.any():
        return None
    return float((np.int64(jobs["b"][valid].max()) - np.int64(jobs["a"][valid].min())) / _NS)


def steps_table(frame: Columns, run_name: str | None) -> pa.Table:
    """The ``STEP_COLUMNS`` table of one run's :func:`step_frame` rows (a NaN goodput: null)."""
    n = len(frame["iteration"])
    columns = {"run_id": pa.array([run_name] * n, pa.string()),
               "iteration": pa.array(np.asarray(frame["iteration"], np.int64))}
    for c in STEP_COLUMNS[2:]:
        if c.endswith("_ns"):
            columns[c] = pa.array(np.asarray(frame[c], np.int64), pa.int64())
        elif c == "failed":
            columns[c] = pa.array(np.asarray(frame[c], bool), pa.bool_())
        else:
            values = np.asarray(frame[c], np.float64)
            nullable = c == "goodput" or c.startswith("failed_")
            columns[c] = pa.array(values, pa.float64(), mask=np.isnan(values) if nullable else None)
    return pa.table(columns)


def run_total(frame: Columns) -> dict[str, Any]:
    total: dict[str, Any] = {k: float(np.sum(frame[k])) for k in _SUM_KEYS}
    total["goodput"] = total["productive_s"] / total["wall_s"] if total["wall_s"] > 0 else None
    total["steps"] = int(len(frame["iteration"]))
    failed = np.asarray(frame["failed"], bool)
    total["failed_steps"] = int(failed.sum())  # their bucketed time is in wasted_s; failed_<bucket>_s: what it was
    for b in BUCKETS:
        total[f"failed_{b}_s"] = float(np.sum(np.asarray(frame[f"failed_{b}_s"])[failed]))
    return total


def outside_summary(sums: np.ndarray, spans: int, unstamped: int, iterations: np.ndarray) -> dict[str, Any]:
    """``outside_steps`` from per-bucket sums (ns), span counts and the stamped iterations with no step."""
    out: dict[str, Any] = {f"{b}_s": float(sums[i] / _NS) for i, b in enumerate(BUCKETS)}
    out["spans"] = int(spans)
    out["unstamped_spans"] = int(unstamped)
    out["iterations"] = sorted(int(i) for i in iterations)
    return out


def step_outliers(frame: Columns) -> tuple[StepOutlier, ...]:
    """ml-goodput-measurement's rule: wall > median + 3 * MAD (unscaled) of the run's step walls
    (``frame``: one run's :func:`step_frame` rows)."""
    if len(frame["wall_s"]) < 3:
        return ()
    wall = frame["wall_s"]
    median = float(np.median(wall))
    threshold = median + 3 * float(np.median(np.abs(wall - median)))
    medians = {c: float(np.median(frame[c])) for c in _GREW_CANDIDATES}
    out = []
    for i in np.flatnonzero(wall > threshold):  # the few anomalous steps only
        growth = {c: float(frame[c][i]) - medians[c] for c in _GREW_CANDIDATES}
        grown = max(growth, key=growth.get)
        out.append(StepOutlier(int(frame["iteration"][i]), float(wall[i]), median, threshold,
                               grown.removesuffix("_s"), growth[grown]))
    return tuple(out)
