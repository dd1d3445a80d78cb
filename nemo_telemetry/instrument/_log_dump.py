"""The log dump exporter: OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them.

One file per process, ``<dir>/logs-<service>-<pid>-<random>.jsonl``, beside the ``traces-*``
files; each line is one ``ExportLogsServiceRequest`` in OTLP/JSON (``{"resourceLogs": [...]}``:
camelCase keys, trace and span ids as lowercase hex, 64-bit integers as strings, enums as
integers). The companion of :class:`~nemo_telemetry.instrument.DumpSpanExporter`.

An unwritable directory is warned about once; the run goes on and the records are dropped.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Sequence

try:  # the SDK's current names; older SDKs have only LogExporter / LogExportResult (deprecated since)
    from opentelemetry.sdk._logs.export import LogRecordExporter as LogExporter
    from opentelemetry.sdk._logs.export import LogRecordExportResult as LogExportResult
except ImportError:  # pragma: no cover - older SDKs
    from opentelemetry.sdk._logs.export import LogExporter, LogExportResult

from nemo_telemetry.instrument._dump import DumpFile, load_encoder
from nemo_telemetry.instrument._slices import SlicePacer, merge_requests

__all__ = ["DumpLogExporter", "logs_to_otlp_json"]

_log = logging.getLogger("nemo_telemetry")


def logs_to_otlp_json(batch: Sequence) -> dict:
    """One ``ExportLogsServiceRequest`` as the Collector's OTLP/JSON (hex ids, int enums)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs

    request = MessageToDict(encode_logs(batch), use_integers_for_enums=True)
    for resource_logs in request.get("resourceLogs", ()):
        for scope_logs in resource_logs.get("scopeLogs", ()):
            for record in scope_logs.get("logRecords", ()):
                for key in ("traceId", "spanId"):
                    if record.get(key):
                        record[key] = base64.b64decode(record[key]).hex()
    return request


def _service_of(request: dict) -> str:
    for resource_logs in request.get("resourceLogs", ()):
        for attribute in resource_logs.get("resource", {}).get("attributes", ()):
            if attribute.get("key") == "service.name":
                return str(attribute.get("value", {}).get("stringValue", "unknown"))
    return "unknown"


class DumpLogExporter(LogExporter):
    """Append each exported batch as one OTLP/JSON line to this process's ``logs-*.jsonl`` file.

    Encoded in slices merged into that one line, as the span dump is.
    """

    def __init__(self, directory: str | os.PathLike, *, service_name: str | None = None) -> None:
        self._dump = DumpFile(directory, prefix="logs", service_name=service_name, what="log dumps")
        self.directory = self._dump.directory
        self.pacer = SlicePacer()
        load_encoder("opentelemetry.exporter.otlp.proto.common._log_encoder")

    @property
    def path(self) -> str | None:
        return self._dump.path

    def export(self, batch: Sequence) -> LogExportResult:
        if not batch:
            return LogExportResult.SUCCESS
        try:
            parts = [logs_to_otlp_json(chunk) for chunk in self.pacer.slices(batch)]
            document = merge_requests(parts, "resourceLogs", "scopeLogs", "logRecords")
        except Exception:
            _log.warning("log dump exporter: could not encode a batch of %d records; it is dropped", len(batch),
                         exc_info=True)
            return LogExportResult.FAILURE
        ok = self._dump.write(document, service=_service_of(document))
        return LogExportResult.SUCCESS if ok else LogExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._dump.flush()

    def shutdown(self) -> None:
        self._dump.close()
