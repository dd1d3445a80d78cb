"""Goodput over a dataset larger than memory: batches in, small partial aggregates out, merged.

The rules are :mod:`goodput.rules`' (partial -> merge -> finish, re-exported here); this module
schedules them over the batches of the Parquet dataset, through any engine that can map a
function over them (this module's local loop, or Ray tasks in :mod:`engines.ray_engine`), and
gets the numbers :func:`goodput.steps.run_goodput` gives on the whole table:

1. *Attribution.* A bucketed span without its own ``rl.iteration`` takes its nearest stamped
   ancestor's, and its parent may be in another partition (another rank's process). The walk
   starts (unstamped bucketed spans) are collected first, each climbed as far as its own batch
   holds the tree (:func:`walk.climb_batch`); then :func:`walk.resolve_walks` looks the pending
   ancestors up in every batch and climbs again, so the rounds count the walks' hops between
   batches, not the tree's levels. The result is an :data:`AttributionIndex`.
2. *Partials* per batch (:func:`goodput_partial`), *merge* (:class:`GoodputAccumulator`) and
   *finish* (``.result``): the rules' own functions. For Ray, :func:`split_by_step` and
   :func:`condense_unions` let reducers merge the steps they own.

Memory is bounded by one batch plus the merged state (a few rows per step, the pending walks),
never by the dataset: ``batch_rows`` sets the batch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nemo_telemetry.analysis.goodput.numbering import (
    FIND_COLUMNS, NUMBER_COLUMNS, StepNumbers, no_step_numbers, number_steps, step_number_partial, step_numbers,
    unstamped_step_count,
)
from nemo_telemetry.analysis.goodput.ranks import merge_ranks, rank_batch_partial, ranks_tables
from nemo_telemetry.analysis.goodput.fleets import (
    FLEET_READ_COLUMNS, attach_fleets, fleet_partial, merge_fleets, metric_partial,
)
from nemo_telemetry.analysis.ingestion.metrics import metrics_for_source
from nemo_telemetry.analysis.goodput.rules import (
    FLEET_BY, PARTIAL_SCHEMA, STEP, UNION, GoodputAccumulator, MergedSteps, RunGoodput, bucketed_rows, goodput_partial,
    merged_steps, partial_columns, partial_rows,
)
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.grouping import Columns, find_keys, first_rows, group_by, string_codes, take
from nemo_telemetry.analysis.decode import span_arrays
from nemo_telemetry.analysis.store.partitions import span_files, span_partitions
from nemo_telemetry.analysis.store.read import reading_errors
from nemo_telemetry.analysis.model.schema import BUCKET, ITERATION, NO_RUN
from nemo_telemetry.analysis.model.walk import KeyIndex, climb_batch, resolve_walks
from nemo_telemetry.analysis.model.tree import TRACE_LOW, key_column, low_column
from nemo_telemetry.errors import UnknownRunError

__all__ = [
    "BATCH_ROWS",
    "GOODPUT_COLUMNS",
    "EDGE_COLUMNS",
    "PARTIAL_SCHEMA",
    "Scan",
    "local_scan",
    "numbered_scan",
    "goodput_partial",
    "AttributionIndex",
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
    "with_ranks",
    "with_fleets",
    "FLEET_SCAN_COLUMNS",
    "stream_goodput",
]

BATCH_ROWS = 1 << 18
GOODPUT_COLUMNS = ("name", "start_ns", "end_ns", "run_id", BUCKET, ITERATION, "trace_key", "span_key", "parent_key",
                   "trace_low", "status_code")  # status: a step whose span ended in error is failed (goodput.rules)
EDGE_COLUMNS = ("trace_key", "span_key", "parent_key", "trace_low", ITERATION)
RANK_READ_COLUMNS = (*GOODPUT_COLUMNS, "service_name", "rank")
FLEET_SCAN_COLUMNS = (*RANK_READ_COLUMNS, *FLEET_READ_COLUMNS)

_WALK_SCHEMA = pa.schema([pa.field("trace_key", pa.uint64()), pa.field("parent_key", pa.uint64()),
                          pa.field("at", pa.uint64()), pa.field(ITERATION, pa.int64()), pa.field(TRACE_LOW, pa.uint64())])
_EDGE_SCHEMA = pa.schema([pa.field("trace_key", pa.uint64()), pa.field("span_key", pa.uint64()),
                          pa.field("parent_key", pa.uint64()), pa.field(ITERATION, pa.int64()),
                          pa.field(TRACE_LOW, pa.uint64())])

# map(fn, columns, files) -> the tables fn returned, one per batch, in any order
Scan = Callable[[Callable[[pa.Table], pa.Table], Sequence[str], Sequence[Path]], Iterable[pa.Table]]


def local_scan(batch_rows: int = BATCH_ROWS) -> Scan:
    """A scan that reads one Parquet batch of ``batch_rows`` rows at a time, in this process."""

    def scan(fn, columns, files) -> Iterator[pa.Table]:
        for path in files:
            reader = pq.ParquetFile(path, page_checksum_verification=True)  # as every reader of a dataset
            for batch in reader.iter_batches(batch_size=batch_rows, columns=list(columns)):
                yield fn(pa.Table.from_batches([batch]))

    return scan


# -- 1. attribution across partitions ----------------------------------------------------------



def walk_starts(batch: pa.Table, *, run_id: str | None = None) -> pa.Table:
    """Where the walks of ``batch`` start, already climbed as far as the batch goes: per distinct
    (trace_key, parent_key) of its unstamped bucketed spans (siblings share one walk), whether a
    stamped ancestor was met (``iteration``) or the key of the ancestor to look up elsewhere (``at``,
    0 when the walk ended at a root)."""
    arrays = span_arrays(batch)
    rows = np.flatnonzero(bucketed_rows(arrays, run_id) & ~arrays.has_iteration)
    table = arrays.table
    trace, span, low = key_column(table, "trace_key"), key_column(table, "span_key"), low_column(table)
    parent = key_column(table, "parent_key")[rows]
    walk = (parent != 0) & (parent != span[rows])
    walk_trace, walk_low, walk_parent = trace[rows][walk], low[rows][walk], parent[walk]
    distinct = first_rows(walk_trace, walk_low, walk_parent)
    starts_trace, starts_low, starts = walk_trace[distinct], walk_low[distinct], walk_parent[distinct]
    rows_of = _KeyIndex.of(trace, span, np.arange(len(span)), low) if len(starts) else None
    hit = rows_of.find(starts_trace, starts, starts_low) if rows_of is not None else np.zeros(0, np.int64)
    inside = np.flatnonzero(hit >= 0)
    stamped, iteration, at = np.zeros(len(starts), bool), np.zeros(len(starts), np.int64), starts.copy()
    if inside.size:
        walked = climb_batch(table, rows_of.values[hit[inside]])
        stamped[inside], iteration[inside], at[inside] = walked.stamped, walked.iteration, walked.exit
    return pa.table([pa.array(starts_trace), pa.array(starts), pa.array(at),
                     pa.array(iteration, mask=~stamped), pa.array(starts_low)], schema=_WALK_SCHEMA)


def ancestor_rows(batch: pa.Table, *, targets: _KeyIndex) -> pa.Table:
    """Rows of ``batch`` whose (trace_key, span_key) is one of ``targets``, climbed as far as the
    batch goes: the iteration met (null: none), and in ``parent_key`` the ancestor to look up next
    elsewhere (0: the walk ended)."""
    span, low = key_column(batch, "span_key"), low_column(batch)
    rows = np.flatnonzero(targets.find(key_column(batch, "trace_key"), span, low) >= 0)
    walked = climb_batch(batch, rows)
    return pa.table([pa.array(key_column(batch, "trace_key")[rows]), pa.array(span[rows]), pa.array(walked.exit),
                     pa.array(walked.iteration, mask=~walked.stamped), pa.array(low[rows])], schema=_EDGE_SCHEMA)


def resolve_attribution(scan: Scan, files: Sequence[Path], *, run_id: str | None = None) -> Columns:
    """The iteration an unstamped span takes from its parent: columns trace_key, parent_key, trace_low, iteration
    (only the walks that met a stamped ancestor).

    One scan finds the walks (one per distinct parent) and climbs each as far as its batch holds
    the tree; :func:`walk.resolve_walks` then looks the pending ancestors up in every batch (a scan
    of :func:`ancestor_rows` per round) until each walk has met a stamped span, a root, or a parent
    that is not in the data.
    """
    starts = _concat(scan(lambda b: walk_starts(b, run_id=run_id), GOODPUT_COLUMNS, files), _WALK_SCHEMA)
    first = _best_copy({
        "trace": key_column(starts, "trace_key"), "low": key_column(starts, TRACE_LOW),
        "start": key_column(starts, "parent_key"), "at": key_column(starts, "at"), **_iterations(starts)},
        ("trace", "low", "start"), "at")

    def lookup(wanted: Columns) -> Columns:
        targets = KeyIndex.of(wanted["trace"], wanted["at"], low=wanted["low"])
        edges = _concat(scan(lambda b: ancestor_rows(b, targets=targets), EDGE_COLUMNS, files), _EDGE_SCHEMA)
        return _best_copy({
            "trace": key_column(edges, "trace_key"), "low": key_column(edges, TRACE_LOW),
            "at": key_column(edges, "span_key"), "parent": key_column(edges, "parent_key"), **_iterations(edges)},
            ("trace", "low", "at"), "parent")

    walks = resolve_walks(first, lookup)
    stamped = walks["stamped"]
    return {"trace_key": walks["trace"][stamped].astype(np.uint64),
            "parent_key": walks["start"][stamped].astype(np.uint64),
            "trace_low": walks["low"][stamped].astype(np.uint64),
            "iteration": walks["iteration"][stamped].astype(np.int64)}


def _iterations(table: pa.Table) -> Columns:
    """``stamped`` and ``iteration`` (0 where not stamped) of a table's ``rl.iteration`` column."""
    column = table.column(ITERATION)
    return {"stamped": np.asarray(valid_rows(column), bool),
            "iteration": np.asarray(pc.fill_null(column, 0).to_numpy(), np.int64)}


