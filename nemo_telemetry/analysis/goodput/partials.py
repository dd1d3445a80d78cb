"""Goodput over a dataset larger than memory: batches in, small partial aggregates out, merged.

The per-step semantics are goodput.py's; this module only splits them into steps that each
see one batch of rows at a time, so that any engine that can map a function over the batches
of the Parquet dataset (this module's local loop, or Ray tasks in :mod:`engine_ray`) gets the
same numbers as :func:`goodput.run_goodput` on the whole table:

1. *Attribution.* A bucketed span without its own ``rl.iteration`` takes its nearest stamped
   ancestor's, and its parent may be in another partition (another rank's process). The walk
   is done over a compact edge table: the walk starts (unstamped bucketed spans) are collected
   first, each climbed as far as its own batch holds the tree; then each round looks up the
   pending ancestors in every batch (a semi-join on ``trace_key``/``span_key``) and climbs
   again, so the rounds count the walks' hops between batches, not the tree's levels.
2. *Partials.* Each batch gives, per (run, iteration): the step window (min start, max end of
   its step spans), per-bucket duration sums in integer nanoseconds, and the union of its
   bucketed intervals (touching intervals coalesced; only the union's length is ever used);
   per run, the job spans' bounds. All of it merges by min / max / sum / union across batches.
3. *Finish.* The merged sums and unions go through ``goodput.step_frame`` and the run totals,
   outliers and outside-step summaries through the very functions the in-memory path uses.

Memory is bounded by one batch plus the merged state (a few rows per step, the pending walks),
never by the dataset: ``batch_rows`` sets the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nemo_telemetry.analysis.goodput import steps as _goodput
from nemo_telemetry.analysis.model._arrays import BUCKETS, span_arrays
from nemo_telemetry.analysis.model.intervals import merge_intervals
from nemo_telemetry.analysis.store.partitions import span_files, span_partitions
from nemo_telemetry.analysis.model.schema import BUCKET, ITERATION
from nemo_telemetry.analysis.model.walk import KeyIndex, climb_batch, resolve_walks
from nemo_telemetry.errors import UnknownRunError

__all__ = [
    "BATCH_ROWS",
    "GOODPUT_COLUMNS",
    "EDGE_COLUMNS",
    "PARTIAL_SCHEMA",
    "Scan",
    "local_scan",
    "goodput_partial",
    "climb",
    "walk_starts",
    "ancestor_rows",
    "resolve_attribution",
    "GoodputAccumulator",
    "Attribution",
    "attribution",
    "condense_unions",
    "partial_table",
    "step_owner",
    "split_by_step",
    "MergedSteps",
    "merged_steps",
    "partitioned_goodput",
    "stream_goodput",
]

BATCH_ROWS = 1 << 18
GOODPUT_COLUMNS = ("name", "start_ns", "end_ns", "run_id", BUCKET, ITERATION, "trace_key", "span_key", "parent_key")
EDGE_COLUMNS = ("trace_key", "span_key", "parent_key", ITERATION)
_NO_RUN = "\x00"  # stands for "no run" where a value must hash or index

# One table shape for every partial row; ``kind`` says which fields mean what.
STEP, SUM, UNION, JOB = 0, 1, 2, 3
PARTIAL_SCHEMA = pa.schema([
    pa.field("kind", pa.int8()),  # STEP: a=min start, b=max end | SUM: a=ns, count=spans
    pa.field("run", pa.string()),  # UNION: [a, b) one interval  | JOB: a=min start, b=max end (valid), count=spans
    pa.field("iteration", pa.int64()),  # null: unstamped (SUM) or not applicable (JOB)
    pa.field("bucket", pa.int8()),
    pa.field("a", pa.int64()),
    pa.field("b", pa.int64()),
    pa.field("count", pa.int64()),
])
_WALK_SCHEMA = pa.schema([pa.field("trace_key", pa.uint64()), pa.field("parent_key", pa.uint64()),
                          pa.field("at", pa.uint64()), pa.field(ITERATION, pa.int64())])
_EDGE_SCHEMA = pa.schema([pa.field("trace_key", pa.uint64()), pa.field("span_key", pa.uint64()),
                          pa.field("parent_key", pa.uint64()), pa.field(ITERATION, pa.int64())])

# map(fn, columns, files) -> the tables fn returned, one per batch, in any order
Scan = Callable[[Callable[[pa.Table], pa.Table], Sequence[str], Sequence[Path]], Iterable[pa.Table]]


def local_scan(batch_rows: int = BATCH_ROWS) -> Scan:
    """A scan that reads one Parquet batch of ``batch_rows`` rows at a time, in this process."""

    def scan(fn, columns, files) -> Iterator[pa.Table]:
        for path in files:
            reader = pq.ParquetFile(path)
            present = [c for c in columns if c in reader.schema_arrow.names]
            for batch in reader.iter_batches(batch_size=batch_rows, columns=present):
                yield fn(pa.Table.from_batches([batch]))

    return scan


# -- 1. attribution across partitions ----------------------------------------------------------


def _u64(table: pa.Table, column: str) -> np.ndarray:
    return pc.fill_null(table.column(column), 0).to_numpy().astype(np.uint64, copy=False)


def _keep_run(arrays, run_id: str | None) -> np.ndarray:
    if run_id is None:
        return np.ones(len(arrays), dtype=bool)
    if run_id not in arrays.runs:
        return np.zeros(len(arrays), dtype=bool)
    return arrays.run == arrays.runs.index(run_id)


def _candidates(arrays, run_id: str | None) -> np.ndarray:
    """goodput's bucketed rows: a known bucket, a valid interval, in the selected run."""
    return (arrays.bucket >= 0) & arrays.valid_interval & _keep_run(arrays, run_id)


