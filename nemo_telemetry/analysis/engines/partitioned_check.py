"""``check_run`` over a partitioned dataset, file by file: the findings' rules mapped over files.

Any engine that maps a function over groups of the dataset's files (:func:`local_map` here, Ray
tasks in :mod:`ray_engine`) gets :func:`checks.check_run`'s report on the whole table. This module
only schedules the rules of :mod:`findings.rules` and moves their partials:

1. *Facts* (one task per group of files): each file's distinct names / runs / buckets /
   categories in reading order (so the driver can rebuild the in-memory codes, which order the
   findings), its step windows, the parents its bucketed spans walk from, the parents it names
   but does not hold (orphan candidates), its anchor traces and the (run, name) and
   (run, span-groups) pairs present.
2. *Walks* (like goodput's attribution): the pending ancestors of the distinct walk starts are
   looked up in every file and climbed as far as that file holds the tree, until each walk has
   met its iteration and its nearest bucketed ancestor, a root, or a parent missing from the
   data; a pass per hop between files. The first pass also looks up the orphan candidates.
3. *Partials* (one task per group): each file, with the walks applied, is a batch of
   :class:`rules.RowFacts`; it gives the rules' partials (each span-level code's offending rows,
   the overlap clusters, the detached-trace counts) and goodput's partials; reducers merge the
   per-step ones.
4. *Collect* (only when needed): the member rows of the first ``max_findings_per_code`` steps
   with overlapping spans and detached traces (their counts come from the merged partials).

The driver merges the partials into one :class:`checks.Merged` over those few rows, coded with the
dataset's global codes and in dataset order, and :func:`checks.finish` writes the report.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.engines.check_rows import (
    FIRST_ANCHOR, SPAN_FLAGS, STEP_FACTS, Codes, in_dataset_order, merged_partials, step_heads,
)
from nemo_telemetry.analysis.findings import checks, rules
from nemo_telemetry.analysis.findings.groups import group_presence
from nemo_telemetry.analysis.goodput.numbering import (
    StepNumbers, file_number_partial, file_unstamped_steps, no_step_numbers, number_steps, step_numbers,
)
from nemo_telemetry.analysis.goodput.census import census_partial, merge_census
from nemo_telemetry.analysis.goodput.rules import step_windows
from nemo_telemetry.analysis.goodput import partials as streaming
from nemo_telemetry.analysis.decode import NO_BUCKET, SpanArrays, span_arrays
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.store.read import READ_COLUMNS, read_span_files, reading_errors
from nemo_telemetry.analysis.store.partitions import span_files
from nemo_telemetry.analysis.model.schema import BUCKET, ITERATION, NO_RUN
from nemo_telemetry.analysis.model.tree import key_column, low_column, with_id_keys
from nemo_telemetry.analysis.model.grouping import Columns, concat, find_keys, first_rows, string_codes, take
from nemo_telemetry.analysis.model.walk import KeyIndex, climb_batch, resolve_walks
from nemo_telemetry.errors import UnknownRunError

__all__ = ["FileMap", "MapReduce", "local_map", "local_map_reduce", "partitioned_check", "stream_check"]

# file_map(function, files, *args) -> [function(paths of a group, *args) for each group], groups in file order;
# each function below returns one result per path, so the flattened results line up with ``files``.
FileMap = Callable[..., list]
# map_reduce(map_function, reduce_function, files, reducers, *args) -> (map results in file order, reducer results):
# map_function(paths, reducers, *args) returns (its result, piece 0 .. piece reducers-1); reducer r gets every piece r.
MapReduce = Callable[..., tuple]

_LOOKUP_COLUMNS = ("trace_key", "span_key", "parent_key", "trace_low", ITERATION, BUCKET, "name")




def local_map(function: Callable, files: Sequence[Path], *args) -> list:
    """The :data:`FileMap` of this process: one file per call, in order."""
    return [function([str(f)], *args) for f in files]


def local_map_reduce(map_function: Callable, reduce_function: Callable, files: Sequence[Path], reducers: int,
                     *args) -> tuple[list, list]:
    """The :data:`MapReduce` of this process: one file per map call, then each reducer in turn."""
    outputs = [map_function([str(f)], reducers, *args) for f in files]
    return [o[0] for o in outputs], [reduce_function(*[o[1 + r] for o in outputs]) for r in range(reducers)]


def _read(path: str, columns: Sequence[str] = READ_COLUMNS, numbers: StepNumbers | None = None) -> pa.Table:
    """One file as ``read_for_analysis`` reads the dataset (same projection, same dictionaries),
    its step spans without rl.iteration numbered (``numbers``: :mod:`goodput.numbering`)."""
    return number_steps(with_id_keys(read_span_files([path], columns=tuple(columns))), numbers)


def _unstamped_steps(paths: list[str]) -> list[int]:
    return [file_unstamped_steps(p) for p in paths]


def _number_partials(paths: list[str]) -> list[pa.Table]:
    return [file_number_partial(p) for p in paths]



def _keep(arrays: SpanArrays, run_id: str | None) -> np.ndarray:
    if run_id is None:
        return np.ones(len(arrays), dtype=bool)
    if run_id not in arrays.runs:
        return np.zeros(len(arrays), dtype=bool)
    return arrays.run == arrays.runs.index(run_id)


def _values(codes: np.ndarray, values: tuple, none: Any = None) -> np.ndarray:
    """Codes (-1: ``none``) as an object array of their values."""
    lookup = np.array(list(values) + [none], dtype=object)
    return lookup[codes]


# -- 1. facts ----------------------------------------------------------------------------------


def _facts(paths: list[str], run_id: str | None, numbers: StepNumbers | None = None) -> list[dict]:
    return [_facts_of(_read(p, numbers=numbers), run_id) for p in paths]


def _facts_of(table: pa.Table, run_id: str | None) -> dict:
    a = span_arrays(table)
    keep = _keep(a, run_id)
    trace, span, parent = key_column(table, "trace_key"), key_column(table, "span_key"), key_column(table, "parent_key")
    low = low_column(table)
    steps = step_windows(a, keep)
    heads = steps.row
    walked = np.flatnonzero((a.bucket != NO_BUCKET) & keep)
    walks = walked[(parent[walked] != 0) & (parent[walked] != span[walked])]
    children = np.flatnonzero(keep & (parent != 0))
    here = KeyIndex.of(trace, span, low=low)
    outside = children[here.find(trace[children], parent[children], low[children]) < 0]
    anchors = rules.anchor_rows(a, keep)
    first = anchors[first_rows(a.run[anchors])]  # each run's first anchor row
    anchor_traces, anchor_lows = rules.distinct_traces(trace[anchors], low[anchors])  # the whole trace ids
    return {
        "rows": len(a), "names": a.names, "runs": a.runs, "buckets": a.bucket_values, "categories": a.categories,
        "steps": {"run": _values(steps.run, a.runs, NO_RUN), "iteration": steps.iteration, "start": steps.start,
                  "end": steps.end, "row": heads, "span_key": span[heads], "trace_id": _trace_ids(a, heads)},
        "walks": _pairs(trace[walks], parent[walks], low[walks]),
        "missing": _pairs(trace[outside], parent[outside], low[outside]),
        "anchor_traces": anchor_traces, "anchor_lows": anchor_lows,
        "first_anchor": {"run": _values(a.run[first], a.runs, NO_RUN), "row": first.astype(np.int64),
                         "name": _values(a.name[first], a.names), "trace_id": _trace_ids(a, first)},
        "group_presence": group_presence(a, keep),
        "census": census_partial(a, keep),
    }


def _trace_ids(a: SpanArrays, rows: np.ndarray) -> np.ndarray:
    """``a.trace_id(rows)`` (object), in one take when the id column was read (messages quote these ids)."""
    if "trace_id" in a.table.column_names:
        ids = [str(v) for v in a.table.column("trace_id").take(pa.array(rows, pa.int64())).to_pylist()]
    else:
        ids = list(a.trace_id(rows))
    return np.array(ids, dtype=object) if ids else np.zeros(0, object)


_PAIRS = {"trace": np.zeros(0, np.uint64), "key": np.zeros(0, np.uint64), "low": np.zeros(0, np.uint64)}


def _pairs(trace: np.ndarray, key: np.ndarray, low: np.ndarray) -> Columns:
    """Distinct (trace, key) pairs (the trace: its key and ``low``, trace_low), in order of first appearance."""
    first = first_rows(trace, low, key)
    return {"trace": np.asarray(trace[first], np.uint64), "key": np.asarray(key[first], np.uint64),
            "low": np.asarray(low[first], np.uint64)}


# -- 2. walks ----------------------------------------------------------------------------------


def _lookup(paths: list[str], targets: KeyIndex, numbers: StepNumbers | None = None) -> list[Columns]:
    """Per file: the rows whose (trace, span) is a target, climbed as far as the file holds the tree
    (:func:`walk.climb_batch`, until both an iteration and a bucketed ancestor were met): what the
    walk met, and in ``parent`` the key of the ancestor to look up elsewhere (0: it ended here)."""
    out = []
    for path in paths:
        table = _read(path, _LOOKUP_COLUMNS, numbers)
        trace, span, low = key_column(table, "trace_key"), key_column(table, "span_key"), low_column(table)
        bucketed = (valid_rows(table.column(BUCKET)) if BUCKET in table.column_names
                    else np.zeros(len(span), bool))
        rows = np.flatnonzero(targets.find(trace, span, low) >= 0)
        met = climb_batch(table, rows, bucketed=bucketed)
        names = np.full(len(rows), None, dtype=object)
        has = np.flatnonzero(met.ancestor >= 0)
        names[has] = table.column("name").take(pa.array(met.ancestor[has])).to_pylist()  # only the names met
        out.append({"trace": trace[rows], "at": span[rows], "parent": met.exit, "stamped": met.stamped,
                    "iteration": met.iteration, "ancestor": names, "low": low[rows]})
    return out


@dataclass(frozen=True, eq=False)
class _Walks:
    """Per walk start (trace, parent): the nearest stamped iteration and bucketed ancestor name at or
    above it. The arrays end with one extra "no walk" entry, at position ``len(index.key)``."""

    index: KeyIndex  # values: position in the arrays below
    found: np.ndarray
    iteration: np.ndarray
    ancestor: np.ndarray  # object: name of the nearest bucketed ancestor, or None

    @classmethod
    def of(cls, walks: Columns) -> "_Walks":
        n = len(walks["trace"])
        return cls(KeyIndex.of(walks["trace"], walks["start"], np.arange(n), walks["low"]),
                   np.append(walks["stamped"], False),
                   np.append(walks["iteration"], 0), np.append(np.asarray(walks["ancestor"], object), None))

    def position(self, trace: np.ndarray, start: np.ndarray, walking: np.ndarray, low: np.ndarray) -> np.ndarray:
        """Position of each row's walk (the "no walk" entry where ``walking`` is False or none was made)."""
        hit = np.where(walking, self.index.find(trace, start, low), -1)
        values = self.index.values if len(self.index.values) else np.zeros(1, np.int64)
        return np.where(hit >= 0, values[np.maximum(hit, 0)], len(self.found) - 1)


