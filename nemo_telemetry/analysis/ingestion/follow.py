"""Following a dump directory that running processes are writing: new files, appended data, rotation.

Each poll reads what every file gained since the last one, whatever its format: JSON lines,
OTLP/JSON documents (pretty-printed or not), length-prefixed protobuf, each optionally gzip or
zstd compressed. What is read goes through ingest's own readers and decoders (the blocks of lines
and of frames ``ingest`` builds, the same bound, the same names for what it rejects), so at the
end the spans equal what ``ingest`` reads from the final files.

- A record cut by a poll (a line without its newline, a frame short of its length, a document
  that does not parse yet) waits for the next poll; only :meth:`DumpFollower.close` judges it.
- A file is known by device and inode, and by a fingerprint: its first bytes and the bytes just
  before where reading stopped. A rotated file (renamed) is read on from where it was; a file
  whose fingerprint changed (truncated, rewritten in place, or a reused inode) is read again from
  its start, the spans already seen dropped as duplicates.
- A compressed file is inflated incrementally, its decompressor kept between polls: each poll
  costs what the file gained, not its whole length, and a stream cut mid-block (a streaming
  compressor's flush) continues on the next poll. Re-decoding from the start would cost the
  whole file every poll. The output of one step is bounded (gzip by ``max_length``; zstd by
  feeding 1 KiB of input at a time: a zstd block inflates to at most 128 KiB and takes at
  least 4 bytes, so a step yields at most about 32 MiB).
- A line, frame or document longer than the bound (``collect``'s, ``max_record_bytes``) is
  rejected and named, never held whole; the rest of the file is followed.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pyarrow as pa
import zstandard

from nemo_telemetry.analysis.ingestion._columns import OtlpTables
from nemo_telemetry.analysis.ingestion._detect import (
    DEFAULT_MAX_REQUEST_BYTES,
    Record,
    classify_document,
    format_of_head,
    frame_size,
    is_bare_request,
    signals_of_head,
    json_lines_block,
    over_bound,
    split_frames,
    truncated_frame,
)
from nemo_telemetry.analysis.ingestion.ingest import IngestPipeline
from nemo_telemetry.analysis.store.dataset import RecentSpanDeduplicator
from nemo_telemetry.errors import IngestError

__all__ = ["DumpFollower", "FollowCounts"]

_READ_BYTES = 8 << 20  # raw bytes per file per poll: a large backlog is read over several polls
_HEAD_BYTES = 4096  # the fingerprint's first bytes: past the resource, into the first span's ids
_LAST_BYTES = 64  # and the bytes just before where reading stopped
_DETECT_BYTES = 1 << 16  # a head this long decides the format even without a newline
_PROCESS_BYTES = 1 << 20  # inflated bytes gathered before they are split into records
_GZIP_STEP = 1 << 20  # most bytes one gzip step inflates to
_GZIP_STEP_IN = 1 << 16  # compressed bytes fed at a time: the input left over is copied once per step
_ZSTD_STEP_IN = 1 << 10  # compressed bytes one zstd step is fed
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class _Inflater:
    """Incremental decompression of a growing gzip or zstd file, in bounded steps; every member
    or frame in turn (a file may hold several)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._pending = b""  # the start of a gzip member too short to begin
        self._started = False  # input went into the current member or frame
        self._object = self._new()

    def _new(self):
        if self.kind == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return zstandard.ZstdDecompressor().decompressobj()

    @property
    def at_boundary(self) -> bool:
        """Whether the input so far ends where a member or frame ends (nothing cut)."""
        return not self._started and not self._pending

    def feed(self, data: bytes):
        """The inflated pieces of ``data`` (which follows what was fed before), each bounded.
        Raises ``zlib.error`` / ``zstandard.ZstdError`` on corrupt input."""
        data, self._pending = self._pending + data, b""
        step = _GZIP_STEP_IN if self.kind == "gzip" else _ZSTD_STEP_IN
        while data:
            if self.kind == "gzip" and not self._started:
                data = data.lstrip(b"\0")  # zero padding between members, as gzip allows
                if len(data) < 2:
                    self._pending = data
                    return
            chunk, data = data[:step], data[step:]
            self._started = True
            while chunk:
                if self.kind == "gzip":
                    piece = self._object.decompress(chunk, _GZIP_STEP)
                    chunk = self._object.unconsumed_tail
                else:
                    piece, chunk = self._object.decompress(chunk), b""
                if piece:
                    yield piece
                if self._object.eof:  # what follows is the next member or frame
                    data = self._object.unused_data + data
                    self._object, self._started = self._new(), False
                    break


