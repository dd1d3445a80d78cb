""":class:`SpanArrays` built row by row from a table's Python values: slow, and plainly what each
field means. The tests compare every strategy of :mod:`decode.strategies` with it, field by field
(values, not codes: a strategy numbers values in the order its dictionaries list them, this one in
the order rows show them)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.decode.spans import (
    BUCKETS, NO_BUCKET, RUN_RESOURCES, UNKNOWN_BUCKET, Later, Parents, RunPairs, SpanArrays,
)
from nemo_telemetry.analysis.model.tree import trace_key_of
from nemo_telemetry.analysis.model.schema import BUCKET, EFFICIENCY_CATEGORY, ITERATION, PROMOTED_RESOURCE_ATTRIBUTES, SPAN_GROUP

__all__ = ["reference_arrays"]


def _hex_key(value) -> int:
    """A hex span id as the uint64 key ingest writes (its 16 hex digits), 0 for none or a
    malformed one."""
    try:
        return 0 if value is None else int(str(value)[:16].rjust(16, "0"), 16)
    except ValueError:
        return 0


def _trace(value) -> tuple[int, int]:
    """A hex trace id as (high, low) halves, left-padded to 32 digits; (0, 0) for none or a
    malformed one."""
    text = "" if value is None else str(value)[:32].rjust(32, "0")
    try:
        number = int(text, 16)
    except ValueError:
        return 0, 0
    return number >> 64, number & ((1 << 64) - 1)


def reference_arrays(spans: pa.Table) -> SpanArrays:
    rows = spans.to_pylist()
    columns = set(spans.column_names)
    n = len(rows)

    def codes(column: str) -> tuple[np.ndarray, tuple]:
        values: dict = {}
        out = [-1 if r.get(column) is None else values.setdefault(r[column], len(values)) for r in rows]
        return np.array(out, dtype=np.int64), tuple(values)

    def ints(column: str) -> tuple[np.ndarray, np.ndarray]:
        got = [r.get(column) for r in rows]
        return (np.array([0 if v is None else int(v) for v in got], dtype=np.int64),
                np.array([v is not None for v in got], dtype=bool))

    def key(row: dict, column: str, hex_column: str) -> int:
        if column in columns:
            return 0 if row[column] is None else int(row[column])
        return _hex_key(row.get(hex_column))

    name, names = codes("name")
    run, runs = codes("run_id")
    bucket_raw, bucket_values = codes(BUCKET)
    category, categories = codes(EFFICIENCY_CATEGORY)
    start, _ = ints("start_ns")
    end, _ = ints("end_ns")
    iteration, has_iteration = ints(ITERATION)
    bucket = np.array([NO_BUCKET if r.get(BUCKET) is None else
                       (BUCKETS.index(r[BUCKET]) if r[BUCKET] in BUCKETS else UNKNOWN_BUCKET) for r in rows], np.int64)

    if "trace_key" in columns and "trace_low" in columns:
        trace_key = [key(r, "trace_key", "trace_id") for r in rows]
        trace_low = [0 if r["trace_low"] is None else int(r["trace_low"]) for r in rows]
    else:  # the trace id whole, as the key and low half every strategy reads (model.tree.trace_key_of)
        halves = [_trace(r.get("trace_id")) for r in rows]
        trace_low = [low for _, low in halves]
        trace_key = trace_key_of(np.array([h for h, _ in halves], np.uint64), np.array(trace_low, np.uint64)).tolist()
    span_key = [key(r, "span_key", "span_id") for r in rows]
    parent_key = [key(r, "parent_key", "parent_span_id") for r in rows]
    if "parent_span_id" in columns:
        has_parent = np.array([r["parent_span_id"] is not None for r in rows], dtype=bool)
    else:
        has_parent = np.array([k != 0 for k in parent_key], dtype=bool)
    holders: dict[tuple[int, int, int], list[int]] = {}  # every span by its whole identity
    for i in range(n):
        holders.setdefault((trace_key[i], trace_low[i], span_key[i]), []).append(i)
    parent = np.full(n, -1, dtype=np.int64)
    orphan = np.zeros(n, dtype=bool)
    for i in range(n):
        if not has_parent[i]:
            continue
        held = holders.get((trace_key[i], trace_low[i], parent_key[i]), [])
        others = [j for j in held if j != i]
        parent[i] = min(others) if others else -1
        orphan[i] = not held

    names_present = frozenset((int(r), int(c)) for r, c in zip(run, name) if r >= 0 and c >= 0)
    resources = {}
    for attribute in RUN_RESOURCES:
        column = PROMOTED_RESOURCE_ATTRIBUTES.get(attribute)
        found = set()
        for i, r in enumerate(rows):
            if run[i] < 0:
                continue
            if column in columns and r[column] is not None:
                found.add((int(run[i]), str(r[column])))
            for k, v in (r.get("resource_attributes") or []):
                if k == attribute and v is not None:
                    found.add((int(run[i]), str(v)))
        resources[attribute] = frozenset(found)

    kept = {c: spans.column(c) for c in ("trace_id", "service_name", "rank", "span_groups", SPAN_GROUP,
                                         "span_groups_namespace") if c in columns}
    kept["trace_key"] = pa.array(trace_key, pa.uint64())
    kept["span_key"] = pa.array(span_key, pa.uint64())
    kept["trace_low"] = pa.array(trace_low, pa.uint64())
    return SpanArrays(
        table=pa.table(kept),
        name=name, names=names, run=run, runs=runs, start=start, end=end, valid_interval=end >= start,
        bucket=bucket, bucket_raw=bucket_raw, bucket_values=bucket_values, category=category, categories=categories,
        iteration=iteration, has_iteration=has_iteration,
        links=Later.known(Parents(parent.__getitem__, has_parent)), orphans=Later.known(orphan),
        pairs=Later.known(RunPairs(names_present, resources)))
