"""``collect``: an OTLP/HTTP trace receiver that appends what it receives to a dataset.

``POST /v1/traces`` with protobuf (``application/x-protobuf``) or JSON (``application/json``)
bodies, optionally ``Content-Encoding: gzip``. Requests are decoded on arrival and answered
with an ``ExportTraceServiceResponse`` in the request's content type; decoded spans wait in
memory and are written (deduplicated) when a batch fills up or a flush interval passes, and on
stop, so every span acknowledged is on disk once :meth:`CollectorServer.stop` returns.

The stdlib ``ThreadingHTTPServer`` keeps this dependency-free and simple: one thread per
connection, a lock around the pending batch and the writer.
"""

from __future__ import annotations

import signal
import socket
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import orjson
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from nemo_telemetry.analysis._columns import OtlpTables, SpanColumns
from nemo_telemetry.analysis._otlp_json import decode_json_request
from nemo_telemetry.analysis._otlp_wire import decode_batch
from nemo_telemetry.analysis.dataset import DatasetWriter
from nemo_telemetry.analysis.ingest import BATCH_SPANS, _drop_malformed_ids

__all__ = ["CollectorServer", "CollectSummary", "run_collector", "DEFAULT_MAX_REQUEST_BYTES"]

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
_INVALID_ARGUMENT = 3  # google.rpc.Code