def _walk(file_map: FileMap, files: Sequence[Path], starts: Columns, candidates: Columns,
          numbers: StepNumbers | None = None) -> tuple[Columns, Columns]:
    """Every walk to its end (:func:`walk.resolve_walks`, a pass over the files per hop between
    them); and which orphan ``candidates`` name a parent found nowhere (looked up in the first pass)."""
    first = {"candidates": {"trace": candidates["trace"], "at": candidates["key"], "low": candidates["low"]}}

    def lookup(wanted: Columns) -> Columns:
        extra = first.pop("candidates", None)
        trace, at, low = wanted["trace"], wanted["at"], wanted["low"]
        if extra is not None:
            trace, at, low = (np.concatenate([mine, extra[c]]) for mine, c in ((trace, "trace"), (at, "at"), (low, "low")))
        targets = KeyIndex.of(trace, at, low=low)  # repeats are harmless: the index only tests membership
        found = concat([f for group in file_map(_lookup, files, targets, numbers) for f in group], _NOT_FOUND)
        # a repeated span id: the first copy in dataset order, as the in-memory index
        found = take(found, first_rows(found["trace"], found["low"], found["at"]))
        if extra is not None:
            index = KeyIndex.of(found["trace"], found["at"], low=found["low"])
            first["missing"] = take(candidates, index.find(candidates["trace"], candidates["key"], candidates["low"]) < 0)
        return found

    trace, start = starts["trace"], starts["key"]
    walks = {"trace": trace, "start": start, "at": start, "stamped": np.zeros(len(trace), bool),
             "iteration": np.zeros(len(trace), np.int64), "ancestor": np.full(len(trace), None, object),
             "low": starts["low"]}
    walked = resolve_walks(walks, lookup, ancestors=True)
    if "missing" not in first:  # no walk to make: the orphan candidates still need their lookup
        lookup({"trace": np.zeros(0, np.uint64), "at": np.zeros(0, np.uint64), "low": np.zeros(0, np.uint64)})
    return walked, first["missing"]


