"""Following a dump directory that running processes are writing: new files, appended lines, rotation.

Each poll reads what was added since the last one. A JSON-lines file is read from where the last
poll stopped; a last line without its newline is the writer mid-line, so it waits for the next
poll (and only at :meth:`DumpFollower.close` counts as truncated). Files are known by device and
inode, so a rotated file (renamed, then a new one at the old name) is read on from where it was,
and the new one from its start; a file that shrank (truncated in place) is read again from its
start, its spans already seen dropped as duplicates. Compressed and protobuf files are read
whole once their size held still for one poll. Lines go through the ingest pipeline: a bad line
is rejected alone, counted and named (``file:line``), as ``ingest`` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from nemo_telemetry.analysis.ingestion._columns import OtlpTables
from nemo_telemetry.analysis.ingestion._detect import classify_json_line, iter_records
from nemo_telemetry.analysis.ingestion.ingest import IngestPipeline
from nemo_telemetry.analysis.store.dataset import RecentSpanDeduplicator
from nemo_telemetry.errors import IngestError

__all__ = ["DumpFollower", "FollowCounts"]

_WHOLE_SUFFIXES = (".gz", ".zst", ".zstd")
_READ_BYTES = 8 << 20  # per file per poll: a large backlog is read over several polls


@dataclass
class _Followed:
    path: Path
    offset: int = 0
    line: int = 1  # number of the next line to start
    tail: bytes = b""  # a line still being written
    whole: bool | None = None  # None: not decided (empty so far); True: read once when stable
    size_seen: int = -1
    done: bool = False


@dataclass(frozen=True)
class FollowCounts:
    """What following has read so far."""

    files: int
    spans: int
    duplicates_dropped: int
    rejected_records: int
    skipped_records: int
    warnings: tuple[str, ...]


@dataclass
class DumpFollower:
    """Reads the OTLP dumps under ``root`` as they grow; :meth:`poll` returns the new spans. A ``root``
    that does not exist yet is waited for (a monitor may start before the run makes its directory)."""

    root: Path
    _files: dict = field(default_factory=dict)  # (dev, inode) -> _Followed
    _out: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise IngestError(f"{self.root}: not a directory; --follow takes the dump directory the run writes")
        self._pipeline = IngestPipeline(sink=self._keep, dedup=RecentSpanDeduplicator(), decode_ahead=0)

    def _keep(self, tables: OtlpTables) -> OtlpTables:
        if tables.spans.num_rows:
            self._out.append(tables.spans)
        return tables

    def poll(self) -> pa.Table | None:
        """The spans added since the last poll (None when there are none)."""
        seen = set()
        for path in self._paths():
            try:
                stat = path.stat()
            except OSError:  # gone between the listing and the stat
                continue
            key = (stat.st_dev, stat.st_ino)
            seen.add(key)
            followed = self._files.setdefault(key, _Followed(path))
            followed.path = path
            self._read(followed, stat.st_size)
        for key in [k for k in self._files if k not in seen]:
            del self._files[key]
        return self._take()

    def close(self) -> pa.Table | None:
        """The last spans: a line left without its newline is rejected as truncated."""
        for followed in self._files.values():
            if followed.tail:
                self._line(followed, followed.tail)
                followed.tail = b""
        return self._take()

    def counts(self) -> FollowCounts:
        c = self._pipeline.counts
        return FollowCounts(len(self._files), c["spans"], c["duplicates_dropped"], c["rejected_records"],
                            c["skipped_records"], tuple(self._pipeline.warnings))

    def _paths(self) -> list[Path]:
        out = []
        for folder, dirs, names in os.walk(self.root):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            out.extend(Path(folder) / n for n in sorted(names) if not n.startswith("."))
        return out

    def _take(self) -> pa.Table | None:
        self._pipeline.flush()
        if not self._out:
            return None
        spans, self._out = pa.concat_tables(self._out, promote_options="permissive"), []
        return spans

    def _read(self, followed: _Followed, size: int) -> None:
        if followed.done:
            return
        if size < followed.offset:  # truncated in place: read it again
            followed.offset, followed.line, followed.tail = 0, 1, b""
        if followed.whole is None and size:
            followed.whole = followed.path.suffix in _WHOLE_SUFFIXES or not self._starts_json(followed.path)
        if followed.whole:
            if size == followed.size_seen:
                followed.done = True
                for record in iter_records(followed.path):
                    self._pipeline.add_record(record.kind, record.where, record.payload)
            followed.size_seen = size
            return
        if size == followed.offset:
            return
        with open(followed.path, "rb") as handle:
            handle.seek(followed.offset)
            data = handle.read(_READ_BYTES)
        followed.offset += len(data)
        data = followed.tail + data
        cut = data.rfind(b"\n") + 1
        followed.tail = data[cut:]
        for line in data[:cut].splitlines(keepends=True):
            self._line(followed, line)

    def _line(self, followed: _Followed, line: bytes) -> None:
        where = f"{followed.path}:{followed.line}"
        followed.line += 1
        if not line.strip():
            return
        record = classify_json_line(line, where)
        self._pipeline.add_record(record.kind, record.where, record.payload)

    @staticmethod
    def _starts_json(path: Path) -> bool:
        with open(path, "rb") as handle:
            head = handle.read(64).lstrip()
        return head[:1] in (b"{", b"[") or not head
