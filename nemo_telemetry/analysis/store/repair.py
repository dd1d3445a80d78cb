"""``verify`` and ``repair`` of a dataset: which committed files are damaged, which spans are
stored twice, and a new committed state without either.

:func:`verify_dataset` reads every committed file whole (its size, footer, row count and every
page, through the page checksums where the file has them) and counts the spans stored more than
once. :func:`repair_dataset` holds the dataset's lock, drops the damaged files from the commit
record (moved to ``DATASET/_damaged/``, not deleted), rewrites the spans, events and links files
that hold repeats so each span is kept once (its first copy in file order, with the events and
links its writer stored), and commits all of it in one record that adds the new files and
removes the old (``commits.py``): a crash at any moment leaves the state before or after.
"""

from __future__ import annotations

import os
import shlex
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from nemo_telemetry.analysis.model.schema import PARENT_ROW
from nemo_telemetry.analysis.store import commits
from nemo_telemetry.analysis.store.dataset import (SpanDeduplicator, is_dataset, span_keys, write_span_file,
                                                   write_table_file)
from nemo_telemetry.errors import IngestError

__all__ = ["DamagedFile", "VerifyReport", "RepairReport", "verify_dataset", "repair_dataset"]

DAMAGED = "_damaged"  # where repair moves the files it drops (a plain read of the tables skips it)
_REQUIRED = {  # columns without which a file is not one of the table's (a foreign Parquet file)
    "spans": ("trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns"),
    "events": ("trace_id", "span_id"),
    "links": ("trace_id", "span_id"),
}
_ID_TABLES = ("spans", "events", "links")  # rows keyed by (trace id, span id): deduplicated by repair