_NOT_FOUND = {"trace": np.zeros(0, np.uint64), "at": np.zeros(0, np.uint64), "parent": np.zeros(0, np.uint64),
              "stamped": np.zeros(0, bool), "iteration": np.zeros(0, np.int64), "ancestor": np.zeros(0, object),
              "low": np.zeros(0, np.uint64)}


# -- 3. partials ------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Shared:
    """What every file task needs to know about the whole dataset."""

    run_id: str | None
    walks: _Walks
    missing: KeyIndex  # (trace, parent) pairs found in no file
    attributed: KeyIndex  # (trace, parent) -> iteration, for goodput's partials
    step_run: np.ndarray  # object: run name of each step (global step order)
    step_iteration: np.ndarray
    anchored_traces: np.ndarray  # uint64 trace keys of the anchored traces, sorted by (key, low)
    anchored_runs: frozenset
    names: tuple  # the dataset's names (global codes), for the nested-bucket ancestors
    file_index: dict  # path -> position in dataset order (orders the clusters' heads across files)
    tolerance_ns: int  # overlaps up to this long are clock granularity (bucketed-overlap at info)
    numbers: StepNumbers | None = None  # the step spans without rl.iteration, numbered as each file is read
    anchored_lows: np.ndarray | None = None  # uint64 trace_low beside each of anchored_traces (the whole trace id)


