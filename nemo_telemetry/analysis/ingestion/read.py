"""The spans table the in-memory analysis reads, from a dataset directory or raw dump files.

A dataset is read by the store (:func:`~nemo_telemetry.analysis.store.read.read_dataset_spans`);
raw files are decoded here, the one layer that knows both, so that the store never reaches up
into the decoders.
"""

from __future__ import annotations

import pyarrow as pa

from nemo_telemetry.analysis.store.read import READ_COLUMNS, read_dataset_spans, span_source_files

__all__ = ["read_for_analysis"]


def read_for_analysis(source, *, columns: tuple[str, ...] = READ_COLUMNS) -> pa.Table:
    """The spans columns goodput and check need, from a dataset directory or raw dump files.

    A dataset is projected onto ``columns`` (:data:`~nemo_telemetry.analysis.store.read.READ_COLUMNS`:
    what check reads; :data:`~nemo_telemetry.analysis.store.read.GOODPUT_COLUMNS`: what goodput
    reads); raw files are ingested whole in memory.
    """
    root, files = span_source_files(source)
    if not files:
        # The decoders (and the OpenTelemetry SDK they import) only for raw files: start-up time a
        # command over a dataset does not pay.
        from nemo_telemetry.analysis.ingestion.ingest import read_spans

        return read_spans(source)
    return read_dataset_spans(root, files, columns=columns)
