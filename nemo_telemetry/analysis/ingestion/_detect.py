"""Open a dump file (plain, gzip or zstd), tell its format, and read it record by record.

Formats, auto-detected from the first bytes (the extension is not trusted):

- ``jsonl``: the Collector file exporter's JSON lines, one ``ExportTraceServiceRequest`` per
  line (``resourceMetrics`` / ``resourceLogs`` lines are skipped and counted);
- ``proto``: the Collector's length-prefixed protobuf, a 4-byte big-endian length before each
  serialized request, each optionally zstd-compressed (the Collector's ``compression: zstd``;
  a compressed payload may hold JSON);
- ``json``: a single OTLP/JSON document, e.g. a ``/v1/traces`` request body, pretty-printed or
  not, or a JSON list of such requests.

A record that cannot be read is reported (file and line or record number) and skipped; the
records around it are kept.

Every record held whole in memory (a line, a protobuf frame, a zstd-compressed frame's payload, a
JSON document) is bounded by ``max_record_bytes``, :data:`DEFAULT_MAX_REQUEST_BYTES` unless told
(``collect``'s bound on a request body, after decompression): a longer one is rejected and named,
and reading goes on after it. A compressed file is read as a stream, so its inflated size costs
time, never more memory than one record: a decompression bomb costs only itself.

- ``proto`` also covers a bare request: one serialized request without a length prefix (an
  OTLP/HTTP request body saved as a file).

The same look at a file's head tells which signals it holds, by content whatever its name
(:func:`signals_of_head`): the ``resourceSpans`` / ``resourceMetrics`` / ``resourceLogs`` keys of
JSON, and for protobuf the wire shape of the first span, metric or log record (each signal's
request has the same outer layout; their items differ in field numbers and wire types). The
name (``metrics-*``, ``logs-*``) only decides what the content cannot tell (an empty file).
:func:`detect_dump` gives both; ingest then reads a file once, for its spans, metrics and logs,
and never decodes a metrics or log request as a trace request.
"""

from __future__ import annotations

import gzip
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np
import orjson
import zstandard

from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_REQUEST_BYTES, FORMATS
from nemo_telemetry.errors import IngestError

__all__ = [
    "FORMATS",
    "ACCEPTED_FORMATS",
    "Record",
    "JsonLines",
    "ProtoFrames",
    "ReadBuffers",
    "DumpFile",
    "detect_dump",
    "detect_format",
    "signals_of_head",
    "is_metrics_dump",
    "is_log_dump",
    "is_bare_request",
    "proto_signal",
    "expand_inputs",
    "expand_inputs_found",
    "iter_records",
    "classify_json_line",
    "DEFAULT_MAX_REQUEST_BYTES",
    "format_of_head",
    "json_lines_block",
    "split_frames",
    "frame_size",
    "over_bound",
    "truncated_frame",
    "classify_document",
    "MAX_PROTO_RECORD",
    "json_with_oversized_numbers",
    "OversizedNumber",
]

ACCEPTED_FORMATS = (
    "Collector file-exporter JSON lines, the Collector's length-prefixed protobuf (optionally "
    "zstd per message), a single OTLP/JSON document (e.g. a /v1/traces request body) or one bare "
    "protobuf request; traces, metrics or logs; each optionally .gz or .zst compressed"
)
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_HEAD_BYTES = 1 << 16
JSON_BLOCK_BYTES = 16 << 20  # JSON lines are read (and scanned) in blocks of about this size
PROTO_BLOCK_BYTES = 16 << 20  # length-prefixed protobuf is read (and walked) in blocks of about this size
_KEPT_BUFFERS = 8  # free read buffers a ReadBuffers holds on to
_KEPT_BUFFER_BYTES = 3 * max(JSON_BLOCK_BYTES, PROTO_BLOCK_BYTES)  # a larger free buffer is not kept
MAX_PROTO_RECORD = 1 << 30  # a larger length prefix means a corrupt or non-OTLP file
_OTHER_SIGNALS = ("resourceMetrics", "resourceLogs", "resource_metrics", "resource_logs")
_TRACES = ("resourceSpans", "resource_spans")


@dataclass(frozen=True)
class DumpFile:
    """An input file, its format, and which signals it holds: ``spans`` false for a protobuf
    file of metrics or logs only, whose requests the span reader counts without decoding them."""

    path: Path
    format: str
    metrics: bool = False
    logs: bool = False
    spans: bool = True


@dataclass(frozen=True)
class Record:
    """One request read from a file (or a block of them): ``kind`` is ``traces``,
    ``json-lines``, ``protobuf-frames``, ``other-signal`` or ``rejected``.

    ``payload`` is a parsed JSON object or protobuf bytes for ``traces``, the parsed JSON
    request (when it was parsed) for ``other-signal``, a :class:`JsonLines`
    block for ``json-lines``, a :class:`ProtoFrames` block for ``protobuf-frames``, the
    problem for ``rejected``; ``where`` is ``file:line`` or ``file: record N (byte B)``.
    """

    kind: str
    where: str
    payload: object = None