@dataclass(frozen=True, eq=False)
class _View:
    """One file's rows with the dataset-wide facts applied (walks, orphans, steps)."""

    facts: rules.RowFacts  # walked_ancestor in the dataset's name codes
    walked: np.ndarray  # mask of facts.walked
    trace: np.ndarray
    span: np.ndarray
    parent: np.ndarray
    low: np.ndarray  # trace_low
    iteration: np.ndarray  # per row, as checks.Merged.iteration
    stamped: np.ndarray  # per row: own or attributed iteration found
    ancestor: np.ndarray  # per row: dataset name code of the nearest bucketed ancestor, -1: none
    step: np.ndarray  # step index of each candidate bucketed row inside a step, else -1


def _view(table: pa.Table, shared: _Shared) -> _View:
    a = span_arrays(table)
    keep = _keep(a, shared.run_id)
    trace, span, parent = key_column(table, "trace_key"), key_column(table, "span_key"), key_column(table, "parent_key")
    low = low_column(table)
    walked = (a.bucket != NO_BUCKET) & keep
    starts = np.where(parent == span, 0, parent)
    walk = shared.walks.position(trace, starts, walked & (starts != 0), low)
    stamped = a.has_iteration | shared.walks.found[walk]
    attributed = np.where(a.has_iteration, a.iteration, shared.walks.iteration[walk])
    iteration = np.where(a.has_iteration, a.iteration, -1)
    iteration = np.where(walked, np.where(stamped, attributed, -1), iteration)
    code_of = {name: i for i, name in enumerate(shared.names)}
    names = np.array([code_of.get(n, -1) if n is not None else -1 for n in shared.walks.ancestor], np.int64)
    ancestor = np.where(walked, names[walk], -1)
    orphan = keep & (parent != 0) & (shared.missing.find(trace, parent, low) >= 0)
    candidate = (a.bucket >= 0) & a.valid_interval & keep & stamped
    step = np.full(len(a), -1, np.int64)
    if len(shared.step_run) and candidate.any():
        rows = np.flatnonzero(candidate)
        local = {run: i for i, run in enumerate(a.runs)}
        step_code = np.array([local.get(r, -1) if r != NO_RUN else -1 for r in shared.step_run], np.int64)
        here = (step_code >= 0) | (shared.step_run == NO_RUN)  # steps of runs this file holds
        index = KeyIndex.of(step_code[here].astype(np.uint64), shared.step_iteration[here].astype(np.uint64),
                                       np.flatnonzero(here))
        hit = index.find(a.run[rows].astype(np.int64).astype(np.uint64), attributed[rows].astype(np.uint64))
        if len(index.values):
            step[rows] = np.where(hit >= 0, index.values[np.maximum(hit, 0)], -1)
    rows = np.flatnonzero(walked)
    facts = rules.RowFacts(arrays=a, keep=keep, walked=rows, walked_stamped=stamped[rows],
                           walked_iteration=attributed[rows], walked_ancestor=ancestor[rows], orphan=orphan)
    return _View(facts, walked, trace, span, parent, low, iteration, stamped, ancestor, step)


