"""Stitch vLLM's ``llm_request`` spans under the ``rl.vllm.generate`` call that produced them.

Where the installed vLLM's engine cannot take ``trace_headers`` (``rl.vllm.trace_path=stitch``,
see :mod:`nemo_telemetry.instrument.vllm`), each request span starts a trace of its own. They are
re-parented here: an ``llm_request`` root span goes under the ``rl.vllm.generate`` /
``rl.vllm.generate_text`` span of the same run (``run_id`` = ``nemo.run.id``, which
``vllm_tracing_env`` puts on vLLM's resource) whose interval contains it -- the latest-starting
one when several do. The request span gets that trace id and parent, and the attributes
``nemo.stitched=true`` and ``nemo.stitched.original_trace_id``; any other span of its original
trace moves with it. Request spans that already have a parent (the headers path) are left alone.

When a run's generate spans overlap in time (several generation workers), containment cannot
tell them apart: such stitches also carry ``nemo.stitch.ambiguous=true``. Counts are in the
result's schema metadata (:data:`STITCHED_KEY`, :data:`UNMATCHED_KEY`, :data:`AMBIGUOUS_KEY`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.schema import ID_KEY_FIELDS
from nemo_telemetry.analysis.model.tree import trace_keys, with_id_keys

__all__ = ["stitch_vllm_spans", "REQUEST_SPAN", "GENERATE_SPANS", "STITCHED_KEY", "UNMATCHED_KEY", "AMBIGUOUS_KEY"]

REQUEST_SPAN = "llm_request"
GENERATE_SPANS = ("rl.vllm.generate", "rl.vllm.generate_text")
STITCHED_KEY = b"nemo.stitch.stitched"
UNMATCHED_KEY = b"nemo.stitch.unmatched"
AMBIGUOUS_KEY = b"nemo.stitch.ambiguous"
_CHUNK = 4096


def stitch_vllm_spans(spans: pa.Table, *, tolerance_ns: int = 0) -> pa.Table:
    """A new spans table with root ``llm_request`` spans re-parented under their generate span.

    ``tolerance_ns`` widens each generate interval on both sides (clock skew between processes;
    0 when vLLM runs in the generate call's own process, as offline ``LLM`` does).
    """
    names = pc.cast(spans["name"], pa.string())
    runs = pc.cast(spans["run_id"], pa.string())
    is_request = pc.and_(pc.equal(names, REQUEST_SPAN), pc.is_null(spans["parent_span_id"]))
    is_generate = pc.is_in(names, pa.array(GENERATE_SPANS))
    total = int(pc.sum(pc.cast(pc.fill_null(is_request, False), pa.int64())).as_py() or 0)
    requests = _frame(spans, is_request, runs)
    generates = _frame(spans, is_generate, runs)
    if requests.empty or generates.empty:
        return _with_counts(spans, 0, total, 0)
    generates = _mark_overlaps(generates)
    match = _match(requests, generates, tolerance_ns)
    matched = match >= 0
    if not matched.any():
        return _with_counts(spans, 0, total, 0)
    rows = requests["row"].to_numpy()[matched]
    chosen = generates.iloc[match[matched]]
    ambiguous = chosen["overlaps"].to_numpy()
    out = _reparent(spans, rows, chosen["row"].to_numpy(), ambiguous)
    return _with_counts(out, len(rows), total - len(rows), int(ambiguous.sum()))


def _frame(spans: pa.Table, mask: pa.ChunkedArray, runs: pa.ChunkedArray) -> pd.DataFrame:
    rows = np.flatnonzero(pc.fill_null(mask, False).to_numpy(zero_copy_only=False))
    take = pa.array(rows, pa.int64())
    return pd.DataFrame({
        "row": rows,
        "run_id": runs.take(take).to_pandas(),
        "start_ns": spans["start_ns"].take(take).to_numpy(),
        "end_ns": spans["end_ns"].take(take).to_numpy(),
    }).dropna(subset=["run_id"])


def _mark_overlaps(generates: pd.DataFrame) -> pd.DataFrame:
    """Sorted by (run, start); ``overlaps`` where a generate span shares time with another of its run.

    After sorting, a span that starts before the running maximum end of its run joins the chain
    of the spans before it; every span of a chain longer than one overlaps some other span.
    """
    g = generates.sort_values(["run_id", "start_ns"], kind="stable").reset_index(drop=True)
    running_end = g.groupby("run_id", sort=False)["end_ns"].cummax()
    prev_end = running_end.groupby(g["run_id"], sort=False).shift(1)
    starts_inside = (g["start_ns"] < prev_end).to_numpy(dtype=bool, na_value=False)
    chain = np.cumsum(~starts_inside)
    chain_size = np.bincount(chain)[chain]
    return g.assign(overlaps=chain_size > 1)


def _match(requests: pd.DataFrame, generates: pd.DataFrame, tolerance_ns: int) -> np.ndarray:
    """Index into ``generates`` of each request's container (-1: none), latest start first."""
    g = generates.assign(gidx=np.arange(len(generates)), g_start=generates["start_ns"] - tolerance_ns,
                         g_end=generates["end_ns"] + tolerance_ns)
    r = requests.assign(ridx=np.arange(len(requests))).sort_values("start_ns", kind="stable")
    joined = pd.merge_asof(r, g[["run_id", "g_start", "g_end", "gidx"]].sort_values("g_start", kind="stable"),
                           left_on="start_ns", right_on="g_start", by="run_id", direction="backward")
    match = np.full(len(requests), -1, dtype=np.int64)
    ok = (joined["g_end"] >= joined["end_ns"]).fillna(False).to_numpy()
    match[joined["ridx"].to_numpy()[ok]] = joined["gidx"].to_numpy()[ok].astype(np.int64)
    _match_overlapping(requests, g, match)
    return match


def _match_overlapping(requests: pd.DataFrame, g: pd.DataFrame, match: np.ndarray) -> None:
    """Second pass for requests the latest-starting generate does not contain (overlapping generates)."""
    missing = np.flatnonzero(match < 0)
    overlapping_runs = set(g.loc[g["overlaps"], "run_id"])
    todo = requests.iloc[missing].assign(pos=missing)
    todo = todo[todo["run_id"].isin(overlapping_runs)]
    for run_id, part in todo.groupby("run_id", sort=False):
        run_g = g[g["run_id"] == run_id]
        starts, ends, gidx = run_g["g_start"].to_numpy(), run_g["g_end"].to_numpy(), run_g["gidx"].to_numpy()
        for lo in range(0, len(part), _CHUNK):  # bounded memory: chunk x generates of the run
            chunk = part.iloc[lo:lo + _CHUNK]
            contains = (starts[None, :] <= chunk["start_ns"].to_numpy()[:, None]) & \
                       (ends[None, :] >= chunk["end_ns"].to_numpy()[:, None])
            latest = np.where(contains, starts[None, :], np.iinfo(np.int64).min).argmax(axis=1)
            found = contains.any(axis=1)
            match[chunk["pos"].to_numpy()[found]] = gidx[latest[found]]


def _reparent(spans: pa.Table, rows: np.ndarray, generate_rows: np.ndarray, ambiguous: np.ndarray) -> pa.Table:
    """Move each request row (and the rest of its original trace) under its generate row."""
    n = spans.num_rows
    trace_id = spans["trace_id"].combine_chunks()
    trace_key = _trace_keys(trace_id)
    # every span of a stitched request's original trace moves to the generate span's trace
    moved_keys, first = np.unique(trace_key[rows], return_index=True)
    found = pc.index_in(pa.array(trace_key), value_set=pa.array(moved_keys))  # hash join on the keys
    moves = np.flatnonzero(valid_rows(found))
    position = np.zeros(n, dtype=np.int64)
    position[moves] = found.take(pa.array(moves)).to_numpy()
    owner = rows[first[position[moves]]]  # the stitched request whose original trace each moving row is in
    same = pc.equal(trace_id.take(pa.array(moves)), trace_id.take(pa.array(owner)))  # exact, not just the key
    keep = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
    source = np.arange(n)
    source[moves[keep]] = generate_rows[first[position[moves[keep]]]]
    source[rows] = generate_rows  # each request its own generate's trace, whatever its trace shares
    new_trace = trace_id.take(pa.array(source))
    parent_row = np.full(n, -1, dtype=np.int64)
    parent_row[rows] = generate_rows
    span_id = spans["span_id"].combine_chunks()
    new_parent = pc.coalesce(span_id.take(pa.array(parent_row, mask=parent_row < 0)),
                             spans["parent_span_id"].combine_chunks())
    out = spans.set_column(spans.schema.get_field_index("trace_id"), spans.schema.field("trace_id"), new_trace)
    out = out.set_column(out.schema.get_field_index("parent_span_id"), out.schema.field("parent_span_id"),
                         new_parent)
    count, keys, values = _added_attributes(trace_id.take(pa.array(rows)), ambiguous)
    out = out.set_column(out.schema.get_field_index("attributes"), out.schema.field("attributes"),
                         _append_to_maps(out["attributes"].combine_chunks(), rows, count, keys, values))
    if any(f.name in out.column_names for f in ID_KEY_FIELDS):
        out = with_id_keys(out.drop_columns([f.name for f in ID_KEY_FIELDS if f.name in out.column_names]))
    return out


def _trace_keys(trace_id: pa.Array) -> np.ndarray:
    """One uint64 per 128-bit trace id, mixing both halves (the dataset's ``trace_key``).

    Equal ids give equal keys; the rare unequal ids with equal keys are told apart by the exact
    comparison in ``_reparent``.
    """
    return trace_keys(trace_id)[0]


_ADDED_KEYS = pa.array(["nemo.stitched", "nemo.stitched.original_trace_id", "nemo.stitch.ambiguous"])


def _added_attributes(original: pa.Array, ambiguous: np.ndarray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """Entry counts per stitched row, and the flat keys and values to append, in row order."""
    count = np.where(ambiguous, 3, 2)
    first = np.r_[0, np.cumsum(count)][:-1]
    kind = np.zeros(int(count.sum()), dtype=np.int64)  # 0 stitched, 1 original trace id, 2 ambiguous
    kind[first + 1] = 1
    kind[first[ambiguous] + 2] = 2
    value_index = np.zeros(len(kind), dtype=np.int64)  # 0: "true", 1 + k: original trace id of row k
    value_index[first + 1] = 1 + np.arange(len(count))
    values = pa.concat_arrays([pa.array(["true"]), original.cast(pa.string())]).take(pa.array(value_index))
    return count, _ADDED_KEYS.take(pa.array(kind)), values


def _append_to_maps(maps: pa.MapArray, rows: np.ndarray, count: np.ndarray, keys: pa.Array,
                    values: pa.Array) -> pa.MapArray:
    """Each row's map followed by its added entries: one permutation of the flat arrays, no per-row maps.

    ``keys``/``values`` hold ``count[i]`` entries for ``rows[i]``, consecutively, in ``rows`` order.
    """
    n = len(maps)
    add_len = np.zeros(n, dtype=np.int64)
    add_len[rows] = count
    add_start = np.zeros(n, dtype=np.int64)
    add_start[rows] = np.r_[0, np.cumsum(count)][:-1]
    absolute = maps.offsets.to_numpy().astype(np.int64)  # offsets are absolute; .keys ignores a slice
    base, old_offsets = absolute[0], absolute - absolute[0]
    old_len = np.diff(old_offsets)
    new_offsets = np.r_[0, np.cumsum(old_len + add_len)]
    row_of_old = np.repeat(np.arange(n), old_len)
    old_pos = new_offsets[:-1][row_of_old] + np.arange(len(row_of_old)) - old_offsets[:-1][row_of_old]
    row_of_add = np.repeat(np.arange(n), add_len)
    rank = np.arange(len(row_of_add)) - np.r_[0, np.cumsum(add_len)][:-1][row_of_add]
    add_pos = new_offsets[:-1][row_of_add] + old_len[row_of_add] + rank
    permutation = np.empty(int(new_offsets[-1]), dtype=np.int64)
    permutation[old_pos] = np.arange(len(row_of_old))
    permutation[add_pos] = len(row_of_old) + add_start[row_of_add] + rank
    take = pa.array(permutation, pa.int64())
    flat_keys = pa.concat_arrays([maps.keys.slice(base, len(row_of_old)).cast(pa.string()), keys]).take(take)
    flat_values = pa.concat_arrays([maps.items.slice(base, len(row_of_old)).cast(pa.string()), values]).take(take)
    return pa.MapArray.from_arrays(pa.array(new_offsets, pa.int32()), flat_keys, flat_values,
                                   mask=maps.is_null() if maps.null_count else None)


def _with_counts(spans: pa.Table, stitched: int, unmatched: int, ambiguous: int) -> pa.Table:
    metadata = dict(spans.schema.metadata or {})
    metadata.update({STITCHED_KEY: str(stitched).encode(), UNMATCHED_KEY: str(unmatched).encode(),
                     AMBIGUOUS_KEY: str(ambiguous).encode()})
    return spans.replace_schema_metadata(metadata)