def _best_copy(frame: Columns, key: tuple[str, ...], onward: str) -> Columns:
    """One row per ``key`` where several batches saw the same walk: a stamped end wins, then a root
    (``onward`` 0), then any pending copy (they converge)."""
    rank = np.where(frame["stamped"], 0, np.where(frame[onward] == 0, 1, 2))
    order = np.argsort(rank, kind="stable")
    return take(frame, order[first_rows(*(frame[k][order] for k in key))])


def _concat(tables: Iterable[pa.Table], schema: pa.Schema) -> pa.Table:
    parts = [t if t.schema.equals(schema) else t.select(schema.names).cast(schema) for t in tables if t.num_rows]
    return pa.concat_tables(parts) if parts else schema.empty_table()


_KeyIndex = AttributionIndex = KeyIndex  # (trace_key, parent_key) -> iteration: what goodput_partial reads


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
    numbers: StepNumbers | None = None  # step spans without rl.iteration (goodput.numbering)

    def scan(self, scan: Scan) -> Scan:
        """``scan`` with each batch's unnumbered step spans numbered before ``fn`` reads it."""
        return numbered_scan(scan, self.numbers)


def scan_step_numbers(scan: Scan, files: Sequence[Path]) -> StepNumbers:
    """:func:`step_numbers` through ``scan``: two columns of every file, and only where some step
    span lacks rl.iteration, a pass over a few more."""
    if not any(pc.sum(t.column("unstamped")).as_py() for t in scan(unstamped_step_count, FIND_COLUMNS, files)):
        return no_step_numbers()
    return step_numbers(scan(step_number_partial, NUMBER_COLUMNS, files))


