"""Waterfalls: span trees laid out as display rows, and the critical path of a step.

A waterfall is what people open when goodput looks wrong, so it shows the trace as it is:

- trees by trace, children ordered by start time; traces of one run (a re-rooted actor starts
  its own) are listed together, runs ordered by their first span;
- a span whose parent is missing is kept as a top-level row and marked ``is_orphan``;
- a child may end after its parent (``rl.checkpoint.finalize``): nothing is clipped;
- more than ``collapse_threshold`` siblings of one name (per-prompt spans) collapse into one
  row with count, total, p50 and p99; their children are merged under that row and collapse
  the same way; step spans never collapse (the default view is one line per step);
- the *critical path* of a step is the chain that determined its end: from the step span,
  repeatedly the child that ends last (a child that ends after its parent did not determine
  the parent's end and is skipped).

Everything is computed with numpy over whole columns, one pass per tree level; the result is
an Arrow table of display rows in tree order, so the CLI, the HTML view and notebooks read the
same thing.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.settings.choices import DEFAULT_COLLAPSE_THRESHOLD
from nemo_telemetry.analysis.model.remote import parent_is_remote
from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION
from nemo_telemetry.analysis.model.tree import parent_indices
from nemo_telemetry.analysis.model.walk import attributed_iterations
from nemo_telemetry.errors import WaterfallError

__all__ = [
    "Waterfall",
    "WaterfallError",
    "waterfall",
    "critical_path",
    "step_span_mask",
    "STEP_NAME_PATTERN",
    "DEFAULT_COLLAPSE_THRESHOLD",
    "TAG_ATTRIBUTES",
    "MIN_TRACE_DIGITS",
    "trace_digits",
]

STEP_NAME_PATTERN = r"^rl\.[^.]+\.step$"
# Span attributes worth a glance on a waterfall line (besides the iteration and the category).
TAG_ATTRIBUTES = ("rl.weight_version", "rl.target_weight_version", "rl.idle.polls")
# A trace id is shown by its first hex digits: at least these, more where the view's traces share them
# (64-bit Jaeger or Zipkin ids padded to 128 bits all begin with sixteen zeros).
MIN_TRACE_DIGITS = 8


@dataclasses.dataclass(frozen=True)
class Waterfall:
    """Display rows of one waterfall, in tree order, and the time window they cover.

    ``rows`` columns: ``depth``, ``parent`` (position of the parent row, -1 at top level),
    ``span_row`` (row in the input table of the span the line stands for; for a collapsed line,
    one of its members), ids, ``name``,
    ``run_id``, ``service_name``, ``rank``, ``start_ns`` / ``end_ns`` (for a collapsed row the
    earliest start and the latest end of its members), ``duration_ns`` (end - start),
    ``bucket``, ``iteration``, ``tags``, ``is_orphan``, ``is_step``, ``is_error``, ``count``
    (members: 1 unless collapsed), ``total_ns`` / ``p50_ns`` / ``p99_ns`` (member durations),
    ``hidden`` (spans inside this row that have no row of their own: folded step, depth or
    duration limit, children of collapsed members that were merged), ``on_critical_path``,
    ``parent_is_remote`` (an orphan whose missing parent is a caller's span in another process,
    outside the data, not a lost one: :func:`~nemo_telemetry.analysis.model.remote.parent_is_remote`), ``heading`` (on a top-level
    row, the group it is listed under: ``run <id>``, or for spans
    without ``nemo.run.id`` ``service <name> · trace <id prefix>``; null below the top level).

    ``trace_digits``: how many leading hex digits of a trace id tell the view's traces apart
    (:func:`trace_digits`); headings show that many, and so should anything that prints a trace of it.
    """

    rows: pa.Table
    window_start_ns: int
    window_end_ns: int
    total_spans: int
    step: int | None = None
    trace_digits: int = MIN_TRACE_DIGITS

    @property
    def window_ns(self) -> int:
        return max(self.window_end_ns - self.window_start_ns, 0)


def step_span_mask(spans: pa.Table) -> np.ndarray:
    """Step spans: name matches ``^rl\\.[^.]+\\.step$`` and ``rl.iteration`` is set."""
    codes, names = _codes(spans.column("name"))
    name_hit = pc.match_substring_regex(names, STEP_NAME_PATTERN).to_numpy(zero_copy_only=False)
    hit = np.zeros(len(codes), dtype=bool)
    known = codes >= 0
    hit[known] = name_hit[codes[known]]
    return hit & _valid(spans.column(ITERATION))


def waterfall(
    spans: pa.Table,
    *,
    trace_id: str | None = None,
    step: int | None = None,
    run_id: str | None = None,
    depth: int | None = None,
    min_duration_ns: int = 0,
    collapse_threshold: int | None = DEFAULT_COLLAPSE_THRESHOLD,
    fold_steps: bool | None = None,
) -> Waterfall:
    """Lay ``spans`` out as a waterfall.

    With ``step``: the trees of that iteration (its step spans and every other tree whose
    top span carries that ``rl.iteration``). Without: every tree of the selection, each step
    span folded into one line (``fold_steps=False`` unfolds them). ``depth`` is the deepest
    level shown (top-level rows are depth 0); rows shorter than ``min_duration_ns`` are left
    out with what is under them; ``collapse_threshold=None`` never collapses.
    """
    if depth is not None and depth < 0:
        raise WaterfallError(f"depth must be 0 or more, got {depth}")
    table, input_rows = _select(spans, run_id=run_id, trace_id=trace_id)
    parents, levels = _tree(table)
    is_step = step_span_mask(table)
    critical = _critical_marks(table, parents, is_step)
    orphan = _valid(table.column("parent_span_id")) & (parents < 0)
    remote = np.zeros(len(orphan), dtype=bool)
    remote[orphan] = parent_is_remote(table, np.flatnonzero(orphan))
    if step is not None:
        keep = _iteration_trees(table, parents, levels, step)
        table, input_rows, parents, levels, (critical, is_step, orphan, remote) = _subset(
            keep, table, input_rows, parents, (critical, is_step, orphan, remote)
        )
    if fold_steps is None:
        fold_steps = step is None
    layout = _Layout(
        table, parents, levels, is_step=is_step,
        expandable=~is_step if fold_steps else np.ones(len(parents), bool),
        max_depth=depth, min_duration_ns=min_duration_ns, threshold=collapse_threshold,
    )
    rows = layout.rows(input_rows=input_rows, orphan=orphan, critical=critical, is_step=is_step, remote=remote)
    if rows.num_rows:
        window = (pc.min(rows.column("start_ns")).as_py(), pc.max(rows.column("end_ns")).as_py())
    else:
        window = (0, 0)
    digits = trace_digits(rows.column("trace_id"))
    rows = rows.append_column("heading", _headings(rows, digits))
    return Waterfall(rows, window[0], window[1], total_spans=table.num_rows, step=step, trace_digits=digits)


def trace_digits(trace_ids, *, minimum: int = MIN_TRACE_DIGITS) -> int:
    """The fewest leading hex digits (at least ``minimum``) in which the distinct ``trace_ids``
    all differ: one more than the longest prefix two of them share (all digits where ids repeat
    only up to case or length)."""
    ids = pc.unique(pc.utf8_lower(pc.unique(trace_ids).cast(pa.string()))).drop_null()  # a few per trace first
    if len(ids) < 2:
        return minimum
    ids = ids.sort() if hasattr(ids, "sort") else ids.take(pc.sort_indices(ids))
    width = max(pc.max(pc.utf8_length(ids)).as_py(), 1)
    padded = pc.utf8_rpad(ids, width, " ").to_numpy(zero_copy_only=False).astype(f"S{width}")
    chars = padded.view(np.uint8).reshape(len(padded), width)
    differs = chars[1:] != chars[:-1]
    shared = np.where(differs.any(axis=1), differs.argmax(axis=1), width)
    return int(min(max(minimum, int(shared.max()) + 1), width))


def _headings(rows: pa.Table, digits: int) -> pa.Array:
    """Each top-level row's group: its run, or its service and trace where it has no run id."""
    top = np.flatnonzero(rows.column("depth").to_numpy(zero_copy_only=False) == 0)
    heads = rows.take(pa.array(top, pa.int64()))
    run = heads.column("run_id").cast(pa.string())
    service = pc.fill_null(heads.column("service_name").cast(pa.string()), "?")
    trace = pc.utf8_slice_codeunits(pc.fill_null(heads.column("trace_id").cast(pa.string()), "?"), 0, digits)
    by_run = pc.binary_join_element_wise("run ", run, "")
    by_trace = pc.binary_join_element_wise("service ", service, " · trace ", trace, "")
    heading = pc.if_else(pc.is_valid(run), by_run, by_trace)
    at = np.full(rows.num_rows, len(top), np.int64)  # below the top level: the null after the headings
    at[top] = np.arange(len(top))
    return pa.concat_arrays([heading.combine_chunks() if isinstance(heading, pa.ChunkedArray) else heading,
                             pa.nulls(1, pa.string())]).take(pa.array(at))