def _rows(view: _View, rows: np.ndarray, **extra) -> Columns:
    """The rows a driver-side table is built from (:data:`check_rows.ROW_COLUMNS`): values (not
    codes), ids and the per-row facts; ``extra`` columns are arrays, or one value for every row."""
    a = view.facts.arrays
    frame = {
        "row": rows.astype(np.int64), "name": _values(a.name[rows], a.names), "run": _values(a.run[rows], a.runs),
        "start": a.start[rows].astype(np.int64), "end": a.end[rows].astype(np.int64),
        "bucket": _values(a.bucket_raw[rows], a.bucket_values), "category": _values(a.category[rows], a.categories),
        "own_iteration": a.iteration[rows].astype(np.int64), "has_iteration": a.has_iteration[rows].astype(bool),
        "iteration": view.iteration[rows].astype(np.int64), "stamped": view.stamped[rows].astype(bool),
        "ancestor": view.ancestor[rows].astype(np.int64), "orphan": view.facts.orphan[rows].astype(bool),
        "trace_id": _trace_ids(a, rows), "span_key": view.span[rows], "trace_key": view.trace[rows],
        "parent_key": view.parent[rows], "step": view.step[rows].astype(np.int64), "walked": view.walked[rows],
        "trace_low": view.low[rows]}
    for key, value in extra.items():
        frame[key] = value if isinstance(value, np.ndarray) else np.full(len(rows), value, dtype=object)
    return frame


def _file_findings(paths: list[str], reducers: int, shared: _Shared) -> tuple:
    """Map task: per file, the rules' partials; and for each reducer, the goodput partials of the
    steps it owns (merged over the group) and the overlap clusters of those steps."""
    results = [_findings_of(_read(p, numbers=shared.numbers), shared) for p in paths]
    partials = streaming.split_by_step([r.pop("partial") for r in results], reducers)
    clusters, deep = (concat([_in_file(r.pop(key), shared.file_index[p]) for r, p in zip(results, paths)], _CLUSTERS)
                      for key in ("clusters", "deep_clusters"))
    owner, deep_owner = clusters["step"] % reducers, deep["step"] % reducers
    return (results, *[(partials[i], take(clusters, owner == i), take(deep, deep_owner == i)) for i in range(reducers)])


_CLUSTERS = {c: np.zeros(0, np.int64) for c in ("step", "start", "end", "members", "head", "file")}


def _in_file(clusters: Columns, file: int) -> Columns:
    """A file's overlap clusters, with the file's position in dataset order."""
    return {**clusters, "file": np.full(len(clusters["step"]), file, np.int64)}


def _reduce_findings(*pieces: tuple) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """Reduce task: its steps' partials merged and condensed (a few rows per step), which of its
    steps hold a cluster of overlapping bucketed spans, and which of them overlap past the tolerance."""
    accumulator = streaming.GoodputAccumulator()
    for partial, _, _ in pieces:
        accumulator.add(partial)
    condensed = streaming.partial_table(streaming.condense_unions(accumulator.merged()))
    return (condensed, rules.overlapping_steps([c for _, c, _ in pieces]),
            rules.overlapping_steps([d for _, _, d in pieces]))


def _findings_of(table: pa.Table, shared: _Shared) -> dict:
    view = _view(table, shared)
    facts = view.facts
    a = facts.arrays
    flags = np.zeros(len(a), np.int64)
    for code, rows in rules.offenders(facts).items():
        flags[rows] |= SPAN_FLAGS[code]
    offenders = np.flatnonzero(flags)
    inside = np.flatnonzero(view.step >= 0)
    clusters, deep = rules.overlap_partial(a.start[inside], a.end[inside], view.step[inside], inside,
                                           shared.tolerance_ns)
    anchored_runs = np.array([i for i, r in enumerate(a.runs) if r in shared.anchored_runs]
                             + ([-1] if NO_RUN in shared.anchored_runs else []), np.int64)
    _, detached = rules.detached_partial(facts, shared.anchored_traces, anchored_runs, shared.anchored_lows)
    detached["run"] = _values(detached["run"], a.runs, NO_RUN)
    bucketed = np.flatnonzero((a.bucket >= 0) & a.valid_interval & facts.keep)  # as goodput's bucketed rows
    failed = rules.failed_partial(a, facts.keep, bucketed, np.where(view.stamped, view.iteration, 0)[bucketed],
                                  view.stamped[bucketed])
    return {
        "offenders": _rows(view, offenders, flags=flags[offenders]),
        "partial": streaming.goodput_partial(table, attributed=shared.attributed, run_id=shared.run_id),
        "clusters": clusters,
        "deep_clusters": deep,
        "detached": detached,
        "failed": failed,
    }


