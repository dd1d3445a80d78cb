"""Goodput per training step: where each step's wall clock went, by ``rl.bucket``.

The rules (DESIGN.md, "analysis: semantics"):

- a *step span* is named ``rl.<algo>.step`` and carries ``rl.iteration``; a step's window runs
  from the earliest start to the latest end of its step spans;
- a bucketed span's iteration is its own ``rl.iteration``, else its nearest stamped ancestor's
  (walking parent links across processes), else it is *unstamped*;
- per step: ``<bucket>_s`` are plain sums of the durations of the bucketed spans attributed to
  it (no clipping: a checkpoint staging span that ends after its step still counts whole);
  ``wall_s`` is the window; ``covered_s`` the union of their intervals inside the window;
  ``unattributed_s = wall_s - covered_s``; ``double_counted_s`` = (sum over buckets) - (length
  of the union of their intervals); ``goodput = productive_s / wall_s``.

Per run (``nemo.run.id``; several runs in one dataset are reported separately) the total sums
the steps (``goodput = sum(productive) / sum(wall)``). Bucketed time that no step window takes
is reported apart, in ``outside_steps``: unstamped spans, and spans attributed to an iteration
that has no step span (validation at iteration 0, or a run whose step group was off). A span
attributed to step *i* that runs past *i*'s window stays in step *i*'s sums and is simply not
``covered``; the unbucketed ``rl.checkpoint.finalize`` tail adds nothing anywhere. The job span
(``rl.<algo>.job``) gives ``job_wall_s``, the run's whole wall clock.

Step-time outliers follow Google's ml-goodput-measurement: a step is anomalous when its wall
exceeds the median plus 3 median absolute deviations of the run's step walls; the bucket
(or the unattributed gap) that grew most over its median names the cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from nemo_telemetry.analysis.model._arrays import BUCKETS, SpanArrays, span_arrays
from nemo_telemetry.analysis.model.intervals import clipped_union_length, merge_intervals, union_length
from nemo_telemetry.errors import NemoTelemetryError, UnknownRunError

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

STEP_SPAN_REGEX = r"^rl\.[^.]+\.step$"
JOB_SPAN_REGEX = r"^rl\.[^.]+\.job$"
_NS = 1e9
_SUM_KEYS = ("wall_s", *(f"{b}_s" for b in BUCKETS), "covered_s", "unattributed_s", "double_counted_s")
STEP_COLUMNS = ("run_id", "iteration", "start_ns", "end_ns", *_SUM_KEYS, "goodput")
RANK_COLUMNS = ("run_id", "service_name", "rank", "steps", *_SUM_KEYS, "goodput")
_GREW_CANDIDATES = (*(f"{b}_s" for b in BUCKETS), "unattributed_s")


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


# -- the computation ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Steps:
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
        index = pd.MultiIndex.from_arrays([self.run, self.iteration])
        found = index.get_indexer(pd.MultiIndex.from_arrays([run, iteration]))
        return np.where(valid, found, -1).astype(np.int64)


@dataclass(frozen=True, eq=False)
class Analysis:
    """Everything goodput and the findings share, computed once per spans table."""

    arrays: SpanArrays
    keep: np.ndarray  # rows of the selected run (all rows when no run was asked for)
    steps: _Steps
    bucketed: np.ndarray  # rows with a known bucket and a valid interval
    bucketed_iteration: np.ndarray
    bucketed_stamped: np.ndarray
    walked: np.ndarray  # every row with an rl.bucket (known, unknown or invalid interval)
    walked_iteration: np.ndarray
    walked_stamped: np.ndarray
    walked_ancestor: np.ndarray  # nearest row with an rl.bucket above each walked row, or -1
    bucketed_step: np.ndarray  # step index of each bucketed row, or -1 (outside any step)
    table: pd.DataFrame  # STEP_COLUMNS (as numbers) plus per-step union detail
    merged: Any  # MergedIntervals of the bucketed rows, grouped by step


def analyse(spans: pa.Table, *, run_id: str | None = None, ancestors: bool = False,
            arrays: SpanArrays | None = None) -> Analysis:
    """Decode, attribute and sum once; goodput and check_run both read the result.

    ``ancestors`` also finds each bucketed span's nearest bucketed ancestor (for the findings);
    ``arrays`` are ``spans`` already decoded (check_run decodes them beside a second thread).
    """
    arrays = span_arrays(spans) if arrays is None else arrays
    keep_run = run_filter(arrays, run_id)
    steps = _step_windows(arrays, keep_run)
    any_bucket = np.flatnonzero((arrays.bucket != -1) & keep_run)  # few rows: the rest is decided on them
    iteration, stamped, ancestor = arrays.walk_up(any_bucket, ancestors=ancestors)
    pick = (arrays.bucket[any_bucket] >= 0) & arrays.valid_interval[any_bucket]
    bucketed = any_bucket[pick]
    step_of = steps.index_of(arrays.run[bucketed], iteration[pick], stamped[pick])
    table, merged = _per_step(arrays, steps, bucketed, step_of)
    return Analysis(arrays, keep_run, steps, bucketed, iteration[pick], stamped[pick], any_bucket, iteration, stamped,
                     ancestor, step_of, table, merged)


def run_filter(arrays: SpanArrays, run_id: str | None) -> np.ndarray:
    """Rows of run ``run_id`` (every row when None); a run that is not there is a clear error."""
    if run_id is None:
        return np.ones(len(arrays), dtype=bool)
    UnknownRunError.unless_present(run_id, arrays.runs)
    return arrays.run == arrays.runs.index(run_id)


def _step_windows(arrays: SpanArrays, keep: np.ndarray) -> _Steps:
    rows = np.flatnonzero(arrays.rows_of_names(STEP_SPAN_REGEX))
    rows = rows[arrays.has_iteration[rows] & arrays.valid_interval[rows] & keep[rows]]
    frame = pd.DataFrame({"run": arrays.run[rows], "iteration": arrays.iteration[rows],
                          "start": arrays.start[rows], "end": arrays.end[rows], "row": rows})
    frame = frame.sort_values(["run", "iteration", "start"], kind="stable")
    windows = frame.groupby(["run", "iteration"], sort=True).agg(
        start=("start", "min"), end=("end", "max"), row=("row", "first")).reset_index()
    return _Steps(*(windows[c].to_numpy(np.int64) for c in ("run", "iteration", "start", "end", "row")))


def _per_step(arrays: SpanArrays, steps: _Steps, bucketed: np.ndarray, step_of: np.ndarray):
    """Sums, union, covered and double-counted time per step (vectorized over the bucketed spans)."""
    n = len(steps)
    inside = step_of >= 0
    rows, group = bucketed[inside], step_of[inside]
    start, end = arrays.start[rows], arrays.end[rows]
    duration = (end - start).astype(np.float64)
    sums = np.bincount(group * len(BUCKETS) + arrays.bucket[rows], weights=duration,
                       minlength=n * len(BUCKETS)).reshape(n, len(BUCKETS))
    merged = merge_intervals(start, end, group)
    return step_frame(steps, sums, merged), merged


def step_frame(steps: _Steps, sums: np.ndarray, merged) -> pd.DataFrame:
    """The per-step table from each step's bucket sums (ns, shape steps x BUCKETS) and the merged
    intervals of its bucketed spans (grouped by step index).

    Shared by the in-memory analysis and the partitioned engines (streaming, Ray), which merge
    partial sums and partial interval unions first: only the union's length matters here.
    """
    n = len(steps)
    union = union_length(merged, n)
    covered = clipped_union_length(merged, steps.start, steps.end)
    wall = (steps.end - steps.start).astype(np.float64)
    frame = pd.DataFrame({"run": steps.run, "iteration": steps.iteration, "start_ns": steps.start,
                          "end_ns": steps.end, "wall_s": wall / _NS})
    for i, b in enumerate(BUCKETS):
        frame[f"{b}_s"] = sums[:, i] / _NS
    frame["covered_s"] = covered / _NS
    frame["unattributed_s"] = (wall - covered) / _NS
    frame["double_counted_s"] = (sums.sum(axis=1) - union) / _NS
    frame["goodput"] = np.where(wall > 0, sums[:, 0] / np.where(wall > 0, wall, 1), np.nan)
    frame["bucket_sum_ns"] = sums.sum(axis=1)
    frame["wall_ns"] = steps.end - steps.start
    return frame


# -- per run -----------------------------------------------------------------------------------


def _runs_present(analysis: Analysis, jobs: np.ndarray) -> list[int]:
    arrays = analysis.arrays
    codes = np.unique(np.concatenate([analysis.steps.run, arrays.run[analysis.bucketed],
                                      arrays.run[jobs[analysis.keep[jobs]]]]))
    return [int(c) for c in codes]


def _run_name(arrays: SpanArrays, code: int) -> str | None:
    return arrays.runs[code] if code >= 0 else None


def _steps_table(frame: pd.DataFrame, run_name: str | None) -> pa.Table:
    columns = {"run_id": pa.array([run_name] * len(frame), pa.string()),
               "iteration": pa.array(frame["iteration"].to_numpy(np.int64))}
    for c in STEP_COLUMNS[2:]:
        values = frame[c].to_numpy()
        columns[c] = pa.array(values, pa.int64() if c.endswith("_ns") else pa.float64(),
                              from_pandas=c == "goodput")
    return pa.table(columns)


def _total(frame: pd.DataFrame) -> dict[str, Any]:
    total: dict[str, Any] = {k: float(frame[k].sum()) for k in _SUM_KEYS}
    total["goodput"] = total["productive_s"] / total["wall_s"] if total["wall_s"] > 0 else None
    total["steps"] = int(len(frame))
    return total


def _outside(analysis: Analysis, run_code: int) -> dict[str, Any]:
    arrays = analysis.arrays
    pick = (analysis.bucketed_step < 0) & (arrays.run[analysis.bucketed] == run_code)
    rows = analysis.bucketed[pick]
    duration = (arrays.end[rows] - arrays.start[rows]).astype(np.float64)
    sums = np.bincount(arrays.bucket[rows], weights=duration, minlength=len(BUCKETS))
    stamped = analysis.bucketed_stamped[pick]
    return outside_summary(sums, len(rows), int((~stamped).sum()), np.unique(analysis.bucketed_iteration[pick][stamped]))


def outside_summary(sums: np.ndarray, spans: int, unstamped: int, iterations: np.ndarray) -> dict[str, Any]:
    """``outside_steps`` from per-bucket sums (ns), span counts and the stamped iterations with no step."""
    out: dict[str, Any] = {f"{b}_s": float(sums[i] / _NS) for i, b in enumerate(BUCKETS)}
    out["spans"] = int(spans)
    out["unstamped_spans"] = int(unstamped)
    out["iterations"] = sorted(int(i) for i in iterations)
    return out


def _job_wall(arrays: SpanArrays, run_code: int, jobs: np.ndarray) -> float | None:
    """The run's job spans' wall; ``jobs`` are the rows of every job span (found once for all runs)."""
    rows = jobs[(arrays.run[jobs] == run_code) & arrays.valid_interval[jobs]]
    if rows.size == 0:
        return None
    return float((arrays.end[rows].max() - arrays.start[rows].min()) / _NS)


def step_outliers(frame: pd.DataFrame) -> tuple[StepOutlier, ...]:
    """ml-goodput-measurement's rule: wall > median + 3 * MAD (unscaled) of the run's step walls."""
    if len(frame) < 3:
        return ()
    wall = frame["wall_s"].to_numpy()
    median = float(np.median(wall))
    threshold = median + 3 * float(np.median(np.abs(wall - median)))
    medians = {c: float(np.median(frame[c].to_numpy())) for c in _GREW_CANDIDATES}
    out = []
    for _, step in frame[frame["wall_s"] > threshold].iterrows():  # the few anomalous steps only
        growth = {c: float(step[c]) - medians[c] for c in _GREW_CANDIDATES}
        grown = max(growth, key=growth.get)
        out.append(StepOutlier(int(step["iteration"]), float(step["wall_s"]), median, threshold,
                               grown.removesuffix("_s"), growth[grown]))
    return tuple(out)


def _ranks_table(analysis: Analysis, run_code: int, run_name: str | None) -> pa.Table:
    """Per (service, rank) of the run: its bucketed spans' sums and coverage over all the run's steps.

    Every (service, rank) with a span in the run has a row, sorted by service name then rank, so a
    worker whose spans carry no bucket shows as zeros rather than missing.
    """
    arrays, steps = analysis.arrays, analysis.steps
    pick = (analysis.bucketed_step >= 0) & (arrays.run[analysis.bucketed] == run_code)
    rows, step = analysis.bucketed[pick], analysis.bucketed_step[pick]
    in_run = np.flatnonzero((arrays.run == run_code) & analysis.keep)
    everyone = pd.DataFrame({"service": arrays.service[in_run],
                             "rank": np.where(arrays.has_rank[in_run], arrays.rank[in_run], -1)}).drop_duplicates()
    names = np.array([*arrays.services, ""], dtype=object)  # code -1 (no service) sorts first, as ""
    everyone = everyone.assign(name=names[everyone["service"].to_numpy()]).sort_values(["name", "rank"])
    who_values = pd.MultiIndex.from_frame(everyone[["service", "rank"]])
    who_code = who_values.get_indexer(pd.MultiIndex.from_arrays(
        [arrays.service[rows], np.where(arrays.has_rank[rows], arrays.rank[rows], -1)]))
    n_who, n_steps = len(who_values), len(steps)
    group = step * n_who + who_code
    start, end = arrays.start[rows], arrays.end[rows]
    sums = np.bincount(who_code * len(BUCKETS) + arrays.bucket[rows], weights=(end - start).astype(np.float64),
                       minlength=n_who * len(BUCKETS)).reshape(n_who, len(BUCKETS))
    merged = merge_intervals(start, end, group)
    union = union_length(merged, n_steps * n_who).reshape(n_steps, n_who).sum(axis=0)
    covered_by_group = clipped_union_length(merged, np.repeat(steps.start, n_who), np.repeat(steps.end, n_who))
    covered = covered_by_group.reshape(n_steps, n_who).sum(axis=0)
    present = np.bincount(np.unique(group) % max(n_who, 1), minlength=n_who) if n_who else np.zeros(0)
    run_wall = float((steps.end - steps.start)[steps.run == run_code].sum())
    services = [arrays.services[s] if s >= 0 else None for s, _ in who_values]
    ranks = [int(r) if r >= 0 else None for _, r in who_values]
    columns: dict[str, Any] = {"run_id": pa.array([run_name] * n_who, pa.string()),
                               "service_name": pa.array(services, pa.string()), "rank": pa.array(ranks, pa.int64()),
                               "steps": pa.array(present, pa.int64()), "wall_s": pa.array([run_wall / _NS] * n_who, pa.float64())}
    for i, b in enumerate(BUCKETS):
        columns[f"{b}_s"] = pa.array(sums[:, i] / _NS, pa.float64())
    columns["covered_s"] = pa.array(covered / _NS, pa.float64())
    columns["unattributed_s"] = pa.array((run_wall - covered) / _NS, pa.float64())
    columns["double_counted_s"] = pa.array((sums.sum(axis=1) - union) / _NS, pa.float64())
    columns["goodput"] = pa.array(sums[:, 0] / run_wall if run_wall > 0 else [None] * n_who, pa.float64())
    return pa.table(columns)


def runs_of(analysis: Analysis, *, by: str = "step") -> tuple[RunGoodput, ...]:
    """The per-run results of an analysis (shared with check_run, which reads the outliers)."""
    if by not in ("step", "rank"):
        raise NemoTelemetryError(f"by={by!r}: choose 'step' or 'rank'")
    out = []
    jobs = np.flatnonzero(analysis.arrays.rows_of_names(JOB_SPAN_REGEX))
    for code in _runs_present(analysis, jobs):
        frame = analysis.table[analysis.table["run"] == code]
        name = _run_name(analysis.arrays, code)
        outside = _outside(analysis, code)
        out.append(RunGoodput(
            run_id=name, steps=_steps_table(frame, name), total=_total(frame), outside_steps=outside,
            job_wall_s=_job_wall(analysis.arrays, code, jobs), outliers=step_outliers(frame),
            ranks=_ranks_table(analysis, code, name) if by == "rank" else None,
        ))
    return tuple(out)


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
    analysis = analyse(spans, run_id=run_id)
    tables = [_steps_table(analysis.table[analysis.table["run"] == code], _run_name(analysis.arrays, code))
              for code in np.unique(analysis.steps.run)]
    if not tables:
        return _steps_table(analysis.table.iloc[0:0], None)
    return pa.concat_tables(tables)


def run_goodput(spans: pa.Table, *, run_id: str | None = None, by: str = "step") -> tuple[RunGoodput, ...]:
    """Per run: the steps table, the total, bucketed time outside steps, the job's wall, outliers.

    ``by="rank"`` adds ``ranks``: the same sums per (service, rank) over all of the run's steps.
    """
    return runs_of(analyse(spans, run_id=run_id), by=by)


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


def goodput_document(runs: tuple[RunGoodput, ...], *, baseline: tuple[RunGoodput, ...] = ()) -> dict[str, Any]:
    """The ``goodput --format json`` document (README: "goodput JSON"); extra keys may be added, never renamed.

    ``{"runs": [{"run_id", "steps": [{"iteration", "wall_s", <bucket>_s..., "unattributed_s",
    "double_counted_s", "goodput", ...}], "total": {...}, "outside_steps": {...}, "job_wall_s"}]}``;
    with ``baseline``, each run also gets ``"baseline": {"run_id", "per_step": compare_runs(...)}``
    against the baseline run of the same id, else the baseline's first run.
    """
    by_id = {b.run_id: b for b in baseline}
    out = []
    for run in runs:
        item: dict[str, Any] = {
            "run_id": run.run_id,
            "steps": [{k: _clean(v) for k, v in row.items() if k != "run_id"} for row in run.steps.to_pylist()],
            "total": {k: _clean(v) for k, v in run.total.items()},
            "outside_steps": dict(run.outside_steps),
            "job_wall_s": run.job_wall_s,
            "outliers": [vars(o) for o in run.outliers],
        }
        if run.ranks is not None:
            item["ranks"] = [{k: _clean(v) for k, v in row.items() if k != "run_id"} for row in run.ranks.to_pylist()]
        if baseline:
            other = by_id.get(run.run_id, baseline[0])
            item["baseline"] = {"run_id": other.run_id, "per_step": compare_runs(run, other)}
        out.append(item)
    return {"runs": out}