def climb(batch: pa.Table, rows: np.ndarray, *, bucketed: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`walk.climb_batch` as a tuple: (stamped, iteration, the next ancestor's key when the walk
    leaves the batch else 0, the row of the nearest span ``bucketed`` marks or -1)."""
    walked = climb_batch(batch, rows, bucketed=bucketed)
    return walked.stamped, walked.iteration, walked.exit, walked.ancestor


def walk_starts(batch: pa.Table, *, run_id: str | None = None) -> pa.Table:
    """Where the walks of ``batch`` start, already climbed as far as the batch goes: per distinct
    (trace_key, parent_key) of its unstamped bucketed spans (siblings share one walk), whether a
    stamped ancestor was met (``iteration``) or the key of the ancestor to look up elsewhere (``at``,
    0 when the walk ended at a root)."""
    arrays = span_arrays(batch)
    rows = np.flatnonzero(_candidates(arrays, run_id) & ~arrays.has_iteration)
    table = arrays.table
    trace, span = _u64(table, "trace_key"), _u64(table, "span_key")
    parent = _u64(table, "parent_key")[rows]
    walk = (parent != 0) & (parent != span[rows])
    pairs = pd.DataFrame({"trace_key": trace[rows][walk], "parent_key": parent[walk]}).drop_duplicates()
    starts_trace, starts = pairs["trace_key"].to_numpy(np.uint64), pairs["parent_key"].to_numpy(np.uint64)
    hit = _KeyIndex.of(trace, span, np.arange(len(span))).find(starts_trace, starts) if len(pairs) else \
        np.zeros(0, np.int64)
    inside = np.flatnonzero(hit >= 0)
    stamped, iteration, at = np.zeros(len(pairs), bool), np.zeros(len(pairs), np.int64), starts.copy()
    if inside.size:
        positions = _KeyIndex.of(trace, span, np.arange(len(span))).values[hit[inside]]
        stamped[inside], iteration[inside], at[inside], _ = climb(table, positions)
    return pa.table([pa.array(starts_trace), pa.array(starts), pa.array(at),
                     pa.array(iteration, mask=~stamped)], schema=_WALK_SCHEMA)


def ancestor_rows(batch: pa.Table, *, targets: _KeyIndex) -> pa.Table:
    """Rows of ``batch`` whose (trace_key, span_key) is one of ``targets``, climbed as far as the
    batch goes: the iteration met (null: none), and in ``parent_key`` the ancestor to look up next
    elsewhere (0: the walk ended)."""
    span = _u64(batch, "span_key")
    rows = np.flatnonzero(targets.find(_u64(batch, "trace_key"), span) >= 0)
    stamped, iteration, after, _ = climb(batch, rows)
    return pa.table([pa.array(_u64(batch, "trace_key")[rows]), pa.array(span[rows]), pa.array(after),
                     pa.array(iteration, mask=~stamped)], schema=_EDGE_SCHEMA)


def resolve_attribution(scan: Scan, files: Sequence[Path], *, run_id: str | None = None) -> pd.DataFrame:
    """The iteration an unstamped span takes from its parent: columns trace_key, parent_key, iteration
    (only the walks that met a stamped ancestor).

    One scan finds the walks (one per distinct parent) and climbs each as far as its batch holds
    the tree; :func:`walk.resolve_walks` then looks the pending ancestors up in every batch (a scan
    of :func:`ancestor_rows` per round) until each walk has met a stamped span, a root, or a parent
    that is not in the data.
    """
    starts = _concat(scan(lambda b: walk_starts(b, run_id=run_id), GOODPUT_COLUMNS, files), _WALK_SCHEMA)
    first = _best_copy(pd.DataFrame({
        "trace": _u64(starts, "trace_key"), "start": _u64(starts, "parent_key"), "at": _u64(starts, "at"),
        "stamped": pc.is_valid(starts.column(ITERATION)).to_numpy(zero_copy_only=False),
        "iteration": pc.fill_null(starts.column(ITERATION), 0).to_numpy()}), ["trace", "start"], "at")

    def lookup(wanted: pd.DataFrame) -> pd.DataFrame:
        targets = KeyIndex.of(wanted["trace"].to_numpy(np.uint64), wanted["at"].to_numpy(np.uint64))
        edges = _concat(scan(lambda b: ancestor_rows(b, targets=targets), EDGE_COLUMNS, files), _EDGE_SCHEMA)
        return _best_copy(pd.DataFrame({
            "trace": _u64(edges, "trace_key"), "at": _u64(edges, "span_key"), "parent": _u64(edges, "parent_key"),
            "stamped": pc.is_valid(edges.column(ITERATION)).to_numpy(zero_copy_only=False),
            "iteration": pc.fill_null(edges.column(ITERATION), 0).to_numpy()}), ["trace", "at"], "parent")

    walks = resolve_walks(first, lookup)
    out = walks.loc[walks["stamped"], ["trace", "start", "iteration"]].rename(
        columns={"trace": "trace_key", "start": "parent_key"})
    return out.reset_index(drop=True).astype({"trace_key": np.uint64, "parent_key": np.uint64, "iteration": np.int64})


def _best_copy(frame: pd.DataFrame, key: list[str], onward: str) -> pd.DataFrame:
    """One row per ``key`` where several batches saw the same walk: a stamped end wins, then a root
    (``onward`` 0), then any pending copy (they converge)."""
    rank = np.where(frame["stamped"], 0, np.where(frame[onward] == 0, 1, 2))
    return frame.assign(rank=rank).sort_values("rank", kind="stable").drop_duplicates(key).drop(columns="rank")


def _concat(tables: Iterable[pa.Table], schema: pa.Schema) -> pa.Table:
    parts = [t if t.schema.equals(schema) else t.select(schema.names).cast(schema) for t in tables if t.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


_KeyIndex = AttributionIndex = KeyIndex  # (trace_key, parent_key) -> iteration: what goodput_partial reads


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


# -- 2. partials per batch ---------------------------------------------------------------------


def goodput_partial(batch: pa.Table, *, attributed: _KeyIndex, run_id: str | None = None) -> pa.Table:
    """The partial aggregates (``PARTIAL_SCHEMA``) of one batch of spans."""
    arrays = span_arrays(batch)
    keep = _keep_run(arrays, run_id)
    runs = np.array(list(arrays.runs) + [None], dtype=object)  # code -1 -> None
    parts = [_step_rows(arrays, keep, runs), _job_rows(arrays, keep, runs)]
    rows = np.flatnonzero(_candidates(arrays, run_id))
    iteration, stamped = _attributed(arrays, rows, attributed)
    run, bucket = arrays.run[rows].astype(np.int64), arrays.bucket[rows].astype(np.int64)
    iteration = np.where(stamped, iteration, 0)
    order, heads = _group_starts(run, stamped, iteration, bucket)
    first = order[heads]
    parts.append(_rows(SUM, runs[run[first]], iteration[first], stamped[first], bucket=bucket[first],
                       a=_reduce(np.add, (arrays.end[rows] - arrays.start[rows])[order], heads),
                       count=np.diff(np.append(heads, len(order)))))
    parts.append(_union_rows(runs[arrays.run[rows][stamped]], iteration[stamped], arrays.start[rows][stamped],
                             arrays.end[rows][stamped]))
    return pa.concat_tables(parts)


def _pair_codes(run: np.ndarray, iteration: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes of the (run, iteration) pairs, and each code's run and iteration (``None`` is a run)."""
    run_codes, run_values = pd.factorize(pd.Series(run, dtype=object), use_na_sentinel=False)
    if len(run_codes) == 0:
        return np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0, np.int64)
    run_codes, iteration = run_codes.astype(np.int64), np.asarray(iteration, np.int64)
    values = np.asarray(run_values, dtype=object)
    low = int(iteration.min())
    if int(iteration.max()) - low < (1 << 47) and len(values) < (1 << 15):  # one int64 key: hash, no sort
        codes, keys = pd.factorize((run_codes << 47) | (iteration - low))
        keys = np.asarray(keys, np.int64)
        return codes.astype(np.int64), values[keys >> 47], (keys & ((1 << 47) - 1)) + low
    pairs, codes = np.unique(np.stack([run_codes, iteration], axis=1), axis=0, return_inverse=True)
    return codes.ravel().astype(np.int64), values[pairs[:, 0]], pairs[:, 1]