def critical_path(spans: pa.Table, *, step: int, run_id: str | None = None) -> pa.Table:
    """The chain of spans that determined the end of step ``step``, from the step span down.

    Columns: ``depth`` (0 = step span), ``span_row`` (row in ``spans``), ``trace_id``,
    ``span_id``, ``name``, ``service_name``, ``rank``, ``start_ns``, ``end_ns``,
    ``duration_ns``. When the iteration has several step spans, the one that ends last starts
    the chain.
    """
    table, input_rows = _select(spans, run_id=run_id, trace_id=None)
    steps = np.nonzero(step_span_mask(table) & (_int_values(table.column(ITERATION)) == step))[0]
    if steps.size == 0:
        raise WaterfallError(f"no step span carries rl.iteration={step}{_runs_hint(table, run_id)}")
    runs = pc.unique(table.column("run_id").take(pa.array(steps))).to_pylist()
    if len(runs) > 1:
        raise WaterfallError(f"step {step} exists in runs {sorted(map(str, runs))}: pass run_id to choose one")
    parents, _ = _tree(table)
    first = steps[np.argmax(_ints(table, "end_ns")[steps])]
    chain = _walk_last_children(np.array([first]), _last_ending_children(table, parents))
    taken = table.take(pa.array(chain, pa.int64()))
    return pa.table({
        "depth": pa.array(np.arange(len(chain), dtype=np.int32)),
        "span_row": pa.array(input_rows[chain]),
        **{c: taken.column(c) for c in ("trace_id", "span_id", "name", "service_name", "rank",
                                         "start_ns", "end_ns", "duration_ns")},
    })


