"""Goodput per training step in memory, and what goodput and the findings share about a spans table.

The rules are :mod:`goodput.rules`' (partial -> merge -> finish); a table in memory is their
one-batch case, its walks done inside the batch (:mod:`model.walk`). :func:`analyse` keeps what
``check_run`` reads besides the per-step table: the walk of every span with an ``rl.bucket``
(iteration and nearest bucketed ancestor) and the bucketed spans' step and intervals.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.goodput.rules import (
    BUCKETS, FLEET_BY, JOB_SPAN_REGEX, STEP_COLUMNS, STEP_SPAN_REGEX, GoodputAccumulator, RunGoodput, Steps, StepOutlier,
    async_span_regex, check_by, empty_step_frame, finish, merged_steps, partial_of, step_outliers,  # noqa: F401
    step_windows, steps_table,
)
from nemo_telemetry.analysis.model.grouping import Columns
from nemo_telemetry.analysis.goodput.numbering import (
    number_steps,
    numbered_spans,
    read_step_numbers,
    unstamped_step_count,
)
from nemo_telemetry.analysis.goodput.ranks import merge_ranks, rank_partial, ranks_tables
from nemo_telemetry.analysis.goodput.fleets import (
    attach_fleets, fleet_document, fleet_partial, merge_fleets, metric_partial,
)
from nemo_telemetry.analysis.decode import (
    KeptRows, Later, SpanArrays, file_rows, span_arrays, table_rows,
)
from nemo_telemetry.analysis.model.walk import walk_rows
from nemo_telemetry.analysis.settings.machine import ReadSettings
from nemo_telemetry.analysis.model.intervals import merge_intervals
from nemo_telemetry.errors import UnknownRunError

__all__ = [
    "STEP_SPAN_REGEX",
    "JOB_SPAN_REGEX",
    "BUCKETS",
    "STEP_COLUMNS",
    "RunGoodput",
    "StepOutlier",
    "goodput_by_step",
    "run_goodput",
    "compare_runs",
    "goodput_document",
]

# Names the findings and the partitioned check read from this module (the rules are rules.py's).
_Steps, _step_windows = Steps, step_windows  # and step_outliers, imported above


@dataclass(frozen=True, eq=False)
class Analysis:
    """Everything goodput and the findings share, computed once per spans table."""

    arrays: SpanArrays
    keep: np.ndarray  # rows of the selected run (all rows when no run was asked for)
    steps: Steps
    bucketed: np.ndarray  # rows with a known bucket and a valid interval
    bucketed_iteration: np.ndarray
    bucketed_stamped: np.ndarray
    walked: np.ndarray  # every row with an rl.bucket (known, unknown or invalid interval)
    walked_iteration: np.ndarray
    walked_stamped: np.ndarray
    walked_ancestor: np.ndarray  # nearest row with an rl.bucket above each walked row, or -1
    bucketed_step: np.ndarray  # step index of each bucketed row, or -1 (outside any step)
    table: Columns  # goodput's per-step table (rules.step_frame)
    merged: Any  # MergedIntervals of the bucketed rows, grouped by step


@dataclass(frozen=True, eq=False)
class _OneBatch:
    """A table as the rules' one batch: its walks, its partial, the partial merged."""

    arrays: SpanArrays
    keep: np.ndarray
    steps: Steps
    walked: np.ndarray
    iteration: np.ndarray
    stamped: np.ndarray
    ancestor: np.ndarray
    pick: np.ndarray  # which walked rows are bucketed (known bucket, valid interval)
    merged: pa.Table  # PARTIAL_SCHEMA
    run_order: tuple  # the whole table's runs, in the order its runs are reported

    @property
    def bucketed(self) -> np.ndarray:
        return self.walked[self.pick]


