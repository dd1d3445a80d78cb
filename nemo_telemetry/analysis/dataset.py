"""The Parquet dataset on disk: writing batches (deduplicated) and reading tables back.

Layout::

    DATASET/spans/run_id=<run id, URI-escaped>/rank=<rank>/part-*.parquet
                                        (hive style, see partitions.py; a missing run id or rank
                                         is written __HIVE_DEFAULT_PARTITION__)
    DATASET/events/part-*.parquet
    DATASET/links/part-*.parquet

Every file holds every column of its table (the partition column too), so a file is readable
on its own and the directory names only serve pruning. Writing and reading stay in this one
module so that finer partitioning (rank, time window) changes one place.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from nemo_telemetry.analysis._columns import SPANS_TABLE_SCHEMA, OtlpTables
from nemo_telemetry.analysis.partitions import split_by_partition
from nemo_telemetry.analysis.schema import EVENTS_SCHEMA, LINKS_SCHEMA
from nemo_telemetry.analysis.tree import hex_to_uint64
from nemo_telemetry.errors import IngestError

__all__ = [
    "DatasetWriter",
    "SpanDeduplicator",
    "is_dataset",
    "read_dataset",
    "NO_RUN_PARTITION",
]

NO_RUN_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_SCHEMAS = {"spans": SPANS_TABLE_SCHEMA, "events": EVENTS_SCHEMA, "links": LINKS_SCHEMA}


def is_dataset(path: Path) -> bool:
    """A directory ingest wrote (it has a ``spans/`` folder)."""
    return Path(path).is_dir() and (Path(path) / "spans").is_dir()


def read_dataset(root: Path, table: str = "spans", *, columns: list[str] | None = None) -> pa.Table:
    """One table of the dataset at ``root`` (empty with the right schema when it has no rows)."""
    schema = _SCHEMAS[table]
    files = sorted(str(p) for p in (Path(root) / table).rglob("*.parquet"))
    if not files:
        empty = schema.empty_table()
        return empty.select(columns) if columns else empty
    try:
        dataset = ds.dataset(files, format="parquet", schema=schema)
        return dataset.to_table(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise IngestError(f"{root}: cannot read the {table} table ({exc}); re-run ingest") from None


class SpanDeduplicator:
    """Remembers every (trace id, span id) admitted and drops repeats, across batches.

    Keys are the 24 raw id bytes, kept sorted in one numpy array, so a batch costs a sort of
    the batch and a binary search; ids that are not 32/16 hex digits are keyed on their hex.
    """

    def __init__(self) -> None:
        self._seen = np.zeros(0, dtype="S24")

    def remember(self, spans: pa.Table) -> None:
        """Add the keys of spans already stored (an existing dataset) without filtering."""
        keys = np.unique(_keys(spans))
        self._seen = np.unique(np.concatenate([self._seen, keys]))

    def admit(self, spans: pa.Table) -> np.ndarray:
        """Boolean mask of the rows of ``spans`` not seen before (first of repeats in a batch)."""
        keys = _keys(spans)
        if keys.size == 0:
            return np.zeros(0, dtype=bool)
        unique, first = np.unique(keys, return_index=True)
        pos = np.searchsorted(self._seen, unique)
        known = np.zeros(unique.size, dtype=bool)
        inside = pos < self._seen.size
        known[inside] = self._seen[pos[inside]] == unique[inside]
        fresh = unique[~known]
        self._seen = np.insert(self._seen, pos[~known], fresh)
        mask = np.zeros(keys.size, dtype=bool)
        mask[first[~known]] = True
        return mask


def _keys(spans: pa.Table) -> np.ndarray:
    if spans.num_rows == 0:
        return np.zeros(0, dtype="S24")
    trace = spans.column("trace_id").combine_chunks()
    if "trace_key" in spans.column_names:  # ingest's own tables carry the first halves already
        hi = pc.fill_null(spans.column("trace_key"), 0).to_numpy().astype(np.uint64)
        span = pc.fill_null(spans.column("span_key"), 0).to_numpy().astype(np.uint64)
    else:
        hi, span = hex_to_uint64(trace), hex_to_uint64(spans.column("span_id"))
    lo = hex_to_uint64(pc.utf8_slice_codeunits(trace, 16, 32))
    packed = np.stack([hi, lo, span], axis=1).astype(">u8")
    keys = np.ascontiguousarray(packed).view("S24").ravel()
    exact = pc.and_(pc.equal(pc.utf8_length(trace), 32), pc.equal(pc.utf8_length(spans.column("span_id")), 16))
    if not pc.all(exact).as_py():  # odd ids: key on their text so distinct ones stay distinct
        text = pc.binary_join_element_wise(trace, spans.column("span_id").combine_chunks(), "/")
        odd = np.asarray(pc.invert(exact).to_numpy(zero_copy_only=False))
        digest = [hashlib.blake2b(s.encode(), digest_size=8).digest() for s in text.filter(pa.array(odd)).to_pylist()]
        keys = keys.astype("S24")
        keys[odd] = [b"\xff" * 16 + d for d in digest]
    return keys


class DatasetWriter:
    """Appends batches to a dataset directory; re-ingesting a span already there is a no-op."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise IngestError(f"{self.root}: exists and is not a directory; choose another --out")
        for table in _SCHEMAS:
            (self.root / table).mkdir(parents=True, exist_ok=True)
        self._prefix = f"part-{time.time_ns()}-{uuid.uuid4().hex[:8]}"
        self._sequence = 0
        self.dedup = SpanDeduplicator()
        self.dedup.remember(read_dataset(self.root, "spans", columns=["trace_id", "span_id", "trace_key", "span_key"]))

    def write(self, tables: OtlpTables) -> OtlpTables:
        """Write the spans not seen before (and their events and links); return what was written."""
        fresh = drop_duplicates(tables, self.dedup)
        self._sequence += 1
        name = f"{self._prefix}-{self._sequence:05d}.parquet"
        self._write_spans(fresh.spans, name)
        for table, data in (("events", fresh.events), ("links", fresh.links)):
            if data.num_rows:
                pq.write_table(data, self.root / table / name)
        return fresh

    def _write_spans(self, spans: pa.Table, name: str) -> None:
        if spans.num_rows == 0:
            return
        for relative, part in split_by_partition(spans):  # run_id=<run>/rank=<rank> (partitions.py)
            folder = self.root / "spans" / relative
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, folder / name)


def drop_duplicates(tables: OtlpTables, dedup: SpanDeduplicator) -> OtlpTables:
    """``tables`` without spans ``dedup`` has seen (and without those spans' events and links)."""
    mask = dedup.admit(tables.spans)
    if mask.all():
        return tables
    spans = tables.spans.filter(pa.array(mask))
    return OtlpTables(spans, _owned_by(tables.events, spans), _owned_by(tables.links, spans))


def _owned_by(table: pa.Table, spans: pa.Table) -> pa.Table:
    """Rows of an events/links table whose span is in ``spans`` (all rows are new then)."""
    if table.num_rows == 0:
        return table
    # The duplicate spans' events were stored with them the first time: keep only
    # rows whose span row survived, matched on (trace_id, span_id).
    owners = pc.binary_join_element_wise(spans.column("trace_id"), spans.column("span_id"), "/")
    keys = pc.binary_join_element_wise(table.column("trace_id"), table.column("span_id"), "/")
    return table.filter(pc.is_in(keys, value_set=owners.combine_chunks()))
