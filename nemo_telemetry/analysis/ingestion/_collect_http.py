"""The collector's HTTP side: one connection's requests checked (path, type, encoding, size,
chunked bodies, deadlines), their bodies decoded, and every answer written (200 with a partial
success, 4xx naming the fault, 503 with ``Retry-After``). Each signal has its endpoint
(:data:`ENDPOINTS`); a body that is not a request of the endpoint's signal (another signal's, a
bare ``ResourceSpans``, a JSON object of some other API) is refused with 400 naming what it is.

Its own module so that :mod:`~nemo_telemetry.analysis.ingestion.collect` holds the server's life
(bounds, start, stop, the summary) and this one the protocol; the handler reaches the server only
through :class:`Receiver`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Protocol

import orjson
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from nemo_telemetry.analysis.ingestion._columns import OtlpTables, SpanColumns
from nemo_telemetry.analysis.ingestion._detect import proto_signal
from nemo_telemetry.analysis.ingestion._otlp_json import decode_json_request
from nemo_telemetry.analysis.ingestion._otlp_wire import decode_batch
from nemo_telemetry.analysis.ingestion.logs import request_logs
from nemo_telemetry.analysis.ingestion.metrics import request_points

__all__ = ["Reject", "Receiver", "ListeningServer", "handler_for", "decode_body", "decode_request", "problems_message",
           "LISTEN_BACKLOG", "RETRY_AFTER_S", "PROTOBUF_TYPES", "JSON_TYPE", "MAX_GZIP_MEMBERS", "ENDPOINTS",
           "DecodedRequest"]

LISTEN_BACKLOG = 1024  # the kernel caps it at net.core.somaxconn
RETRY_AFTER_S = 1  # sent with every 503
_LINGER_S = 1.0  # after an early error reply, how long to discard what the client still sends
_CHUNK_SIZE_LINE = re.compile(rb"[0-9A-Fa-f]{1,16}(;[^\r\n]*)?\r?\n")
_TRAILER_LINES = 100
_PROBLEMS_SHOWN = 5  # rejected spans named in a partial success's message
PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"
_INVALID_ARGUMENT, _UNAVAILABLE, _UNAUTHENTICATED = 3, 14, 16  # google.rpc.Code
_GZIP_MAGIC = b"\x1f\x8b"
MAX_GZIP_MEMBERS = 1000  # a body's gzip members (exporters send one)
_GZIP_FEED = 1 << 16  # compressed bytes fed to the inflater at a time
_MAX_LENGTH_DIGITS = 19  # an int64 byte count; a longer Content-Length is malformed, not merely large
ENDPOINTS = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}
"""The OTLP/HTTP paths served, and the signal each takes."""
_PATH_OF = {signal: path for path, signal in ENDPOINTS.items()}
_REQUEST_KEYS = {"traces": ("resourceSpans", "resource_spans"), "metrics": ("resourceMetrics", "resource_metrics"),
                 "logs": ("resourceLogs", "resource_logs")}
_REQUEST_NAMES = {"traces": "ExportTraceServiceRequest", "metrics": "ExportMetricsServiceRequest",
                  "logs": "ExportLogsServiceRequest"}
_BARE_KEYS = {"traces": ("scopeSpans", "scope_spans"), "metrics": ("scopeMetrics", "scope_metrics"),
              "logs": ("scopeLogs", "scope_logs")}
_ITEMS = {"traces": "spans", "metrics": "data points", "logs": "log records"}


class Reject(Exception):
    """A request answered with ``status`` and ``message`` instead of being stored."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ListeningServer(ThreadingHTTPServer):
    """The stdlib server with a deep listen backlog and a hook run at every accept-loop poll."""

    request_queue_size = LISTEN_BACKLOG
    daemon_threads = False  # server_close() joins the connection threads
    block_on_close = True

    def __init__(self, address, handler, on_poll: Callable[[], None]) -> None:
        self._on_poll = on_poll
        super().__init__(address, handler)

    def service_actions(self) -> None:
        self._on_poll()