class _CountingReader(io.RawIOBase):
    """Counts the bytes read from the file on disk (compressed), for progress."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        self.count += n or 0
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


class ReadBuffers:
    """Buffers that blocks are read into, given back once a block is decoded.

    A fresh buffer costs a page fault per 4 KiB page the first time it is written: reading a
    large file into fresh blocks costs one for every page of it. A pipeline
    that gives its blocks' buffers back reads the whole file through the few it has in flight.
    Taken and given back on the reading thread only.
    """

    def __init__(self) -> None:
        self._free: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes; its contents are whatever it last held."""
        for index, buffer in enumerate(self._free):
            if len(buffer) >= size:
                return self._free.pop(index)
        # Blocks ask for a block plus the part-record carried over: room to spare lets the
        # next block, with its own carry, fit in this buffer again.
        return bytearray(size + max(size // 8, 1 << 16))

    def give(self, buffer: bytearray) -> None:
        """Take ``buffer`` back: nothing may read it (or a view of it) after this. One grown for a
        line or frame longer than a block is let go: kept, it would hold its memory unused."""
        if len(self._free) < _KEPT_BUFFERS and len(buffer) <= _KEPT_BUFFER_BYTES:
            self._free.append(buffer)


def expand_inputs(inputs) -> list[Path]:
    """Files named, and the files under directories named (sorted, hidden files skipped)."""
    return [path for path, _ in expand_inputs_found(inputs)]


def expand_inputs_found(inputs) -> list[tuple[Path, Path | None]]:
    """:func:`expand_inputs` with the directory each file was found in (None: named itself), so
    a file that is not OTLP can be skipped when a directory brought it and refused when named."""
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    files: list[tuple[Path, Path | None]] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
            files.extend((p, path) for p in found)
        elif path.is_file():
            files.append((path, None))
        else:
            raise IngestError(f"{path}: no such file or directory")
    return files


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def open_decompressed(path: Path, data: bytes | None = None) -> tuple[io.BufferedReader, _CountingReader]:
    """The decompressed byte stream of ``path`` and the counter of bytes read from disk;
    ``data``: the file's bytes, already read (the file is not opened again)."""
    counter = _CountingReader(open(path, "rb") if data is None else io.BytesIO(data))
    raw = io.BufferedReader(counter, buffer_size=_HEAD_BYTES)
    magic = raw.peek(4)[:4]
    if magic.startswith(_GZIP_MAGIC):
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb")
    elif magic == _ZSTD_MAGIC:
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    else:
        return raw, counter
    return io.BufferedReader(stream, buffer_size=_HEAD_BYTES), counter


def _peek(stream: io.BufferedReader, path: Path) -> bytes:
    try:
        return stream.peek(_HEAD_BYTES)[:_HEAD_BYTES]
    except (OSError, EOFError, zstandard.ZstdError) as exc:
        raise IngestError(f"{path}: cannot decompress ({exc}); expected {ACCEPTED_FORMATS}") from None


def detect_format(path: Path) -> str:
    """``jsonl``, ``proto``, ``json`` or ``empty``; ``IngestError`` when it is none of them."""
    return detect_dump(path).format


def detect_dump(path: Path, fmt: str | None = None) -> DumpFile:
    """The format of ``path`` (``fmt`` when given, else detected as :func:`detect_format`
    does) and which signals it holds (:func:`signals_of_head`), from one look at its head."""
    try:
        head = _head(path)
    except IngestError:
        if fmt is None:
            raise
        head = b""  # forced: the reader names the problem
    fmt = fmt or _format_of(head, path)
    signals = signals_of_head(head, fmt) or _signals_of_name(path)
    # JSON records say their signal one by one (another signal's are counted by the span reader);
    # protobuf requests do not, so a protobuf file of metrics or logs is not read for spans.
    spans = "traces" in signals or fmt in ("json", "jsonl")
    return DumpFile(path, fmt, "metrics" in signals, "logs" in signals, spans)


def _signals_of_name(path: Path) -> frozenset[str]:
    """What a file's name says when its content cannot tell: the dump exporter's ``metrics-*``
    and ``logs-*`` files, else traces."""
    if path.name.startswith("metrics-"):
        return frozenset({"metrics"})
    if path.name.startswith("logs-"):
        return frozenset({"logs"})
    return frozenset({"traces"})


def signals_of_head(head: bytes, fmt: str | None = None) -> frozenset[str]:
    """The signals (``traces``, ``metrics``, ``logs``) a file's decompressed ``head`` shows; empty
    when it cannot tell (no request in it, or a protobuf item of no signal's shape). ``fmt``: the
    head's format when known already."""
    try:
        fmt = fmt or _format_of(head, Path("head"))
    except IngestError:
        return frozenset()
    if fmt in ("json", "jsonl"):
        return _json_signals(head)
    if fmt == "proto":
        payload = _first_proto_request(head)
        if payload[:1] in (b"{", b"["):
            return _json_signals(payload)
        signal = proto_signal(payload)
        return frozenset({signal}) if signal else frozenset()
    return frozenset()


_JSON_SIGNAL_KEYS = re.compile(rb'(?:^|[{,\s])"resource_?([Ss]pans|[Mm]etrics|[Ll]ogs)"\s*:')
_KEY_SIGNAL = {b"spans": "traces", b"metrics": "metrics", b"logs": "logs"}


def _json_signals(text: bytes) -> frozenset[str]:
    """The signals whose request key (``resourceSpans`` ...) opens an object in ``text``; a key
    inside a string value (its quotes escaped) is not one."""
    return frozenset(_KEY_SIGNAL[m.group(1).lower()] for m in _JSON_SIGNAL_KEYS.finditer(text))


def _first_proto_request(head: bytes) -> bytes:
    """The (start of the) first request of a protobuf head: after a length prefix, decompressed
    when the Collector compressed it; the head itself for a bare request."""
    if not is_bare_request(head):
        head = head[4 : 4 + int.from_bytes(head[:4], "big")]
    if head[:4] == _ZSTD_MAGIC:
        try:
            with zstandard.ZstdDecompressor().stream_reader(head) as reader:
                return reader.read(_HEAD_BYTES)
        except zstandard.ZstdError:
            return b""
    return head


# Each signal's item (Span, Metric, LogRecord): field number -> wire type (0 varint, 1 fixed64,
# 2 length-delimited, 5 fixed32), from the OTLP protos.
_SPAN_WIRE = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 0, 7: 1, 8: 1, 9: 2, 10: 0, 11: 2, 12: 0, 13: 2, 14: 0, 15: 2, 16: 5}
_METRIC_WIRE = {1: 2, 2: 2, 3: 2, 5: 2, 7: 2, 9: 2, 10: 2, 11: 2, 12: 2}
_LOG_WIRE = {1: 1, 2: 0, 3: 2, 5: 2, 6: 2, 7: 0, 8: 5, 9: 2, 10: 2, 11: 1, 12: 2}
_METRIC_DATA = (5, 7, 9, 10, 11)  # gauge, sum, histogram, exponential histogram, summary


def proto_signal(request: bytes) -> str | None:
    """The signal of a serialized OTLP export request (or its start): ``traces``, ``metrics``,
    ``logs``, or None when it holds no item or its first item has no signal's shape.

    The three requests nest alike (request -> resource -> scope -> items, each at field 1 then
    2 then 2), so the first item decides: a span has its start and end times as fixed64 fields
    7 and 8, a log record its times as fixed64 fields 1 and 11, a metric a name and its data
    (gauge, sum ...) as messages."""
    item = _first_item(request)
    if not item:
        return None
    sizes = {number: len(value) for number, kind, value in item if kind == 2}
    if _fits(item, _SPAN_WIRE) and (any(n in (7, 8) for n, _, _ in item) or (sizes.get(1), sizes.get(2)) == (16, 8)):
        return "traces"  # its times, or else a trace id and a span id of their sizes
    if _fits(item, _METRIC_WIRE) and _text(item, 1) and any(n in _METRIC_DATA for n, _, _ in item):
        return "metrics"
    if _fits(item, _LOG_WIRE):
        return "logs"
    return "traces" if _fits(item, _SPAN_WIRE) else None


def _text(item: list, number: int) -> bool:
    """Whether the item has field ``number`` and it is UTF-8 text (a metric's name)."""
    values = [value for n, kind, value in item if n == number and kind == 2]
    try:
        return bool(values) and all(bytes(value).decode("utf-8") is not None for value in values)
    except UnicodeDecodeError:
        return False


def _fits(item: list, wire: dict) -> bool:
    return all(wire.get(number) == kind for number, kind, _ in item)


def _first_item(request: bytes) -> list:
    """``(field, wire type, value)`` of the first span, metric or log record of ``request``
    (as far as the bytes go); [] when there is none or the bytes are no protobuf."""
    view = memoryview(request)
    for path in (1, 2, 2):  # resource_*, scope_*, the items
        inner = next((value for number, kind, value in _wire_fields(view) if number == path and kind == 2), None)
        if inner is None:
            return []
        view = inner
    return list(_wire_fields(view))


def _wire_fields(view: memoryview) -> Iterator[tuple[int, int, object]]:
    """The fields of one message's bytes: ``(number, wire type, value)``, a length-delimited
    value as a view (cut short where the bytes end); stops at the first malformed tag."""
    pos, end = 0, len(view)
    while pos < end:
        tag, pos = _varint(view, pos)
        if tag is None or tag >> 3 == 0:
            return
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            value, pos = _varint(view, pos)
            if value is None:
                return
        elif kind == 1 or kind == 5:
            size = 8 if kind == 1 else 4
            if pos + size > end:
                return
            value, pos = view[pos : pos + size], pos + size
        elif kind == 2:
            size, pos = _varint(view, pos)
            if size is None:
                return
            value, pos = view[pos : min(pos + size, end)], pos + size
        else:
            return
        yield number, kind, value


def _varint(view: memoryview, pos: int) -> tuple[int | None, int]:
    value = shift = 0
    while pos < len(view) and shift < 64:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return None, pos


def is_bare_request(head: bytes) -> bool:
    """Whether a protobuf head is one request without a length prefix (a request body saved as a
    file) rather than length-prefixed requests: read as a prefix, its first bytes would claim
    a request that does not begin with a well-formed resource field (or ends past the head
    when the head is the whole file)."""
    if head[:1] != b"\x0a" or proto_signal(head) is None:
        return False
    if not _looks_like_proto_frame(head):
        return True
    length = int.from_bytes(head[:4], "big")
    if len(head) < _HEAD_BYTES and 4 + length > len(head):
        return True  # the whole file is shorter than the prefix would say
    if head[4:8] == _ZSTD_MAGIC:
        return False
    fields = list(_wire_fields(memoryview(head)[4 : 4 + length]))
    return not (fields and all(number == 1 and kind == 2 for number, kind, _ in fields))


def is_metrics_dump(path: Path) -> bool:
    """A metrics dump: ``resourceMetrics`` (or a protobuf metric) in its head, or, when the content
    cannot tell, a name starting ``metrics-``. A file that cannot be read is not one."""
    return _is_signal_dump(path, "metrics")


def is_log_dump(path: Path, head: bytes | None = None) -> bool:
    """A log dump: ``resourceLogs`` (or a protobuf log record) in its head (``head``: the
    decompressed start of the file, when read already), or, when the content cannot tell, a
    name starting ``logs-``. A file that cannot be read is not one (the trace reader names its
    problem)."""
    return _is_signal_dump(path, "logs", head)


def _is_signal_dump(path: Path, signal: str, head: bytes | None = None) -> bool:
    if head is None:
        try:
            head = _head(path)
        except Exception:  # OSError, or not compressed as it claims
            return False
    return signal in (signals_of_head(head) or _signals_of_name(path))


def _head(path: Path) -> bytes:
    stream, _ = open_decompressed(path)
    with stream:
        return _peek(stream, path)


def format_of_head(head: bytes, path: Path) -> str:
    """The format a file's decompressed ``head`` shows, as :func:`detect_format` decides it."""
    return _format_of(head, path)


def _format_of(head: bytes, path: Path) -> str:
    stripped = head.lstrip()
    if not stripped:
        return "empty"
    if stripped[:1] in (b"{", b"["):
        first_line = stripped.split(b"\n", 1)[0].strip()
        if first_line in (b"{", b"[") or first_line.startswith(b"["):
            return "json"
        if _wrapped_document(stripped, first_line):
            return "json"
        _check_first_json_line(first_line, path)
        return "jsonl"
    if _looks_like_proto_frame(head) or is_bare_request(head):
        return "proto"
    if any(line.lstrip().startswith(b'{"resource') for line in head.split(b"\n")[1:]):
        return "jsonl"  # a garbage first line in front of JSON lines: reported when read
    raise IngestError(f"{path}: not an OTLP dump. Accepted: {ACCEPTED_FORMATS}.")


def _wrapped_document(head: bytes, first_line: bytes) -> bool:
    """Whether ``head`` (from its first ``{``) is one JSON document wrapped over several lines
    rather than JSON lines: its first line ends within the head and is no JSON by itself, and no
    later whole line of the head is an OTLP request (a garbage line in front of JSON lines is
    reported line by line, not read as a document)."""
    lines = head.split(b"\n")
    if len(lines) < 2 or _parses(first_line):
        return False
    for i, line in enumerate(lines[1:], 1):
        line = line.strip()
        if line.startswith(b'{"resource'):
            return False  # a request per line, maybe cut by the head's end
        if i < len(lines) - 1 and line.startswith(b"{") and _parses(line):
            return False
    return True


def _parses(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    return True


def _check_first_json_line(line: bytes, path: Path) -> None:
    """A complete first line that is JSON but no OTLP request means the file is not OTLP."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError:
        return  # longer than the head, or garbage: judged record by record
    if not isinstance(doc, dict) or not any(k in doc for k in _TRACES + _OTHER_SIGNALS):
        keys = ", ".join(list(doc)[:5]) if isinstance(doc, dict) else type(doc).__name__
        raise IngestError(
            f"{path}: JSON, but not OTLP (first line has {keys}, no resourceSpans). "
            f"Accepted: {ACCEPTED_FORMATS}."
        )


def _looks_like_proto_frame(head: bytes) -> bool:
    if len(head) < 5:
        return False
    length = int.from_bytes(head[:4], "big")
    return 0 < length <= MAX_PROTO_RECORD and (head[4] == 0x0A or head[4:8] == _ZSTD_MAGIC)


def iter_records(
    path: Path,
    fmt: str | None = None,
    *,
    on_bytes: Callable[[int], None] | None = None,
    buffers: ReadBuffers | None = None,
    data: bytes | None = None,
    max_record_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    spans: bool = True,
) -> Iterator[Record]:
    """Every request of ``path`` in order (whole lines and plain protobuf frames in blocks);
    ``fmt`` overrides detection. Blocks are read into ``buffers`` when given (the caller gives
    each block's ``storage`` back once it is done with it), else into fresh memory. ``data``:
    the file's bytes when the caller read them already (for its metrics or logs too). A line,
    frame or document longer than ``max_record_bytes`` (decompressed) is rejected and named.
    ``spans=False`` (a protobuf file of another signal, :attr:`DumpFile.spans`): its protobuf
    requests come as ``other-signal`` records (payload: the bytes), one per request, for the
    span reader to count, never to decode as trace requests."""
    stream, counter = open_decompressed(path, data)
    with stream:
        fmt = fmt or _format_of(_peek(stream, path), path)
        if fmt == "empty":
            return
        readers = {"jsonl": _json_lines, "proto": _proto_frames, "json": _json_document}
        if fmt not in readers:
            raise IngestError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        reader = readers[fmt]
        if fmt == "proto" and is_bare_request(_peek(stream, path)):
            reader = _bare_request
        try:
            for record in reader(stream, path, buffers or ReadBuffers(), max_record_bytes):
                if not spans and record.kind in ("traces", "protobuf-frames") and not isinstance(record.payload, dict):
                    yield from _other_signal(record)
                else:
                    yield record
                if on_bytes is not None:
                    on_bytes(counter.count)
        except (OSError, EOFError, zstandard.ZstdError) as exc:
            yield Record("rejected", f"{path}", f"the rest of the file cannot be decompressed ({exc})")


def _other_signal(record: Record) -> Iterator[Record]:
    """The requests of a protobuf record as ``other-signal`` records (a block gives its buffer up)."""
    if record.kind == "traces":
        yield Record("other-signal", record.where, record.payload)
        return
    block = record.payload
    for index in range(len(block.starts)):
        yield Record("other-signal", block.where(index), None)


def _bare_request(stream: BinaryIO, path: Path, buffers: ReadBuffers, limit: int) -> Iterator[Record]:
    """A file that is one protobuf request without a length prefix (a request body saved)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        yield Record("rejected", f"{path}", over_bound("protobuf request", limit))
        return
    yield Record("traces", f"{path}: request 1", data)


def _classify(doc: object, where: str) -> Record:
    if isinstance(doc, dict):
        if any(k in doc for k in _TRACES):
            return Record("traces", where, doc)
        if any(k in doc for k in _OTHER_SIGNALS):
            return Record("other-signal", where, doc)  # the request, for its own signal's reader
    return Record("rejected", where, "valid JSON but not an OTLP request (no resourceSpans)")


@dataclass(frozen=True)
class JsonLines:
    """A block of whole JSON lines read in one piece (the payload of a ``json-lines`` record):
    the bytes, where each line starts and ends (its newline included; blank lines too) and
    its line number in the file."""

    path: Path
    buffer: memoryview  # of ``storage``, the buffer the block was read into: not copied
    starts: np.ndarray
    ends: np.ndarray
    numbers: np.ndarray
    storage: bytearray

    def __len__(self) -> int:
        return len(self.buffer)

    def line(self, index: int) -> tuple[str, bytes]:
        """(``file:line``, the line's bytes) of line ``index`` of the block."""
        return f"{self.path}:{self.numbers[index]}", bytes(self.buffer[self.starts[index] : self.ends[index]])


def _json_lines(stream: BinaryIO, path: Path, buffers: ReadBuffers, limit: int) -> Iterator[Record]:
    """Blocks of whole lines (kind ``json-lines``), read straight into one buffer each: the
    pipeline scans a block in bulk and hands the lines the scan leaves alone to
    ``classify_json_line``. No per-line objects, no copy beyond the read. A line longer than
    ``limit`` is rejected and skipped to its newline, never held whole."""
    number = 1
    tail = b""  # the start of a line that continues in the next block
    held = None  # the buffer ``tail`` is a view of while a line longer than a block grows (not copied)
    while True:
        if len(tail) > limit:
            yield Record("rejected", f"{path}:{number}", over_bound("line", limit))
            tail = _skip_line(stream)
            if tail is None:
                return
            number += 1
            continue
        carried = len(tail)
        room = max(JSON_BLOCK_BYTES, carried)  # a line longer than a block: double the room
        if carried >= JSON_BLOCK_BYTES:  # but no more than the bound needs
            room = min(room, limit + 1 - carried)
        buffer = buffers.take(carried + room)
        memoryview(buffer)[:carried] = tail  # a bytearray's slice assignment would copy ``tail`` first
        if held is not None:
            tail, held = b"", buffers.give(held)
        size = carried + _fill(stream, memoryview(buffer)[carried : carried + room])
        if size == carried:
            if carried:
                yield from _bounded_block(path, buffer, size, number, limit)
            return
        cut = buffer.rfind(b"\n", 0, size) + 1
        if cut == 0 and size > limit:  # past the bound already: rejected, never copied
            buffers.give(buffer)
            yield Record("rejected", f"{path}:{number}", over_bound("line", limit))
            tail = _skip_line(stream)
            if tail is None:
                return
            number += 1
            continue
        if cut == 0:
            tail, held = memoryview(buffer)[:size], buffer
            continue
        tail = bytes(memoryview(buffer)[cut:size])
        records = list(_bounded_block(path, buffer, cut, number, limit))
        number += sum(len(r.payload.starts) if r.kind == "json-lines" else 1 for r in records)
        yield from records


def over_bound(what: str, limit: int) -> str:
    """Why a line, frame or document past the decompression bound is rejected."""
    return (f"{what} longer than {limit} bytes (decompressed), the bound on one request "
            f"(--max-request-mib, as collect's); the rest of the file is read on")


def _skip_line(stream: BinaryIO) -> bytes | None:
    """Read past the rest of the current line; what follows its newline (None: the file ended)."""
    while True:
        chunk = stream.read(1 << 20)
        if not chunk:
            return None
        cut = chunk.find(b"\n") + 1
        if cut:
            return chunk[cut:]


def _bounded_block(path: Path, buffer: bytearray, size: int, number: int, limit: int) -> Iterator[Record]:
    """:func:`_block`, with the lines longer than ``limit`` rejected (one record each) first."""
    record = _block(path, buffer, size, number)
    block = record.payload
    long = (block.ends - block.starts) > limit
    if not long.any():
        yield record
        return
    for line in block.numbers[long].tolist():
        yield Record("rejected", f"{path}:{line}", over_bound("line", limit))
    keep = ~long
    if keep.any():
        kept = JsonLines(path, block.buffer, block.starts[keep], block.ends[keep], block.numbers[keep], buffer)
        yield Record("json-lines", record.where, kept)


def json_lines_block(path: Path, buffer: bytearray, size: int, number: int, limit: int) -> list[Record]:
    """The records of the whole lines ``buffer[:size]`` holds, its first line being line ``number``
    of ``path``: a ``json-lines`` block as ingest reads it, after the rejected long lines. For a
    reader that gathers the lines itself (``monitor --follow``)."""
    return list(_bounded_block(path, buffer, size, number, limit))


def _fill(stream: BinaryIO, view: memoryview) -> int:
    """Read into ``view`` until it is full or the stream ends (a decompressing stream may
    return less than asked before its end); how many bytes were read."""
    done = 0
    while done < len(view):
        got = stream.readinto(view[done:])
        if not got:
            break
        done += got
    return done


def _block(path: Path, buffer: bytearray, size: int, number: int) -> Record:
    """The lines of ``buffer[:size]``, which ends with a newline unless it is the file's end."""
    ends = _line_ends(buffer, size)
    if size and buffer[size - 1] != 10:
        ends = np.append(ends, size)
    starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
    numbers = number + np.arange(len(starts), dtype=np.int64)
    block = JsonLines(path, memoryview(buffer)[:size], starts, ends, numbers, buffer)
    return Record("json-lines", f"{path}:{number}", block)


def _line_ends(buffer: bytearray, size: int) -> np.ndarray:
    """Where each line of ``buffer[:size]`` ends (after its newline). Long lines (the usual
    case: a request per line) are found with memchr, one ``find`` each; once lines turn out
    short (more than one per 256 bytes so far), numpy finds the rest in one pass."""
    ends_list = []
    pos = buffer.find(b"\n", 0, size)
    while pos >= 0:
        ends_list.append(pos + 1)
        if len(ends_list) > 64 and len(ends_list) * 256 > pos:
            rest = np.frombuffer(buffer, dtype=np.uint8, count=size)[pos + 1 :]
            return np.concatenate([np.array(ends_list, dtype=np.int64), np.flatnonzero(rest == 10) + (pos + 2)])
        pos = buffer.find(b"\n", pos + 1, size)
    return np.array(ends_list, dtype=np.int64)


def classify_json_line(line: bytes, where: str) -> Record:
    """One JSON line parsed by orjson: ``traces`` (a dict), ``other-signal`` or ``rejected``.

    A number no double holds (a 5,000-digit timestamp) fails orjson's parse of the whole line;
    such a line is parsed again with that number kept as an :class:`OversizedNumber`, so the
    decoder rejects the one span (or record) whose field holds it and keeps the rest."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        doc = json_with_oversized_numbers(line) if "number" in str(exc) else None
        if doc is None:
            if not line.endswith(b"\n"):
                return Record("rejected", where, "truncated last record (the writer stopped mid-line)")
            return Record("rejected", where, f"malformed JSON line ({exc})")
    return _classify(doc, where)


class OversizedNumber:
    """A JSON number too long for int64 or a double: a type no field accepts (never rounded)."""

    def __init__(self, text: str) -> None:
        self.digits = len(text)

    def __repr__(self) -> str:
        return f"<a number of {self.digits} characters>"


def json_with_oversized_numbers(line: bytes) -> object | None:
    """``line`` parsed with numbers past a double's range kept as :class:`OversizedNumber`
    (None when it is not JSON for another reason: NaN and Infinity are refused, as by orjson).
    Every reader of JSON lines parses a line orjson refuses for a number this way, so that the
    span, log and metrics readers of one file agree on what the line is."""
    import json

    def integer(text: str) -> object:
        return int(text) if len(text) <= 40 else OversizedNumber(text)

    def decimal(text: str) -> object:
        value = float(text)
        return value if value not in (float("inf"), float("-inf")) else OversizedNumber(text)

    def constant(text: str) -> object:
        raise ValueError(f"{text} is not JSON")

    try:
        return json.loads(line, parse_int=integer, parse_float=decimal, parse_constant=constant)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def _json_document(stream: BinaryIO, path: Path, buffers: ReadBuffers, limit: int) -> Iterator[Record]:
    text = stream.read(limit + 1)
    if len(text) > limit:
        yield Record("rejected", f"{path}", over_bound("JSON document", limit))
        return
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        line = getattr(exc, "lineno", "?")
        yield Record("rejected", f"{path}:{line}", f"malformed or truncated JSON document ({exc})")
        return
    for i, item in enumerate(doc if isinstance(doc, list) else [doc]):
        yield _classify(item, f"{path}: request {i + 1}" if isinstance(doc, list) else f"{path}:1")


def classify_document(text: bytes, path: Path) -> list[Record]:
    """The records of a whole OTLP/JSON document's bytes, as ingest reads a ``json`` file."""
    return list(_json_document(io.BytesIO(text), path, ReadBuffers(), max(len(text), 1)))


@dataclass(frozen=True)
class ProtoFrames:
    """A block of whole length-prefixed protobuf requests read in one piece (the payload of a
    ``protobuf-frames`` record): request ``i`` is ``buffer[starts[i]:ends[i]]``, record number
    ``numbers[i]`` of the file, its length prefix at file byte ``offsets[i]``."""

    path: Path
    buffer: memoryview  # of ``storage``, the buffer the block was read into: not copied
    starts: np.ndarray
    ends: np.ndarray
    numbers: np.ndarray
    offsets: np.ndarray
    storage: bytearray

    def __len__(self) -> int:
        return int(self.ends[-1] - self.starts[0]) if len(self.starts) else 0

    def where(self, index: int) -> str:
        return _frame_where(self.path, int(self.numbers[index]), int(self.offsets[index]))

    def payload(self, index: int) -> bytes:
        return bytes(self.buffer[self.starts[index] : self.ends[index]])


def _frame_where(path: Path, number: int, offset: int) -> str:
    return f"{path}: record {number} (byte {offset})"


def _proto_frames(stream: BinaryIO, path: Path, buffers: ReadBuffers, limit: int) -> Iterator[Record]:
    """Blocks of whole plain requests (kind ``protobuf-frames``) read straight into one buffer
    each, for the compiled walk; zstd-compressed and JSON requests as records of their own,
    yielded before the block they were read with (spans are not ordered by request). A
    truncated or implausible length prefix, or a truncated last request, ends the file with a
    ``rejected`` record naming it; a request longer than ``limit`` is rejected and skipped."""
    number = 1  # the record number of the frame at ``buffer[0]``
    base = 0  # the file offset of ``buffer[0]``
    tail = b""  # the start of a frame that continues in the next block
    while True:
        if len(tail) >= 4 and frame_size(tail) - 4 > limit:  # never held: read past it
            yield Record("rejected", _frame_where(path, number, base), over_bound("record", limit))
            size = frame_size(tail)
            if len(tail) < size and len(tail) + _discard(stream, size - len(tail)) < size:
                return
            number, base, tail = number + 1, base + size, tail[size:]
            continue
        room = max(PROTO_BLOCK_BYTES, frame_size(tail) - len(tail))  # a longer frame: room for it
        buffer = buffers.take(len(tail) + room)
        buffer[: len(tail)] = tail
        size = len(tail) + _fill(stream, memoryview(buffer)[len(tail) : len(tail) + room])
        at_end = size < len(tail) + room
        block, records, frames, used, problem = split_frames(path, buffer, size, number, base, limit)
        tail = bytes(memoryview(buffer)[used:size])  # before the block is yielded (and given back)
        if block is None:
            buffers.give(buffer)
        yield from records
        if block is not None:
            yield Record("protobuf-frames", block.where(0), block)
        number, base = number + frames, base + used
        if problem is not None:
            yield Record("rejected", _frame_where(path, number, base), problem)
            return
        if at_end and not (len(tail) >= 4 and frame_size(tail) - 4 > limit):
            if tail:
                yield Record("rejected", _frame_where(path, number, base), truncated_frame(tail))
            return


def _discard(stream: BinaryIO, count: int) -> int:
    """Read and drop ``count`` bytes (fewer where the stream ends first); how many."""
    done = 0
    while done < count:
        chunk = stream.read(min(count - done, 1 << 20))
        if not chunk:
            break
        done += len(chunk)
    return done


def frame_size(head: bytes) -> int:
    """The bytes of the frame ``head`` starts (prefix included), as far as it says."""
    return 4 + int.from_bytes(head[:4], "big") if len(head) >= 4 else 4


def truncated_frame(tail: bytes) -> str:
    """Why the bytes ``tail`` left at a file's end are not a whole frame."""
    if len(tail) < 4:
        return "truncated length prefix; the rest of the file is skipped"
    return f"truncated last record ({len(tail) - 4} of {frame_size(tail) - 4} bytes)"


def split_frames(path: Path, buffer: bytearray, size: int, number: int, base: int, limit: int):
    """The whole frames of ``buffer[:size]``: (a ``ProtoFrames`` of the plain ones or None,
    records of the compressed or JSON ones, how many frames, bytes used, a problem that ends
    the file or None). It stops before a frame longer than ``limit``, which the caller
    rejects and reads past without holding it; a compressed frame inflating past ``limit`` is
    rejected here.
    A Python step per frame: a request holds hundreds of spans, and this is one prefix read."""
    starts, ends, numbers, offsets, records = [], [], [], [], []
    view = memoryview(buffer)
    pos, problem = 0, None
    while size - pos >= 4:
        length = int.from_bytes(view[pos : pos + 4], "big")
        if length > MAX_PROTO_RECORD:
            problem = f"implausible length {length}; the rest of the file is skipped"
            break
        if size - pos - 4 < length or length > limit:
            break
        start = pos + 4
        head = view[start : start + min(4, length)]
        if head == _ZSTD_MAGIC or head[:1] == b"{":
            where = _frame_where(path, number + len(starts) + len(records), base + pos)
            records.append(_proto_payload(bytes(view[start : start + length]), where, limit))
        else:
            numbers.append(number + len(starts) + len(records))
            offsets.append(base + pos)
            starts.append(start)
            ends.append(start + length)
        pos = start + length
    block = None
    if starts:
        block = ProtoFrames(
            path, view[:pos], np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64),
            np.array(numbers, dtype=np.int64), np.array(offsets, dtype=np.int64), buffer,
        )
    return block, records, len(starts) + len(records), pos, problem


def _proto_payload(payload: bytes, where: str, limit: int) -> Record:
    if payload[:4] == _ZSTD_MAGIC:
        try:  # a bounded read: a small frame may claim (and inflate to) gigabytes
            with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
                payload = reader.read(limit + 1)
        except zstandard.ZstdError as exc:
            return Record("rejected", where, f"corrupt zstd record ({exc})")
        if len(payload) > limit:
            return Record("rejected", where, over_bound("zstd record", limit))
    if payload[:1] == b"{":
        try:
            return _classify(orjson.loads(payload), where)
        except orjson.JSONDecodeError as exc:
            return Record("rejected", where, f"malformed JSON record ({exc})")
    return Record("traces", where, payload)
