"""The findings' rules over one batch of rows: partial(batch) -> merge(partials) -> finish.

Every engine states a finding's rule through these functions only. A batch is a
:class:`RowFacts`: one table's rows with the dataset-wide facts applied (the attribution walk,
orphans, step windows). In memory the batch is the whole table; out of core it is one file of
the dataset, and its facts come from the walk over every file.

- *Span-level codes* (``invalid-interval``, ``unknown-bucket``, ``umbrella-bucket``,
  ``nested-bucket``, ``unstamped-span``, ``orphan-span``): :func:`offenders` gives each code's
  rows of the batch; merging is concatenation in dataset order; :mod:`checks` finishes them
  (groups, counts, messages).
- ``bucketed-overlap``: :func:`overlap_partial` gives the batch's clusters of overlapping
  bucketed intervals per step (and those overlapping past the tolerance); :func:`overlapping_steps`
  merges any number of them into the steps that have an overlap (and a deep one).
- ``detached-trace``: :func:`detached_partial` counts, per (run, trace) outside every anchored
  trace, the batch's rows and how many of them are separate by design;
  :func:`detached_traces` merges the counts and keeps the traces that are detached. A trace here
  (and wherever the findings group rows per trace) is the pair (``trace_key``, ``trace_low``):
  the whole 128-bit trace id, so two ids that share a trace key stay two traces.
- ``missing-group-spans``: :func:`group_presence` (groups) reads each process's enabled groups,
  the groups the spans recorded and the names of the spans that record none; merging is their union.
- Step-level codes (``bucket-exceeds-wall``, ``unattributed-step-time``, ``step-time-outlier``)
  read goodput's finished per-step table only.
- ``failed-step``: which steps failed is goodput's (its ``failed`` column, from
  :func:`goodput.rules.failing_rows`); :func:`failed_partial` gives the batch's spans that fail a
  step, with what a finding quotes of them, and :func:`failed_spans` merges any number of them
  into the first (earliest start, then dataset order) of each step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.goodput.rules import failing_rows
from nemo_telemetry.analysis.goodput.steps import JOB_SPAN_REGEX, STEP_SPAN_REGEX
from nemo_telemetry.analysis.decode import UNKNOWN_BUCKET, SpanArrays
from nemo_telemetry.analysis.model.columns import code_mask, codes_matching, column_rows, filled
from nemo_telemetry.analysis.model.grouping import Columns, concat, find_keys, group_by, string_codes, take
from nemo_telemetry.analysis.model.intervals import merge_intervals
from nemo_telemetry.analysis.model.remote import parent_is_remote
from nemo_telemetry.analysis.model.status import status_messages
from nemo_telemetry.analysis.model.tree import TRACE_LOW
from nemo_telemetry.instrument import REGISTRY, span_name_regex
from nemo_telemetry.instrument.span_groups import UNBUCKETED_SPAN_CATEGORIES

__all__ = ["RowFacts", "row_traces", "row_lows", "trace_pairs", "distinct_traces", "rows_in_traces", "SPAN_CODES", "ANCHOR_REGEX", "STANDALONE_GROUPS", "offenders",
           "BATCH_FINDING_CODES", "batch_offenders", "catalogue_name_sets",
           "group_name_codes", "anchor_rows", "overlap_partial", "overlapping_steps", "detached_partial", "loose_rows", "detached_counts",
           "detached_traces", "FAILED_SPANS", "failed_partial", "failed_spans", "remote_parent"]

_FEW_TRACES = 4  # anchored traces up to which rows_in_traces compares keys instead of hashing them

# The span-level codes, in the order check_run writes them.
SPAN_CODES = ("invalid-interval", "unknown-bucket", "umbrella-bucket", "nested-bucket", "unstamped-span",
              "orphan-span", "remote-parent")
ANCHOR_REGEX = f"{JOB_SPAN_REGEX}|{STEP_SPAN_REGEX}"  # the spans that make a trace part of the run's steps
# Groups whose root spans are separate traces by design (seed 000: startup closes before the job
# opens; worker __init__ spans are opened before any call carries context).
STANDALONE_GROUPS = ("setup", "model_init")


@dataclass(frozen=True, eq=False)
class RowFacts:
    """One batch's rows and what the whole dataset says about them.

    ``walked`` are the rows with an ``rl.bucket`` in the selected run; the ``walked_*`` arrays
    line up with them. Name codes are the batch's (``arrays.names``).
    """

    arrays: SpanArrays
    keep: np.ndarray  # mask: rows of the selected run
    walked: np.ndarray  # rows with an rl.bucket (known, unknown or invalid interval) in the selected run
    walked_stamped: np.ndarray  # own or attributed iteration found
    walked_iteration: np.ndarray  # that iteration (meaningful where stamped)
    walked_ancestor: np.ndarray  # name code of the nearest row with an rl.bucket above, -1: none
    orphan: np.ndarray | None  # mask: names a parent found in no batch (None while the test runs)

    def trace_of(self, rows: np.ndarray) -> np.ndarray:
        """The uint64 trace key of each of ``rows`` (taken from the batch, never decoded whole)."""
        return row_traces(self.arrays, rows)

    def low_of(self, rows: np.ndarray) -> np.ndarray:
        """The uint64 ``trace_low`` of each of ``rows``: with :meth:`trace_of`, the row's whole
        trace id (two trace ids may share a trace key; no two share both)."""
        return row_lows(self.arrays, rows)

    def iteration_of(self, rows: np.ndarray) -> np.ndarray:
        """Each row's iteration: attributed where walked, else its own; -1 where none."""
        a = self.arrays
        out = np.where(a.has_iteration[rows], a.iteration[rows], -1)
        if len(self.walked) and len(rows):
            pos = np.minimum(np.searchsorted(self.walked, rows), len(self.walked) - 1)
            hit = self.walked[pos] == rows
            out[hit] = np.where(self.walked_stamped[pos[hit]], self.walked_iteration[pos[hit]], -1)
        return out