def _attributed(arrays, rows: np.ndarray, attributed: _KeyIndex) -> tuple[np.ndarray, np.ndarray]:
    iteration = arrays.iteration[rows].copy()
    stamped = arrays.has_iteration[rows].copy()
    walked = np.flatnonzero(~stamped)
    if walked.size and len(attributed.key):
        table = arrays.table
        parent = _u64(table, "parent_key")[rows[walked]]
        parent = np.where(parent == _u64(table, "span_key")[rows[walked]], 0, parent)  # its own parent: no walk
        hit = attributed.find(_u64(table, "trace_key")[rows[walked]], parent)
        found = hit >= 0
        iteration[walked[found]] = attributed.values[hit[found]]
        stamped[walked[found]] = True
    return iteration, stamped


def _step_rows(arrays, keep: np.ndarray, runs: np.ndarray) -> pa.Table:
    if not (arrays.has_iteration & keep).any():  # no step span can be here: skip the pandas groupby
        return PARTIAL_SCHEMA.empty_table()
    steps = _goodput._step_windows(arrays, keep)
    return _rows(STEP, runs[steps.run], steps.iteration, np.ones(len(steps), bool), a=steps.start, b=steps.end)


def _job_rows(arrays, keep: np.ndarray, runs: np.ndarray) -> pa.Table:
    # As goodput: a job span names its run as present; the wall comes from valid ones.
    rows = np.flatnonzero(arrays.rows_of_names(_goodput.JOB_SPAN_REGEX) & keep)
    valid = arrays.valid_interval[rows]
    start = np.where(valid, arrays.start[rows], np.iinfo(np.int64).max)
    end = np.where(valid, arrays.end[rows], np.iinfo(np.int64).min)
    run = arrays.run[rows].astype(np.int64)
    order, heads = _group_starts(run)
    return _rows(JOB, runs[run[order[heads]]], np.zeros(len(heads), np.int64), np.zeros(len(heads), bool),
                 bucket=_reduce(np.maximum, valid[order].astype(np.int64), heads), a=_reduce(np.minimum, start[order], heads),
                 b=_reduce(np.maximum, end[order], heads), count=np.diff(np.append(heads, len(order))))


