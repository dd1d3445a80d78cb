"""A span's OTLP status as the rules read it: which rows ended in error, and what they said.

A failed step (goodput and the ``failed-step`` finding) is decided from the ``status_code``
column alone, read through the same projection as every other column (:mod:`store.read`); the
``status_message`` of the few rows a finding quotes is taken at those rows only.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import code_mask, filled

__all__ = ["STATUS_ERROR", "error_rows", "status_messages"]

STATUS_ERROR = "error"  # the status_code value ingest writes for STATUS_CODE_ERROR (model.schema.STATUS_CODES)


def error_rows(table: pa.Table) -> np.ndarray:
    """Mask of the rows whose ``status_code`` is error (none where the table has no such column)."""
    out = np.zeros(table.num_rows, dtype=bool)
    if "status_code" not in table.column_names:
        return out
    at = 0
    for chunk in table.column("status_code").chunks:  # each chunk on its own dictionary: no codes mapped
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        error = [i for i, value in enumerate(chunk.dictionary.to_pylist()) if value == STATUS_ERROR]
        if error:  # a chunk whose dictionary has no error holds none (most of them)
            out[at:at + len(chunk)] = code_mask(filled(chunk.indices, -1), error, len(chunk.dictionary))
        at += len(chunk)
    return out


def status_messages(table: pa.Table, rows: np.ndarray) -> list[str | None]:
    """The ``status_message`` of each of ``rows`` (None where unset or not read)."""
    if "status_message" not in table.column_names or len(rows) == 0:
        return [None] * len(rows)
    taken = table.column("status_message").take(pa.array(np.asarray(rows, np.int64), pa.int64()))
    if pa.types.is_dictionary(taken.type):
        taken = taken.cast(pa.string())
    return [m if m else None for m in taken.to_pylist()]
