"""The spans table as the numpy arrays goodput and the findings compute on, built once per call.

Strings that repeat (names, buckets, runs, services) become integer codes into a small tuple
of values, so every rule over names is decided once per distinct name and then broadcast by
code. The walk up the tree starts only from the rows that need it (the bucketed spans), one
level per numpy step, so a 10-million-span table costs a handful of gathers on small arrays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION
from nemo_telemetry.analysis.tree import parent_indices, with_id_keys

__all__ = ["BUCKETS", "SpanArrays", "span_arrays", "codes_matching", "READ_COLUMNS"]

BUCKETS = ("productive", "overhead", "idle", "wasted")
UNKNOWN_BUCKET = -2
NO_BUCKET = -1
_MAX_DEPTH = 1024  # a parent cycle stops here instead of looping forever

# What goodput and check read: project a Parquet dataset onto these and nothing else is decoded.
READ_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns", "service_name", "run_id",
    "rank", BUCKET, ITERATION, EFFICIENCY_CATEGORY, "resource_attributes",
    "trace_key", "span_key", "parent_key",
)


def _codes(spans: pa.Table, column: str) -> tuple[np.ndarray, tuple]:
    """(int32 codes with -1 for null, the distinct values) of a string or dictionary column."""
    if column not in spans.column_names:
        return np.full(spans.num_rows, -1, dtype=np.int32), ()
    arr = spans.column(column).combine_chunks() if spans.num_rows else pa.array([], pa.string())
    if not pa.types.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr)
    codes = pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return codes, tuple(arr.dictionary.to_pylist())


def _int_column(spans: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with nulls as 0, validity) of an integer column (absent: all null)."""
    n = spans.num_rows
    if column not in spans.column_names or n == 0:
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    col = spans.column(column)
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    values = pc.fill_null(col, 0).to_numpy().astype(np.int64, copy=False)
    return values, valid


def codes_matching(values: tuple, regex: str) -> np.ndarray:
    """Codes of the distinct values that match ``regex`` (decided once per value)."""
    pattern = re.compile(regex)
    return np.array([i for i, v in enumerate(values) if v is not None and pattern.search(v)], dtype=np.int32)


@dataclass(frozen=True, eq=False)
class SpanArrays:
    """Columns of one spans table as numpy arrays; ``table`` is kept to read ids for messages."""

    table: pa.Table
    name: np.ndarray
    names: tuple
    run: np.ndarray
    runs: tuple
    service: np.ndarray
    services: tuple
    start: np.ndarray
    end: np.ndarray
    bucket: np.ndarray  # index into BUCKETS, NO_BUCKET, or UNKNOWN_BUCKET
    bucket_raw: np.ndarray  # code into bucket_values
    bucket_values: tuple
    category: np.ndarray
    categories: tuple
    iteration: np.ndarray
    has_iteration: np.ndarray
    rank: np.ndarray
    has_rank: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @cached_property
    def parents(self) -> np.ndarray:
        return parent_indices(self.table)

    @cached_property
    def has_parent(self) -> np.ndarray:
        if "parent_span_id" in self.table.column_names:
            return pc.is_valid(self.table.column("parent_span_id")).to_numpy(zero_copy_only=False)
        return pc.not_equal(self.table.column("parent_key"), 0).to_numpy(zero_copy_only=False)

    @cached_property
    def valid_interval(self) -> np.ndarray:
        return self.end >= self.start

    def rows_of_names(self, regex: str) -> np.ndarray:
        """Boolean mask of the rows whose name matches ``regex``."""
        return np.isin(self.name, codes_matching(self.names, regex))

    def span_id(self, rows) -> list[str]:
        return self._ids("span_id", "span_key", rows)

    def trace_id(self, rows) -> list[str]:
        return self._ids("trace_id", "trace_key", rows)

    def _ids(self, column: str, key: str, rows) -> list[str]:
        rows = np.asarray(rows, dtype=np.int64)
        if column in self.table.column_names:
            return [str(v) for v in self.table.column(column).take(pa.array(rows)).to_pylist()]
        return [f"{int(v):016x}" for v in self.table.column(key).take(pa.array(rows)).to_pylist()]

    def walk_up(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For ``rows``: (attributed iteration, whether one was found, nearest bucketed ancestor or -1).

        The iteration is the row's own ``rl.iteration``, else the nearest stamped ancestor's
        (parent links join across processes through carriers); a walk stops at a root or orphan.
        """
        iteration = self.iteration[rows].copy()
        found = self.has_iteration[rows].copy()
        bucketed_ancestor = np.full(len(rows), -1, dtype=np.int64)
        parents = self.parents
        bucketed = self.bucket != NO_BUCKET
        current = parents[rows]
        active = np.flatnonzero(current >= 0)
        for _ in range(_MAX_DEPTH):
            if active.size == 0:
                break
            at = current[active]
            take_iter = ~found[active] & self.has_iteration[at]
            iteration[active[take_iter]] = self.iteration[at[take_iter]]
            found[active[take_iter]] = True
            take_bucket = (bucketed_ancestor[active] < 0) & bucketed[at]
            bucketed_ancestor[active[take_bucket]] = at[take_bucket]
            current[active] = parents[at]
            keep = (current[active] >= 0) & (~found[active] | (bucketed_ancestor[active] < 0))
            active = active[keep]
        return iteration, found, bucketed_ancestor


def span_arrays(spans: pa.Table) -> SpanArrays:
    """Decode the columns goodput and the findings use (ids stay in ``table`` until a message needs them)."""
    spans = with_id_keys(spans)
    name, names = _codes(spans, "name")
    run, runs = _codes(spans, "run_id")
    service, services = _codes(spans, "service_name")
    bucket_raw, bucket_values = _codes(spans, BUCKET)
    category, categories = _codes(spans, EFFICIENCY_CATEGORY)
    lookup = np.array([BUCKETS.index(v) if v in BUCKETS else UNKNOWN_BUCKET for v in bucket_values] + [NO_BUCKET],
                      dtype=np.int8)
    start, _ = _int_column(spans, "start_ns")
    end, _ = _int_column(spans, "end_ns")
    iteration, has_iteration = _int_column(spans, ITERATION)
    rank, has_rank = _int_column(spans, "rank")
    return SpanArrays(
        table=spans, name=name, names=names, run=run, runs=runs, service=service, services=services,
        start=start, end=end, bucket=lookup[bucket_raw], bucket_raw=bucket_raw, bucket_values=bucket_values,
        category=category, categories=categories, iteration=iteration, has_iteration=has_iteration,
        rank=rank, has_rank=has_rank,
    )