# -- selection -----------------------------------------------------------------------------


def _select(spans: pa.Table, *, run_id: str | None, trace_id: str | None) -> tuple[pa.Table, np.ndarray]:
    """Rows of the run and trace asked for, and their row numbers in ``spans``."""
    mask = np.ones(spans.num_rows, dtype=bool)
    if run_id is not None:
        mask &= _equals(spans.column("run_id"), run_id)
        if not mask.any():
            raise WaterfallError(f"no spans of run {run_id!r}{_runs_hint(spans, None)}")
    if trace_id is not None:
        prefix = trace_id.strip().lower()
        hit = pc.starts_with(spans.column("trace_id"), prefix).to_numpy(zero_copy_only=False)
        mask &= np.asarray(hit, dtype=bool)
        found = pc.unique(spans.filter(pa.array(mask)).column("trace_id")).to_pylist()
        if not found:
            raise WaterfallError(f"no spans of trace {trace_id!r}: the trace id is the 32 hex digits "
                                 "in the spans table's trace_id column (a unique prefix is enough)")
        if len(found) > 1:
            raise WaterfallError(f"trace prefix {trace_id!r} matches {len(found)} traces: give more digits")
    if mask.all():
        return spans, np.arange(spans.num_rows, dtype=np.int64)
    return spans.filter(pa.array(mask)), np.nonzero(mask)[0].astype(np.int64)


def _runs_hint(table: pa.Table, run_id: str | None) -> str:
    runs = sorted(str(r) for r in pc.unique(table.column("run_id")).to_pylist())
    where = f" in run {run_id!r}" if run_id else ""
    return f"{where}; runs present: {', '.join(runs[:10]) or 'none'}"