# -- 4. collect --------------------------------------------------------------------------------


def _collect(paths: list[str], shared: _Shared, steps: np.ndarray, traces: Columns) -> list[Columns]:
    """Per file: the bucketed rows inside ``steps``, and every row of the (run, trace) pairs ``traces``
    (run names, NO_RUN for none)."""
    out = []
    for path in paths:
        view = _view(_read(path, numbers=shared.numbers), shared)
        a = view.facts.arrays
        inside = np.isin(view.step, steps) & (view.step >= 0)
        local = {run: i for i, run in enumerate(a.runs)}
        wanted_run = np.array([-1 if r == NO_RUN else local.get(r, -2) for r in traces["run"]], np.int64)  # -2: absent
        member = view.facts.keep & (find_keys((wanted_run, traces["trace"], traces["low"]),
                                              (a.run.astype(np.int64), view.trace, view.low)) >= 0)
        parts = [_rows(view, np.flatnonzero(inside), part="overlap"),
                 _rows(view, np.flatnonzero(member), part="detached")]
        out.append({name: np.concatenate([p[name] for p in parts]) for name in parts[0]})
    return out


# -- the driver --------------------------------------------------------------------------------


def partitioned_check(root: str | Path, file_map: FileMap, *, map_reduce: MapReduce = local_map_reduce,
                      reducers: int = 2, run_id: str | None = None, unattributed_threshold: float = 0.2,
                      overlap_tolerance_s: float = checks.DEFAULT_OVERLAP_TOLERANCE_S,
                      max_span_ids: int = 10, max_findings_per_code: int = 100) -> checks.CheckReport:
    """:func:`checks.check_run` of the dataset at ``root``, its work mapped over the files by
    ``file_map``; the per-step merges (goodput's partials, overlap clusters) by ``map_reduce``
    over ``reducers`` reducers, so this process receives a few rows per step."""
    root = Path(root)
    files = span_files(root)
    options = {"max_span_ids": max_span_ids, "max_findings_per_code": max_findings_per_code}
    tolerance_ns = checks.overlap_tolerance_ns(overlap_tolerance_s)
    if not files:
        from nemo_telemetry.analysis.ingestion.read import read_for_analysis

        return checks.check_run(read_for_analysis(root), run_id=run_id, unattributed_threshold=unattributed_threshold,
                                overlap_tolerance_s=overlap_tolerance_s, **options)
    numbers = (step_numbers(p for group in file_map(_number_partials, files) for p in group)
               if any(n for group in file_map(_unstamped_steps, files) for n in group) else no_step_numbers())
    facts = [f for group in file_map(_facts, files, run_id, numbers) for f in group]
    codes = Codes()
    for f in facts:
        codes.add(f)
    UnknownRunError.unless_present(run_id, codes.runs)
    walked, missing = _walk(file_map, files, _concat(f["walks"] for f in facts), _concat(f["missing"] for f in facts),
                            numbers)
    shared = dataclasses.replace(_shared(facts, codes, walked, missing, run_id, files, tolerance_ns), numbers=numbers)
    groups, reduced = map_reduce(_file_findings, _reduce_findings, files, reducers, shared)
    results = [r for group in groups for r in group]
    accumulator = streaming.GoodputAccumulator()
    for condensed, _, _ in reduced:
        accumulator.add(condensed)
    analysis = streaming.merged_steps(accumulator.merged(), codes.tuple("runs"))
    overlapping = np.unique(np.concatenate([np.zeros(0, np.int64)] + [c for _, c, _ in reduced]))
    deep = np.unique(np.concatenate([np.zeros(0, np.int64)] + [d for _, _, d in reduced]))
    counts = concat([r["detached"] for r in results], _COUNTS)
    counts["run"] = codes.code("runs", [None if r == NO_RUN else r for r in counts["run"]])
    detached = rules.detached_traces(counts)
    shown = take(detached, slice(0, max_findings_per_code))
    traces = {"run": _values(shown["run"], codes.tuple("runs"), NO_RUN), "trace": shown["trace"], "low": shown["low"]}
    overlap_steps = overlapping[:max_findings_per_code]
    collected = [_of_file(c, i) for i, c in enumerate(
        c for group in file_map(_collect, files, shared, overlap_steps, traces) for c in group)] \
        if len(overlap_steps) or len(traces["run"]) else []
    offenders = [_of_file(r["offenders"], i, part="offender") for i, r in enumerate(results)]
    rows = in_dataset_order(offenders + collected + [step_heads(facts, analysis.steps, codes)])
    failed = rules.failed_spans([{**r["failed"], "file": np.full(len(r["failed"]["run"]), i, np.int64)}
                                 for i, r in enumerate(results)])
    merged = dataclasses.replace(merged_partials(rows, codes, analysis, facts, overlapping, deep, detached),
                                 numbers=numbers, failed=failed, census=merge_census(f["census"] for f in facts))
    return checks.finish(merged, unattributed_threshold=unattributed_threshold, tolerance_ns=tolerance_ns, **options)