@dataclass
class _Followed:
    path: Path
    head: bytes = b""  # the file's first raw bytes: its fingerprint
    last: bytes = b""  # the raw bytes just before ``offset``
    offset: int = 0  # raw bytes read
    seen: tuple = ()  # (size, mtime_ns) when last read
    inflater: _Inflater | None = None
    compression: str | None = None  # None: not decided; "": plain
    fmt: str | None = None  # jsonl, proto, bare, json; None: not decided; "done": nothing more to read
    spans: bool = True  # False: protobuf of metrics or logs only, its requests counted, not decoded
    pending: bytearray = field(default_factory=bytearray)  # inflated bytes not yet taken as records
    number: int = 1  # the line or record number of ``pending[0]``
    base: int = 0  # the inflated offset of ``pending[0]``
    skip_line: bool = False  # reading past a line over the bound
    skip_bytes: int = 0  # reading past a frame over the bound


@dataclass(frozen=True)
class FollowCounts:
    """What following has read so far. ``reread_files``: files read again from their start
    because their identity changed (truncated, rewritten, a reused inode)."""

    files: int
    spans: int
    duplicates_dropped: int
    rejected_records: int
    skipped_records: int
    warnings: tuple[str, ...]
    reread_files: int = 0
    skipped_files: int = 0


