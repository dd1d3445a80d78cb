"""The spans dataset's partition layout: by run (``nemo.run.id``), then by rank (``nv.dl.rank``).

::

    DATASET/spans/run_id=<run id, URI-escaped>/rank=<rank>/part-*.parquet

A value that is missing is written as ``__HIVE_DEFAULT_PARTITION__`` (hive's name for null).
Every file still holds every column, so the folder names only serve pruning and splitting the
work: the local out-of-core engine walks the files one at a time, the Ray engine hands groups of them to Ray tasks.
Datasets written before the rank level existed (``run_id=<run>/part-*.parquet``) read the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from nemo_telemetry.analysis.model.columns import valid_rows
from nemo_telemetry.analysis.store.commits import dataset_state

__all__ = ["NO_VALUE", "Partition", "partition_folder", "split_by_partition", "span_partitions", "span_files"]

NO_VALUE = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class Partition:
    """One (run, rank) folder of the spans table and its files (sorted)."""

    run_id: str | None
    rank: int | None
    files: tuple[Path, ...]

    @property
    def bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def partition_folder(run_id: str | None, rank: int | None) -> str:
    """``run_id=<run>/rank=<rank>``, relative to ``DATASET/spans``."""
    run = NO_VALUE if run_id is None else quote(run_id, safe="")
    return f"run_id={run}/rank={NO_VALUE if rank is None else int(rank)}"


def split_by_partition(spans: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    """(folder, rows) for each (run, rank) present in ``spans``, rows in their order.

    Spans arrive in runs of one resource (a request), so each partition is a few slices of
    ``spans`` put together without copying, rather than a gather of every column.
    """
    if spans.num_rows == 0:
        return
    run = spans.column("run_id").combine_chunks()
    if pa.types.is_dictionary(run.type):
        run = run.dictionary_decode()
    encoded = pc.dictionary_encode(run)
    run_codes = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    runs = encoded.dictionary.to_pylist()
    rank_valid = valid_rows(spans.column("rank"))
    rank = pc.fill_null(spans.column("rank"), 0).to_numpy().astype(np.int64)
    rank = np.where(rank_valid, rank, np.iinfo(np.int64).min)  # null rank: its own partition
    starts = np.concatenate(([0], np.flatnonzero((run_codes[1:] != run_codes[:-1]) | (rank[1:] != rank[:-1])) + 1))
    stops = np.append(starts[1:], len(rank))
    segment_run, segment_rank = run_codes[starts], rank[starts]
    order = np.lexsort((segment_rank, segment_run))  # stable: a partition's slices stay in order
    key_run, key_rank = segment_run[order], segment_rank[order]
    cuts = np.flatnonzero((key_run[1:] != key_run[:-1]) | (key_rank[1:] != key_rank[:-1])) + 1
    for group in np.split(order, cuts):
        code, value = int(segment_run[group[0]]), int(segment_rank[group[0]])
        folder = partition_folder(runs[code] if code >= 0 else None,
                                  None if value == np.iinfo(np.int64).min else value)
        part = pa.concat_tables([spans.slice(int(starts[g]), int(stops[g] - starts[g])) for g in group])
        yield folder, _own_dictionary(part, "run_id")


def _own_dictionary(part: pa.Table, column: str) -> pa.Table:
    """``part`` with ``column`` re-encoded to the values it holds: Parquet keeps a dictionary
    whole, and a reader orders runs by first appearance in the dictionaries it reads."""
    index = part.schema.get_field_index(column)
    values = part.column(column)
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    encoded = pc.dictionary_encode(values.combine_chunks()).cast(part.schema.field(index).type)
    return part.set_column(index, part.schema.field(index), encoded)


def _value(folder_name: str) -> str | None:
    value = folder_name.split("=", 1)[1] if "=" in folder_name else folder_name
    return None if value == NO_VALUE else unquote(value)


def span_partitions(root: Path, *, run_id: str | None = None) -> list[Partition]:
    """The (run, rank) partitions of a dataset's committed spans files, sorted by folder; ``run_id``
    prunes. Warns (:class:`~nemo_telemetry.errors.IncompleteDatasetWarning`) when an ingest did not finish."""
    by_folder: dict[Path, list[Path]] = {}
    for rel, path in dataset_state(root).placed("spans"):  # a file still staged: its folder is its recorded one
        by_folder.setdefault(Path(rel).parent, []).append(path)
    out = []
    for folder, files in sorted(by_folder.items()):
        parts = dict(p.split("=", 1) for p in folder.relative_to("spans").parts if "=" in p)
        run = _value(f"run_id={parts['run_id']}") if "run_id" in parts else None
        if run_id is not None and run != run_id:
            continue
        rank = _value(f"rank={parts['rank']}") if "rank" in parts else None
        out.append(Partition(run, int(rank) if rank is not None else None, tuple(files)))
    return out


def span_files(root: Path, *, run_id: str | None = None) -> list[Path]:
    """Every spans file of the dataset, in the order ``read_dataset`` reads them."""
    files = [f for p in span_partitions(root, run_id=run_id) for f in p.files]
    return sorted(files, key=str)