def _one_batch(arrays: SpanArrays, keep: np.ndarray, run_order: tuple, *, ancestors: bool = False,
               whole: Callable[[], tuple[pa.Table, np.ndarray]] | None = None) -> _OneBatch:
    """The rules over ``arrays`` as one batch. ``whole`` (for arrays of only the rows goodput reads)
    gives the whole table (its id keys and rl.iteration at least) and each row's position in it, for
    walks that leave those rows."""
    steps = step_windows(arrays, keep)
    walked = np.flatnonzero(arrays.has_bucket & keep)  # few rows: the rest is decided on them
    if whole is None:
        iteration, stamped, ancestor = arrays.walk_up(walked, ancestors=ancestors)
    else:
        iteration, stamped = _walk_in_whole(arrays, walked, whole)
        ancestor = np.full(len(walked), -1, np.int64)
    pick = (arrays.bucket[walked] >= 0) & arrays.valid_interval[walked]
    accumulator = GoodputAccumulator()
    accumulator.add(partial_of(arrays, keep, walked[pick], iteration[pick], stamped[pick], steps=steps))
    return _OneBatch(arrays, keep, steps, walked, iteration, stamped, ancestor, pick, accumulator.merged(), run_order)


def _walk_in_whole(arrays: SpanArrays, walked: np.ndarray, whole) -> tuple[np.ndarray, np.ndarray]:
    """Attributed iterations of ``walked``: their own, else the walk over the whole table (read only
    when some row needs it, and then only at the rows the walks visit: :func:`walk_rows`)."""
    iteration, stamped = arrays.iteration[walked].copy(), arrays.has_iteration[walked].copy()
    pending = np.flatnonzero(~stamped)
    if pending.size:
        table, position = whole()
        iteration[pending], stamped[pending] = walk_rows(table, position[walked[pending]])
    return iteration, stamped


_STEP_OR_JOB = f"{STEP_SPAN_REGEX}|{JOB_SPAN_REGEX}"


def _read_names() -> str:
    """The rows goodput reads, besides the spans with an ``rl.bucket``: step and job spans, and the
    async phases' spans, bucketed or not, which decide a run's caveats (a few percent of a run's
    spans; the per-prompt and worker spans without a bucket are only walked through). The catalogue
    is read on first use, not on import."""
    return f"{_STEP_OR_JOB}|{async_span_regex()}"


def analyse(spans: pa.Table, *, run_id: str | None = None, ancestors: bool = False,
            arrays: SpanArrays | None = None) -> Analysis:
    """Decode, attribute and sum once; goodput and check_run both read the result.

    ``ancestors`` also finds each bucketed span's nearest bucketed ancestor (for the findings);
    ``arrays`` are ``spans`` already decoded (check_run's come from the read seam).
    """
    arrays = span_arrays(spans) if arrays is None else arrays
    one = _one_batch(arrays, run_filter(arrays, run_id), arrays.runs, ancestors=ancestors)
    arrays, steps, pick, bucketed = one.arrays, one.steps, one.pick, one.bucketed
    step_of = steps.index_of(arrays.run[bucketed], one.iteration[pick], one.stamped[pick])
    table = merged_steps(one.merged, arrays.runs).table
    inside = step_of >= 0
    merged = merge_intervals(arrays.start[bucketed[inside]], arrays.end[bucketed[inside]], step_of[inside])
    return Analysis(arrays, one.keep, steps, bucketed, one.iteration[pick], one.stamped[pick], one.walked,
                    one.iteration, one.stamped, one.ancestor, step_of, table, merged)


def run_filter(arrays: SpanArrays, run_id: str | None) -> np.ndarray:
    """Rows of run ``run_id`` (every row when None); a run that is not there is a clear error."""
    if run_id is None:
        return np.ones(len(arrays), dtype=bool)
    UnknownRunError.unless_present(run_id, arrays.runs)
    return arrays.run == arrays.runs.index(run_id)


# -- public API --------------------------------------------------------------------------------


def goodput_by_step(spans: pa.Table, *, run_id: str | None = None) -> pa.Table:
    """One row per run and step (``STEP_COLUMNS``), sorted by run and iteration.

    >>> from nemo_telemetry.analysis import spans_table
    >>> s = 1_000_000_000
    >>> spans = spans_table([
    ...     {"trace_id": "a" * 32, "span_id": "1" * 16, "name": "rl.grpo.step", "start_ns": 0, "end_ns": 10 * s,
    ...      "iteration": 1},
    ...     {"trace_id": "a" * 32, "span_id": "2" * 16, "parent_span_id": "1" * 16, "name": "rl.vllm.generate",
    ...      "start_ns": 0, "end_ns": 4 * s, "bucket": "productive"},
    ... ])
    >>> row = goodput_by_step(spans).to_pylist()[0]
    >>> row["wall_s"], row["productive_s"], row["unattributed_s"], row["goodput"]
    (10.0, 4.0, 6.0, 0.4)
    """
    tables = [run.steps for run in run_goodput(spans, run_id=run_id) if run.steps.num_rows]
    return pa.concat_tables(tables) if tables else steps_table(empty_step_frame(), None)


