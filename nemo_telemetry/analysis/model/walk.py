"""The iteration-attribution walk, written once: up the parent links to the nearest stamped span.

A bucketed span's iteration is its own ``rl.iteration``, else its nearest stamped ancestor's
(DESIGN.md, "analysis: semantics"). Two functions hold that rule for every engine:

- :func:`climb` walks from start rows up through a batch's own parent links, one level per
  numpy step over the walks still going, until each met a stamped span (and, when asked, a
  bucketed one), a root, or a parent the batch does not hold; in memory the batch is the table.
- :func:`resolve_walks` continues the walks that left their batch: each round looks the pending
  ancestors up in every batch (the caller's ``lookup``, which climbs there with :func:`climb`)
  until each walk is done. Rounds count the walks' hops between batches, not the tree's depth.

A parent cycle stops after :data:`MAX_DEPTH` levels (in a batch) or when the walk is back at
its start (across batches), instead of looping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import column_rows, filled, valid_rows
from nemo_telemetry.analysis.model.grouping import Columns, concat, first_rows, take
from nemo_telemetry.analysis.model.keys import BLOCK_ROWS, LowBitsFilter, SortedSet
from nemo_telemetry.analysis.model.schema import ITERATION
from nemo_telemetry.analysis.model.tree import (
    SPAN_SPREAD, TRACE_LOW, key_column, mixed_key, parent_indices, with_id_keys,
)

__all__ = ["MAX_DEPTH", "KeyIndex", "Climb", "climb", "climb_batch", "attributed_iterations", "WALK_COLUMNS",
           "resolve_walks", "walk_rows", "KeyScan"]

MAX_DEPTH = 1024


@dataclass(frozen=True, eq=False)
class KeyIndex:
    """(trace, key) pairs mixed into one number and sorted once, for many lookups; ``values``
    holds what each pair stands for (a row, an iteration). The trace is its ``trace_key`` and,
    where given, its ``trace_low`` (0 otherwise); a lookup matches the mixed number and confirms
    the trace, so two pairs that mix to one number are still told apart."""

    key: np.ndarray  # mixed, sorted
    values: np.ndarray
    trace: np.ndarray  # each entry's trace key, in the same order
    low: np.ndarray  # and its trace_low

    @classmethod
    def of(cls, trace: np.ndarray, key: np.ndarray, values: np.ndarray | None = None,
           low: np.ndarray | None = None) -> "KeyIndex":
        mixed = mixed_key(trace, key)
        order = np.argsort(mixed, kind="stable")
        values = np.zeros(len(mixed), np.int64) if values is None else np.asarray(values)
        low = np.zeros(len(mixed), np.uint64) if low is None else np.asarray(low, np.uint64)
        return cls(mixed[order], values[order], np.asarray(trace, np.uint64)[order], low[order])

    def find(self, trace: np.ndarray, key: np.ndarray, low: np.ndarray | None = None) -> np.ndarray:
        """Position of each (trace, key) in the index (the first, if repeated), or -1."""
        if len(self.key) == 0 or len(key) == 0:
            return np.full(len(key), -1, dtype=np.int64)
        trace = np.asarray(trace, np.uint64)
        low = np.zeros(len(key), np.uint64) if low is None else np.asarray(low, np.uint64)
        mixed = mixed_key(trace, key)
        pos = np.searchsorted(self.key, mixed)
        out = np.full(len(key), -1, dtype=np.int64)
        pending = np.arange(len(key))
        while pending.size:  # past entries of the same mixed key and another trace (rare)
            at = pos[pending]
            pending, at = pending[at < len(self.key)], at[at < len(self.key)]
            same = self.key[at] == mixed[pending]
            pending, at = pending[same], at[same]
            hit = (self.trace[at] == trace[pending]) & (self.low[at] == low[pending])
            out[pending[hit]] = at[hit]
            pending = pending[~hit]
            pos[pending] += 1
        return out

    def lookup(self, trace: np.ndarray, key: np.ndarray, missing: int = -1,
               low: np.ndarray | None = None) -> np.ndarray:
        """The value of each (trace, key), or ``missing``."""
        hit = self.find(trace, key, low)
        out = np.full(len(hit), missing, dtype=self.values.dtype if len(self.values) else np.int64)
        out[hit >= 0] = self.values[hit[hit >= 0]]
        return out


@dataclass(frozen=True, eq=False)
class Climb:
    """What each walk met, one entry per start row."""

    stamped: np.ndarray  # bool: a stamped span was met (the start included), or the start was given as stamped
    iteration: np.ndarray  # int64: that span's rl.iteration (0 where none was met, or given as stamped)
    ancestor: np.ndarray  # int64: row of the nearest span ``bucketed`` marks (the start included), else -1
    exit: np.ndarray  # uint64: key of the parent to look up in other batches (unfinished walk), else 0


def climb(start: np.ndarray, parent_of: Callable[[np.ndarray], np.ndarray], has_iteration: np.ndarray,
          iteration: np.ndarray, *, bucketed: np.ndarray | None = None, stamped: np.ndarray | None = None,
          parent_key: np.ndarray | None = None, max_depth: int = MAX_DEPTH) -> Climb:
    """From each row of ``start`` (-1: no walk) up the tree as far as the batch holds it.

    ``parent_of(rows)`` gives each row's parent row in the batch (-1: a root, or a parent the batch
    does not hold); ``has_iteration`` / ``iteration`` are the rows' own ``rl.iteration``. A walk
    stops once it met a stamped span, or with ``bucketed`` (a row mask) once it met both a stamped
    and a bucketed span. ``stamped`` marks starts whose iteration is already known (they look only
    for the bucketed ancestor). ``parent_key`` (uint64 per row, 0 for a root) names, in ``exit``,
    the missing parent where an unfinished walk left the batch.
    """
    start = np.asarray(start, dtype=np.int64)
    n = len(start)
    real = start >= 0
    at = np.where(real, start, 0)
    met = np.zeros(n, bool) if stamped is None else np.asarray(stamped, bool).copy()
    own = real & ~met & has_iteration[at]
    value = np.where(own, iteration[at], 0).astype(np.int64)
    met |= own
    ancestor = np.full(n, -1, np.int64)
    if bucketed is not None:
        ancestor[real & bucketed[at]] = start[real & bucketed[at]]

    def going(walks: np.ndarray) -> np.ndarray:
        return ~met[walks] | (ancestor[walks] < 0) if bucketed is not None else ~met[walks]

    active = np.flatnonzero(real)
    active = active[going(active)]
    exit_key = np.zeros(n, np.uint64)
    for _ in range(max_depth):
        if active.size == 0:
            break
        parent = parent_of(at[active])
        if parent_key is not None:
            left = parent < 0
            exit_key[active[left]] = parent_key[at[active[left]]]
        moved, row = active[parent >= 0], parent[parent >= 0]
        at[moved] = row
        take = ~met[moved] & has_iteration[row]
        value[moved[take]], met[moved[take]] = iteration[row[take]], True
        if bucketed is not None:
            take = (ancestor[moved] < 0) & bucketed[row]
            ancestor[moved[take]] = row[take]
        active = moved[going(moved)]
    return Climb(met, value, ancestor, exit_key)


def climb_batch(batch: pa.Table, rows: np.ndarray, *, bucketed: np.ndarray | None = None) -> Climb:
    """:func:`climb` from ``rows`` of a batch with ``trace_key`` / ``span_key`` / ``parent_key``
    (and ``rl.iteration``) columns: parents are found by key in the batch, a span that names
    itself as parent is a root."""
    trace, span, parent = key_column(batch, "trace_key"), key_column(batch, "span_key"), key_column(batch, "parent_key")
    low = key_column(batch, TRACE_LOW) if TRACE_LOW in batch.column_names else None
    parent = np.where(parent == span, np.uint64(0), parent)
    if ITERATION in batch.column_names:
        has = valid_rows(batch.column(ITERATION))
        values = pc.fill_null(batch.column(ITERATION), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        has, values = np.zeros(len(span), bool), np.zeros(len(span), np.int64)
    index = KeyIndex.of(trace, span, np.arange(len(span)), low) if len(rows) else KeyIndex.of(trace[:0], span[:0])

    def parent_of(at: np.ndarray) -> np.ndarray:
        return np.where(parent[at] != 0, index.lookup(trace[at], parent[at], low=None if low is None else low[at]), -1)

    return climb(rows, parent_of, has, values, bucketed=bucketed, parent_key=parent)


def attributed_iterations(spans: pa.Table, parents: np.ndarray | None = None) -> pa.Array:
    """Each span's own ``rl.iteration``, else its nearest stamped ancestor's, else null."""
    if parents is None:
        parents = parent_indices(spans)
    own = spans.column(ITERATION).combine_chunks() if spans.num_rows else pa.array([], pa.int64())
    valid = valid_rows(own)
    values = pc.fill_null(own, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    walked = climb(np.arange(len(parents)), parents.__getitem__, valid, values)
    return pa.array(walked.iteration, pa.int64(), mask=~walked.stamped)


# A walk's state between rounds, and what ``lookup`` returns per ancestor found (``at`` its key,
# ``parent`` the key of the next ancestor to look up, 0 when the walk ended in that batch).
WALK_COLUMNS = ("trace", "start", "at", "stamped", "iteration", "low")
_FOUND_COLUMNS = ("trace", "at", "parent", "stamped", "iteration", "low")


def resolve_walks(walks: Columns, lookup: Callable[[Columns], Columns], *,
                  ancestors: bool = False, max_depth: int = MAX_DEPTH) -> Columns:
    """Every walk of ``walks`` to its end, across batches; the walks with what they met.

    ``walks`` has :data:`WALK_COLUMNS` (uint64 ``trace`` and ``low``: the walk's trace key and
    trace_low, ``low`` zeros where not given; ``start``: the walk's key, ``at``: the
    ancestor to look up next, 0 when the walk already ended; ``stamped``, ``iteration``: what it
    met so far), and with ``ancestors`` an ``ancestor`` column (object: the nearest bucketed
    ancestor met, None when none). ``lookup(wanted)`` gets the distinct (``trace``, ``low``,
    ``at``) keys to look up and returns, per key found in the data (one row per key: the caller
    picks among copies), the climb from that ancestor: ``trace``, ``low``, ``at``, ``parent`` (the
    next key, 0: the walk ended), ``stamped``, ``iteration`` and with ``ancestors`` ``ancestor``. A walk is done
    once it met a stamped span (and with ``ancestors`` a bucketed one), a root, a key found
    nowhere, or its own start again (a cycle). Returns ``walks`` without ``at``, one row per walk.
    """
    types = {"trace": np.uint64, "start": np.uint64, "at": np.uint64, "stamped": bool, "iteration": np.int64,
             "low": np.uint64, **({"ancestor": object} if ancestors else {})}
    if "low" not in walks:
        walks = {**walks, "low": np.zeros(len(walks["trace"]), np.uint64)}
    pending = {c: np.array(walks[c], dtype=t) for c, t in types.items()}
    going = _going(pending, ancestors)
    done = [take(pending, ~going)]
    pending = take(pending, going)
    for _ in range(max_depth):
        if len(pending["trace"]) == 0:
            break
        distinct = first_rows(pending["trace"], pending["low"], pending["at"])
        found = lookup({"trace": pending["trace"][distinct], "low": pending["low"][distinct],
                        "at": pending["at"][distinct]})
        found_trace, found_at = np.asarray(found["trace"], np.uint64), np.asarray(found["at"], np.uint64)
        found_low = np.asarray(found["low"], np.uint64) if "low" in found else np.zeros(len(found_at), np.uint64)
        index = KeyIndex.of(found_trace, found_at, np.arange(len(found_at)), found_low)
        row = index.lookup(pending["trace"], pending["at"], low=pending["low"])
        present, row = row >= 0, np.maximum(row, 0)
        step = {c: v.copy() for c, v in pending.items()}
        if len(found_at):
            met = present & ~step["stamped"] & np.asarray(found["stamped"], bool)[row]
            step["iteration"][met] = np.asarray(found["iteration"], np.int64)[row][met]
            step["stamped"][met] = True
            if ancestors:
                ancestor = np.asarray(found["ancestor"], object)[row]
                met = present & _none(step["ancestor"]) & ~_none(ancestor)
                step["ancestor"][met] = ancestor[met]
            parent = np.where(present, np.asarray(found["parent"], np.uint64)[row], np.uint64(0))
        else:
            parent = np.zeros(len(row), np.uint64)
        step["at"] = np.where((parent == step["at"]) | (parent == step["start"]), np.uint64(0), parent)
        going = _going(step, ancestors)
        done.append(take(step, ~going))
        pending = take(step, going)
    done.append(pending)  # past max_depth: what they met so far
    out = concat(done, {c: np.zeros(0, t) for c, t in types.items()})
    del out["at"]
    return out


def _none(values: np.ndarray) -> np.ndarray:
    """Mask of the entries of an object array that are None."""
    return np.fromiter((v is None for v in values), bool, len(values))


def _going(walks: Columns, ancestors: bool) -> np.ndarray:
    unfinished = ~walks["stamped"]
    if ancestors:
        unfinished |= _none(walks["ancestor"])
    return unfinished & (walks["at"] != 0)


# -- a walk over a whole table of which only a few rows climb (goodput by step) ---------------


def walk_rows(table: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(attributed iteration, whether one was found) of ``rows``, as ``span_arrays(table).walk_up(rows)``
    gives them, for a table of which only these few rows climb (goodput's unstamped bucketed spans).

    No sorted index of every span: each level of the climb finds the parents it asks for by one
    pass over the spans' mixed keys (:class:`KeyScan`), and reads ``rl.iteration`` only at the
    rows it visits: a few passes instead of sorting every span's key into an index.
    """
    table = with_id_keys(table)
    rows = np.asarray(rows, dtype=np.int64)
    if ITERATION in table.column_names:
        has_iteration = valid_rows(table.column(ITERATION))
        iteration = _RowsOf(table.column(ITERATION))
    else:
        has_iteration, iteration = np.zeros(table.num_rows, dtype=bool), np.zeros(table.num_rows, dtype=np.int64)
    own = has_iteration[rows]
    need = np.flatnonzero(~own)
    scan = KeyScan(table)
    walked = climb(scan.parent_of(rows[need]), scan.parent_of, has_iteration, iteration, stamped=own[need])
    out, found = iteration[rows], own.copy()  # nulls read as 0, as walk_up has them
    take = walked.stamped & ~own[need]
    out[need[take]], found[need[take]] = walked.iteration[take], True
    return out, found