def numbered_scan(scan: Scan, numbers: StepNumbers | None) -> Scan:
    """``scan`` whose ``fn`` reads each batch with the step spans of ``numbers`` numbered."""
    if numbers is None or numbers.numbered == 0:
        return scan

    def numbered(fn, columns, files):
        return scan(lambda b: fn(number_steps(b, numbers)), columns, files)

    return numbered


def attribution(root: Path, scan: Scan, *, run_id: str | None = None) -> Attribution:
    """Check ``run_id``, then resolve the walks of every unstamped bucketed span through ``scan``."""
    order = run_order(root)
    UnknownRunError.unless_present(run_id, order)
    files = span_files(root)
    numbers = scan_step_numbers(scan, files)
    resolved = resolve_attribution(numbered_scan(scan, numbers), files, run_id=run_id)
    attributed = _KeyIndex.of(resolved["trace_key"], resolved["parent_key"], resolved["iteration"],
                              resolved["trace_low"])
    return Attribution(order, span_files(root, run_id=run_id) if run_id is not None else files, attributed, numbers)


def partitioned_goodput(root: Path, scan: Scan, *, run_id: str | None = None, compact_rows: int = 1 << 20,
                        by: str = "step") -> tuple[RunGoodput, ...]:
    """``run_goodput`` of the dataset at ``root``, computed batch by batch through ``scan``."""
    plan = attribution(Path(root), scan, run_id=run_id)
    scan = plan.scan(scan)
    accumulator = GoodputAccumulator(compact_rows)
    for partial in scan(lambda b: goodput_partial(b, attributed=plan.attributed, run_id=run_id), GOODPUT_COLUMNS,
                        plan.files):
        accumulator.add(partial)
    runs = accumulator.result(plan.order)
    if by in FLEET_BY:
        return with_fleets(runs, accumulator.merged(), scan, plan, metrics_for_source(Path(root)), run_id=run_id,
                           by=by)
    return with_ranks(runs, accumulator.merged(), scan, plan, run_id=run_id) if by == "rank" else runs


def with_fleets(runs: tuple[RunGoodput, ...], merged: pa.Table, scan: Scan, plan: Attribution, metrics, *,
                run_id: str | None = None, by: str = "fleet") -> tuple[RunGoodput, ...]:
    """``runs`` with their ``fleets`` (:mod:`goodput.fleets`): one more scan for the fleet partials
    (merged as they arrive), the metric partial of ``metrics`` (the dataset's metrics table, or
    None), finished over the windows of ``merged`` (goodput's merged partials)."""
    pieces = [metric_partial(metrics, run_id=run_id)]
    for partial in scan(lambda b: fleet_partial(b, run_id=run_id), FLEET_SCAN_COLUMNS, plan.files):
        pieces = [merge_fleets([*pieces, partial])]
    return attach_fleets(runs, merge_fleets(pieces), merged, plan.order, by=by)