@dataclass(frozen=True)
class DamagedFile:
    """A committed file that cannot be read as committed, and where its rows came from."""

    path: str  # relative to the dataset
    problem: str
    rows: int | None  # as its commit recorded them (None: a commit that recorded no sizes)
    restore: str | None  # the command that stores its spans again (an ingest's), or None: unknown

    def to_dict(self) -> dict:
        return {"path": self.path, "problem": self.problem, "rows": self.rows, "restore": self.restore}


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_dataset` found. ``ok``: nothing damaged and no span stored twice."""

    root: str
    files: int
    damaged: tuple[DamagedFile, ...]
    duplicate_spans: int  # extra copies of spans stored more than once
    unfinished: int  # ingests or receiver sessions that began and did not finish (readers warn)

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.duplicate_spans

    def to_dict(self) -> dict:
        return {"root": self.root, "ok": self.ok, "files": self.files,
                "damaged": [d.to_dict() for d in self.damaged], "duplicate_spans": self.duplicate_spans,
                "unfinished": self.unfinished}


@dataclass(frozen=True)
class RepairReport:
    """What :func:`repair_dataset` changed: the files dropped (and how to restore their spans),
    the repeats removed, the files rewritten, the committed files renamed into place."""

    root: str
    dropped: tuple[DamagedFile, ...]
    spans_lost: int  # rows of the dropped spans files (as committed)
    duplicates_removed: int  # span copies removed (their events and links with them)
    files_rewritten: int
    renamed: int
    restore: tuple[str, ...] = field(default=())  # commands that store the lost spans again, where known

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.duplicates_removed or self.renamed)

    def to_dict(self) -> dict:
        return {"root": self.root, "changed": self.changed, "dropped": [d.to_dict() for d in self.dropped],
                "spans_lost": self.spans_lost, "duplicates_removed": self.duplicates_removed,
                "files_rewritten": self.files_rewritten, "renamed": self.renamed, "restore": list(self.restore)}


def verify_dataset(root: str | Path) -> VerifyReport:
    """Every committed file of the dataset at ``root`` read whole, and the spans stored twice counted."""
    root = _dataset_root(root)
    state = commits.dataset_state(root, warn=False)
    damaged, intact = _inspect(root, state)
    duplicates = sum(int((~mask).sum()) for mask in _first_copies(root, intact["spans"], by_writer=False).values())
    return VerifyReport(str(root), sum(len(state.recorded(t)) for t in commits.TABLES), damaged, duplicates,
                        len(state.unfinished))


def repair_dataset(root: str | Path) -> RepairReport:
    """Restore the dataset at ``root`` to a consistent committed state, keeping every intact span once.

    Holds the dataset's lock (a writer at work: :class:`~nemo_telemetry.errors.DatasetLockedError`).
    Damaged files leave the commit record (moved to ``_damaged/``); their spans are lost from
    the dataset, and :attr:`RepairReport.restore` says which ingests store them again where the
    record knows. Files holding repeated spans are rewritten without the repeats. One commit
    record makes it all visible at once.
    """
    root = _dataset_root(root)
    writer = f"{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    with commits.DatasetLock(root, command=shlex.join(["nemo-telemetry", "repair", str(root)])):
        own = commits.WriterLock(root, writer)
        try:
            return _repair(root, writer)
        finally:
            own.release()


def _repair(root: Path, writer: str) -> RepairReport:
    before = commits.dataset_state(root, warn=False)
    renamed = len(commits.roll_forward(root, before)) if before.committed is not None else 0
    state, sequence = commits.prepare(root, writer)  # an older dataset's files recorded first; leftovers removed
    damaged, intact = _inspect(root, state)
    removes = [d.path for d in damaged]
    added, sizes, staged = [], {}, []
    duplicates = rewritten = 0
    for table in _ID_TABLES:
        for rel, keep in _first_copies(root, intact[table], by_writer=table != "spans").items():
            if keep.all():
                continue
            if table == "spans":
                duplicates += int((~keep).sum())
            removes.append(rel)
            rewritten += 1
            rows = pq.read_table(root / rel).filter(pa.array(keep))
            if rows.num_rows == 0:
                continue
            new_rel = str(Path(rel).with_name(f"part-{writer}-{len(added) + 1:09d}.parquet"))
            tmp = commits.staging_name(root, root / new_rel, writer)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            if table == "spans":
                write_span_file(rows.drop_columns([PARENT_ROW]), tmp)  # the kept rows' own parent rows
            else:
                write_table_file(rows, tmp)
            added.append(new_rel)
            sizes[new_rel] = commits.file_info(tmp, rows.num_rows)
            staged.append((tmp, root / new_rel))
    if removes or added:
        staging = root / commits.STAGING
        folders = {p for _, final in staged for p in commits.staging_name(root, final, writer).parents
                   if p.is_relative_to(staging)} | {root}
        for path in [tmp for tmp, _ in staged] + sorted(folders):
            commits.fsync_path(path)
        commits.write_record(root, writer, sequence, {
            "kind": "commit", "files": added, "sizes": sizes, "removes": sorted(set(removes)), "source": "repair",
        })
        for tmp, final in staged:
            os.replace(tmp, final)
        commits.remove_empty_folders(root / commits.STAGING / writer)
        _set_aside(root, damaged, [r for r in removes if r not in {d.path for d in damaged}])
    return RepairReport(str(root), damaged, sum(d.rows or 0 for d in damaged if d.path.startswith("spans/")),
                        duplicates, rewritten, renamed,
                        tuple(dict.fromkeys(d.restore for d in damaged if d.restore)))


def _set_aside(root: Path, damaged: tuple[DamagedFile, ...], replaced: list[str]) -> None:
    """After the record that removes them: the damaged files into ``_damaged/``, the replaced ones
    deleted. A crash before this leaves them uncommitted, and the next writer removes them."""
    for item in damaged:
        path = root / item.path
        if path.exists():
            target = root / DAMAGED / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    for rel in replaced:
        (root / rel).unlink(missing_ok=True)


def _dataset_root(root: str | Path) -> Path:
    root = Path(root)
    if not is_dataset(root):
        raise IngestError(f"{root}: not a dataset (no spans/ folder); give the --out folder of an ingest or collect")
    return root


def _inspect(root: Path, state: commits.DatasetState) -> tuple[tuple[DamagedFile, ...], dict[str, list[str]]]:
    """(the damaged committed files, the intact ones per table)."""
    restore = _restore_commands(root)
    damaged, intact = [], {table: [] for table in commits.TABLES}
    for table in commits.TABLES:
        for rel in state.recorded(table):
            info = state.info.get(rel)
            path, problem = commits.inspect_file(root, rel, info)
            found = problem.problem if problem is not None else _read_whole(path, table, info)
            if found is None:
                intact[table].append(rel)
            else:
                damaged.append(DamagedFile(rel, found, int(info[1]) if info else None,
                                           restore.get(_writer_of(Path(rel).name))))
    return tuple(damaged), intact


def _read_whole(path: Path, table: str, info: list | None) -> str | None:
    """What is wrong with a file whose size and footer are as committed: its schema, its row
    count, a page that does not decode or fails its checksum; None when it reads whole."""
    try:
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
        missing = [c for c in _REQUIRED.get(table, ()) if c not in parquet.schema_arrow.names]
        if missing:
            return f"not a {table} file of this dataset (no {', '.join(missing)} column)"
        if info and parquet.metadata.num_rows != int(info[1]):
            return f"{parquet.metadata.num_rows} rows, {info[1]} committed"
        for _ in parquet.iter_batches(batch_size=1 << 16):
            pass
    except (pa.ArrowException, OSError, ValueError) as exc:
        return "unreadable: " + " ".join(str(exc).split())
    return None


def _first_copies(root: Path, files: list[str], *, by_writer: bool) -> dict[str, np.ndarray]:
    """Per file (relative to ``root``), a mask of the rows to keep: each span's first copy in file
    order. ``by_writer`` (events, links): a span's rows from the first writer that stored any for
    it, all of them (a span has several events; its first writer stored them all)."""
    masks: dict[str, np.ndarray] = {}
    seen = SpanDeduplicator()
    groups: dict[str, list[str]] = {}
    for rel in files:
        groups.setdefault((_writer_of(Path(rel).name) or rel) if by_writer else rel, []).append(rel)
    for members in groups.values():
        keyed = [(rel, span_keys(pq.read_table(root / rel, columns=["trace_id", "span_id"]))) for rel in members]
        for rel, keys in keyed:
            masks[rel] = ~seen.contains(keys) if by_writer else seen.admit(_NO_ROWS, keys)
        if by_writer:  # after the whole group: one writer's rows of a span are kept together
            for _, keys in keyed:
                seen.admit(_NO_ROWS, keys)
    return masks


_NO_ROWS = pa.table({})  # admit reads the keys given, not the table


def _writer_of(name: str) -> str | None:
    parts = name.split("-")
    return f"{parts[1]}-{parts[2]}" if name.startswith("part-") and len(parts) >= 4 else None


def _restore_commands(root: Path) -> dict[str, str]:
    """writer -> the ingest command that stores its spans again, for the ingests the record knows."""
    return {writer: shlex.join(["nemo-telemetry", "ingest", *inputs, "--out", str(root)])
            for writer, inputs in commits.ingest_inputs(root).items() if inputs}