class Receiver(Protocol):
    """What a connection's handler asks of the collector that owns it
    (:class:`~nemo_telemetry.analysis.ingestion.collect.CollectorServer`): its bounds, whether it
    is stopping, its connection deadlines, its counters, and the request's commit."""

    max_request_bytes: int
    max_connections: int
    read_timeout_s: float
    request_timeout_s: float
    token: bytes | None  # the bearer token every request must carry; None: no check
    tls: ssl.SSLContext | None  # connections are TLS when set
    _stopped: threading.Event

    def _open_connection(self, conn: socket.socket) -> int: ...
    def _close_connection(self, conn: socket.socket) -> None: ...
    def _set_deadline(self, conn: socket.socket, seconds: float) -> bool: ...
    def _count(self, name: str) -> None: ...
    def _accept(self, body: bytes, content_type: str, signal: str = "traces") -> tuple[int, str]: ...


def decode_body(body: bytes, content_type: str, doc: object = None) -> tuple[OtlpTables, list[str]]:
    """The trace request's tables and what each span rejected alone was rejected for (``doc``: a
    JSON body parsed already). Any failure of a decoder is the request's fault: a 400 that names it."""
    try:
        if content_type == JSON_TYPE:
            cols = SpanColumns()
            decode_json_request(orjson.loads(body) if doc is None else doc, cols)
            return cols.to_tables(), list(cols.rejected)
        problems: list[tuple[int, str]] = []
        tables, rejected = decode_batch([body], problems)
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise Reject(400, f"bad OTLP {content_type} payload: {exc}") from None
    except Exception as exc:  # a decoder bug must not reset the connection
        raise Reject(400, f"bad OTLP {content_type} payload: {type(exc).__name__}: {exc}") from None
    if rejected:
        raise Reject(400, f"bad OTLP {content_type} payload: {rejected[0][1]}")
    return tables, [problem for _, problem in problems]


@dataclass(frozen=True)
class DecodedRequest:
    """A request body decoded: the span tables (empty for metrics and logs), the metrics or logs
    table as the dataset file to stage (``(metrics/<hash>.parquet, table)``, named by the body's
    content as ``ingest`` names a dump's, so a body sent again is stored once), and each item
    (span, data point, log record) rejected alone."""

    tables: OtlpTables
    files: tuple[tuple[str, object], ...]
    problems: list[str]


def decode_request(body: bytes, content_type: str, signal: str = "traces") -> DecodedRequest:
    """A body posted to ``signal``'s endpoint, decoded; :class:`Reject` (400) naming the fault when
    it does not decode or is not a request of that signal."""
    json_body = content_type == JSON_TYPE
    doc = _parsed_json(body, content_type) if json_body else None
    wrong = _wrong_json(doc, signal) if json_body else _wrong_proto(body, signal)
    if wrong is not None:
        raise Reject(400, f"bad OTLP {content_type} payload: {wrong}")
    if signal == "traces":
        tables, problems = decode_body(body, content_type, doc)
        return DecodedRequest(tables, (), problems)
    read = request_points if signal == "metrics" else request_logs
    try:
        table, problems = read(body, json_body=json_body)
    except ValueError as exc:
        raise Reject(400, f"bad OTLP {content_type} payload: {exc}") from None
    except Exception as exc:  # a decoder bug must not reset the connection
        raise Reject(400, f"bad OTLP {content_type} payload: {type(exc).__name__}: {exc}") from None
    files = ((f"{signal}/{hashlib.sha1(body).hexdigest()[:20]}.parquet", table),) if table.num_rows else ()
    return DecodedRequest(OtlpTables.empty(), files, list(problems))


def _parsed_json(body: bytes, content_type: str) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Reject(400, f"bad OTLP {content_type} payload: {exc}") from None


def _wrong_json(doc: object, signal: str) -> str | None:
    """Why a parsed JSON body is not an OTLP/JSON request of ``signal`` (None when it is one; ``{}``
    is the empty request)."""
    name, key = _REQUEST_NAMES[signal], _REQUEST_KEYS[signal][0]
    if not isinstance(doc, dict):
        return f"the body is a JSON {type(doc).__name__}, not an OTLP/JSON {name} object ({{\"{key}\": [...]}})"
    if not doc or any(k in doc for k in _REQUEST_KEYS[signal]):
        return None
    other = next((s for s, keys in _REQUEST_KEYS.items() if any(k in doc for k in keys)), None)
    if other is not None:
        return f"a {other} request ({_REQUEST_KEYS[other][0]}) sent to {_PATH_OF[signal]}; send it to {_PATH_OF[other]}"
    keys = ", ".join(str(k) for k in list(doc)[:5])
    bare = any(k in doc for k in _BARE_KEYS[signal])
    hint = (f"; it looks like one {key[0].upper()}{key[1:]} object: send {{\"{key}\": [it]}}" if bare
            else f"; an OTLP/JSON {name} holds {key}")
    return f"no {key} in the JSON object (its keys: {keys}): not an OTLP/JSON {name}{hint}"


