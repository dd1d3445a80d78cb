"""``collect``: an OTLP/HTTP receiver that commits what it receives to a dataset.

``POST /v1/traces``, ``/v1/metrics`` and ``/v1/logs`` with protobuf (``application/x-protobuf``)
or JSON (``application/json``) bodies (spans to the dataset's span tables, data points and log
records to its ``metrics/`` and ``logs/`` tables, read by ``read_metrics`` / ``read_logs`` as
``ingest``'s are; a body that is not a request of the endpoint's signal is answered 400), optionally ``Content-Encoding: gzip`` (every member decoded; a body cut short, or with
bytes after its last member, refused), sized by ``Content-Length`` or sent
``Transfer-Encoding: chunked`` (``Expect: 100-continue`` answered). A request is answered 200
only once its spans are committed on disk: requests that arrive while a commit is running wait
together for the next one (group commit), so one write and one fsync serve them all. A write
that fails (a full disk, an I/O error, a permission) is answered 503 with ``Retry-After``, the
OTLP exporters' signal to send again; nothing is acknowledged that is not written.

Bounds, each a keyword of :class:`CollectorServer`: request size, concurrent connections (503
beyond), a timeout per socket read, a deadline for reading one request; the listen backlog is
``LISTEN_BACKLOG``. :meth:`CollectorServer.stop` drops idle and half-received requests at once
and answers those already received once their commit is done. Beyond loopback, a bearer token
and TLS guard it (:class:`CollectorServer`'s ``token``, ``tls_cert`` / ``tls_key``). It listens
before the compiled kernels are loaded (:class:`_KernelLoader`).

The stdlib ``ThreadingHTTPServer`` keeps this dependency-free: one thread per connection
(:mod:`~nemo_telemetry.analysis.ingestion._collect_http`), one committer thread that owns the
dataset writer (:mod:`~nemo_telemetry.analysis.ingestion._collect_commit`); this module is the
server that binds them, with its bounds and its summary.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from nemo_telemetry.analysis.settings.choices import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_TIMEOUT_S
from nemo_telemetry.analysis.kernels import compiled as _compiled
from nemo_telemetry.analysis.ingestion._collect_commit import Committer, describe_failure, hold_dataset, open_session
from nemo_telemetry.analysis.ingestion._collect_http import (
    LISTEN_BACKLOG,
    MAX_GZIP_MEMBERS,
    PROTOBUF_TYPES,
    RETRY_AFTER_S,
    ListeningServer,
    Reject,
    decode_body,
    decode_request,
    handler_for,
    problems_message,
)
from nemo_telemetry.analysis.store.dataset import SpanDeduplicator
from nemo_telemetry.analysis.ingestion.ingest import drop_malformed_ids
from nemo_telemetry.environment_variables import NEMO_TELEMETRY_COMPILED
from nemo_telemetry.errors import IngestError, ListenError, ReceiverSecurityError

__all__ = [
    "CollectorServer",
    "CollectSummary",
    "run_collector",
    "load_kernels",
    "read_token_file",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "LISTEN_BACKLOG",
    "MAX_GZIP_MEMBERS",
    "RETRY_AFTER_S",
]

DEFAULT_REQUEST_TIMEOUT_S = 60.0  # reading one request, from its first line to its last byte
_STOP_POLL_S = 0.05  # the accept loop's poll: stop() and the deadline reaper act within it
_KERNEL_LOAD_JOIN_S = 5.0  # stop() waits this long for a load from the kernel cache in flight
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CollectSummary:
    """What a collector received and wrote.

    ``unavailable_requests`` were answered 503 (a failed write, too many connections, or
    stopping): the exporter sends them again. ``rejected_spans`` are the spans dropped from a
    partial success and those of a request answered 400 after decoding (a request that does not
    decode counts in ``rejected_requests`` only; so does one refused 401 for its bearer token).
    ``failed_handshakes`` are TLS connections closed before a request (plain HTTP to a TLS
    receiver, a client that does not trust its certificate). ``unwritten_spans`` counts, once the collector has
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
    failed_handshakes: int = 0
    metric_points: int = 0
    logs: int = 0
    rejected_metric_points: int = 0
    rejected_logs: int = 0



def load_kernels() -> None:
    """Load the compiled decoder and dedup kernels (compiling them when their cache is empty)
    with the signatures a receiver's requests use; loaded, the seam takes them for every
    request however small."""
    _compiled.kernels(*_compiled.KERNEL_MODULES, work=_compiled.SMALL_BYTES)
    span = Span(trace_id=b"\1" * 16, span_id=b"\1" * 8, name="load", start_time_unix_nano=1, end_time_unix_nano=2)
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[span])])])
    tables, _ = decode_body(request.SerializeToString(), PROTOBUF_TYPES[0])
    SpanDeduplicator().admit(tables.spans)


_COMPILE_COMMAND = "from nemo_telemetry.analysis.ingestion.collect import load_kernels; load_kernels()"


