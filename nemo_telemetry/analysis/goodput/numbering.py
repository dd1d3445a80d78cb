"""Step spans without ``rl.iteration``, numbered in start order per run and process.

Some loops open ``rl.<algo>.step`` spans without :func:`iteration_scope` (NeMo-RL-shaped loops
that never stamp the iteration). Such a span is a step all the same: per (run, process), where a
process is its (``service_name``, ``rank``), its step spans are numbered 1, 2, ... in start order
(ties by trace and span id, so every engine numbers alike), and the number stands in for the
missing ``rl.iteration`` everywhere goodput and the findings read it: the step windows and the
ancestor walks that attribute bucketed spans.

A process whose step spans are partly stamped keeps its own numbers: its unstamped step spans
are left unnumbered (a number guessed beside the trainer's own could put two steps in one
window) and reported, as the numbered ones are, by ``check``'s ``step-without-iteration``.

The rule is a partial (:func:`step_number_partial`, a batch's step spans) merged
(:func:`step_numbers`) and applied to each batch as it is read (:func:`number_steps`), so the
in-memory, streaming and Ray engines number the same spans the same way.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nemo_telemetry.analysis.goodput.rules import STEP_SPAN_REGEX
from nemo_telemetry.analysis.model.columns import column_rows, valid_rows
from nemo_telemetry.analysis.model.grouping import group_by, string_codes
from nemo_telemetry.analysis.model.schema import ITERATION
from nemo_telemetry.analysis.model.tree import (
    TRACE_LOW, hex_to_uint64, key_column, low_column, trace_keys, with_id_keys,
)
from nemo_telemetry.analysis.model.walk import KeyIndex

__all__ = ["NUMBER_COLUMNS", "StepNumbers", "step_number_partial", "step_numbers", "number_steps", "numbered_spans",
           "file_number_partial", "number_arrays", "FIND_COLUMNS", "unstamped_step_count", "no_step_numbers",
           "file_unstamped_steps",
           "file_step_numbers", "arrays_unstamped_steps", "read_step_numbers"]

NUMBER_COLUMNS = ("name", ITERATION, "start_ns", "run_id", "service_name", "rank", "trace_id", "span_id",
                  "trace_key", "span_key", TRACE_LOW)
"""What the partial reads of a batch."""

_PARTIAL_SCHEMA = pa.schema([
    pa.field("run_id", pa.string()), pa.field("service_name", pa.string()), pa.field("rank", pa.int64()),
    pa.field("name", pa.string()), pa.field("start_ns", pa.int64()), pa.field("trace_id", pa.string()),
    pa.field("span_id", pa.string()), pa.field("trace_key", pa.uint64()), pa.field("span_key", pa.uint64()),
    pa.field("stamped", pa.bool_()), pa.field(TRACE_LOW, pa.uint64())])


@dataclass(frozen=True, eq=False)
class StepNumbers:
    """The step spans without ``rl.iteration``: the number each takes (``iteration``; -1: left
    unnumbered, its process stamps its other step spans), and what a finding names of them."""

    spans: pa.Table  # _PARTIAL_SCHEMA columns of the unstamped step spans, plus ``iteration``

    def __len__(self) -> int:
        return self.spans.num_rows

    @property
    def numbered(self) -> int:
        return int(pc.sum(pc.greater_equal(self.spans.column("iteration"), 0)).as_py() or 0) if len(self) else 0

    def index(self) -> KeyIndex:
        iteration = self.spans.column("iteration").to_numpy()
        keep = iteration >= 0
        return KeyIndex.of(key_column(self.spans, "trace_key")[keep], key_column(self.spans, "span_key")[keep],
                           iteration[keep], low_column(self.spans)[keep])


FIND_COLUMNS = ("name", ITERATION)
"""What :func:`unstamped_step_count` reads: the first pass, which most datasets end with."""


def unstamped_step_count(batch: pa.Table) -> pa.Table:
    """One row: how many step spans of the batch carry no ``rl.iteration`` (a run that stamps its
    steps reads two columns for the numbering, and no more)."""
    count = 0
    if batch.num_rows and "name" in batch.column_names:
        is_step = _step_mask(batch.column("name"))
        if ITERATION in batch.column_names:
            is_step &= ~valid_rows(batch.column(ITERATION))
        count = int(is_step.sum())
    return pa.table({"unstamped": pa.array([count], pa.int64())})


def no_step_numbers() -> StepNumbers:
    """The numbering of a dataset whose step spans all carry ``rl.iteration``."""
    return StepNumbers(_PARTIAL_SCHEMA.empty_table().append_column("iteration", pa.array(np.zeros(0, np.int64))))


def step_number_partial(batch: pa.Table) -> pa.Table:
    """The batch's step spans (stamped or not) as ``_PARTIAL_SCHEMA`` rows; the merge needs the
    stamped ones only to know which processes stamp their steps."""
    if batch.num_rows == 0 or "name" not in batch.column_names:
        return _PARTIAL_SCHEMA.empty_table()
    is_step = _step_mask(batch.column("name"))
    if not is_step.any():
        return _PARTIAL_SCHEMA.empty_table()
    is_step = pa.array(is_step)
    rows = batch.filter(is_step)
    names = rows.column("name")
    names = names.cast(pa.string()) if pa.types.is_dictionary(names.type) else names
    n = rows.num_rows

    def text(column: str) -> pa.Array:
        if column not in rows.column_names:
            return pa.nulls(n, pa.string())
        values = rows.column(column)
        return (values.cast(pa.string()) if pa.types.is_dictionary(values.type) else values).combine_chunks()

    rank = (rows.column("rank").combine_chunks().cast(pa.int64()) if "rank" in rows.column_names
            else pa.nulls(n, pa.int64()))
    stamped = (pc.is_valid(rows.column(ITERATION)) if ITERATION in rows.column_names
               else pa.array(np.zeros(n, bool)))
    if "trace_key" in rows.column_names:
        trace_key, trace_low = key_column(rows, "trace_key"), low_column(rows)
    else:
        trace_key, trace_low = trace_keys(rows.column("trace_id"))
    span_key = key_column(rows, "span_key") if "span_key" in rows.column_names else hex_to_uint64(rows.column("span_id"))
    span_ids = text("span_id") if "span_id" in rows.column_names else pa.array(  # a projection without ids
        [f"{k:016x}" for k in span_key.tolist()], pa.string())
    return pa.table([text("run_id"), text("service_name"), rank, names.combine_chunks(),
                     rows.column("start_ns").combine_chunks().cast(pa.int64()), text("trace_id"), span_ids,
                     pa.array(trace_key, pa.uint64()), pa.array(span_key, pa.uint64()),
                     stamped.combine_chunks() if isinstance(stamped, pa.ChunkedArray) else stamped,
                     pa.array(trace_low, pa.uint64())],
                    schema=_PARTIAL_SCHEMA)


def _step_mask(names: pa.ChunkedArray) -> np.ndarray:
    """Rows named like a step span; a dictionary column is matched on its dictionary only."""
    out = []
    for chunk in names.chunks:
        if pa.types.is_dictionary(chunk.type):
            hit = pc.fill_null(pc.match_substring_regex(chunk.dictionary, STEP_SPAN_REGEX), False)
            out.append(pc.fill_null(pc.take(hit, chunk.indices), False).to_numpy(zero_copy_only=False))
        else:
            out.append(pc.fill_null(pc.match_substring_regex(chunk, STEP_SPAN_REGEX), False)
                       .to_numpy(zero_copy_only=False))
    return np.concatenate(out) if out else np.zeros(0, bool)


def step_numbers(partials: Iterable[pa.Table]) -> StepNumbers:
    """The merged partials: each unstamped step span's number, 1, 2, ... in start order (then
    trace and span id) per (run, service, rank); -1 in a process that stamps other step spans."""
    parts = [p.cast(_PARTIAL_SCHEMA) for p in partials if p.num_rows]
    table = pa.concat_tables(parts) if parts else _PARTIAL_SCHEMA.empty_table()
    stamped = table.column("stamped").to_numpy(zero_copy_only=False).astype(bool)
    if stamped.all():
        return no_step_numbers()
    run = string_codes(table.column("run_id").to_numpy(zero_copy_only=False))[0]
    service = string_codes(table.column("service_name").to_numpy(zero_copy_only=False))[0]
    rank = pc.fill_null(table.column("rank"), -(1 << 62)).to_numpy().astype(np.int64)
    process = group_by(run, service, rank)
    of = process.codes
    stamps = np.bincount(of, weights=stamped.astype(np.float64), minlength=len(process)) > 0
    trace = string_codes(table.column("trace_id").to_numpy(zero_copy_only=False))[0]
    span = string_codes(table.column("span_id").to_numpy(zero_copy_only=False))[0]
    start = table.column("start_ns").to_numpy().astype(np.int64)
    loose = np.flatnonzero(~stamped)
    order = loose[np.lexsort((span[loose], trace[loose], start[loose], of[loose]))]
    group = of[order]
    first = np.ones(len(order), bool)
    first[1:] = group[1:] != group[:-1]
    heads = np.flatnonzero(first)
    position = np.arange(len(order)) - np.repeat(heads, np.diff(np.append(heads, len(order))))
    iteration = np.where(stamps[group], -1, position + 1).astype(np.int64)
    return StepNumbers(table.take(pa.array(order, pa.int64())).append_column("iteration", pa.array(iteration)))


def number_steps(table: pa.Table, numbers: StepNumbers | None) -> pa.Table:
    """``table`` with the numbered step spans' ``rl.iteration`` filled in (their own stays: only
    nulls are filled). ``table`` needs the id key columns and ``rl.iteration``."""
    if numbers is None or numbers.numbered == 0 or table.num_rows == 0 or ITERATION not in table.column_names:
        return table
    found = numbers.index().lookup(key_column(table, "trace_key"), key_column(table, "span_key"), missing=-1,
                                   low=low_column(table))
    if not (found >= 0).any():
        return table
    own = table.column(ITERATION)
    filled = pc.if_else(pc.and_(pc.is_null(own), pa.array(found >= 0)), pa.array(found, own.type), own)
    return table.set_column(table.schema.get_field_index(ITERATION), table.schema.field(ITERATION), filled)


def number_arrays(arrays, numbers: StepNumbers | None):
    """Decoded ``arrays`` (a :class:`~nemo_telemetry.analysis.decode.SpanArrays`) with their step
    spans numbered: what :func:`number_steps` does to a table. The same arrays when nothing is
    numbered; else a copy whose iteration columns are new (the decoded ones are not written)."""
    if numbers is None or numbers.numbered == 0 or len(arrays) == 0:
        return arrays
    rows = np.flatnonzero(arrays.rows_of_names(STEP_SPAN_REGEX) & ~arrays.has_iteration)
    if len(rows) == 0:
        return arrays
    trace = column_rows(arrays.table.column("trace_key"), rows, 0).astype(np.uint64, copy=False)
    low = (column_rows(arrays.table.column(TRACE_LOW), rows, 0).astype(np.uint64, copy=False)
           if TRACE_LOW in arrays.table.column_names else np.zeros(len(rows), np.uint64))
    span = hex_to_uint64(pa.array(arrays.span_id(rows), pa.string()))
    found = numbers.index().lookup(trace, span, low=low)
    hit = found >= 0
    if not hit.any():
        return arrays
    iteration, has_iteration = arrays.iteration.copy(), arrays.has_iteration.copy()
    if iteration.dtype != np.int64 and found[hit].max(initial=0) > np.iinfo(iteration.dtype).max:
        iteration = iteration.astype(np.int64)
    iteration[rows[hit]] = found[hit]
    has_iteration[rows[hit]] = True
    return dataclasses.replace(arrays, iteration=iteration, has_iteration=has_iteration)


def numbered_spans(spans: pa.Table) -> tuple[pa.Table, StepNumbers]:
    """A table in memory with its unstamped step spans numbered (id keys added when they were)."""
    numbers = step_numbers([step_number_partial(spans)])
    if numbers.numbered == 0:
        return spans, numbers
    return number_steps(with_id_keys(spans), numbers), numbers


def file_step_numbers(files: Sequence[str | Path]) -> StepNumbers:
    """:func:`step_numbers` of spans files (the engines' first pass): two columns of each file,
    then, only where a step span lacks ``rl.iteration``, a few more."""
    if not any(file_unstamped_steps(str(f)) for f in files):
        return no_step_numbers()
    return step_numbers(file_number_partial(str(f)) for f in files)


def arrays_unstamped_steps(arrays) -> int:
    """How many step spans of decoded ``arrays`` (a :class:`~nemo_telemetry.analysis.decode.SpanArrays`)
    carry no ``rl.iteration``: :func:`unstamped_step_count` over what a decode holds already, so a
    dataset whose steps are stamped needs no pass of its own to say so. The name test is Python's
    ``re.search``, which matches every name Arrow's regex does (and a name ending in a newline
    besides): where it counts a step Arrow would not, the files' pass numbers nothing, as before."""
    if len(arrays) == 0:
        return 0
    return int(np.count_nonzero(arrays.rows_of_names(STEP_SPAN_REGEX) & ~arrays.has_iteration))


def read_step_numbers(files: Sequence[str | Path], unstamped: int) -> StepNumbers:
    """:func:`file_step_numbers` of spans files whose unstamped step spans were counted on the
    way (``unstamped``, :func:`arrays_unstamped_steps`): no pass over the files when there are none."""
    return file_step_numbers(files) if unstamped else no_step_numbers()


def _file_pass(path: str, fn, columns: Sequence[str], empty: pa.Table) -> pa.Table:
    reader = pq.ParquetFile(path)  # a spans file of the dataset's format: every column is there
    return pa.concat_tables([fn(pa.Table.from_batches([b])) for b in reader.iter_batches(columns=list(columns))]
                            or [empty])


def file_unstamped_steps(path: str) -> int:
    """:func:`unstamped_step_count` of one spans file."""
    counts = _file_pass(path, unstamped_step_count, FIND_COLUMNS, pa.table({"unstamped": pa.array([], pa.int64())}))
    return int(pc.sum(counts.column("unstamped")).as_py() or 0)


def file_number_partial(path: str) -> pa.Table:
    """:func:`step_number_partial` of one spans file (what a Ray task or this process reads)."""
    return _file_pass(path, step_number_partial, NUMBER_COLUMNS, _PARTIAL_SCHEMA.empty_table())