def _reduce(ufunc, values: np.ndarray, heads: np.ndarray) -> np.ndarray:
    return ufunc.reduceat(values, heads) if len(heads) else np.zeros(0, values.dtype)


def _union_rows(run: np.ndarray, iteration: np.ndarray, start: np.ndarray, end: np.ndarray) -> pa.Table:
    """The union of the intervals of each (run, iteration), touching intervals coalesced."""
    codes, runs, iterations = _pair_codes(run, iteration)
    group, lo, hi = _coalesced_union(codes, start, end)
    return _rows(UNION, runs[group], iterations[group], np.ones(len(group), bool), a=lo, b=hi)


def _coalesced_union(group: np.ndarray, start: np.ndarray, end: np.ndarray):
    merged = merge_intervals(start, end, group)
    if len(merged) == 0:
        return merged.group, merged.start, merged.end
    new = np.ones(len(merged), dtype=bool)
    new[1:] = (merged.group[1:] != merged.group[:-1]) | (merged.start[1:] != merged.end[:-1])
    heads = np.flatnonzero(new)
    return merged.group[heads], merged.start[heads], np.maximum.reduceat(merged.end, heads)


def _rows(kind: int, run, iteration, has_iteration, *, bucket=None, a=None, b=None, count=None) -> pa.Table:
    n = len(iteration)
    zeros = np.zeros(n, np.int64)
    return pa.table([
        pa.array(np.full(n, kind, np.int8)), pa.array(np.asarray(run, dtype=object), pa.string(), from_pandas=True),
        pa.array(np.asarray(iteration, np.int64), mask=~np.asarray(has_iteration, bool)),
        pa.array(np.asarray(zeros if bucket is None else bucket).astype(np.int8)),
        pa.array(np.asarray(zeros if a is None else a, np.int64)), pa.array(np.asarray(zeros if b is None else b, np.int64)),
        pa.array(np.asarray(zeros if count is None else count, np.int64)),
    ], schema=PARTIAL_SCHEMA)


