"""The monitor's one door to the goodput rules (``goodput.rules``, ``goodput.partials``): nothing else here calls them.

The monitor applies the same partial -> merge -> finish rules as the offline engines, only a
batch at a time: walks of unstamped spans (``walk_starts``), one partial per batch of settled
spans (``goodput_partial`` with the walks' iterations), partials merged (``GoodputAccumulator``)
and finished into ``goodput --format json`` steps (``goodput_document``); the spans that fail a
step, as the ``failed-step`` finding names them (``failed_partial``, only for a batch with a span
in error status).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.findings.rules import failed_partial, failed_spans
from nemo_telemetry.analysis.goodput import partials, rules
from nemo_telemetry.analysis.goodput.steps import goodput_document
from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.model.grouping import Columns
from nemo_telemetry.analysis.model.schema import BUCKET, ITERATION
from nemo_telemetry.analysis.model.status import error_rows
from nemo_telemetry.analysis.model.tree import TRACE_LOW, with_id_keys

__all__ = ["COLUMNS", "STEP", "SUM", "UNION", "JOB", "goodput_columns", "Walks", "walks", "partial",
           "Merged", "step_documents", "failed"]

COLUMNS = partials.GOODPUT_COLUMNS
STEP, SUM, UNION, JOB = rules.STEP, rules.SUM, rules.UNION, rules.JOB
_SCHEMA = pa.schema([pa.field("name", pa.string()), pa.field("start_ns", pa.int64()), pa.field("end_ns", pa.int64()),
                     pa.field("run_id", pa.string()), pa.field(BUCKET, pa.string()), pa.field(ITERATION, pa.int64()),
                     pa.field("trace_key", pa.uint64()), pa.field("span_key", pa.uint64()),
                     pa.field("parent_key", pa.uint64()), pa.field("trace_low", pa.uint64()),
                     pa.field("status_code", pa.string()),
                     pa.field("status_message", pa.string())])


def goodput_columns(spans: pa.Table) -> pa.Table:
    """The columns the rules read, in one plain schema (so batches from any source concatenate).
    The status is kept only where it is an error (the only status a rule reads), so the spans the
    state holds carry no string per span for it."""
    spans = with_id_keys(spans)
    error = pa.chunked_array([pa.array(error_rows(spans))]) if "status_code" in spans.column_names else None
    columns = []
    for field in _SCHEMA:
        if field.name in spans.column_names:
            column = pc.cast(spans.column(field.name), field.type)
            if field.name in ("status_code", "status_message"):
                column = (pc.if_else(error, column, pa.scalar(None, field.type)) if error is not None
                          else pa.nulls(spans.num_rows, field.type))
            columns.append(column)
        else:
            columns.append(pa.nulls(spans.num_rows, field.type))
    return pa.table(columns, schema=_SCHEMA)


class Walks:
    """Where the walks of unstamped bucketed spans ended: (trace_key, parent_key, trace_low) -> iteration,
    and the walks still waiting for an ancestor that has not arrived."""

    def __init__(self, table: pa.Table) -> None:
        trace = table.column("trace_key").to_numpy().astype(np.uint64)
        low = table.column(TRACE_LOW).to_numpy().astype(np.uint64)
        parent = table.column("parent_key").to_numpy().astype(np.uint64)
        at = table.column("at").to_numpy().astype(np.uint64)
        stamped = valid_rows(table.column(ITERATION))
        iteration = pc.fill_null(table.column(ITERATION), 0).to_numpy().astype(np.int64)
        self.trace, self.parent, self.iteration = trace[stamped], parent[stamped], iteration[stamped]
        self.low = low[stamped]
        waiting = ~stamped & (at != 0)
        self._waiting = partials.AttributionIndex.of(trace[waiting], parent[waiting], low=low[waiting])
        self.waiting = int(waiting.sum())

    def is_waiting(self, spans: pa.Table) -> np.ndarray:
        """Unstamped rows of ``spans`` whose walk waits for an ancestor."""
        trace = pc.fill_null(spans.column("trace_key"), 0).to_numpy().astype(np.uint64)
        parent = pc.fill_null(spans.column("parent_key"), 0).to_numpy().astype(np.uint64)
        low = pc.fill_null(spans.column(TRACE_LOW), 0).to_numpy().astype(np.uint64)
        unstamped = ~valid_rows(spans.column(ITERATION))
        return unstamped & (self._waiting.find(trace, parent, low) >= 0)


def walks(context: pa.Table) -> Walks:
    """The walks of ``context``'s unstamped bucketed spans, climbed as far as ``context`` holds the tree."""
    return Walks(partials.walk_starts(context))


def partial(spans: pa.Table, found: Walks) -> pa.Table:
    """The partial (``PARTIAL_SCHEMA``) of settled ``spans``; their walks' iterations are in ``found``."""
    index = partials.AttributionIndex.of(found.trace, found.parent, found.iteration, found.low)
    return rules.goodput_partial(spans, attributed=index)


def failed(spans: pa.Table, found: Walks) -> Columns | None:
    """Per (run, iteration) the first of settled ``spans`` that fails the step (``rules.failed_spans``;
    their walks' iterations in ``found``), None when no span of the batch ended in error."""
    if not error_rows(spans).any():
        return None
    index = partials.AttributionIndex.of(found.trace, found.parent, found.iteration, found.low)
    return failed_spans([failed_partial(*rules.batch_attribution(spans, attributed=index))])


class Merged:
    """Partials merged as they arrive (the offline engines' accumulator)."""

    def __init__(self) -> None:
        self._accumulator = rules.GoodputAccumulator()

    def add(self, table: pa.Table) -> None:
        self._accumulator.add(table)

    def frame(self) -> pa.Table:
        """``PARTIAL_SCHEMA``: columns kind, run, iteration (null: unstamped), bucket, a, b, count;
        one row per key."""
        return self._accumulator.merged()

    def replace(self, frame: pa.Table) -> None:
        """Keep only ``frame`` (merged rows): what the monitor folds away leaves the state."""
        self._accumulator = rules.GoodputAccumulator()
        self._accumulator.add(partials.partial_table(frame))


def step_documents(frame: pa.Table, run_order: Sequence[str | None]) -> Iterable[dict]:
    """Each step of merged rows ``frame`` as a step of ``goodput --format json``, with ``run_id``."""
    accumulator = rules.GoodputAccumulator()
    accumulator.add(partials.partial_table(frame))
    for run in goodput_document(accumulator.result(run_order))["runs"]:
        for step in run["steps"]:
            yield {"run_id": run["run_id"], **step}