class _RowsOf:
    """An int64 column read at the rows indexed (nulls as 0), for a walk that visits a few of them."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        self.column = column

    def __getitem__(self, rows) -> np.ndarray:
        return column_rows(self.column, np.asarray(rows, dtype=np.int64), 0).astype(np.int64, copy=False)


class KeyScan:
    """Parent rows as :meth:`SpanArrays.parent_of` finds them (the lowest other row whose trace
    and span id are the reference's), by one pass over the span keys per lookup: each block's
    spread span ids are tested against the references' (:class:`SortedSet`), and only the spans
    that pass are mixed with their trace, searched by that number and confirmed on the trace."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.by_id = "parent_span_id" in table.column_names  # as _has_parent: the id when read, else the key
        self.named = valid_rows(table.column("parent_span_id")) if self.by_id else None
        self.has_low = TRACE_LOW in table.column_names

    def parent_of(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full(len(rows), -1, dtype=np.int64)
        trace, parent = (column_rows(self.table.column(c), rows, 0).astype(np.uint64, copy=False)
                         for c in ("trace_key", "parent_key"))
        low = (column_rows(self.table.column(TRACE_LOW), rows, 0).astype(np.uint64, copy=False) if self.has_low
               else np.zeros(len(rows), np.uint64))
        ask = np.flatnonzero(self.named[rows] if self.by_id else parent != 0)
        if ask.size == 0:
            return out
        wanted, trace, low = mixed_key(trace[ask], parent[ask]), trace[ask], low[ask]
        fresh = np.concatenate(([True], (wanted[1:] != wanted[:-1]) | (trace[1:] != trace[:-1]) | (low[1:] != low[:-1])))
        run = np.cumsum(fresh) - 1
        found = self.lookup(wanted[fresh], parent[ask][fresh], trace[fresh], low[fresh])
        out[ask], _ = self.pick(found, run, rows[ask])
        return out

    def lookup(self, wanted: np.ndarray, parent: np.ndarray, trace: np.ndarray,
               low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each parent reference (``wanted``: mixed keys; ``parent``: the parent keys;
        ``trace`` and ``low``: its trace), the lowest row that holds it and the next one (-1:
        none), for :meth:`pick`. A caller passes a run of equal references (siblings stored
        together) once."""
        held, keys, traces, lows = self._rows_with(parent)
        order = np.argsort(keys, kind="stable")  # by mixed key, then row
        keys, held, traces, lows = keys[order], held[order], traces[order], lows[order]
        pos = np.searchsorted(keys, wanted)
        first, second = np.full(len(wanted), -1, np.int64), np.full(len(wanted), -1, np.int64)
        pending = np.arange(len(wanted))
        while pending.size:  # along the rows of the reference's mixed key: usually one, or a few copies
            at = pos[pending]
            pending, at = pending[at < len(keys)], at[at < len(keys)]
            same = keys[at] == wanted[pending]
            pending, at = pending[same], at[same]
            hit = (traces[at] == trace[pending]) & (lows[at] == low[pending])
            into_first = hit & (first[pending] < 0)
            first[pending[into_first]] = held[at[into_first]]
            into_second = hit & ~into_first
            second[pending[into_second]] = held[at[into_second]]
            pending = pending[second[pending] < 0]
            pos[pending] += 1
        return first, second

    @staticmethod
    def pick(found: tuple[np.ndarray, np.ndarray], run: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The parent row of each of ``rows`` (-1: not in the table), whose reference is ``run``
        among those :meth:`lookup` ``found``, and whether any row holds it (a span that names
        itself holds its own: not an orphan, but no parent)."""
        first, second = found
        parent = first[run]
        held = parent >= 0
        itself = parent == rows
        parent[itself] = second[run[itself]]
        return parent, held

    def _rows_with(self, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, their mixed keys, trace keys and trace_low) of the spans whose span id is one of
        ``parent`` (the references' parent keys).

        A block of rows at a time small enough that its temporaries are reused from one block to
        the next instead of faulted in afresh. Each block's span ids first pass a filter on their
        low bits (:class:`LowBitsFilter`: a few in a hundred do), and only those are spread and
        tested exactly (:class:`SortedSet`)."""
        with np.errstate(over="ignore"):
            members = SortedSet(np.unique(np.asarray(parent, dtype=np.uint64) * SPAN_SPREAD))
        first = LowBitsFilter(parent)
        low_block, flag_block = np.empty(BLOCK_ROWS, np.uint64), np.empty(BLOCK_ROWS, bool)
        rows, keys, traces, lows = [], [], [], []
        at = 0
        columns = ["span_key", "trace_key", *([TRACE_LOW] if self.has_low else [])]
        for batch in self.table.select(columns).to_batches(max_chunksize=BLOCK_ROWS):
            n = batch.num_rows
            span = filled(batch.column(0), 0).astype(np.uint64, copy=False)
            passing = first.passing(span, low=low_block[:n], flags=flag_block[:n])
            if passing.size:
                with np.errstate(over="ignore"):
                    spread = span[passing] * SPAN_SPREAD
                hit = passing[members.contains(spread, out=np.empty(passing.size, bool))]
            else:
                hit = passing
            if hit.size:
                trace = filled(batch.column(1), 0).astype(np.uint64, copy=False)[hit]
                rows.append(hit + at)
                keys.append(mixed_key(trace, span[hit]))
                traces.append(trace)
                lows.append(filled(batch.column(2), 0).astype(np.uint64, copy=False)[hit] if self.has_low
                            else np.zeros(len(hit), np.uint64))
            at += n
        if not rows:
            return (np.zeros(0, np.int64), *(np.zeros(0, np.uint64) for _ in range(3)))
        return np.concatenate(rows), np.concatenate(keys), np.concatenate(traces), np.concatenate(lows)