_COUNTS = {"run": np.zeros(0, object), "trace": np.zeros(0, np.uint64), "low": np.zeros(0, np.uint64),
           "rows": np.zeros(0, np.int64),
           "designed": np.zeros(0, np.int64)}


def _of_file(rows: Columns, file: int, **extra) -> Columns:
    """A file's rows with its position in dataset order (and ``extra``: one value for every row)."""
    n = len(rows["row"])
    return {**rows, "file": np.full(n, file, np.int64), **{k: np.full(n, v, dtype=object) for k, v in extra.items()}}


def _concat(pairs) -> Columns:
    """(trace, key) pairs of many files, each pair once."""
    both = concat(list(pairs), _PAIRS)
    return _pairs(both["trace"], both["key"], both["low"])


def _shared(facts: list[dict], codes: Codes, walked: Columns, missing: Columns,
            run_id: str | None, files: Sequence[Path], tolerance_ns: int) -> _Shared:
    steps = concat([f["steps"] for f in facts], STEP_FACTS)
    steps = take(steps, first_rows(string_codes(steps["run"])[0], steps["iteration"]))  # each (run, iteration) once
    code = codes.code("runs", steps["run"]).astype(np.int64)
    steps = take(steps, np.lexsort((steps["iteration"], code)))  # goodput's order
    found = take(walked, walked["stamped"])
    anchored = concat([f["first_anchor"] for f in facts], FIRST_ANCHOR)
    return _Shared(
        run_id=run_id, walks=_Walks.of(walked), missing=KeyIndex.of(missing["trace"], missing["key"], low=missing["low"]),
        attributed=KeyIndex.of(found["trace"], found["start"], found["iteration"], found["low"]),
        step_run=steps["run"], step_iteration=steps["iteration"],
        **_anchored_pairs(facts),
        anchored_runs=frozenset(anchored["run"].tolist()), names=codes.tuple("names"),
        file_index={str(f): i for i, f in enumerate(files)}, tolerance_ns=tolerance_ns)


def _anchored_pairs(facts: list[dict]) -> dict:
    """Every file's anchored (trace key, trace low) pairs, each once, sorted: :class:`_Shared`'s
    ``anchored_traces`` and ``anchored_lows``."""
    both = concat([{"trace": f["anchor_traces"], "low": f["anchor_lows"]} for f in facts],
                  {"trace": np.zeros(0, np.uint64), "low": np.zeros(0, np.uint64)})
    traces, lows = rules.distinct_traces(both["trace"], both["low"])
    return {"anchored_traces": traces, "anchored_lows": lows}


def stream_check(root: str | Path, **options) -> checks.CheckReport:
    """:func:`partitioned_check` in this process, one file at a time (three reducers, run in turn)."""
    with reading_errors(Path(root)):  # a page that fails its read: the file named, exit 2
        return partitioned_check(root, local_map, map_reduce=local_map_reduce, reducers=3, **options)
