"""The read of only the rows a rule sums, for goodput by step: the spans with an ``rl.bucket`` and
those whose name a regex picks (step and job spans), every column read, plus what the walks of
unstamped bucketed spans need of every other row (:data:`WALK_READ`). A few percent of a run's
spans: the per-prompt and worker spans without a bucket are only walked through, so their columns
are never decoded (:class:`KeptRows`, decoded by the caller with
:func:`~nemo_telemetry.analysis.decode.span_arrays`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import code_mask, code_values, filled, valid_rows
from nemo_telemetry.analysis.model.schema import BUCKET, ITERATION
from nemo_telemetry.analysis.settings.machine import ReadSettings
from nemo_telemetry.analysis.store.read import scan_span_files

__all__ = ["WALK_READ", "KeptRows", "kept_rows", "table_rows", "file_rows"]

WALK_READ = ("trace_key", "span_key", "parent_key", "trace_low", ITERATION)
"""What the walks of unstamped bucketed spans read of every row (:func:`file_rows` keeps them)."""


@dataclass(frozen=True, eq=False)
class KeptRows:
    """What a rule reads of a spans table: the rows it decodes, and what the walks need."""

    rows: pa.Table  # the bucketed spans and those named as asked (kept_rows), every column read
    position: np.ndarray  # their row numbers in the whole table
    run_order: tuple  # the whole table's runs, in code_values order
    walk_table: Callable[[], pa.Table]  # every row's id keys and rl.iteration, for walks that leave ``rows``


def kept_rows(spans: pa.Table, names: str) -> np.ndarray:
    """The rows with an ``rl.bucket`` or a name matching the regex ``names``, ascending."""
    mask = np.zeros(spans.num_rows, dtype=bool)
    if BUCKET in spans.column_names:
        mask |= valid_rows(spans.column(BUCKET))
    if "name" in spans.column_names:
        at = 0
        for chunk in spans.column("name").chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = pc.dictionary_encode(chunk)
            # each dictionary entry decided once, then the rows by their indices: a few comparisons
            # (code_mask), where Arrow's take of the decisions goes bit by bit
            named = np.flatnonzero(pc.fill_null(pc.match_substring_regex(chunk.dictionary, names), False)
                                   .to_numpy(zero_copy_only=False))
            if len(named):
                mask[at:at + len(chunk)] |= code_mask(filled(chunk.indices, -1), named, len(chunk.dictionary))
            at += len(chunk)
    return np.flatnonzero(mask)


def _take(spans: pa.Table, rows: np.ndarray) -> pa.Table:
    """``spans.take(rows)`` (``rows`` sorted) batch by batch: no column is concatenated whole first."""
    batches, at = [], 0
    for batch in spans.to_batches():
        lo, hi = np.searchsorted(rows, [at, at + batch.num_rows])
        if hi > lo:
            batches.append(batch.take(pa.array(rows[lo:hi] - at, pa.int64())))
        at += batch.num_rows
    return pa.Table.from_batches(batches, schema=spans.schema) if batches else spans.slice(0, 0)


def table_rows(spans: pa.Table, names: str) -> KeptRows:
    """:class:`KeptRows` of a table in memory."""
    position = kept_rows(spans, names)
    return KeptRows(_take(spans, position), position, code_values(spans, "run_id"), lambda: spans)


def file_rows(files: list[str], columns: tuple[str, ...], names: str, *,
              prepare: Callable[[pa.Table], pa.Table] = lambda batch: batch,
              settings: ReadSettings | None = None, batch_rows: int | None = None) -> KeptRows | None:
    """:class:`KeptRows` of a dataset's spans files, read batch by batch (``batch_rows``, else the
    settings'): each batch, as ``prepare`` gives it (the rule's own fill-ins, such as step
    numbers), keeps its rows of :func:`kept_rows` and its walk columns (:data:`WALK_READ`); the
    rest of it is let go.

    None when the files hold no spans: the caller reads them whole.
    """
    if batch_rows is None and settings is not None:
        batch_rows = settings.batch_rows
    rows: list[pa.RecordBatch] = []
    position: list[np.ndarray] = []
    kept: list[pa.RecordBatch] = []
    runs: dict[str, int] = {}
    at = 0
    for batch in scan_span_files(files, columns=columns, batch_rows=batch_rows,
                                 threads=settings.threads if settings is not None else None):
        one = prepare(pa.Table.from_batches([batch]))
        batch = one.to_batches()[0] if one.num_rows else batch
        for value in code_values(one, "run_id"):  # the whole table's run order, as code_values gives it
            runs.setdefault(value, len(runs))
        picked = kept_rows(one, names)
        rows.append(batch.take(pa.array(picked, pa.int64())))
        position.append(picked + at)
        kept.append(batch.select([c for c in WALK_READ if c in batch.schema.names]))
        at += batch.num_rows
    if not kept:
        return None
    return KeptRows(pa.Table.from_batches(rows), np.concatenate(position), tuple(runs),
                    lambda: pa.Table.from_batches(kept))
