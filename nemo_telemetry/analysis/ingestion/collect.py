"""``collect``: an OTLP/HTTP trace receiver that commits what it receives to a dataset.

``POST /v1/traces`` with protobuf (``application/x-protobuf``) or JSON (``application/json``)
bodies, optionally ``Content-Encoding: gzip``, sized by ``Content-Length`` or sent
``Transfer-Encoding: chunked`` (``Expect: 100-continue`` answered). A request is answered 200
only once its spans are committed on disk: requests that arrive while a commit is running wait
together for the next one (group commit), so one write and one fsync serve them all. A write
that fails (a full disk, an I/O error, a permission) is answered 503 with ``Retry-After``, the
OTLP exporters' signal to send again; nothing is acknowledged that is not written.

Bounds, each a keyword of :class:`CollectorServer`: request size, concurrent connections (503
beyond), a timeout per socket read, a deadline for reading one request; the listen backlog is
``LISTEN_BACKLOG``. :meth:`CollectorServer.stop` drops idle and half-received requests at once
and answers those already received once their commit is done.

The stdlib ``ThreadingHTTPServer`` keeps this dependency-free: one thread per connection, one
committer thread that owns the dataset writer.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import orjson
import pyarrow as pa
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from nemo_telemetry.analysis.choices import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S
from nemo_telemetry.analysis.kernels import _compiled
from nemo_telemetry.analysis.ingestion._columns import OtlpTables, SpanColumns
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.ingestion._otlp_wire import decode_batch
from nemo_telemetry.analysis.store.dataset import DatasetWriter, SpanDeduplicator, read_dataset
from nemo_telemetry.analysis.ingestion.ingest import drop_malformed_ids
from nemo_telemetry.errors import IngestError, ListenError

__all__ = [
    "CollectorServer",
    "CollectSummary",
    "run_collector",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "LISTEN_BACKLOG",
    "RETRY_AFTER_S",
]

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
DEFAULT_REQUEST_TIMEOUT_S = 60.0  # reading one request, from its first line to its last byte
LISTEN_BACKLOG = 1024  # the kernel caps it at net.core.somaxconn
RETRY_AFTER_S = 1  # sent with every 503
_LINGER_S = 1.0  # after an early error reply, how long to discard what the client still sends
_STOP_POLL_S = 0.05  # the accept loop's poll: stop() and the deadline reaper act within it
_CHUNK_SIZE_LINE = re.compile(rb"[0-9A-Fa-f]{1,16}(;[^\r\n]*)?\r?\n")
_TRAILER_LINES = 100
_PROBLEMS_SHOWN = 5  # rejected spans named in a partial success's message
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
_INVALID_ARGUMENT, _UNAVAILABLE = 3, 14  # google.rpc.Code
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectSummary:
    """What a collector received and wrote.

    ``unavailable_requests`` were answered 503 (a failed write, too many connections, or
    stopping): the exporter sends them again. ``rejected_spans`` are the spans dropped from a
    partial success and those of a request answered 400 after decoding (a request that does not
    decode counts in ``rejected_requests`` only). ``unwritten_spans`` counts, once the collector has
    stopped, the distinct spans it received but could not write and no later retry wrote;
    ``write_error`` is the last write failure's cause ("" when every write worked).
    """

    requests: int
    spans: int
    events: int
    links: int
    duplicates_dropped: int
    rejected_requests: int
    rejected_spans: int
    unavailable_requests: int = 0
    unwritten_spans: int = 0
    write_error: str = ""


class _Reject(Exception):
    """A request answered with ``status`` and ``message`` instead of being stored."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Ticket:
    """One request's tables waiting for a commit; its handler waits on ``done``. ``error`` is
    the write's ``OSError`` (answer 503) or what else stopped these spans being stored (400)."""

    def __init__(self, tables: OtlpTables) -> None:
        self.tables = tables
        self.done = threading.Event()
        self.error: BaseException | None = None