def with_ranks(runs: tuple[RunGoodput, ...], merged: pa.Table, scan: Scan, plan: Attribution, *,
               run_id: str | None = None) -> tuple[RunGoodput, ...]:
    """``runs`` with their ``--by rank`` tables: one more scan for the rank partials, merged here,
    finished over the steps of ``merged`` (goodput's merged partials)."""
    pieces = list(plan.scan(scan)(lambda b: rank_batch_partial(b, attributed=plan.attributed, run_id=run_id), RANK_READ_COLUMNS,
                       plan.files))
    tables = ranks_tables(merge_ranks(pieces), merged_steps(merged, plan.order), plan.order)
    return tuple(replace(run, ranks=tables[run.run_id]) for run in runs)


def condense_unions(merged: pa.Table) -> pa.Table:
    """Merged partials with each step's UNION rows replaced by at most two that give the same
    union length and the same length inside the step window (all the finish reads of them):
    ``[start, start + covered)`` and ``[end, end + outside)``. Only valid once every partial of
    the step is in ``merged`` (a reducer that owns the step); UNION rows of no step are dropped."""
    rows, runs = partial_columns(merged)
    steps, unions = take(rows, rows["kind"] == STEP), take(rows, rows["kind"] == UNION)
    step = find_keys((steps["run"], steps["iteration"]), (unions["run"], unions["iteration"]))
    joined = take(unions, step >= 0)
    step = step[step >= 0]
    a_step, b_step = steps["a"][step], steps["b"][step]
    length = joined["b"] - joined["a"]
    covered = np.clip(np.minimum(joined["b"], b_step) - np.maximum(joined["a"], a_step), 0, None)
    per_step = group_by(joined["run"], joined["iteration"])
    run = np.array([*runs, None], dtype=object)[per_step.key(joined["run"])]
    iteration, a, b = per_step.key(joined["iteration"]), per_step.key(a_step), per_step.key(b_step)
    length, covered = per_step.reduce(np.add, length), per_step.reduce(np.add, covered)
    inside, outside = (a, a + covered), (b, b + length - covered)
    parts = [merged.filter(pc.not_equal(merged.column("kind"), UNION))]
    for lo, hi in (inside, outside):
        some = hi > lo
        parts.append(partial_rows(UNION, run[some], iteration[some], np.ones(int(some.sum()), bool), a=lo[some],
                                  b=hi[some]))
    return pa.concat_tables(parts)


def step_owner(run: np.ndarray, iteration: np.ndarray, reducers: int) -> np.ndarray:
    """Which of ``reducers`` owns each (run, iteration) (run None, iteration -1 allowed): a hash that
    every process computes alike, so each reducer receives every partial of the steps it owns."""
    codes, names = string_codes(run)
    hashes = np.array([_hash(NO_RUN if name is None else name) for name in (*names, None)], np.uint64)
    runs = hashes[codes]  # code -1 (no run) -> the last
    with np.errstate(over="ignore"):
        mixed = runs ^ (np.asarray(iteration, np.int64).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return (mixed % np.uint64(max(1, reducers))).astype(np.int64)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def split_by_step(partials: Iterable[pa.Table], reducers: int) -> list[pa.Table]:
    """Partial tables in ``reducers`` tables, by :func:`step_owner` of their (run, iteration)
    (unmerged: a reducer merges every partial of its steps once)."""
    table = _concat(partials, PARTIAL_SCHEMA)
    iteration = pc.fill_null(table.column("iteration"), -1).to_numpy().astype(np.int64)
    owner = step_owner(table.column("run"), iteration, reducers)
    return [table.filter(pa.array(owner == r)) for r in range(reducers)]


def partial_table(merged: pa.Table) -> pa.Table:
    """Merged partials as a ``PARTIAL_SCHEMA`` table (the columns in its order, its types)."""
    return merged.select(PARTIAL_SCHEMA.names).cast(PARTIAL_SCHEMA)


def stream_goodput(root: str | Path, *, run_id: str | None = None, batch_rows: int = BATCH_ROWS, by: str = "step"):
    """``run_goodput`` of a dataset too large for memory: one batch of ``batch_rows`` rows at a time."""
    with reading_errors(Path(root)):  # a page that fails its read: the file named, exit 2
        return partitioned_goodput(Path(root), local_scan(batch_rows), run_id=run_id, compact_rows=4 * batch_rows,
                                   by=by)