def _wrong_proto(body: bytes, signal: str) -> str | None:
    """Why a protobuf body is another signal's request (None when it is not told as one)."""
    other = proto_signal(body)
    if other is None or other == signal:
        return None
    return (f"a protobuf {_REQUEST_NAMES[other]} ({other}) sent to {_PATH_OF[signal]}; "
            f"send it to {_PATH_OF[other]}")


def problems_message(problems: list[str]) -> str:
    """A partial success's message: the first few problems, and how many more."""
    shown = "; ".join(problems[:_PROBLEMS_SHOWN])
    more = len(problems) - _PROBLEMS_SHOWN
    return f"{shown}; and {more} more" if more > 0 else shown


def handler_for(server: Receiver) -> type:
    class Handler(_OtlpHandler):
        collector = server
        timeout = server.read_timeout_s  # StreamRequestHandler sets it on the socket

    return Handler


class _OtlpHandler(BaseHTTPRequestHandler):
    """One connection: requests checked for path, type, encoding and size, bodies handed to the
    collector; every malformed request gets a 4xx with a message."""

    collector: Receiver
    protocol_version = "HTTP/1.1"
    server_version = "nemo-telemetry-collect"
    disable_nagle_algorithm = True  # a reply's head and body are two writes: the body must not wait for an ACK
    _overloaded = False
    _linger = False  # a body is left unread: discard it after the reply, then close

    def log_message(self, format: str, *args) -> None:  # the stdlib's name
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
            if not self._handshake():
                return
            while True:
                self.handle_one_request()
                if self.close_connection or not collector._set_deadline(self.connection, collector.read_timeout_s):
                    break
        finally:
            collector._close_connection(self.connection)

    def setup(self) -> None:
        """With TLS, the connection is wrapped here and its handshake done in :meth:`handle`, on
        this connection's thread under its deadlines (never in the accept loop)."""
        if self.collector.tls is not None:
            self.request = self.collector.tls.wrap_socket(self.request, server_side=True,
                                                          do_handshake_on_connect=False)
        super().setup()

    def _handshake(self) -> bool:
        """The TLS handshake; False (the connection closed, counted) when the client fails it:
        plain HTTP to a TLS port, a certificate it does not trust, silence past the deadline."""
        if self.collector.tls is None:
            return True
        try:
            self.connection.do_handshake()
        except OSError:  # ssl.SSLError, a reset, the read deadline
            self.collector._count("failed_handshakes")
            return False
        return True

    def finish(self) -> None:
        """The stdlib closes the socket it accepted; a TLS connection wraps it, so close that."""
        try:
            super().finish()
        finally:
            if self.collector.tls is not None:
                try:
                    socket.socket.shutdown(self.connection, socket.SHUT_WR)
                except OSError:
                    pass
                self.connection.close()

    def parse_request(self) -> bool:
        """The request line is in: from here it has ``request_timeout_s`` to arrive whole."""
        self.collector._set_deadline(self.connection, self.collector.request_timeout_s)
        return super().parse_request()

    def handle_expect_100(self) -> bool:
        """Refuse before the client sends its body, when the headers already say why."""
        try:
            self._check_headers()
        except Reject as exc:
            self.close_connection = True
            self._reply_rejected(exc)
            return False
        return super().handle_expect_100()

    def do_POST(self) -> None:  # the stdlib's name
        try:
            self._check_headers()
            body = self._read_body()
            self.collector._set_deadline(self.connection, math.inf)
            rejected, message = self.collector._accept(body, self._content_type(), self._signal())
        except Reject as exc:
            self._reply_rejected(exc)
            return
        self._reply_success(rejected, message)

    def _signal(self) -> str:
        return ENDPOINTS[self.path.split("?")[0]]

    def _content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip().lower()

    def _check_headers(self) -> None:
        """Refuse what the request line and headers alone condemn; its body is left unread."""
        problem = self._header_problem()
        if problem is not None:
            self._linger = True
            raise problem

    def _header_problem(self) -> Reject | None:
        collector = self.collector
        if self._overloaded:
            return Reject(503, f"collector is serving its {collector.max_connections} connections; retry later")
        if collector._stopped.is_set():
            return Reject(503, "collector is stopping; retry later")
        if collector.token is not None and not self._authorized():
            return Reject(401, "missing or wrong bearer token: send the header "
                               "'Authorization: Bearer <the token in the receiver's --token-file>'")
        if self.path.split("?")[0] not in ENDPOINTS:
            return Reject(404, f"no OTLP endpoint at {self.path}; traces go to /v1/traces, metrics to /v1/metrics, "
                               "logs to /v1/logs")
        if self._content_type() not in PROTOBUF_TYPES + (JSON_TYPE,):
            return Reject(415, f"unsupported Content-Type {self._content_type()!r}; "
                                "send application/x-protobuf or application/json")
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", "", "gzip"):
            return Reject(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
        transfer, length = self.headers.get("Transfer-Encoding"), self.headers.get("Content-Length")
        if transfer is not None:
            if transfer.strip().lower() != "chunked":
                return Reject(501, f"unsupported Transfer-Encoding {transfer!r}; use chunked or a Content-Length")
            return None
        if length is None:
            return Reject(411, "a Content-Length or Transfer-Encoding: chunked header is required")
        size = self._content_length()
        if size is None:
            return Reject(400, f"malformed Content-Length {length.strip()[:40]!r}: give the body's size in bytes, "
                               f"a decimal number of at most {_MAX_LENGTH_DIGITS} digits")
        if size > collector.max_request_bytes:
            return Reject(413, f"request of {size} bytes is over the {collector.max_request_bytes}-byte limit")
        return None

    def _authorized(self) -> bool:
        """Whether the request carries the bearer token, compared in constant time (the scheme
        name is case-insensitive, RFC 9110)."""
        scheme, _, credentials = self.headers.get("Authorization", "").strip().partition(" ")
        presented = credentials.strip().encode("latin-1", "replace") if scheme.lower() == "bearer" else b""
        return hmac.compare_digest(presented, self.collector.token)

    def _content_length(self) -> int | None:
        """The Content-Length as a number; None when it is not one (a sign, a letter, a second
        header that disagrees, more digits than any body has)."""
        values = {value.strip() for value in self.headers.get_all("Content-Length", [])}
        if len(values) != 1:
            return None
        value = values.pop()
        if not (value.isascii() and value.isdigit()):
            return None
        significant = value.lstrip("0") or "0"
        return int(significant) if len(significant) <= _MAX_LENGTH_DIGITS else None

    def _read_body(self) -> bytes:
        limit = self.collector.max_request_bytes
        try:
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = self.close_connection or self.headers.get("Content-Length") is not None
                body = self._read_chunked(limit)
            else:
                body = self._read_exactly(self._content_length())
        except TimeoutError:
            self.close_connection = True
            raise Reject(408, f"no byte of the body for {self.collector.read_timeout_s:g} s; send it faster") from None
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
            raise Reject(503, "collector is stopping; retry later")
        raise Reject(408, f"the body ended {where} (or took over {self.collector.request_timeout_s:g} s)")

    def _read_chunked(self, limit: int) -> bytes:
        """A ``Transfer-Encoding: chunked`` body, refused past ``limit`` bytes like any other."""
        parts, size = [], 0
        while True:
            line = self.rfile.readline(80)
            if not line:
                self._body_ended(f"after {size} bytes of chunks")
            if not _CHUNK_SIZE_LINE.fullmatch(line):
                self.close_connection = True
                raise Reject(400, f"bad chunk size line {line[:40]!r} in a chunked body")
            chunk = int(line.split(b";")[0], 16)
            if chunk == 0:
                break
            size += chunk
            if size > limit:
                self._linger = True
                raise Reject(413, f"chunked request is over the {limit}-byte limit")
            parts.append(self._read_exactly(chunk))
            end = self.rfile.read(1)
            if end == b"\r":
                end = self.rfile.read(1)
            if end != b"\n":
                self.close_connection = True
                raise Reject(400, "a chunk of a chunked body is not followed by CRLF")
        for _ in range(_TRAILER_LINES):  # trailer fields, ignored, up to the blank line
            if self.rfile.readline(65537) in (b"\r\n", b"\n", b""):
                return b"".join(parts)
        self.close_connection = True
        raise Reject(400, f"more than {_TRAILER_LINES} trailer lines after a chunked body")

    def _reply_rejected(self, exc: Reject) -> None:
        self.collector._count("unavailable_requests" if exc.status == 503 else "rejected_requests")
        if self._linger:
            self.close_connection = True
        content_type = self._content_type()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 503 else {}
        if exc.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="nemo-telemetry"'
        code = {503: _UNAVAILABLE, 401: _UNAUTHENTICATED}.get(exc.status, _INVALID_ARGUMENT)
        if content_type == JSON_TYPE:
            body = orjson.dumps({"code": code, "message": str(exc)})
        elif content_type in PROTOBUF_TYPES:
            body = Status(code=code, message=str(exc)).SerializeToString()
        else:
            body, content_type = str(exc).encode(), "text/plain; charset=utf-8"
        self._send(exc.status, body, content_type, headers)
        if self._linger:
            self._discard_input()

    def _reply_success(self, rejected: int, message: str) -> None:
        signal = self._signal()
        response, field, json_field = {
            "traces": (ExportTraceServiceResponse(), "rejected_spans", "rejectedSpans"),
            "metrics": (ExportMetricsServiceResponse(), "rejected_data_points", "rejectedDataPoints"),
            "logs": (ExportLogsServiceResponse(), "rejected_log_records", "rejectedLogRecords"),
        }[signal]
        content_type = self._content_type()
        if rejected:
            setattr(response.partial_success, field, rejected)
            response.partial_success.error_message = message
        if content_type == JSON_TYPE:
            body = b"{}" if not rejected else orjson.dumps(
                {"partialSuccess": {json_field: str(rejected), "errorMessage": message}}
            )
        else:
            body, content_type = response.SerializeToString(), "application/x-protobuf"
        self._send(200, body, content_type, {})

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str]) -> None:
        """Write the reply; a connection that can no longer carry one (the client gone, or a TLS
        connection whose reads were ended by stop() or a deadline) is closed unanswered: the
        exporter sees a connection error and sends again, as it does after a 503."""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True

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
    """Decompress every gzip member of ``body`` (RFC 1952 allows several, concatenated), refusing
    to inflate past ``limit`` in all (a small gzip bomb stays small), and refusing a body that
    ends inside a member or goes on after the last one with bytes that are not a member: only a
    body decoded whole is stored. The input is fed ``_GZIP_FEED`` bytes at a time and members
    are bounded by ``MAX_GZIP_MEMBERS``, so that a body of many tiny members costs at most about
    ``MAX_GZIP_MEMBERS * _GZIP_FEED`` bytes copied, not its size squared."""
    view = memoryview(body)
    parts: list[bytes] = []
    size = offset = members = 0
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while not inflater.eof and offset < len(view):
                chunk = view[offset:offset + _GZIP_FEED]
                offset += len(chunk)
                data = inflater.decompress(chunk, limit - size + 1)
                size += len(data)
                if size > limit or inflater.unconsumed_tail:
                    raise Reject(413, f"request inflates past the {limit}-byte limit")
                if data:
                    parts.append(data)
        except zlib.error as exc:
            raise Reject(400, f"corrupt gzip body ({exc}) in member {members + 1}") from None
        if not inflater.eof:
            raise Reject(400, f"truncated gzip body: member {members + 1} ends before its end "
                              f"(after {len(body)} bytes sent, {size} inflated); send the whole body")
        members += 1
        offset -= len(inflater.unused_data)
        if offset == len(view):
            return b"".join(parts)
        rest = bytes(view[offset:offset + len(_GZIP_MAGIC)])
        if not _GZIP_MAGIC.startswith(rest):  # a member cut after its first byte is truncated, above
            raise Reject(400, f"{len(view) - offset} bytes after the end of gzip member {members} are not a "
                              "gzip member; send the compressed body alone")
        if members == MAX_GZIP_MEMBERS:
            raise Reject(400, f"a gzip body of more than {MAX_GZIP_MEMBERS} members; send fewer, larger ones")