def run_goodput(spans: pa.Table, *, run_id: str | None = None, by: str = "step",
                metrics: pa.Table | None = None) -> tuple[RunGoodput, ...]:
    """Per run: the steps table, the total, bucketed time outside steps, the job's wall, outliers.

    ``by="rank"`` adds ``ranks``: the same sums per (service, rank) over all of the run's steps.
    ``by="fleet"`` (or ``"fleet,step"``, the same per step too) adds ``fleets``: GPU-seconds per
    fleet and bucket (:mod:`goodput.fleets`); ``metrics`` (``read_metrics``' table) gives the
    busy metric and token counters of fleets that no span covers.
    """
    check_by(by)
    spans, _ = numbered_spans(spans)
    if by == "step":
        return goodput_of_rows(goodput_rows(spans), run_id=run_id)
    arrays = span_arrays(spans)
    one = _one_batch(arrays, run_filter(arrays, run_id), arrays.runs)
    if by in FLEET_BY:
        merged = merge_fleets([fleet_partial(spans, run_id=run_id), metric_partial(metrics, run_id=run_id)])
        return attach_fleets(finish(one.merged, one.run_order), merged, one.merged, one.run_order, by=by)
    ranks = merge_ranks([rank_partial(arrays, one.keep, one.bucketed, one.iteration[one.pick], one.stamped[one.pick])])
    tables = ranks_tables(ranks, merged_steps(one.merged, one.run_order), one.run_order)
    return tuple(replace(run, ranks=tables[run.run_id]) for run in finish(one.merged, one.run_order))


def _narrow_batch(read: GoodputRows, run_id: str | None) -> _OneBatch:
    """The one batch of only the rows goodput reads (:func:`_read_names`), so the columns of the
    many spans without a bucket are never decoded; runs keep the whole table's order."""
    UnknownRunError.unless_present(run_id, read.run_order)
    arrays = span_arrays(read.rows)
    keep = np.ones(len(arrays), bool) if run_id is None else (
        arrays.run == arrays.runs.index(run_id) if run_id in arrays.runs else np.zeros(len(arrays), bool))

    def whole() -> tuple[pa.Table, np.ndarray]:
        return read.walk_table(), read.position

    return _one_batch(arrays, keep, read.run_order, whole=whole)


GoodputRows = KeptRows
"""What goodput by step reads of a spans table (the seam's :class:`~nemo_telemetry.analysis.decode.KeptRows`)."""


def goodput_rows(spans: pa.Table) -> GoodputRows:
    """:class:`GoodputRows` of a table in memory."""
    return table_rows(spans, _read_names())


def read_goodput_rows(files: list[str], columns: tuple[str, ...], *, batch_rows: int | None = None,
                      settings: ReadSettings | None = None) -> GoodputRows | None:
    """:class:`GoodputRows` of a dataset's spans files, read batch by batch by the seam
    (:func:`~nemo_telemetry.analysis.decode.file_rows`), their step spans without rl.iteration
    numbered (over every file).

    Every step span is among the rows kept, so they tell whether any lacks rl.iteration: only then
    are the files read for the numbers, which fill in those rows' rl.iteration and the walk
    columns' (a lookup by id keys, row by row: as each batch would have been numbered).

    None when the files hold no spans: the caller reads them whole.
    """
    read = file_rows(files, columns, _read_names(), settings=settings, batch_rows=batch_rows)
    if read is None:
        return None
    unstamped = int(pc.sum(unstamped_step_count(read.rows).column("unstamped")).as_py() or 0)
    numbers = read_step_numbers(files, unstamped)
    if numbers.numbered == 0:
        return read
    walk = Later(lambda: number_steps(read.walk_table(), numbers))
    return KeptRows(number_steps(read.rows, numbers), read.position, read.run_order, walk.get)


def goodput_of_rows(read: GoodputRows, *, run_id: str | None = None) -> tuple[RunGoodput, ...]:
    """:func:`run_goodput` by step from what it reads of a table (:func:`goodput_rows`,
    :func:`read_goodput_rows`)."""
    one = _narrow_batch(read, run_id)
    return finish(one.merged, one.run_order)