class _KernelLoader:
    """Loads the compiled kernels while the receiver already serves, so that an exporter's first
    request is answered at once even on a fresh install (an empty kernel cache: a compile of
    every kernel first).

    With the kernels cached, a background thread loads them. With nothing
    cached, a child process compiles them into the cache (its own interpreter: the compiler
    does not hold this one's GIL, and stopping kills it at once) while every request takes the
    reference decoders (:func:`~nemo_telemetry.analysis.kernels.compiled.deferred`); once it
    is done the thread loads them from the cache. A compile that fails leaves the reference
    paths serving, with one warning in the log. With no writable cache, nothing is compiled
    ahead: the reference paths serve, as the seam decides for any small input.
    """

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._child: subprocess.Popen | None = None
        self._child_lock = threading.Lock()
        self._thread = threading.Thread(target=self._load, name="nemo-collect-kernels", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            how = _compiled.mode()
            if how == "off":
                return
            if how == "auto" and not _compiled.cached(*_compiled.KERNEL_MODULES):
                if _compiled.cache_dir() is None:
                    return
                with _compiled.deferred(*_compiled.KERNEL_MODULES):
                    if not self._compile_in_child():
                        return
            if not self._stopping.is_set():
                load_kernels()
        except Exception as exc:  # the reference paths serve; the receiver goes on
            _log.warning("collect: loading the compiled kernels failed (%s: %s); the reference decoders serve",
                         type(exc).__name__, exc)

    def _compile_in_child(self) -> bool:
        """Compile the kernels into the cache in a child process; whether it succeeded."""
        with self._child_lock:
            if self._stopping.is_set():
                return False
            env = {**os.environ, NEMO_TELEMETRY_COMPILED: "1"}
            self._child = subprocess.Popen([sys.executable, "-c", _COMPILE_COMMAND], env=env,
                                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.PIPE, start_new_session=True)  # a Ctrl-C is ours
        _, stderr = self._child.communicate()
        if self._stopping.is_set():
            return False
        if self._child.returncode != 0:
            last = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {self._child.returncode}"]
            _log.warning("collect: compiling the kernels failed (%s); the reference decoders serve", last[0])
            return False
        return True

    def stop(self) -> None:
        """Kill a compile in flight (numba replaces cache files atomically: a later run starts
        over), and let a load from the cache finish within a second or two."""
        with self._child_lock:
            self._stopping.set()
            child = self._child
        if child is not None and child.poll() is None:
            child.kill()
        self._thread.join(_KERNEL_LOAD_JOIN_S)


def read_token_file(path: str | Path) -> str:
    """The bearer token in ``path`` (its first line, surrounding whitespace dropped); raises
    :class:`~nemo_telemetry.errors.ReceiverSecurityError` naming the file when it cannot be
    read or holds no usable token."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReceiverSecurityError(f"--token-file {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    lines = text.strip().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ReceiverSecurityError(f"--token-file {path}: the file is empty; write the token on its first line")
    _check_token(token, where=f"--token-file {path}")
    return token


def _check_token(token: str | None, where: str = "token") -> bytes | None:
    """The token as the bytes a request's header must carry; printable ASCII without spaces, so
    that it travels in an HTTP header unchanged."""
    if token is None:
        return None
    if not token or not all("!" <= c <= "~" for c in token):
        raise ReceiverSecurityError(f"{where}: a bearer token is printable ASCII without spaces "
                                    "(for example `openssl rand -hex 32`)")
    return token.encode("ascii")


def _tls_context(cert: str | Path | None, key: str | Path | None) -> ssl.SSLContext | None:
    """A server context for the PEM certificate chain ``cert`` and its private key ``key``."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ReceiverSecurityError("give --tls-cert and --tls-key together (the certificate chain and its private "
                                    "key, PEM files)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ReceiverSecurityError(f"--tls-cert {cert} / --tls-key {key}: cannot load them "
                                    f"({getattr(exc, 'strerror', None) or exc}); give a PEM certificate chain and "
                                    "its private key") from None
    return context


def _is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one ("" and 0.0.0.0 are every
    interface); a name that does not resolve counts as loopback here: binding it fails, with
    its own message."""
    try:
        infos = socket.getaddrinfo(host or None, 0, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return True
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    return all(a.is_loopback or getattr(a, "ipv4_mapped", None) is not None and a.ipv4_mapped.is_loopback
               for a in addresses)


class CollectorServer:
    """An OTLP/HTTP receiver committing to the dataset at ``out``; ``port=0`` picks a free port.

    Raises :class:`~nemo_telemetry.errors.ListenError` when the address cannot be bound and
    :class:`~nemo_telemetry.errors.IngestError` when the dataset cannot be created. The class
    attributes are the default bounds. ``on_commit`` is called (on the committer thread) with the
    spans each commit added, deduplicated, once they are durable: how ``monitor`` sees them.

    ``token``: every request must carry ``Authorization: Bearer <token>`` (compared in constant
    time; 401 otherwise). ``tls_cert`` / ``tls_key`` (PEM files, given together): serve HTTPS.
    A ``host`` beyond loopback without a token raises
    :class:`~nemo_telemetry.errors.ReceiverSecurityError` unless ``insecure``: anyone who
    reaches the port could write spans into the dataset.
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
        token: str | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        insecure: bool = False,
    ) -> None:
        self.token = _check_token(token)
        self.tls = _tls_context(tls_cert, tls_key)
        self.unguarded = self.token is None and not _is_loopback(host)
        """Listening beyond loopback without a token (allowed by ``insecure``)."""
        if self.unguarded and not insecure:
            raise ReceiverSecurityError(
                f"refusing to listen on {host!r} without a bearer token: anyone who reaches that address could "
                f"write spans into {out}; give --token-file PATH (and --tls-cert / --tls-key so the token does "
                "not travel in clear text), or --insecure to listen anyway on a network you trust")
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._counts: dict = {name: field.default if isinstance(field.default, str) else 0
                              for name, field in CollectSummary.__dataclass_fields__.items()}
        self._stopped = threading.Event()
        self._deadlines: dict[socket.socket, float] = {}  # open connection -> when to drop it
        try:
            self._dataset_lock = hold_dataset(Path(out))  # one writer at a time, for the whole session
            writer = open_session(Path(out), lock=self._dataset_lock)
        except OSError as exc:
            self._release_dataset()
            raise IngestError(f"{out}: cannot create the dataset ({describe_failure(exc)}); choose another --out") from None
        except BaseException:
            self._release_dataset()
            raise
        try:
            self._httpd = ListeningServer((host, port), handler_for(self), self._drop_late_connections)
        except OSError as exc:
            writer.abort()
            self._release_dataset()
            raise ListenError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
        self._committer = Committer(Path(out), writer, self._counts, self._lock, on_commit, self._dataset_lock)
        self._thread: threading.Thread | None = None
        self._kernels = _KernelLoader()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls is not None else 'http'}://{host}:{port}"

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
            self._kernels.stop()
            if self._thread is not None:
                self._httpd.shutdown()
            self._drop_late_connections()
            self._httpd.server_close()  # joins the connection threads
            try:
                self._committer.close()
            finally:
                self._release_dataset()
        return self.summary()

    def _release_dataset(self) -> None:
        lock, self._dataset_lock = getattr(self, "_dataset_lock", None), None
        if lock is not None:
            lock.release()

    def __enter__(self) -> "CollectorServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def summary(self) -> CollectSummary:
        with self._lock:
            return CollectSummary(**self._counts)

    def accept(self, body: bytes, content_type: str, signal: str = "traces") -> int:
        """Decode one request body of ``signal`` (``traces``, ``metrics``, ``logs``) and commit it;
        return how many of its spans, data points or log records were rejected."""
        return self._accept(body, content_type, signal)[0]

    def _accept(self, body: bytes, content_type: str, signal: str = "traces") -> tuple[int, str]:
        """:meth:`accept`, and why items were rejected alone (the partial success's message).
        Raises ``Reject``: 400 for a body that does not decode, is not a request of ``signal``, or
        that the writer refuses, 503 when the write fails (the disk's fault: the exporter sends
        it again)."""
        decoded = decode_request(body, content_type, signal)
        problems = decoded.problems

        def count(n: int) -> None:
            problems.extend(["a span with a malformed trace or span id"] * n)

        tables = drop_malformed_ids(decoded.tables, count)
        ticket = self._committer.submit(tables, decoded.files)
        ticket.done.wait()
        rejected = {"traces": "rejected_spans", "metrics": "rejected_metric_points", "logs": "rejected_logs"}[signal]
        if isinstance(ticket.error, OSError):
            raise Reject(503, f"cannot write the dataset ({describe_failure(ticket.error)}); retry later")
        if ticket.error is not None:
            rows = tables.spans.num_rows + sum(table.num_rows for _, table in decoded.files)
            with self._lock:
                self._counts[rejected] += rows + len(problems)
            raise Reject(400, f"the request's {signal} cannot be stored ({describe_failure(ticket.error)})")
        with self._lock:
            self._counts["requests"] += 1
            self._counts[rejected] += len(problems)
        return len(problems), problems_message(problems)

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
            try:  # the plain socket's shutdown: a TLS socket's own would drop its state under its reader
                socket.socket.shutdown(conn, socket.SHUT_RD)
            except OSError:
                pass



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
    token: str | None = None,
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
    insecure: bool = False,
) -> CollectSummary:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set), then stop and return the summary.

    The signals are taken before anything else, so one that arrives while the dataset is opened
    or the port bound stops the collector as soon as it serves (with nothing received)."""
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        server = CollectorServer(out, host=host, port=port, max_request_bytes=max_request_bytes,
                                 max_connections=max_connections, read_timeout_s=read_timeout_s, token=token,
                                 tls_cert=tls_cert, tls_key=tls_key, insecure=insecure).start()
        try:
            if on_ready is not None:
                on_ready(server)
            while not stop.wait(0.1):
                pass
        finally:
            summary = server.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return summary
