"""The dump exporter: OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them.

One file per process, ``<dir>/traces-<service>-<pid>-<random>.jsonl``; each line is one
``ExportTraceServiceRequest`` in OTLP/JSON: camelCase keys, trace and span ids as lowercase hex,
64-bit integers as strings, enums as integers. So a run can be analysed with no collector, and
the same reader handles a collector's output and ours.

An unwritable directory is warned about once; the run goes on and the spans are dropped.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import secrets
import threading
from typing import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from nemo_telemetry.instrument._slices import SlicePacer, merge_requests

__all__ = ["DumpSpanExporter", "DumpFile", "encode_line", "load_encoder", "spans_to_otlp_json",
           "otlp_json_ids_to_base64"]

_log = logging.getLogger("nemo_telemetry")
_UNSAFE = re.compile(r"[^A-Za-z0-9._]+")


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def _convert_ids(request: dict, convert) -> dict:
    for resource_spans in request.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = convert(span[key])
                for link in span.get("links", ()):
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = convert(link[key])
    return request


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict:
    """One ``ExportTraceServiceRequest`` as the Collector's OTLP/JSON (hex ids, int enums)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    request = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    return _convert_ids(request, _b64_to_hex)


def otlp_json_ids_to_base64(request: dict) -> dict:
    """The inverse id conversion, for ``json_format.ParseDict`` (which expects base64 bytes)."""
    return _convert_ids(request, _hex_to_b64)


def encode_line(document: dict) -> bytes:
    """``document`` as one compact JSON line (UTF-8, newline-terminated).

    orjson, a single short C call; the standard library's encoder for what orjson refuses (an
    integer beyond 64 bits), with the same compact separators.
    """
    import orjson

    try:
        return orjson.dumps(document, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return (json.dumps(document, separators=(",", ":")) + "\n").encode("utf-8")


def load_encoder(module: str) -> None:
    """Import an OTLP encoder module and the JSON side now, at start-up.

    Left to the first export, the imports would run on the export thread and hold the GIL
    (and the import lock) through a training step.
    """
    import importlib

    import orjson  # noqa: F401
    from google.protobuf import json_format  # noqa: F401

    importlib.import_module(module)


class DumpFile:
    """This process's ``<prefix>-<service>-<pid>-<random>.jsonl`` under ``directory``, one JSON document a line.

    Shared by the span and metric dump exporters. The file is created on the first write (a
    process that emits nothing leaves no file) and flushed after every line, so what was
    exported before a crash is on disk. An unwritable directory is warned about once; after
    that every write fails fast and the run goes on.
    """

    def __init__(self, directory: str | os.PathLike, *, prefix: str, service_name: str | None = None,
                 what: str = "span dumps") -> None:
        self.directory = os.fspath(directory)
        self.prefix = prefix
        self.service_name = service_name
        self.path: str | None = None
        self._what = what
        self._lock = threading.Lock()
        self._file = None
        self._failed = False
        self._closed = False

    def write(self, document: dict, *, service: str | None = None) -> bool:
        """Append ``document`` as one line; False (and one warning) when it cannot be written."""
        if self._closed or self._failed:
            return False
        try:
            line = encode_line(document)
            with self._lock:
                if self._file is None:
                    self._open(self.service_name or service)
                self._file.write(line)
                self._file.flush()
        except OSError as exc:
            self._failed = True
            _log.warning("dump exporter: cannot write %s under %r (%s); the run goes on without writing "
                         "%s there. Set NEMO_TELEMETRY_DUMP_DIR (or telemetry.dump_dir) to a writable directory.",
                         self._what, self.directory, exc, self._what)
            return False
        return True

    def _open(self, service: str | None) -> None:
        safe = _UNSAFE.sub("_", service or "unknown").strip("_") or "unknown"
        name = f"{self.prefix}-{safe}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, name)
        self._file = open(path, "ab")
        self.path = path

    def flush(self) -> bool:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.flush()
                except OSError:
                    return False
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None


class DumpSpanExporter(SpanExporter):
    """Append each exported batch as one OTLP/JSON line to this process's ``traces-*.jsonl`` file.

    The batch is encoded in slices (:class:`~nemo_telemetry.instrument._slices.SlicePacer`) merged
    into that one line, so the export thread gives the GIL back to the training thread between
    slices.
    """

    def __init__(self, directory: str | os.PathLike, *, service_name: str | None = None,
                 prefix: str = "traces") -> None:
        self._dump = DumpFile(directory, prefix=prefix, service_name=service_name, what="span dumps")
        self.directory = self._dump.directory
        self.pacer = SlicePacer()
        load_encoder("opentelemetry.exporter.otlp.proto.common.trace_encoder")

    @property
    def path(self) -> str | None:
        return self._dump.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            parts = [spans_to_otlp_json(chunk) for chunk in self.pacer.slices(spans)]
            document = merge_requests(parts, "resourceSpans", "scopeSpans", "spans")
        except Exception:
            _log.warning("dump exporter: could not encode a batch of %d spans; it is dropped", len(spans),
                         exc_info=True)
            return SpanExportResult.FAILURE
        service = str(spans[0].resource.attributes.get("service.name", "unknown"))
        return SpanExportResult.SUCCESS if self._dump.write(document, service=service) else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._dump.flush()

    def shutdown(self) -> None:
        self._dump.close()