class _Committer:
    """One thread owns the dataset writer: it takes every request queued while it was busy,
    writes and commits them together, then wakes their handlers with the outcome."""

    def __init__(self, root: Path, writer: DatasetWriter, counts: dict, lock: threading.Lock,
                 on_commit: Callable[[pa.Table], None] | None = None) -> None:
        self._root = root
        self._on_commit = on_commit  # sees each committed group's new spans, before any handler answers
        self._writer: DatasetWriter | None = writer  # None after a failed write, until reopened
        self._counts, self._lock = counts, lock  # the server's summary counters and their lock
        self._cond = threading.Condition()
        self._queued: list[_Ticket] = []
        self._closing = False
        self._failing = False
        self._failed_ids: list[pa.Table] = []  # distinct spans whose write failed
        self._failed_seen = SpanDeduplicator()
        self._thread = threading.Thread(target=self._run, name="nemo-collect-commit", daemon=True)
        self._thread.start()

    def submit(self, tables: OtlpTables) -> _Ticket:
        """Queue ``tables`` for the next commit; wait on the ticket's ``done``."""
        ticket = _Ticket(tables)
        with self._cond:
            self._queued.append(ticket)
            self._cond.notify()
        return ticket

    def close(self) -> None:
        """Commit what is queued, stop the thread, close the writer; count what stayed unwritten."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception as exc:  # noqa: BLE001 - reported in the summary
                self._record_failure(exc)
        if self._failed_ids:
            with self._lock:
                self._counts["unwritten_spans"] = self._still_unwritten()

    def _still_unwritten(self) -> int:
        """The failed spans that no later commit wrote (the dataset on disk is the judge)."""
        ids = pa.concat_tables(self._failed_ids)
        try:
            committed = SpanDeduplicator()
            committed.remember(read_dataset(self._root, "spans", columns=["trace_id", "span_id"]))
        except Exception as exc:  # noqa: BLE001 - cannot tell: count every failed span
            self._record_failure(exc)
            return ids.num_rows
        return int(committed.admit(ids).sum())

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._closing:
                    self._cond.wait()
                group, self._queued = self._queued, []
            if group:
                self._commit(group)
                for ticket in group:
                    ticket.done.set()
            elif self._closing:
                return

    def _commit(self, group: list[_Ticket]) -> None:
        """One write and commit for the group. A failure that is not the disk's (a table the
        writer refuses) is the fault of one request or more: each is then committed alone, so
        one bad request cannot fail the others."""
        tables = OtlpTables.concat([ticket.tables for ticket in group])
        try:
            written = self._write(tables, requests=len(group))
        except OSError as exc:
            self._record_failure(exc)
            self._remember_failed(tables.spans)
            for ticket in group:
                ticket.error = exc
            return
        except Exception as exc:  # noqa: BLE001 - answered 400; the thread lives on
            if len(group) == 1:
                group[0].error = exc
                return
            for ticket in group:
                self._commit([ticket])
            return
        if self._failing:
            self._failing = False
            _log.warning("writing %s works again", self._root)
        with self._lock:
            self._counts["spans"] += written.spans.num_rows
            self._counts["events"] += written.events.num_rows
            self._counts["links"] += written.links.num_rows
            self._counts["duplicates_dropped"] += tables.spans.num_rows - written.spans.num_rows
        if self._on_commit is not None and written.spans.num_rows:
            try:
                self._on_commit(written.spans)
            except Exception:  # noqa: BLE001 - a consumer's fault must not fail a durable commit
                _log.exception("the on_commit hook failed; the spans are committed")

    def _write(self, tables: OtlpTables, *, requests: int) -> OtlpTables:
        """Write and commit; durable on return. A failed commit leaves the writer usable; a
        failed write leaves it half-staged, so it is aborted and the next commit opens another."""
        writer = self._writer if self._writer is not None else self._open()
        try:
            written = writer.write(tables)
        except BaseException:
            self._writer = None
            try:
                writer.abort()
            except Exception:  # noqa: BLE001 - the write's own error is the one to report
                pass
            raise
        writer.commit(source="collect", requests=requests)
        return written

    def _open(self) -> DatasetWriter:
        self._writer = _open_session(self._root)
        return self._writer

    def _record_failure(self, exc: BaseException) -> None:
        """Log a failure once per outage (not per request); keep the cause for the summary."""
        cause = _describe(exc)
        if not self._failing:
            self._failing = True
            _log.error("cannot write %s (%s); answering 503 with Retry-After until writing works again",
                       self._root, cause)
        with self._lock:
            self._counts["write_error"] = cause

    def _remember_failed(self, spans: pa.Table) -> None:
        ids = spans.select(["trace_id", "span_id"])
        fresh = self._failed_seen.admit(ids)
        self._failed_ids.append(ids if fresh.all() else ids.filter(pa.array(fresh)))


def _open_session(root: Path) -> DatasetWriter:
    """A writer whose start is recorded: until it closes, readers say a collect is running (or
    was killed); its clean close also finishes the sessions of writers that failed before it."""
    writer = DatasetWriter(root)
    try:
        writer.start([], tool="collect")
    except BaseException:
        writer.abort()
        raise
    return writer


def _load_kernels() -> None:
    """Load the compiled decoder and dedup kernels (compiling them, once per machine, when their
    cache is empty) before listening, so that no exporter's first request waits for them;
    loaded, the seam takes them for every request however small."""
    _compiled.kernels(*_compiled.KERNEL_MODULES, work=_compiled.SMALL_BYTES)
    span = Span(trace_id=b"\1" * 16, span_id=b"\1" * 8, name="load", start_time_unix_nano=1, end_time_unix_nano=2)
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])
    tables, _ = _decode(request.SerializeToString(), _PROTOBUF_TYPES[0])
    SpanDeduplicator().admit(tables.spans)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"


class _Server(ThreadingHTTPServer):
    """The stdlib server with a deep listen backlog and a hook run at every accept-loop poll."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = False  # server_close() joins the connection threads
    block_on_close = True

    def __init__(self, address, handler, on_poll: Callable[[], None]) -> None:
        self._on_poll = on_poll
        super().__init__(address, handler)

    def service_actions(self) -> None:
        self._on_poll()


