"""Whether a span's parent is remote: a span of another process (its caller), by OTLP's own word.

A span whose parent is not in the data is either lost (a worker whose dump is missing or was not
flushed) or called from a process whose spans were never part of the data (an uninstrumented
client, another team's service). OTLP says which: the span's ``flags`` carry the parent's
is-remote bit when the exporter set the has-is-remote bit beside it; without it, a server or
consumer span's parent is remote by the kind's definition. ``check`` (``remote-parent``) and the
waterfall (``parent_is_remote``) read this one test.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.schema import REMOTE_PARENT_KINDS

__all__ = ["HAS_IS_REMOTE", "IS_REMOTE", "parent_is_remote"]

HAS_IS_REMOTE = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: the exporter says whether the parent is remote
IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK: it is


def parent_is_remote(table: pa.Table, rows: np.ndarray | None = None) -> np.ndarray:
    """Per row of ``table`` (or of ``rows``, when given): is the span's parent remote? By its
    ``flags`` where they say, else by its ``kind`` (server, consumer); False where the table has
    neither column."""
    n = table.num_rows if rows is None else len(rows)
    out = np.zeros(n, dtype=bool)
    if n == 0:
        return out
    picked = table if rows is None else table.take(pa.array(rows, pa.int64()))
    if "kind" in picked.column_names:
        kinds = picked.column("kind").cast(pa.string())
        out = pc.fill_null(pc.is_in(kinds, value_set=pa.array(REMOTE_PARENT_KINDS, pa.string())), False)
        out = np.asarray(out.to_numpy(zero_copy_only=False), dtype=bool)
    if "flags" in picked.column_names:
        flags = pc.fill_null(picked.column("flags").cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
        said = (flags & HAS_IS_REMOTE) != 0
        out = np.where(said, (flags & IS_REMOTE) != 0, out)
    return out