# -- 3. merge and finish -----------------------------------------------------------------------


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

    def _compact(self) -> pd.DataFrame:
        frame = _merge(pa.concat_tables(self._state) if self._state else PARTIAL_SCHEMA.empty_table())
        self._state = [pa.Table.from_pandas(frame, schema=PARTIAL_SCHEMA, preserve_index=False)]
        self._pending_rows = self._state_rows = len(frame)
        return frame

    def merged(self) -> pd.DataFrame:
        """Every partial added so far, merged: one STEP / SUM / JOB row per key, disjoint UNIONs."""
        return self._compact()

    def result(self, run_order: Sequence[str | None]) -> tuple[_goodput.RunGoodput, ...]:
        """The runs' goodput; ``run_order`` is the order the in-memory path reports runs in."""
        return _finish(self._compact(), run_order)


def _frame(table: pa.Table) -> pd.DataFrame:
    frame = pd.DataFrame({
        "kind": table.column("kind").to_numpy(), "run": table.column("run").to_numpy(zero_copy_only=False),
        "stamped": pc.is_valid(table.column("iteration")).to_numpy(zero_copy_only=False),
        "iteration": pc.fill_null(table.column("iteration"), 0).to_numpy(),
        "bucket": table.column("bucket").to_numpy(), "a": table.column("a").to_numpy(),
        "b": table.column("b").to_numpy(), "count": table.column("count").to_numpy()})
    frame["run"] = frame["run"].astype(object)
    return frame


