"""A span's OTLP status as the rules read it: which rows ended in error, and what they said.

A failed step (goodput and the ``failed-step`` finding) is decided from the ``status_code``
column alone, read through the same projection as every other column (:mod:`store.read`); the
``status_message`` of the few rows a finding quotes is taken at those rows only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from nemo_telemetry.analysis.model.columns import code_mask, column_codes

__all__ = ["STATUS_ERROR", "error_rows", "status_messages"]

STATUS_ERROR = "error"  # the status_code value ingest writes for STATUS_CODE_ERROR (model.schema.STATUS_CODES)


def error_rows(table: pa.Table) -> np.ndarray:
    """Mask of the rows whose ``status_code`` is error (none where the table has no such column)."""
    codes, values = column_codes(table, "status_code")
    if STATUS_ERROR not in values:
        return np.zeros(table.num_rows, dtype=bool)
    return code_mask(codes, [values.index(STATUS_ERROR)], len(values))


def status_messages(table: pa.Table, rows: np.ndarray) -> list[str | None]:
    """The ``status_message`` of each of ``rows`` (None where unset or not read)."""
    if "status_message" not in table.column_names or len(rows) == 0:
        return [None] * len(rows)
    taken = table.column("status_message").take(pa.array(np.asarray(rows, np.int64), pa.int64()))
    if pa.types.is_dictionary(taken.type):
        taken = taken.cast(pa.string())
    return [m if m else None for m in taken.to_pylist()]
