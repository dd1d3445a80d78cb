"""The read seam: every way spans become the one structure the rules read.

ingest -> store -> **decode** -> rules (goodput, findings) -> engines -> views. The rules take a
:class:`SpanArrays` and never learn which strategy built it (:mod:`decode.strategies`; goodput by
step decodes only the rows it sums, :mod:`decode.rows`);
:func:`reference_arrays` builds the same structure row by row, plainly, for the tests to compare
every strategy with. How much of the machine a decode uses comes from one
:class:`~nemo_telemetry.analysis.settings.machine.ReadSettings`.
"""

from nemo_telemetry.analysis.decode.reference import reference_arrays
from nemo_telemetry.analysis.decode.rows import WALK_READ, KeptRows, file_rows, kept_rows, table_rows
from nemo_telemetry.analysis.decode.spans import (
    BUCKETS, NO_BUCKET, RUN_RESOURCES, SPAN_GROUPS_ATTRIBUTE, UNKNOWN_BUCKET, Later, Parents, RunPairs, SpanArrays,
)
from nemo_telemetry.analysis.decode.strategies import FileParents, SpanReader, index_parents, rows_arrays, span_arrays

__all__ = ["BUCKETS", "NO_BUCKET", "UNKNOWN_BUCKET", "RUN_RESOURCES", "SPAN_GROUPS_ATTRIBUTE", "Later", "Parents",
           "RunPairs", "SpanArrays", "FileParents", "SpanReader", "rows_arrays", "span_arrays", "index_parents",
           "reference_arrays", "WALK_READ", "KeptRows", "file_rows", "kept_rows", "table_rows"]