def _merge(table: pa.Table) -> pd.DataFrame:
    """Partial rows merged: one STEP / SUM / JOB row per key, UNION rows disjoint per key."""
    frame = _frame(table)
    keys = ["run", "stamped", "iteration", "bucket"]
    by_kind = {k: frame[frame["kind"] == k] for k in (STEP, SUM, UNION, JOB)}
    out = [
        by_kind[STEP].groupby(keys, dropna=False, sort=False).agg(a=("a", "min"), b=("b", "max"), count=("count", "sum")),
        by_kind[SUM].groupby(keys, dropna=False, sort=False).agg(a=("a", "sum"), b=("b", "sum"), count=("count", "sum")),
        by_kind[JOB].groupby(["run", "stamped", "iteration"], dropna=False, sort=False).agg(
            bucket=("bucket", "max"), a=("a", "min"), b=("b", "max"), count=("count", "sum")),
    ]
    merged = [part.reset_index().assign(kind=k) for part, k in zip(out, (STEP, SUM, JOB))]
    unions = by_kind[UNION]
    codes, runs, iterations = _pair_codes(unions["run"].to_numpy(object), unions["iteration"].to_numpy(np.int64))
    group, lo, hi = _coalesced_union(codes, unions["a"].to_numpy(np.int64), unions["b"].to_numpy(np.int64))
    merged.append(pd.DataFrame({"kind": UNION, "run": runs[group], "stamped": True, "iteration": iterations[group],
                                "bucket": 0, "a": lo, "b": hi, "count": 0}))
    columns = ["kind", "run", "iteration", "stamped", "bucket", "a", "b", "count"]
    result = pd.concat([m[columns] for m in merged], ignore_index=True)
    result["iteration"] = result["iteration"].astype(np.int64).where(result["stamped"].astype(bool), None)
    return result.drop(columns="stamped").astype({"kind": np.int8, "bucket": np.int8, "a": np.int64, "b": np.int64,
                                                  "count": np.int64})


@dataclass(frozen=True, eq=False)
class MergedSteps:
    """The merged partials as goodput's per-step analysis: step windows (runs coded by the
    caller's run order), the per-step table, and the SUM rows with the step each belongs to."""

    merged: pd.DataFrame
    steps: _goodput._Steps
    table: pd.DataFrame
    sums: pd.DataFrame
    inside: np.ndarray


def merged_steps(merged: pd.DataFrame, run_order: Sequence[str | None]) -> MergedSteps:
    """Steps and ``step_frame`` from merged partials (``run_order[i]`` gets code i, no run -1)."""
    merged = merged.copy()
    merged["stamped"] = merged["iteration"].notna()
    merged["iteration"] = merged["iteration"].fillna(0).astype(np.int64)
    code_of = {run: (-1 if run is None else i) for i, run in enumerate(run_order)}
    merged["code"] = [code_of.get(r if isinstance(r, str) else None, -1) for r in merged["run"]]
    steps_part = merged[merged["kind"] == STEP].sort_values(["code", "iteration"], kind="stable")
    steps = _goodput._Steps(*(steps_part[c].to_numpy(np.int64) for c in ("code", "iteration", "a", "b")),
                            np.zeros(len(steps_part), np.int64))
    sums_part = merged[merged["kind"] == SUM]
    step_of_sum = steps.index_of(sums_part["code"].to_numpy(np.int64), sums_part["iteration"].to_numpy(np.int64),
                                 sums_part["stamped"].to_numpy(bool))
    inside = step_of_sum >= 0
    sums = np.zeros((len(steps), len(BUCKETS)), dtype=np.int64)
    np.add.at(sums, (step_of_sum[inside], sums_part["bucket"].to_numpy(np.int64)[inside]),
              sums_part["a"].to_numpy(np.int64)[inside])
    unions = merged[merged["kind"] == UNION]
    step_of_union = steps.index_of(unions["code"].to_numpy(np.int64), unions["iteration"].to_numpy(np.int64),
                                   np.ones(len(unions), bool))
    keep = step_of_union >= 0
    intervals = merge_intervals(unions["a"].to_numpy(np.int64)[keep], unions["b"].to_numpy(np.int64)[keep],
                                step_of_union[keep])
    table = _goodput.step_frame(steps, sums.astype(np.float64), intervals)
    return MergedSteps(merged, steps, table, sums_part, inside)