def row_traces(arrays: SpanArrays, rows: np.ndarray) -> np.ndarray:
    """The uint64 trace key of each of ``rows``."""
    return column_rows(arrays.table.column("trace_key"), rows, 0).astype(np.uint64, copy=False)


def row_lows(arrays: SpanArrays, rows: np.ndarray) -> np.ndarray:
    """The uint64 ``trace_low`` of each of ``rows`` (0 where the table has no such column: a
    projection whose trace is its ``trace_key`` alone, as :func:`model.tree.low_column`)."""
    if TRACE_LOW not in arrays.table.column_names:
        return np.zeros(len(rows), np.uint64)
    return column_rows(arrays.table.column(TRACE_LOW), rows, 0).astype(np.uint64, copy=False)


def trace_pairs(arrays: SpanArrays, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (trace key, trace low) pairs of ``rows``, sorted: the whole trace ids they sit in."""
    return distinct_traces(row_traces(arrays, rows), row_lows(arrays, rows))


def distinct_traces(traces: np.ndarray, lows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (``traces``, ``lows``) pairs, sorted by (trace key, trace low)."""
    traces, lows = np.asarray(traces, np.uint64), np.asarray(lows, np.uint64)
    order = np.lexsort((lows, traces))
    traces, lows = traces[order], lows[order]
    first = np.ones(len(order), bool)
    first[1:] = (traces[1:] != traces[:-1]) | (lows[1:] != lows[:-1])
    return traces[first], lows[first]


def rows_in_traces(arrays: SpanArrays, traces: np.ndarray, lows: np.ndarray | None = None) -> np.ndarray:
    """Mask of the rows whose trace is one of ``traces``: the pair (trace key, trace low) is one
    of (``traces``, ``lows``) where ``lows`` is given (the whole trace id: two ids crafted to share
    a trace key stay apart), else the trace key alone."""
    column = arrays.table.column("trace_key")
    traces = np.asarray(traces, dtype=np.uint64)
    low_column = arrays.table.column(TRACE_LOW) if lows is not None and TRACE_LOW in arrays.table.column_names else None
    lows = np.zeros(len(traces), np.uint64) if lows is None else np.asarray(lows, dtype=np.uint64)
    if len(traces) > _FEW_TRACES or column.null_count:
        if low_column is None:
            found = pc.is_in(column, value_set=pa.array(traces, pa.uint64()))
            return found.to_numpy(zero_copy_only=False) if len(arrays) else np.zeros(0, bool)
        return _pairs_in(arrays, column, low_column, traces, lows)
    # A run's steps sit in one trace or a few: a comparison per trace beats hashing every key.
    out = np.zeros(len(arrays), dtype=bool)
    at = 0
    for chunk in column.chunks:
        keys, into = chunk.to_numpy().astype(np.uint64, copy=False), out[at:at + len(chunk)]
        low = None if low_column is None else filled(low_column.slice(at, len(chunk)), 0).astype(np.uint64, copy=False)
        if len(keys) and keys[0] == keys.min() == keys.max() and (low is None or low[0] == low.min() == low.max()):
            # one trace in the chunk (a process's spans of a run, which is one trace): decided once
            into[:] = any(keys[0] == t and (low is None or low[0] == w) for t, w in zip(traces, lows))
            at += len(chunk)
            continue
        for trace, want in zip(traces, lows):
            hit = keys == trace
            if low is not None:
                hit &= low == want
            into |= hit
        at += len(chunk)
    return out


def _pairs_in(arrays: SpanArrays, column: pa.ChunkedArray, low_column: pa.ChunkedArray, traces: np.ndarray,
              lows: np.ndarray) -> np.ndarray:
    """:func:`rows_in_traces` by hashing the keys: the one hash pass gives each row the position of
    its key among ``traces``, and the row's low half must be that trace's (a key held by two
    anchored traces, crafted to collide, is settled pair by pair at its rows)."""
    if not len(arrays):
        return np.zeros(0, bool)
    keys, first, count = np.unique(traces, return_index=True, return_counts=True)
    position = filled(pc.index_in(column, value_set=pa.array(keys, pa.uint64())), -1)
    out = position >= 0
    at = np.maximum(position, 0)
    row_low = filled(low_column, 0).astype(np.uint64, copy=False)
    out &= row_low == lows[first][at]
    if (count > 1).any():  # the key's other anchored trace may be the row's
        rows = np.flatnonzero(~out & (position >= 0) & (count[at] > 1))
        pairs = find_keys((traces, lows), (keys[position[rows]], row_low[rows]))
        out[rows[pairs >= 0]] = True
    return out


def offenders(facts: RowFacts) -> dict[str, np.ndarray]:
    """Each span-level code's offending rows of the batch (ascending)."""
    walked = facts.walked
    orphans = np.flatnonzero(facts.orphan & facts.keep)
    remote = remote_parent(facts.arrays, orphans)
    return {
        **batch_offenders(facts.arrays, facts.keep),
        "nested-bucket": walked[facts.walked_ancestor >= 0],
        "unstamped-span": walked[~facts.walked_stamped],
        "orphan-span": orphans[~remote],
        "remote-parent": orphans[remote],
    }


def remote_parent(arrays: SpanArrays, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` (orphans: few) have a remote parent (:func:`model.remote.parent_is_remote`:
    their flags' is-remote bit, else their kind; False where neither column was read)."""
    return parent_is_remote(arrays.table, rows)


BATCH_FINDING_CODES = ("invalid-interval", "unknown-bucket", "umbrella-bucket")
"""The span-level codes a span's own columns decide, without its ancestors or the other batches."""


def batch_offenders(a: SpanArrays, keep: np.ndarray) -> dict[str, np.ndarray]:
    """The offending rows of the :data:`BATCH_FINDING_CODES` (ascending)."""
    umbrella_only, unbucketed = catalogue_name_sets(a.names)
    unbucketed_categories = np.array([i for i, c in enumerate(a.categories) if c in UNBUCKETED_SPAN_CATEGORIES],
                                     dtype=np.int32)
    bucketed = np.flatnonzero(a.has_bucket & keep)
    names = a.name[bucketed]
    flagged = (code_mask(names, np.concatenate([umbrella_only, unbucketed]), len(a.names))
               | code_mask(a.bucketed_category(bucketed), unbucketed_categories, len(a.categories)))
    return {
        "invalid-interval": np.flatnonzero(~a.valid_interval & keep),
        "unknown-bucket": np.flatnonzero((a.bucket == UNKNOWN_BUCKET) & keep),
        "umbrella-bucket": bucketed[flagged],
    }


def catalogue_name_sets(names: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Codes of ``names`` that only umbrella groups claim, and of those declared unbucketed."""
    catalogue = REGISTRY.catalogue()
    claims_of = [(info, [re.compile(span_name_regex(p)) for p in info.spans],
                  [re.compile(span_name_regex(p)) for p in info.unbucketed_spans]) for info in catalogue]
    umbrella_only, unbucketed = [], []
    for code, name in enumerate(names):
        if name is None:
            continue
        claims = [info for info, spans, _ in claims_of if any(rx.match(name) for rx in spans)]
        if claims and all(info.umbrella for info in claims):
            umbrella_only.append(code)
        if any(rx.match(name) for _, _, declared in claims_of for rx in declared):
            unbucketed.append(code)
    return np.array(umbrella_only, dtype=np.int32), np.array(unbucketed, dtype=np.int32)


def group_name_codes(names: tuple, group_name: str) -> np.ndarray:
    """Codes of ``names`` that group ``group_name`` declares."""
    info = next((i for i in REGISTRY.catalogue() if i.name == group_name), None)
    if info is None or not info.spans:
        return np.zeros(0, dtype=np.int32)
    return codes_matching(names, "|".join(span_name_regex(p) for p in info.spans))


def anchor_rows(arrays: SpanArrays, keep: np.ndarray) -> np.ndarray:
    """Job and step span rows of the selected run: their traces hold the run's steps."""
    return np.flatnonzero(arrays.rows_of_names(ANCHOR_REGEX) & keep)


# -- bucketed-overlap --------------------------------------------------------------------------


def overlap_partial(start: np.ndarray, end: np.ndarray, step: np.ndarray, rows: np.ndarray,
                    tolerance_ns: int) -> tuple[Columns, Columns]:
    """The batch's clusters of overlapping bucketed intervals per step, and the clusters of those
    overlapping by more than ``tolerance_ns`` (``rows``: the batch rows, for the clusters' heads).

    Shortening every interval by the tolerance keeps exactly the pairs that overlap by more than
    it; an interval no longer than the tolerance cannot, and is left out.
    """
    longer = (end - start) > tolerance_ns
    return (_clusters(start, end, step, rows),
            _clusters(start[longer], end[longer] - tolerance_ns, step[longer], rows[longer]))


def _clusters(start: np.ndarray, end: np.ndarray, step: np.ndarray, rows: np.ndarray) -> Columns:
    """Clusters of overlapping intervals per step: hull, member count and first row (by start)."""
    merged = merge_intervals(start, end, step)
    order = np.lexsort((rows, start, merged.cluster_of))
    first = np.ones(len(order), dtype=bool)
    first[1:] = merged.cluster_of[order[1:]] != merged.cluster_of[order[:-1]]
    return {"step": np.asarray(merged.group, np.int64), "start": np.asarray(merged.start, np.int64),
            "end": np.asarray(merged.end, np.int64), "members": np.asarray(merged.members, np.int64),
            "head": rows[order[first]].astype(np.int64)}


def overlapping_steps(clusters: list[Columns]) -> np.ndarray:
    """Steps with a cluster of overlapping intervals, from every batch's clusters (columns of
    :func:`overlap_partial`'s, plus ``file``: the batch's position in dataset order, when there are
    several). A batch's cluster lies inside one cluster of the whole step: merging their hulls in
    dataset order gives the step's clusters, and members add up."""
    parts = [p for p in clusters if len(p["step"])]
    if not parts:
        return np.zeros(0, np.int64)
    if len(parts) == 1:
        return np.unique(parts[0]["step"].astype(np.int64)[parts[0]["members"] > 1])
    hulls = concat(parts, {"step": np.zeros(0, np.int64), "start": np.zeros(0, np.int64),
                           "end": np.zeros(0, np.int64), "members": np.zeros(0, np.int64),
                           "head": np.zeros(0, np.int64), "file": np.zeros(0, np.int64)})
    hulls = take(hulls, np.lexsort((hulls["head"], hulls["file"])))
    merged = merge_intervals(hulls["start"], hulls["end"], hulls["step"])
    members = np.bincount(merged.cluster_of, weights=hulls["members"].astype(np.float64), minlength=len(merged))
    return np.unique(merged.group[members > 1])


# -- detached-trace ----------------------------------------------------------------------------


def detached_partial(facts: RowFacts, anchored_traces: np.ndarray, anchored_runs: np.ndarray,
                     anchored_lows: np.ndarray | None = None) -> tuple[np.ndarray, Columns]:
    """The batch's rows of anchored runs outside every anchored trace (``anchored_traces`` and
    ``anchored_lows``: the anchored traces' (trace key, trace low) pairs, as :func:`trace_pairs`;
    ``anchored_runs`` the batch's run codes that have an anchor), and per (run code, trace) how
    many rows it holds and how many are not a root, or are a root by design (startup, model load)."""
    rows = loose_rows(facts.arrays, facts.keep, anchored_traces, anchored_runs, anchored_lows)
    return rows, detached_counts(facts, rows)


def loose_rows(arrays: SpanArrays, keep: np.ndarray, anchored_traces: np.ndarray,
               anchored_runs: np.ndarray, anchored_lows: np.ndarray | None = None) -> np.ndarray:
    """:func:`detached_partial`'s rows (``keep``: the selected run's). They read neither the walks
    nor the orphan test: a caller may find them while those run."""
    loose = keep & code_mask(arrays.run, anchored_runs, len(arrays.runs))
    loose &= ~rows_in_traces(arrays, anchored_traces, anchored_lows)
    return np.flatnonzero(loose)


def detached_counts(facts: RowFacts, rows: np.ndarray) -> Columns:
    """:func:`detached_partial`'s counts per (run code, trace) of its ``rows``: the trace is the
    pair (``trace``: trace key, ``low``: trace low), the whole trace id."""
    a = facts.arrays
    standalone = code_mask(a.name[rows], np.concatenate([group_name_codes(a.names, g) for g in STANDALONE_GROUPS]),
                           len(a.names))
    designed = (a.has_parent[rows] & ~facts.orphan[rows]) | standalone
    run, trace, low = a.run[rows].astype(np.int64), facts.trace_of(rows), facts.low_of(rows)
    traces = group_by(run, trace, low)
    return {"run": traces.key(run), "trace": traces.key(trace), "low": traces.key(low), "rows": traces.size(),
            "designed": traces.reduce(np.add, designed.astype(np.int64))}


def detached_traces(counts: Columns) -> Columns:
    """Merged (``run``, ``trace``, ``low``, ``rows``, ``designed``) counts: the (run, trace) pairs
    that are detached (some root not there by design), sorted by (run, trace): columns ``run``,
    ``trace``, ``low`` (the trace is the pair of trace key and trace low; counts without ``low``
    are of trace keys alone, and read as low 0)."""
    run, trace = np.asarray(counts["run"], np.int64), np.asarray(counts["trace"], np.uint64)
    low = np.asarray(counts["low"], np.uint64) if "low" in counts else np.zeros(len(trace), np.uint64)
    traces = group_by(run, trace, low)
    detached = traces.reduce(np.add, np.asarray(counts["designed"], np.int64)) < traces.reduce(
        np.add, np.asarray(counts["rows"], np.int64))
    return {"run": traces.key(run)[detached], "trace": traces.key(trace)[detached], "low": traces.key(low)[detached]}


# -- failed-step -------------------------------------------------------------------------------

FAILED_SPANS = {"run": np.zeros(0, object), "iteration": np.zeros(0, np.int64), "start": np.zeros(0, np.int64),
                "name": np.zeros(0, object), "span_id": np.zeros(0, object), "trace_id": np.zeros(0, object),
                "message": np.zeros(0, object), "file": np.zeros(0, np.int64), "row": np.zeros(0, np.int64),
                "spans": np.zeros(0, np.int64)}
"""The columns of :func:`failed_partial` and :func:`failed_spans` (``spans``: how many failed the step)."""


def failed_partial(arrays: SpanArrays, keep: np.ndarray, rows: np.ndarray, iteration: np.ndarray,
                   stamped: np.ndarray) -> Columns:
    """The batch's spans that fail a step (:func:`goodput.rules.failing_rows` of its bucketed
    ``rows``, attributed ``iteration`` where ``stamped``), as values a finding quotes: run name,
    iteration, start, name, span and trace id, status message."""
    found, its = failing_rows(arrays, keep, rows, iteration, stamped)
    if len(found) == 0:
        return {k: v.copy() for k, v in FAILED_SPANS.items()}
    lookup = np.array([*arrays.runs, None], dtype=object)
    names = np.array([*arrays.names, None], dtype=object)
    return {"run": lookup[arrays.run[found]], "iteration": its, "start": np.asarray(arrays.start[found], np.int64),
            "name": names[arrays.name[found]], "span_id": np.array(arrays.span_id(found), dtype=object),
            "trace_id": np.array(arrays.trace_id(found), dtype=object),
            "message": np.array(status_messages(arrays.table, found), dtype=object),
            "file": np.zeros(len(found), np.int64), "row": found.astype(np.int64),
            "spans": np.ones(len(found), np.int64)}


def failed_spans(parts: list[Columns]) -> Columns:
    """Partials of :func:`failed_partial` merged (each with its ``file``: position in dataset
    order): per (run, iteration), the first span that failed it (earliest start, then dataset
    order) and in ``spans`` how many did."""
    rows = concat(parts, FAILED_SPANS)
    run, _ = string_codes(rows["run"])
    order = np.lexsort((rows["row"], rows["file"], rows["start"], rows["iteration"], run))
    rows, run = take(rows, order), run[order]
    new = np.ones(len(run), dtype=bool)
    new[1:] = (run[1:] != run[:-1]) | (rows["iteration"][1:] != rows["iteration"][:-1])
    heads = np.flatnonzero(new)
    counts = np.bincount(np.cumsum(new) - 1, weights=rows["spans"], minlength=len(heads)).astype(np.int64)
    return {**take(rows, heads), "spans": counts}