@dataclass(frozen=True)
class CollectSummary:
    """What a collector received and wrote."""

    requests: int
    spans: int
    events: int
    links: int
    duplicates_dropped: int
    rejected_requests: int
    rejected_spans: int


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class CollectorServer:
    """An OTLP/HTTP receiver writing to the dataset at ``out``; ``port=0`` picks a free port."""

    def __init__(
        self,
        out: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        batch_spans: int = BATCH_SPANS,
        flush_interval_s: float = 2.0,
    ) -> None:
        self.max_request_bytes = max_request_bytes
        self._writer = DatasetWriter(Path(out))
        self._batch_spans = batch_spans
        self._flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._pending: list[OtlpTables] = []
        self._pending_spans = 0
        self._counts = dict.fromkeys(CollectSummary.__dataclass_fields__, 0)
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._idle: set[socket.socket] = set()  # keep-alive connections waiting for a request
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = False  # server_close() joins in-flight requests
        self._httpd.block_on_close = True

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def traces_url(self) -> str:
        return f"{self.url}/v1/traces"

    def start(self) -> "CollectorServer":
        """Serve and flush in background threads; returns at once."""
        for target in (self._serve, self._flush_periodically):
            thread = threading.Thread(target=target, name=f"nemo-collect-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> CollectSummary:
        """Stop accepting, finish requests in flight, write every pending span; idempotent."""
        if not self._stopped.is_set():
            self._stopped.set()
            self._httpd.shutdown()
            self._close_idle_connections()
            self._httpd.server_close()
            for thread in self._threads:
                thread.join()
            self.flush()
        return self.summary()

    def _close_idle_connections(self) -> None:
        """Wake handler threads blocked on an idle keep-alive connection so they can be joined."""
        with self._lock:
            for conn in self._idle:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _count_rejected(self) -> None:
        with self._lock:
            self._counts["rejected_requests"] += 1

    def _connection_idle(self, conn: socket.socket, idle: bool) -> bool:
        """Track ``conn``; ``False`` once stopping (the handler should close the connection)."""
        with self._lock:
            (self._idle.add if idle else self._idle.discard)(conn)
            return not self._stopped.is_set()

    def __enter__(self) -> "CollectorServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> CollectSummary:
        with self._lock:
            return CollectSummary(**self._counts)

    def flush(self) -> None:
        """Write the pending spans now."""
        with self._lock:
            self._flush_locked()

    def _serve(self) -> None:
        self._httpd.serve_forever(poll_interval=0.05)  # stop() waits at most one poll

    def _flush_periodically(self) -> None:
        while not self._stopped.wait(self._flush_interval_s):
            self.flush()

    def _flush_locked(self) -> None:
        if not self._pending:
            return
        tables = OtlpTables.concat(self._pending)
        self._pending, self._pending_spans = [], 0
        written = self._writer.write(tables)
        self._counts["spans"] += written.spans.num_rows
        self._counts["events"] += written.events.num_rows
        self._counts["links"] += written.links.num_rows
        self._counts["duplicates_dropped"] += tables.spans.num_rows - written.spans.num_rows

    def accept(self, body: bytes, content_type: str) -> int:
        """Decode one request body and queue its spans; return how many spans were rejected."""
        try:
            tables, spans_rejected = self._decode(body, content_type)
        except (ValueError, orjson.JSONDecodeError) as exc:
            raise _BadRequest(400, f"bad OTLP {content_type} payload: {exc}") from None
        rejected = [spans_rejected]

        def count(n: int) -> None:
            rejected[0] = spans_rejected + n

        tables = _drop_malformed_ids(tables, count)
        with self._lock:
            self._counts["requests"] += 1
            self._counts["rejected_spans"] += rejected[0]
            self._pending.append(tables)
            self._pending_spans += tables.spans.num_rows
            if self._pending_spans >= self._batch_spans:
                self._flush_locked()
        return rejected[0]


    @staticmethod
    def _decode(body: bytes, content_type: str) -> tuple[OtlpTables, int]:
        """The request's tables and how many of its spans the decoder rejected alone."""
        if content_type == _JSON_TYPE:
            cols = SpanColumns()
            decode_json_request(orjson.loads(body), cols)
            return cols.to_tables(), len(cols.rejected)
        spans_rejected: list = []
        tables, rejected = decode_batch([body], spans_rejected)
        if rejected:
            raise ValueError(rejected[0][1])
        return tables, len(spans_rejected)


def _handler_for(server: CollectorServer) -> type:
    class Handler(_OtlpHandler):
        collector = server

    return Handler


class _OtlpHandler(BaseHTTPRequestHandler):
    """One request: check path, size, encoding and type, then hand the body to the collector."""

    collector: CollectorServer
    protocol_version = "HTTP/1.1"
    server_version = "nemo-telemetry-collect"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: the library never prints; the CLI reports the summary."""

    def handle(self) -> None:
        """The stdlib's keep-alive loop, with the connection marked idle between requests."""
        try:
            self.close_connection = True
            while self.collector._connection_idle(self.connection, True):
                self.handle_one_request()
                if self.close_connection:
                    break
        finally:
            self.collector._connection_idle(self.connection, False)

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        if not self.collector._connection_idle(self.connection, False):
            self.close_connection = True
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            body = self._read_body()
            if content_type not in _PROTOBUF_TYPES + (_JSON_TYPE,):
                raise _BadRequest(415, f"unsupported Content-Type {content_type!r}; send application/x-protobuf or application/json")
            rejected = self.collector.accept(body, content_type)
        except _BadRequest as exc:
            self.collector._count_rejected()
            self._reply_error(exc.status, str(exc), content_type)
            return
        self._reply_success(rejected, content_type)

    def _read_body(self) -> bytes:
        if self.path.split("?")[0] != "/v1/traces":
            self.close_connection = True
            raise _BadRequest(404, f"no OTLP endpoint at {self.path}; traces go to /v1/traces")
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise _BadRequest(411, "a Content-Length header is required")
        limit = self.collector.max_request_bytes
        if int(length) > limit:
            self.close_connection = True  # the body is not read
            raise _BadRequest(413, f"request of {length} bytes is over the {limit}-byte limit")
        body = self.rfile.read(int(length))
        encoding = self.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding == "gzip":
            return _gunzip(body, limit)
        if encoding not in ("identity", ""):
            raise _BadRequest(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
        return body

    def _reply_success(self, rejected: int, content_type: str) -> None:
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = "spans with malformed trace or span ids"
        if content_type == _JSON_TYPE:
            body = b"{}" if not rejected else orjson.dumps(
                {"partialSuccess": {"rejectedSpans": str(rejected), "errorMessage": response.partial_success.error_message}}
            )
        else:
            body, content_type = response.SerializeToString(), "application/x-protobuf"
        self._send(200, body, content_type)

    def _reply_error(self, status: int, message: str, content_type: str) -> None:
        if content_type == _JSON_TYPE:
            body = orjson.dumps({"code": _INVALID_ARGUMENT, "message": message})
        elif content_type in _PROTOBUF_TYPES:
            body = Status(code=_INVALID_ARGUMENT, message=message).SerializeToString()
        else:
            body, content_type = message.encode(), "text/plain; charset=utf-8"
        self._send(status, body, content_type)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress, refusing to inflate past ``limit`` (a small gzip bomb stays small)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise _BadRequest(400, f"corrupt gzip body ({exc})") from None
    if len(data) > limit or inflater.unconsumed_tail:
        raise _BadRequest(413, f"request inflates past the {limit}-byte limit")
    return data


def run_collector(
    out: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 4318,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    on_ready: Callable[[CollectorServer], None] | None = None,
    stop: threading.Event | None = None,
) -> CollectSummary:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set), then flush and return the summary."""
    stop = stop or threading.Event()
    server = CollectorServer(out, host=host, port=port, max_request_bytes=max_request_bytes).start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        if on_ready is not None:
            on_ready(server)
        while not stop.wait(0.2):
            pass
    finally:
        summary = server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return summary