def _finish(merged: pd.DataFrame, run_order: Sequence[str | None]) -> tuple[_goodput.RunGoodput, ...]:
    analysis = merged_steps(merged, run_order)
    merged, steps, table, sums_part, inside = (analysis.merged, analysis.steps, analysis.table, analysis.sums,
                                               analysis.inside)
    jobs = merged[merged["kind"] == JOB]
    present = set(steps.run.tolist()) | set(sums_part["code"].tolist()) | set(jobs["code"].tolist())
    out = []
    for code in sorted(present):
        name = run_order[code] if code >= 0 else None
        frame = table[table["run"] == code]
        outside = sums_part[(sums_part["code"] == code) & ~inside]
        outside_sums = np.zeros(len(BUCKETS), np.int64)
        np.add.at(outside_sums, outside["bucket"].to_numpy(np.int64), outside["a"].to_numpy(np.int64))
        out.append(_goodput.RunGoodput(
            run_id=name, steps=_goodput._steps_table(frame, name), total=_goodput._total(frame),
            outside_steps=_goodput.outside_summary(
                outside_sums, int(outside["count"].sum()), int(outside.loc[~outside["stamped"], "count"].sum()),
                np.unique(outside.loc[outside["stamped"], "iteration"].to_numpy(np.int64))),
            job_wall_s=_job_wall(jobs[jobs["code"] == code]), outliers=_goodput.step_outliers(frame)))
    return tuple(out)


def _job_wall(jobs: pd.DataFrame) -> float | None:
    valid = jobs[jobs["bucket"] > 0]
    if valid.empty:
        return None
    return float((np.int64(valid["b"].max()) - np.int64(valid["a"].min())) / _goodput._NS)


# -- engines -----------------------------------------------------------------------------------


def run_order(root: Path) -> list[str | None]:
    """Runs in the order the in-memory path codes them: first appearance in file order."""
    order: list[str | None] = []
    for part in sorted(span_partitions(root), key=lambda p: str(p.files[0])):
        if part.run_id is not None and part.run_id not in order:
            order.append(part.run_id)
    return order


@dataclass(frozen=True, eq=False)
class Attribution:
    """What the partials pass needs: the runs' order, the files to map, the walks' iterations."""

    order: list
    files: list
    attributed: _KeyIndex


def attribution(root: Path, scan: Scan, *, run_id: str | None = None) -> Attribution:
    """Check ``run_id``, then resolve the walks of every unstamped bucketed span through ``scan``."""
    order = run_order(root)
    UnknownRunError.unless_present(run_id, order)
    files = span_files(root)
    resolved = resolve_attribution(scan, files, run_id=run_id)
    attributed = _KeyIndex.of(resolved["trace_key"].to_numpy(np.uint64), resolved["parent_key"].to_numpy(np.uint64),
                              resolved["iteration"].to_numpy(np.int64))
    return Attribution(order, span_files(root, run_id=run_id) if run_id is not None else files, attributed)


def partitioned_goodput(root: Path, scan: Scan, *, run_id: str | None = None,
                        compact_rows: int = 1 << 20) -> tuple[_goodput.RunGoodput, ...]:
    """``run_goodput`` (by step) of the dataset at ``root``, computed batch by batch through ``scan``."""
    plan = attribution(Path(root), scan, run_id=run_id)
    accumulator = GoodputAccumulator(compact_rows)
    for partial in scan(lambda b: goodput_partial(b, attributed=plan.attributed, run_id=run_id), GOODPUT_COLUMNS,
                        plan.files):
        accumulator.add(partial)
    return accumulator.result(plan.order)