@dataclass
class DumpFollower:
    """Reads the OTLP dumps under ``root`` as they grow; :meth:`poll` returns the new spans. A ``root``
    that does not exist yet is waited for (a monitor may start before the run makes its directory).
    ``max_record_bytes``: the bound on one line, frame or document, once inflated."""

    root: Path
    max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    _files: dict = field(default_factory=dict)  # (dev, inode) -> _Followed
    _out: list = field(default_factory=list)
    _reread: int = 0
    _bytes_read: int = 0
    behind: bool = field(default=False, init=False)  # whether the last poll left bytes the files held unread

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if self.root.exists() and not self.root.is_dir():
            raise IngestError(f"{self.root}: not a directory; --follow takes the dump directory the run writes")
        if not self.max_record_bytes > 0:
            raise IngestError(f"max_record_bytes={self.max_record_bytes!r}: give a number of bytes > 0")
        self._pipeline = IngestPipeline(sink=self._keep, dedup=RecentSpanDeduplicator(), decode_ahead=0,
                                        max_record_bytes=self.max_record_bytes)

    def _keep(self, tables: OtlpTables) -> OtlpTables:
        if tables.spans.num_rows:
            self._out.append(tables.spans)
        return tables

    def poll(self) -> pa.Table | None:
        """The spans added since the last poll (None when there are none); :attr:`behind` says
        whether it read less than the files held (a backlog: poll again without waiting)."""
        self.behind = self._poll_once()
        return self._take()

    def close(self) -> pa.Table | None:
        """The last spans: what is left unread is read, then each record still cut is judged as
        ``ingest`` judges the end of a file (a last line without its newline is decoded when it
        parses, a truncated frame or document is rejected)."""
        held = sum(self._sizes())  # what the files hold now; a writer still going is not chased
        start = self._bytes_read
        while self._poll_once() and self._bytes_read - start < held:
            pass
        for followed in self._files.values():
            self._finish(followed)
        return self._take()

    def counts(self) -> FollowCounts:
        c = self._pipeline.counts
        return FollowCounts(len(self._files), c["spans"], c["duplicates_dropped"], c["rejected_records"],
                            c["skipped_records"], tuple(self._pipeline.warnings), self._reread, c["skipped_files"])

    # -- reading -----------------------------------------------------------------------------

    def _poll_once(self) -> bool:
        """Read what every file gained (up to ``_READ_BYTES`` each); whether any read stopped short."""
        seen, more = set(), False
        for path in self._paths():
            try:
                stat = path.stat()
            except OSError:  # gone between the listing and the stat
                continue
            key = (stat.st_dev, stat.st_ino)
            seen.add(key)
            followed = self._files.setdefault(key, _Followed(path))
            followed.path = path
            if followed.seen != (stat.st_size, stat.st_mtime_ns):
                more |= self._read(key, followed)
        for key in [k for k in self._files if k not in seen]:
            del self._files[key]
        return more

    def _sizes(self) -> list[int]:
        sizes = []
        for path in self._paths():
            try:
                sizes.append(path.stat().st_size)
            except OSError:
                pass
        return sizes

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

    def _read(self, key: tuple, followed: _Followed) -> bool:
        try:
            with open(followed.path, "rb") as handle:
                stat = os.fstat(handle.fileno())
                if (stat.st_dev, stat.st_ino) != key:  # replaced since the listing: the next poll
                    return False
                if not self._same_file(handle, followed, stat.st_size):
                    followed = self._files[key] = _Followed(followed.path)
                    self._reread += 1
                handle.seek(followed.offset)
                data = handle.read(_READ_BYTES)
        except OSError:
            return False
        if followed.compression is None and not self._decide_compression(followed, data):
            return False  # too few bytes to tell yet
        followed.seen = (stat.st_size, stat.st_mtime_ns) if len(data) < _READ_BYTES else ()
        if len(followed.head) < _HEAD_BYTES and followed.offset == len(followed.head):
            followed.head += data[: _HEAD_BYTES - len(followed.head)]
        followed.offset += len(data)
        self._bytes_read += len(data)
        followed.last = (followed.last + data)[-_LAST_BYTES:]
        self._inflate(followed, data)
        return len(data) == _READ_BYTES

    @staticmethod
    def _same_file(handle, followed: _Followed, size: int) -> bool:
        """Whether the file still holds what was read of it: as long, same first bytes, same bytes
        before where reading stopped."""
        if size < followed.offset:
            return False
        if followed.head:
            handle.seek(0)
            if handle.read(len(followed.head)) != followed.head:
                return False
        if followed.last:
            handle.seek(followed.offset - len(followed.last))
            if handle.read(len(followed.last)) != followed.last:
                return False
        return True

    @staticmethod
    def _decide_compression(followed: _Followed, data: bytes, final: bool = False) -> bool:
        if len(data) < 4 and not final and not data.startswith(_GZIP_MAGIC):
            return False
        if data.startswith(_GZIP_MAGIC):
            followed.compression, followed.inflater = "gzip", _Inflater("gzip")
        elif data.startswith(_ZSTD_MAGIC):
            followed.compression, followed.inflater = "zstd", _Inflater("zstd")
        else:
            followed.compression = ""
        return True

    def _inflate(self, followed: _Followed, data: bytes) -> None:
        if followed.fmt == "done":
            return
        if followed.inflater is None:
            self._take_bytes(followed, data)
            self._records(followed, final=False)
            return
        try:
            for piece in followed.inflater.feed(data):
                self._take_bytes(followed, piece)
                if len(followed.pending) >= _PROCESS_BYTES:
                    self._records(followed, final=False)
                if followed.fmt == "done":  # rejected whole (a document past the bound): nothing more to inflate
                    return
        except (zlib.error, zstandard.ZstdError) as exc:
            self._records(followed, final=False)
            self._pipeline.reject(f"{followed.path}", f"the rest of the file cannot be decompressed ({exc})")
            followed.fmt, followed.pending = "done", bytearray()
            return
        self._records(followed, final=False)

    def _take_bytes(self, followed: _Followed, data: bytes) -> None:
        """Append inflated ``data`` to what waits, less what a record over the bound still skips."""
        if followed.skip_bytes:
            skipped = min(followed.skip_bytes, len(data))
            followed.skip_bytes -= skipped
            followed.base += skipped
            data = data[skipped:]
        if followed.skip_line and data:
            cut = data.find(b"\n") + 1
            if not cut:
                return
            followed.skip_line, followed.number, data = False, followed.number + 1, data[cut:]
        followed.pending += data

    # -- records -----------------------------------------------------------------------------

    def _records(self, followed: _Followed, *, final: bool) -> None:
        """Hand the pipeline every whole record ``pending`` holds (with ``final``, the file's end)."""
        if followed.fmt is None and not self._decide_format(followed, final):
            return
        if followed.fmt == "jsonl":
            self._lines(followed, final)
        elif followed.fmt == "proto":
            self._frames(followed, final)
        elif followed.fmt == "json":
            self._document(followed, final)
        elif followed.fmt == "bare" and (final or len(followed.pending) > self.max_record_bytes):
            self._bare(followed)

    def _decide_format(self, followed: _Followed, final: bool) -> bool:
        head = bytes(followed.pending[:_DETECT_BYTES])
        stripped = head.lstrip()
        if not stripped:
            return False
        json_like = stripped[:1] in (b"{", b"[")
        # A head that may be a bare protobuf request is judged whole (its first item tells it).
        short = 8 if head[:1] != b"\x0a" else _DETECT_BYTES
        enough = len(head) >= _DETECT_BYTES or (b"\n" in stripped[1:] if json_like else len(head) >= short)
        if not (enough or final):
            return False
        try:
            followed.fmt = format_of_head(head, followed.path)
        except IngestError as exc:
            self._pipeline.skip_files([f"{exc} Skipped (found in the followed directory {self.root})."])
            followed.fmt, followed.pending = "done", bytearray()
            return False
        if followed.fmt == "proto":
            followed.spans = "traces" in (signals_of_head(head, "proto") or {"traces"})
            followed.fmt = "bare" if is_bare_request(head) else "proto"
        self._pipeline.counts["files"] += 1
        return True

    def _copy(self, pending: bytearray, size: int) -> bytearray:
        """``pending[:size]`` in one of the pipeline's read buffers, which it takes back once the
        block is decoded (reused, as ingest reuses them)."""
        buffer = self._pipeline.buffers.take(size)
        buffer[:size] = memoryview(pending)[:size]
        return buffer

    def _add(self, records, spans: bool = True) -> None:
        for record in records:
            if not spans and record.kind == "protobuf-frames":  # metrics or logs: counted, not decoded
                for index in range(len(record.payload.starts)):
                    self._pipeline.add_record("other-signal", record.payload.where(index), None)
            elif not spans and record.kind == "traces" and not isinstance(record.payload, dict):
                self._pipeline.add_record("other-signal", record.where, None)
            else:
                self._pipeline.add_record(record.kind, record.where, record.payload)

    def _bare(self, followed: _Followed) -> None:
        """A file that is one protobuf request (no length prefix), taken at its end."""
        if len(followed.pending) > self.max_record_bytes:
            self._add([Record("rejected", f"{followed.path}", over_bound("protobuf request", self.max_record_bytes))])
        else:
            self._add([Record("traces", f"{followed.path}: request 1", bytes(followed.pending))], followed.spans)
        followed.fmt, followed.pending = "done", bytearray()

    def _lines(self, followed: _Followed, final: bool) -> None:
        pending, limit = followed.pending, self.max_record_bytes
        cut = len(pending) if final else pending.rfind(b"\n") + 1
        if cut:
            records = json_lines_block(followed.path, self._copy(pending, cut), cut, followed.number, limit)
            followed.number += sum(len(r.payload.starts) if r.kind == "json-lines" else 1 for r in records)
            self._add(records)
            del pending[:cut]
        if len(pending) > limit:  # a line still without its newline, over the bound: never held whole
            self._add([Record("rejected", f"{followed.path}:{followed.number}", over_bound("line", limit))])
            pending.clear()
            followed.skip_line = True

    def _frames(self, followed: _Followed, final: bool) -> None:
        limit = self.max_record_bytes
        while True:
            pending = followed.pending
            block, records, frames, used, problem = split_frames(followed.path, self._copy(pending, len(pending)),
                                                                 len(pending), followed.number, followed.base, limit)
            self._add(records, followed.spans)
            if block is not None:
                self._add([Record("protobuf-frames", block.where(0), block)], followed.spans)
            del pending[:used]
            followed.number, followed.base = followed.number + frames, followed.base + used
            where = f"{followed.path}: record {followed.number} (byte {followed.base})"
            if problem is not None:
                self._add([Record("rejected", where, problem)])
                followed.fmt, followed.pending = "done", bytearray()
                return
            if len(pending) >= 4 and frame_size(pending) - 4 > limit:
                size = frame_size(pending)
                self._add([Record("rejected", where, over_bound("record", limit))])
                skipped = min(size, len(pending))
                del pending[:skipped]
                followed.skip_bytes = size - skipped
                followed.number, followed.base = followed.number + 1, followed.base + skipped
                if followed.skip_bytes:
                    return
                continue
            if final and pending:
                self._add([Record("rejected", where, truncated_frame(bytes(pending)))])
                pending.clear()
            return

    def _document(self, followed: _Followed, final: bool) -> None:
        pending, limit = followed.pending, self.max_record_bytes
        if len(pending) > limit:
            self._add([Record("rejected", f"{followed.path}", over_bound("JSON document", limit))])
            followed.fmt, followed.pending = "done", bytearray()
            return
        if not final:
            if not bytes(pending[-64:]).rstrip().endswith((b"}", b"]")):
                return
            try:
                orjson.loads(pending)
            except orjson.JSONDecodeError:
                return  # still being written
        if pending.strip():
            self._add(classify_document(bytes(pending), followed.path))
        followed.fmt, followed.pending = "done", bytearray()

    def _finish(self, followed: _Followed) -> None:
        """The end of a file at :meth:`close`: its last bytes, and a compressed stream cut short."""
        if followed.compression is None:
            try:
                with open(followed.path, "rb") as handle:
                    data = handle.read(_READ_BYTES)
            except OSError:
                return
            self._decide_compression(followed, data, final=True)
            followed.offset = len(data)
            self._inflate(followed, data)
        if followed.fmt == "done":
            return
        self._records(followed, final=True)
        if followed.inflater is not None and not followed.inflater.at_boundary and followed.fmt != "done":
            self._pipeline.reject(f"{followed.path}", "the rest of the file cannot be decompressed "
                                                      "(the compressed stream ends mid-frame)")