def _iteration_trees(table: pa.Table, parents: np.ndarray, levels: "_Levels", step: int) -> np.ndarray:
    """Spans of the trees of iteration ``step``: a span stamped ``step`` whose parent is not
    attributed to ``step`` tops a tree; everything below it comes along (a late child too)."""
    own = _int_values(table.column(ITERATION))
    attributed = _int_values(attributed_iterations(table, parents))
    has_parent = parents >= 0
    parent_attr = np.where(has_parent, attributed[np.maximum(parents, 0)], np.iinfo(np.int64).min)
    top = (own == step) & (parent_attr != step)
    if not top.any():
        present = np.unique(own[(own != _NULL_INT) & step_span_mask(table)])
        shown = ", ".join(map(str, present[:20])) + (" ..." if present.size > 20 else "")
        raise WaterfallError(f"no span carries rl.iteration={step}; step iterations present: {shown or 'none'}")
    keep = top.copy()
    for nodes in levels.each(start=1):
        keep[nodes] |= keep[parents[nodes]]
    return keep


def _subset(keep, table, input_rows, parents, flags):
    """Restrict every per-span array to ``keep``; a parent left out makes a top-level row
    (flags such as ``is_orphan`` were computed on the whole selection, so such a row is not
    an orphan: its parent exists, outside the step's trees)."""
    new_index = np.cumsum(keep) - 1
    kept = np.nonzero(keep)[0]
    old_parents = parents[kept]
    inside = (old_parents >= 0) & keep[np.maximum(old_parents, 0)]
    new_parents = np.where(inside, new_index[np.maximum(old_parents, 0)], -1)
    sub = table.take(pa.array(kept))
    return sub, input_rows[kept], new_parents, _Levels(_depths(new_parents)[0]), tuple(f[kept] for f in flags)


# -- tree ---------------------------------------------------------------------------------


_NULL_INT = np.iinfo(np.int64).min


class _Levels:
    """Span indices grouped by depth, for passes that go one tree level at a time."""

    def __init__(self, depth: np.ndarray):
        self.depth = depth
        self.order = np.argsort(depth, kind="stable")
        top = int(depth.max()) + 1 if depth.size else 0
        self.bounds = np.searchsorted(depth[self.order], np.arange(top + 1))

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    def each(self, *, start: int = 0, reverse: bool = False):
        levels = range(start, self.count)
        for d in reversed(levels) if reverse else levels:
            yield self.order[self.bounds[d] : self.bounds[d + 1]]


def _tree(table: pa.Table) -> tuple[np.ndarray, _Levels]:
    """Parent row of each span and depths; spans caught in a parent cycle become top-level."""
    parents = parent_indices(table)
    depth, looped = _depths(parents)
    if looped.any():
        parents = np.where(looped, -1, parents)
        depth, _ = _depths(parents)
    return parents, _Levels(depth)