def condense_unions(merged: pd.DataFrame) -> pd.DataFrame:
    """Merged partials with each step's UNION rows replaced by at most two that give the same
    union length and the same length inside the step window (all the finish reads of them):
    ``[start, start + covered)`` and ``[end, end + outside)``. Only valid once every partial of
    the step is in ``merged`` (a reducer that owns the step); UNION rows of no step are dropped."""
    steps = merged[merged["kind"] == STEP][["run", "iteration", "a", "b"]]
    unions = merged[merged["kind"] == UNION]
    joined = unions.merge(steps, on=["run", "iteration"], suffixes=("", "_step"))
    length = joined["b"] - joined["a"]
    covered = (np.minimum(joined["b"], joined["b_step"]) - np.maximum(joined["a"], joined["a_step"])).clip(lower=0)
    per_step = joined.assign(length=length, covered=covered).groupby(
        ["run", "iteration"], sort=False, dropna=False).agg(
        length=("length", "sum"), covered=("covered", "sum"), a=("a_step", "first"), b=("b_step", "first")).reset_index()
    inside = pd.DataFrame({"kind": UNION, "run": per_step["run"], "iteration": per_step["iteration"], "bucket": 0,
                           "a": per_step["a"], "b": per_step["a"] + per_step["covered"], "count": 0})
    outside = pd.DataFrame({"kind": UNION, "run": per_step["run"], "iteration": per_step["iteration"], "bucket": 0,
                            "a": per_step["b"], "b": per_step["b"] + per_step["length"] - per_step["covered"],
                            "count": 0})
    parts = [merged[merged["kind"] != UNION], inside[inside["b"] > inside["a"]], outside[outside["b"] > outside["a"]]]
    return pd.concat(parts, ignore_index=True).astype(
        {"kind": np.int8, "bucket": np.int8, "a": np.int64, "b": np.int64, "count": np.int64})


def step_owner(run: np.ndarray, iteration: np.ndarray, reducers: int) -> np.ndarray:
    """Which of ``reducers`` owns each (run, iteration) (run None, iteration -1 allowed): a hash that
    every process computes alike, so each reducer receives every partial of the steps it owns."""
    runs = pd.util.hash_array(np.array([_NO_RUN if r is None else r for r in run], dtype=object))
    with np.errstate(over="ignore"):
        mixed = runs ^ (np.asarray(iteration, np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return (mixed % np.uint64(max(1, reducers))).astype(np.int64)


def split_by_step(partials: Iterable[pa.Table], reducers: int) -> list[pa.Table]:
    """Partial tables in ``reducers`` tables, by :func:`step_owner` of their (run, iteration)
    (unmerged: a reducer merges every partial of its steps once)."""
    table = _concat(partials, PARTIAL_SCHEMA)
    iteration = pc.fill_null(table.column("iteration"), -1).to_numpy().astype(np.int64)
    owner = step_owner(table.column("run").to_numpy(zero_copy_only=False), iteration, reducers)
    return [table.filter(pa.array(owner == r)) for r in range(reducers)]


def partial_table(frame: pd.DataFrame) -> pa.Table:
    """A merged-partials frame back as a ``PARTIAL_SCHEMA`` table."""
    return pa.Table.from_pandas(frame[PARTIAL_SCHEMA.names], schema=PARTIAL_SCHEMA, preserve_index=False)


def stream_goodput(root: str | Path, *, run_id: str | None = None, batch_rows: int = BATCH_ROWS):
    """``run_goodput`` of a dataset too large for memory: one batch of ``batch_rows`` rows at a time."""
    return partitioned_goodput(Path(root), local_scan(batch_rows), run_id=run_id, compact_rows=4 * batch_rows)