class CollectorServer:
    """An OTLP/HTTP receiver committing to the dataset at ``out``; ``port=0`` picks a free port.

    Raises :class:`~nemo_telemetry.errors.ListenError` when the address cannot be bound and
    :class:`~nemo_telemetry.errors.IngestError` when the dataset cannot be created. The class
    attributes are the default bounds. ``on_commit`` is called (on the committer thread) with the
    spans each commit added, deduplicated, once they are durable: how ``monitor`` sees them.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S

    def __init__(
        self,
        out: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        on_commit: Callable[[pa.Table], None] | None = None,
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._counts: dict = {name: field.default if isinstance(field.default, str) else 0
                              for name, field in CollectSummary.__dataclass_fields__.items()}
        self._stopped = threading.Event()
        self._deadlines: dict[socket.socket, float] = {}  # open connection -> when to drop it
        _load_kernels()
        try:
            writer = _open_session(Path(out))
        except OSError as exc:
            raise IngestError(f"{out}: cannot create the dataset ({_describe(exc)}); choose another --out") from None
        try:
            self._httpd = _Server((host, port), _handler_for(self), self._drop_late_connections)
        except OSError as exc:
            writer.abort()
            raise ListenError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        self._committer = _Committer(Path(out), writer, self._counts, self._lock, on_commit)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"

    def start(self) -> "CollectorServer":
        """Serve in a background thread; returns at once."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(_STOP_POLL_S,),
                                        name="nemo-collect-serve", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> CollectSummary:
        """Stop accepting, drop idle and half-received requests (a half-received one is answered
        503), answer the received ones after their commit, close the dataset; idempotent."""
        if not self._stopped.is_set():
            self._stopped.set()
            if self._thread is not None:
                self._httpd.shutdown()
            self._drop_late_connections()
            self._httpd.server_close()  # joins the connection threads
            self._committer.close()
        return self.summary()

    def __enter__(self) -> "CollectorServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> CollectSummary:
        with self._lock:
            return CollectSummary(**self._counts)

    def accept(self, body: bytes, content_type: str) -> int:
        """Decode one request body and commit its spans; return how many spans were rejected."""
        return self._accept(body, content_type)[0]

    def _accept(self, body: bytes, content_type: str) -> tuple[int, str]:
        """:meth:`accept`, and why spans were rejected alone (the partial success's message).
        Raises ``_Reject``: 400 for a body that
        does not decode or spans the writer refuses, 503 when the write fails (the disk's
        fault: the exporter sends it again)."""
        tables, problems = _decode(body, content_type)

        def count(n: int) -> None:
            problems.extend(["a span with a malformed trace or span id"] * n)

        tables = drop_malformed_ids(tables, count)
        ticket = self._committer.submit(tables)
        ticket.done.wait()
        if isinstance(ticket.error, OSError):
            raise _Reject(503, f"cannot write the dataset ({_describe(ticket.error)}); retry later")
        if ticket.error is not None:
            with self._lock:
                self._counts["rejected_spans"] += tables.spans.num_rows + len(problems)
            raise _Reject(400, f"the request's spans cannot be stored ({_describe(ticket.error)})")
        with self._lock:
            self._counts["requests"] += 1
            self._counts["rejected_spans"] += len(problems)
        return len(problems), _problems_message(problems)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _open_connection(self, conn: socket.socket) -> int:
        """Track ``conn``; return how many connections are open with it."""
        with self._lock:
            self._deadlines[conn] = time.monotonic() + self.read_timeout_s
            return len(self._deadlines)

    def _close_connection(self, conn: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(conn, None)

    def _set_deadline(self, conn: socket.socket, seconds: float) -> bool:
        """Drop ``conn`` if it is still reading in ``seconds`` (``inf``: the server is working on
        it); ``False`` once stopping, so the handler closes it."""
        with self._lock:
            if conn in self._deadlines:
                self._deadlines[conn] = time.monotonic() + seconds
            return not self._stopped.is_set()

    def _drop_late_connections(self) -> None:
        """End the reads of connections past their deadline, or of every reading one when
        stopping: their handler sees the end of input and answers or closes."""
        now = time.monotonic()
        with self._lock:
            late = [c for c, t in self._deadlines.items() if t < now or (self._stopped.is_set() and t < math.inf)]
        for conn in late:
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass


def _decode(body: bytes, content_type: str) -> tuple[OtlpTables, list[str]]:
    """The request's tables and what each span rejected alone was rejected for. Any failure of
    a decoder is the request's fault: a 400 that names it."""
    try:
        if content_type == _JSON_TYPE:
            cols = SpanColumns()
            decode_json_request(orjson.loads(body), cols)
            return cols.to_tables(), list(cols.rejected)
        problems: list[tuple[int, str]] = []
        tables, rejected = decode_batch([body], problems)
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise _Reject(400, f"bad OTLP {content_type} payload: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a decoder bug must not reset the connection
        raise _Reject(400, f"bad OTLP {content_type} payload: {type(exc).__name__}: {exc}") from None
    if rejected:
        raise _Reject(400, f"bad OTLP {content_type} payload: {rejected[0][1]}")
    return tables, [problem for _, problem in problems]


def _problems_message(problems: list[str]) -> str:
    """A partial success's message: the first few problems, and how many more."""
    shown = "; ".join(problems[:_PROBLEMS_SHOWN])
    more = len(problems) - _PROBLEMS_SHOWN
    return f"{shown}; and {more} more" if more > 0 else shown


def _handler_for(server: CollectorServer) -> type:
    class Handler(_OtlpHandler):
        collector = server
        timeout = server.read_timeout_s  # StreamRequestHandler sets it on the socket

    return Handler


class _OtlpHandler(BaseHTTPRequestHandler):
    """One connection: requests checked for path, type, encoding and size, bodies handed to the
    collector; every malformed request gets a 4xx with a message."""

    collector: CollectorServer
    protocol_version = "HTTP/1.1"
    server_version = "nemo-telemetry-collect"
    _overloaded = False
    _linger = False  # a body is left unread: discard it after the reply, then close

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: the library never prints; the CLI reports the summary."""

    def handle(self) -> None:
        """The stdlib's keep-alive loop, with deadlines, the connection bound and stop()."""
        collector = self.collector
        open_connections = collector._open_connection(self.connection)
        self._overloaded = open_connections > collector.max_connections
        if self._overloaded:  # answered 503 as soon as its request is in: it need not wait long
            self.connection.settimeout(min(collector.read_timeout_s, _LINGER_S))
        if collector._stopped.is_set() or open_connections > 2 * collector.max_connections:
            collector._close_connection(self.connection)  # stopping, or a flood: closed unanswered
            return
        try:
            self.close_connection = True
            while True:
                self.handle_one_request()
                if self.close_connection or not collector._set_deadline(self.connection, collector.read_timeout_s):
                    break
        finally:
            collector._close_connection(self.connection)

    def parse_request(self) -> bool:
        """The request line is in: from here it has ``request_timeout_s`` to arrive whole."""
        self.collector._set_deadline(self.connection, self.collector.request_timeout_s)
        return super().parse_request()

    def handle_expect_100(self) -> bool:
        """Refuse before the client sends its body, when the headers already say why."""
        try:
            self._check_headers()
        except _Reject as exc:
            self.close_connection = True
            self._reply_rejected(exc)
            return False
        return super().handle_expect_100()

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        try:
            self._check_headers()
            body = self._read_body()
            self.collector._set_deadline(self.connection, math.inf)
            rejected, message = self.collector._accept(body, self._content_type())
        except _Reject as exc:
            self._reply_rejected(exc)
            return
        self._reply_success(rejected, message)

    def _content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip().lower()

    def _check_headers(self) -> None:
        """Refuse what the request line and headers alone condemn; its body is left unread."""
        problem = self._header_problem()
        if problem is not None:
            self._linger = True
            raise problem

    def _header_problem(self) -> _Reject | None:
        collector = self.collector
        if self._overloaded:
            return _Reject(503, f"collector is serving its {collector.max_connections} connections; retry later")
        if collector._stopped.is_set():
            return _Reject(503, "collector is stopping; retry later")
        if self.path.split("?")[0] != "/v1/traces":
            return _Reject(404, f"no OTLP endpoint at {self.path}; traces go to /v1/traces")
        if self._content_type() not in _PROTOBUF_TYPES + (_JSON_TYPE,):
            return _Reject(415, f"unsupported Content-Type {self._content_type()!r}; "
                                "send application/x-protobuf or application/json")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip"):
            return _Reject(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
        transfer, length = self.headers.get("Transfer-Encoding"), self.headers.get("Content-Length")
        if transfer is not None:
            if transfer.strip().lower() != "chunked":
                return _Reject(501, f"unsupported Transfer-Encoding {transfer!r}; use chunked or a Content-Length")
            return None
        if length is None or not length.strip().isdigit():
            return _Reject(411, "a Content-Length or Transfer-Encoding: chunked header is required")
        if int(length) > collector.max_request_bytes:
            return _Reject(413, f"request of {int(length)} bytes is over the {collector.max_request_bytes}-byte limit")
        return None

    def _read_body(self) -> bytes:
        limit = self.collector.max_request_bytes
        try:
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = self.close_connection or self.headers.get("Content-Length") is not None
                body = self._read_chunked(limit)
            else:
                body = self._read_exactly(int(self.headers["Content-Length"]))
        except TimeoutError:
            self.close_connection = True
            raise _Reject(408, f"no byte of the body for {self.collector.read_timeout_s:g} s; send it faster") from None
        if self.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            return _gunzip(body, limit)
        return body

    def _read_exactly(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if len(data) < size:
            self._body_ended(f"after {len(data)} of {size} bytes")
        return data

    def _body_ended(self, where: str) -> None:
        """The input ended inside a body: the client closed, or its time ran out, or stop()."""
        self.close_connection = True
        if self.collector._stopped.is_set():
            raise _Reject(503, "collector is stopping; retry later")
        raise _Reject(408, f"the body ended {where} (or took over {self.collector.request_timeout_s:g} s)")

    def _read_chunked(self, limit: int) -> bytes:
        """A ``Transfer-Encoding: chunked`` body, refused past ``limit`` bytes like any other."""
        parts, size = [], 0
        while True:
            line = self.rfile.readline(80)
            if not line:
                self._body_ended(f"after {size} bytes of chunks")
            if not _CHUNK_SIZE_LINE.fullmatch(line):
                self.close_connection = True
                raise _Reject(400, f"bad chunk size line {line[:40]!r} in a chunked body")
            chunk = int(line.split(b";")[0], 16)
            if chunk == 0:
                break
            size += chunk
            if size > limit:
                self._linger = True
                raise _Reject(413, f"chunked request is over the {limit}-byte limit")
            parts.append(self._read_exactly(chunk))
            end = self.rfile.read(1)
            if end == b"\r":
                end = self.rfile.read(1)
            if end != b"\n":
                self.close_connection = True
                raise _Reject(400, "a chunk of a chunked body is not followed by CRLF")
        for _ in range(_TRAILER_LINES):  # trailer fields, ignored, up to the blank line
            if self.rfile.readline(65537) in (b"\r\n", b"\n", b""):
                return b"".join(parts)
        self.close_connection = True
        raise _Reject(400, f"more than {_TRAILER_LINES} trailer lines after a chunked body")

    def _reply_rejected(self, exc: _Reject) -> None:
        self.collector._count("unavailable_requests" if exc.status == 503 else "rejected_requests")
        if self._linger:
            self.close_connection = True
        content_type = self._content_type()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 503 else {}
        code = _UNAVAILABLE if exc.status == 503 else _INVALID_ARGUMENT
        if content_type == _JSON_TYPE:
            body = orjson.dumps({"code": code, "message": str(exc)})
        elif content_type in _PROTOBUF_TYPES:
            body = Status(code=code, message=str(exc)).SerializeToString()
        else:
            body, content_type = str(exc).encode(), "text/plain; charset=utf-8"
        self._send(exc.status, body, content_type, headers)
        if self._linger:
            self._discard_input()

    def _reply_success(self, rejected: int, message: str) -> None:
        response = ExportTraceServiceResponse()
        content_type = self._content_type()
        if rejected:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = message
        if content_type == _JSON_TYPE:
            body = b"{}" if not rejected else orjson.dumps(
                {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": message}}
            )
        else:
            body, content_type = response.SerializeToString(), "application/x-protobuf"
        self._send(200, body, content_type, {})

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _discard_input(self) -> None:
        """Read what the client still sends for up to ``_LINGER_S`` before closing, so that its
        unread bytes do not make the close a reset that loses the reply (a lingering close)."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _LINGER_S
            while (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                if not self.connection.recv(1 << 16):
                    return
        except OSError:
            pass


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress, refusing to inflate past ``limit`` (a small gzip bomb stays small)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _Reject(400, f"corrupt gzip body ({exc})") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise _Reject(413, f"request inflates past the {limit}-byte limit")
    return data


def run_collector(
    out: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 4318,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    on_ready: Callable[[CollectorServer], None] | None = None,
    stop: threading.Event | None = None,
) -> CollectSummary:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set), then stop and return the summary."""
    stop = stop or threading.Event()
    server = CollectorServer(out, host=host, port=port, max_request_bytes=max_request_bytes,
                             max_connections=max_connections, read_timeout_s=read_timeout_s).start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        if on_ready is not None:
            on_ready(server)
        while not stop.wait(0.1):
            pass
    finally:
        summary = server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return summary