def _depths(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distance to the top of each span's tree by pointer jumping; the second array marks
    spans that never reach a top (a parent cycle in malformed input)."""
    depth = (parents >= 0).astype(np.int64)
    up = parents.copy()
    for _ in range(max(int(np.log2(max(len(parents), 1))) + 2, 2)):
        live = np.nonzero(up >= 0)[0]
        if live.size == 0:
            break
        target = up[live]
        depth[live] = depth[live] + depth[target]
        up[live] = up[target]
    return depth, up >= 0


def _last_ending_children(table: pa.Table, parents: np.ndarray) -> np.ndarray:
    """For each span, its child that ends last among those ending no later than it; -1 if none
    (on a tie, the later row)."""
    end = _ints(table, "end_ns")
    has_parent = parents >= 0
    children = np.nonzero(has_parent & (end <= end[np.maximum(parents, 0)]))[0]
    result = np.full(len(parents), -1, dtype=np.int64)
    if children.size:
        of = parents[children]
        latest = np.full(len(parents), np.iinfo(np.int64).min)
        np.maximum.at(latest, of, end[children])
        last = children[end[children] == latest[of]]
        np.maximum.at(result, parents[last], last)
    return result


def _walk_last_children(first: np.ndarray, last_child: np.ndarray) -> np.ndarray:
    """Follow last-ending children down from ``first``; every span visited, in walk order."""
    visited = [first]
    frontier = first
    for _ in range(len(last_child)):
        frontier = last_child[frontier]
        frontier = frontier[frontier >= 0]
        if frontier.size == 0:
            break
        visited.append(frontier)
    return np.concatenate(visited)


def _critical_marks(table: pa.Table, parents: np.ndarray, is_step: np.ndarray) -> np.ndarray:
    """Spans on the critical path of any step (per run and iteration, the last-ending step span)."""
    marks = np.zeros(table.num_rows, dtype=bool)
    steps = np.nonzero(is_step)[0]
    if steps.size == 0:
        return marks
    run_codes, _ = _codes(table.column("run_id"))
    iteration = _int_values(table.column(ITERATION))
    end = _ints(table, "end_ns")
    order = steps[np.lexsort((end[steps], iteration[steps], run_codes[steps]))]
    key = np.stack([run_codes[order], iteration[order]])
    last = np.r_[np.any(key[:, 1:] != key[:, :-1], axis=0), True]
    marks[_walk_last_children(order[last], _last_ending_children(table, parents))] = True
    return marks


# -- layout -------------------------------------------------------------------------------


class _Layout:
    """One top-down pass over the levels decides which span carries which display row."""

    def __init__(self, table, parents, levels, *, is_step, expandable, max_depth, min_duration_ns, threshold):
        self.table = table
        self.parents = parents
        self.levels = levels
        self.is_step = is_step  # steps never collapse: one line each
        n = len(parents)
        self.start = _ints(table, "start_ns")
        self.end = _ints(table, "end_ns")
        self.duration = self.end - self.start
        self.name_codes, name_dictionary = _codes(table.column("name"))
        self.names = len(name_dictionary) + 1  # codes are -1 (null) .. len - 1: shift by one
        self.name_codes = self.name_codes + 1
        self.run_order = self._run_order()
        self.runs = int(self.run_order.max()) + 1 if n else 0
        self.carrier = np.full(n, -1, dtype=np.int64)  # display row (its span) holding each span
        self.member_of = np.full(n, -1, dtype=np.int64)  # display row each span is a member of
        self.display_parent = np.full(n, -1, dtype=np.int64)
        self.expand = np.zeros(n, dtype=bool)  # per display row: are its members' children placed
        self.opens = np.zeros(n, dtype=bool)  # per span: may its children get rows of their own
        threshold = math.inf if threshold is None else threshold
        for depth_level, nodes in enumerate(levels.each()):
            self._place(nodes, depth_level, expandable, max_depth, min_duration_ns, threshold)

    def _run_order(self) -> np.ndarray:
        """Rank of each span's run by the run's first start: split traces of a run stay together."""
        codes, dictionary = _codes(self.table.column("run_id"))
        codes = np.where(codes < 0, len(dictionary), codes)
        first = np.full(len(dictionary) + 1, np.iinfo(np.int64).max)
        np.minimum.at(first, codes, self.start)
        return np.argsort(np.argsort(first, kind="stable"), kind="stable")[codes]

    def _place(self, nodes, depth_level, expandable, max_depth, min_duration_ns, threshold):
        if depth_level == 0:
            holder = np.full(len(nodes), -1, dtype=np.int64)
            candidate = np.ones(len(nodes), dtype=bool)
            group_parent = -1 - self.run_order[nodes]
        else:
            holder = self.carrier[self.parents[nodes]]
            candidate = self.opens[self.parents[nodes]]
            group_parent = holder
        self.carrier[nodes[~candidate]] = holder[~candidate]
        nodes, holder, group_parent = nodes[candidate], holder[candidate], group_parent[candidate]
        if nodes.size == 0:
            return
        # Siblings of one name are one group; its first member (by row) stands for it.
        key = (group_parent + self.runs + 1) * self.names + self.name_codes[nodes]
        order = np.argsort(key, kind="stable")
        nodes, holder, key = nodes[order], holder[order], key[order]
        first = np.r_[True, key[1:] != key[:-1]]
        group = np.cumsum(first) - 1
        heads = np.nonzero(first)[0]
        size = np.diff(np.r_[heads, len(nodes)])
        collapsed = (size[group] > threshold) & ~self.is_step[nodes]
        row = np.where(collapsed, nodes[heads][group], nodes)
        longest = np.maximum.reduceat(self.duration[nodes], heads)
        row_longest = np.where(collapsed, longest[group], self.duration[nodes])
        # Without a limit everything shows, a span that ends before it starts included.
        visible = row_longest >= min_duration_ns if min_duration_ns > 0 else np.ones(len(nodes), dtype=bool)
        self.carrier[nodes] = np.where(visible, row, holder)
        self.member_of[nodes[visible]] = row[visible]
        new_rows = nodes[visible & (row == nodes)]
        self.display_parent[row[visible]] = holder[visible]
        deeper = max_depth is None or depth_level < max_depth
        self.expand[new_rows] = expandable[new_rows] & deeper
        self.opens[nodes] = visible & self.expand[row]

    def rows(self, *, input_rows, orphan, critical, is_step, remote) -> pa.Table:
        """The display rows in tree order, with their aggregates."""
        n = len(self.parents)
        display = np.nonzero(self.carrier == np.arange(n))[0]
        members = np.nonzero(self.member_of >= 0)[0]
        owner = self.member_of[members]
        first_start = self.start.copy()
        np.minimum.at(first_start, owner, self.start[members])
        order = display[_preorder(display, self.display_parent, first_start, self.run_order, self.levels.depth)]
        count = np.bincount(owner, minlength=n)
        total = np.bincount(owner, weights=self.duration[members], minlength=n)
        carried = np.bincount(self.carrier[self.carrier >= 0], minlength=n)
        last_end = self.end.copy()
        np.maximum.at(last_end, owner, self.end[members])
        p50, p99 = _percentiles(owner, self.duration[members], display, n, (0.5, 0.99))
        any_of = lambda flag: np.bincount(owner[flag[members]], minlength=n) > 0  # noqa: E731
        position = np.full(n, -1, dtype=np.int64)
        position[order] = np.arange(len(order))
        parent_pos = np.where(self.display_parent[order] >= 0, position[np.maximum(self.display_parent[order], 0)], -1)
        status_error = _equals(self.table.column("status_code"), "error")
        t = self.table.take(pa.array(order, pa.int64()))
        start = first_start[order]
        end = last_end[order]
        return pa.table({
            "depth": pa.array(self.levels.depth[order].astype(np.int32)),
            "parent": pa.array(parent_pos),
            "span_row": pa.array(input_rows[order]),
            "trace_id": t.column("trace_id"),
            "span_id": t.column("span_id"),
            "parent_span_id": t.column("parent_span_id"),
            "name": _decoded(t.column("name")),
            "run_id": _decoded(t.column("run_id")),
            "service_name": _decoded(t.column("service_name")),
            "rank": t.column("rank"),
            "start_ns": pa.array(start),
            "end_ns": pa.array(end),
            "duration_ns": pa.array(end - start),
            "bucket": _decoded(t.column(BUCKET)),
            "iteration": t.column(ITERATION),
            "tags": _tags(t),
            "is_orphan": pa.array(any_of(orphan)[order]),
            "is_step": pa.array(is_step[order]),
            "is_error": pa.array(any_of(status_error)[order]),
            "count": pa.array(count[order]),
            "total_ns": pa.array(total[order].astype(np.int64)),
            "p50_ns": pa.array(p50[order]),
            "p99_ns": pa.array(p99[order]),
            "hidden": pa.array(carried[order] - count[order]),
            "on_critical_path": pa.array(any_of(critical)[order]),
            "parent_is_remote": pa.array(any_of(remote)[order]),
        })


def _preorder(rows: np.ndarray, parent_span: np.ndarray, start: np.ndarray, run_order: np.ndarray,
              depth: np.ndarray) -> np.ndarray:
    """Permutation of ``rows`` into depth-first order, siblings by start time (top level: by run,
    then start), computed from subtree sizes one level at a time."""
    m = len(rows)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    local = np.full(len(parent_span), -1, dtype=np.int64)
    local[rows] = np.arange(m)
    parent = np.where(parent_span[rows] >= 0, local[np.maximum(parent_span[rows], 0)], -1)
    levels = _Levels(depth[rows])
    size = np.ones(m, dtype=np.int64)
    for nodes in levels.each(start=1, reverse=True):
        size += np.bincount(parent[nodes], weights=size[nodes], minlength=m).astype(np.int64)
    top_key = np.where(parent < 0, run_order[rows], 0)
    order = np.lexsort((np.arange(m), start[rows], top_key, parent))
    sizes = size[order]
    before = np.cumsum(sizes) - sizes
    first = np.r_[True, parent[order][1:] != parent[order][:-1]]
    group_base = before[np.nonzero(first)[0]][np.cumsum(first) - 1]
    offset = np.empty(m, dtype=np.int64)
    offset[order] = before - group_base
    position = offset.copy()
    for nodes in levels.each(start=1):
        position[nodes] = position[parent[nodes]] + 1 + offset[nodes]
    return np.argsort(position, kind="stable")


def _percentiles(owner: np.ndarray, values: np.ndarray, rows: np.ndarray, n: int,
                 qs: tuple[float, ...]) -> list[np.ndarray]:
    """Nearest-rank percentiles of ``values`` grouped by ``owner`` (one of the sorted ``rows``).

    (owner, value) pairs are sorted as one plain integer sort, the owner's position among the
    rows in the high bits: several times faster than ``np.lexsort`` on a million members. When
    the values span too many bits for that, their ranks are packed instead.
    """
    out = [np.zeros(n, dtype=np.int64) for _ in qs]
    if owner.size == 0:
        return out
    dense = np.searchsorted(rows, owner).astype(np.int64)
    low = int(values.min())
    spread = values - low
    bits = max(int(spread.max()).bit_length(), 1)
    by_value = None
    if bits + max(len(rows).bit_length(), 1) > 62:
        by_value = np.argsort(values)
        spread = np.empty(len(values), dtype=np.int64)
        spread[by_value] = np.arange(len(values))
        bits = max(len(values).bit_length(), 1)
    packed = (dense << bits) | spread
    packed.sort()
    owner_sorted = rows[packed >> bits]
    low_bits = packed & ((1 << bits) - 1)
    values_sorted = low_bits + low if by_value is None else values[by_value][low_bits]
    heads = np.nonzero(np.r_[True, owner_sorted[1:] != owner_sorted[:-1]])[0]
    counts = np.diff(np.r_[heads, len(owner_sorted)])
    for result, q in zip(out, qs):
        pick = heads + np.maximum(np.ceil(q * counts).astype(np.int64) - 1, 0)
        result[owner_sorted[heads]] = values_sorted[pick]
    return out


def _tags(rows: pa.Table) -> pa.Array:
    """``key=value`` pairs worth a glance, space-separated (category, versions, polls; the
    iteration has its own column)."""
    pieces = []
    columns = [(EFFICIENCY_CATEGORY, _decoded(rows.column(EFFICIENCY_CATEGORY)))]
    attributes = rows.column("attributes")
    for key in TAG_ATTRIBUTES:
        columns.append((key, pc.map_lookup(attributes, key, "first") if rows.num_rows else pa.array([], pa.string())))
    if not rows.num_rows:
        return pa.array([], pa.string())
    for key, values in columns:
        piece = pc.binary_join_element_wise(pa.scalar(f"{key}="), values, "", null_handling="emit_null")
        pieces.append(pc.fill_null(piece, ""))
    # Empty pieces and a space-collapse, not null_handling="skip": pyarrow 26 drops rows whose
    # pieces are all null under "skip".
    joined = pc.binary_join_element_wise(*pieces, " ")
    return pc.utf8_trim(pc.replace_substring_regex(joined, " +", " "), " ")


# -- column helpers -----------------------------------------------------------------------


def _codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
    """Dictionary codes (-1 for null) and the dictionary of a string or dictionary column."""
    if isinstance(column, pa.ChunkedArray):
        if pa.types.is_dictionary(column.type):
            column = column.unify_dictionaries()
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    codes = pc.fill_null(column.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, column.dictionary


def _equals(column: pa.ChunkedArray, value: str) -> np.ndarray:
    codes, dictionary = _codes(column)
    hits = np.nonzero(np.asarray(pc.equal(dictionary, value).to_numpy(zero_copy_only=False), dtype=bool))[0]
    return np.isin(codes, hits)


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    return column.cast(pa.string()) if pa.types.is_dictionary(column.type) else column


def _valid(column) -> np.ndarray:
    return np.asarray(valid_rows(column), dtype=bool)


def _int_values(column) -> np.ndarray:
    """int64 values with nulls as the smallest int64 (never a real iteration)."""
    return pc.fill_null(column, _NULL_INT).to_numpy(zero_copy_only=False).astype(np.int64)


def _ints(table: pa.Table, name: str) -> np.ndarray:
    return _int_values(table.column(name))