# -- comparing and serialising -----------------------------------------------------------------

_STEP_KEYS = ("wall_s", *(f"{b}_s" for b in BUCKETS), "unattributed_s", "double_counted_s", "goodput")


def compare_runs(current: RunGoodput, baseline: RunGoodput) -> dict[str, dict[str, float | None]]:
    """Bucket by bucket, the mean step of ``current`` against the mean step of ``baseline``.

    Means per step, so runs of different lengths compare; ``goodput`` is each run's total ratio.
    Each key gives ``{"current", "baseline", "delta"}`` (delta = current - baseline).
    """
    def per_step(run: RunGoodput) -> dict[str, float | None]:
        steps = run.total.get("steps") or 0
        out = {k: (run.total[k] / steps if steps else None) for k in _STEP_KEYS if k != "goodput"}
        out["goodput"] = run.total.get("goodput")
        return out

    mine, theirs = per_step(current), per_step(baseline)
    return {k: {"current": mine[k], "baseline": theirs[k],
                "delta": None if mine[k] is None or theirs[k] is None else mine[k] - theirs[k]} for k in _STEP_KEYS}


def _clean(value: Any) -> Any:
    """JSON-safe: NaN becomes None."""
    return None if isinstance(value, float) and value != value else value


_FAILED_BUCKETS = tuple(f"failed_{b}_s" for b in BUCKETS)


def _step_document(row: dict[str, Any]) -> dict[str, Any]:
    """A step of the document: its columns, the failed ones nested as ``failed_buckets``."""
    out = {k: _clean(v) for k, v in row.items() if k != "run_id" and k not in _FAILED_BUCKETS}
    if "failed" in row:
        out["failed"] = bool(row["failed"])
        out["failed_buckets"] = ({k.removeprefix("failed_"): _clean(row[k]) for k in _FAILED_BUCKETS}
                                 if row["failed"] else None)
    return out


def goodput_document(runs: tuple[RunGoodput, ...], *, baseline: tuple[RunGoodput, ...] = (),
                     census: Any = None) -> dict[str, Any]:
    """The ``goodput --format json`` document (docs/goodput.md); extra keys may be added, never renamed.

    ``{"runs": [{"run_id", "steps": [{"iteration", "wall_s", <bucket>_s..., "unattributed_s",
    "double_counted_s", "goodput", "failed", "failed_buckets", ...}], "total": {..., "failed_steps",
    "failed_<bucket>_s"...}, "outside_steps": {...}, "job_wall_s", "caveats": [...]}]}``. A failed
    step's bucketed time is in ``wasted_s``; ``failed_buckets`` holds the ``<bucket>_s`` it would
    have had (null for a step that did not fail); the total is ``RunGoodput.total`` as it is (flat:
    every value a number). ``caveats`` says what the run's number does not mean;
    with ``baseline``, each run also gets ``"baseline": {"run_id", "per_step": compare_runs(...)}``
    against the baseline run of the same id, else the baseline's first run. With ``census`` (a
    :class:`~nemo_telemetry.analysis.goodput.census.SpanCensus`), the document also has
    ``"data": census.to_dict()``: what the source holds, for a source with no step to report.
    """
    by_id = {b.run_id: b for b in baseline}
    out = []
    for run in runs:
        item: dict[str, Any] = {
            "run_id": run.run_id,
            "steps": [_step_document(row) for row in run.steps.to_pylist()],
            "total": {k: _clean(v) for k, v in run.total.items()},
            "outside_steps": dict(run.outside_steps),
            "job_wall_s": run.job_wall_s,
            "outliers": [vars(o) for o in run.outliers],
            "caveats": list(run.caveats),
        }
        if run.fleets is not None:
            item.update(fleet_document(run.fleets))
        if run.ranks is not None:
            item["ranks"] = [{k: _clean(v) for k, v in row.items() if k != "run_id"} for row in run.ranks.to_pylist()]
        if baseline:
            other = by_id.get(run.run_id, baseline[0])
            item["baseline"] = {"run_id": other.run_id, "per_step": compare_runs(run, other)}
        out.append(item)
    document: dict[str, Any] = {"runs": out}
    if census is not None:
        document["data"] = census.to_dict()
    return document
