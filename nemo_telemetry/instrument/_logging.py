"""The log bridge: every ``logging`` record carries the trace and span ids active when it was made.

Two halves. The ids are stamped by a LogRecord factory, so they work with whatever handlers and
formatters the trainer already has: use ``%(otelTraceID)s`` / ``%(otelSpanID)s`` in a format
string, or read the attributes in a handler. Ids are lowercase hex, ``0`` when no span is active
(the names match opentelemetry-instrumentation-logging, so existing formats keep working). And
the records are exported: an OpenTelemetry ``LoggingHandler`` on the root logger feeds a
``LoggerProvider`` whose exporter follows the spans' (OTLP, or ``logs-*.jsonl`` dump files).
"""

from __future__ import annotations

import logging
import threading

from opentelemetry import trace as trace_api

__all__ = ["install_log_bridge", "uninstall_log_bridge", "log_bridge_installed", "start_log_export", "stop_log_export"]

_lock = threading.Lock()
_previous_factory = None
_service_name = ""


def _stamp(record: logging.LogRecord) -> logging.LogRecord:
    ctx = trace_api.get_current_span().get_span_context()
    if ctx.is_valid:
        record.otelTraceID = format(ctx.trace_id, "032x")
        record.otelSpanID = format(ctx.span_id, "016x")
        record.otelTraceSampled = ctx.trace_flags.sampled
    else:
        record.otelTraceID, record.otelSpanID, record.otelTraceSampled = "0", "0", False
    record.otelServiceName = _service_name
    return record


def install_log_bridge(service_name: str = "") -> None:
    """Stamp ids on every record from now on (idempotent)."""
    global _previous_factory, _service_name
    with _lock:
        _service_name = service_name
        if _previous_factory is not None:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args, **kwargs):
            return _stamp(previous(*args, **kwargs))

        _previous_factory = previous
        logging.setLogRecordFactory(factory)


def uninstall_log_bridge() -> None:
    """Restore the record factory that was in place before :func:`install_log_bridge`."""
    global _previous_factory
    with _lock:
        if _previous_factory is not None:
            logging.setLogRecordFactory(_previous_factory)
            _previous_factory = None


def log_bridge_installed() -> bool:
    return _previous_factory is not None


# -- export: records through the OpenTelemetry log bridge ------------------------------------

_handler: logging.Handler | None = None


def _bridge_handler_class():
    """LoggingHandler without our own stamped ``otel*`` fields as attributes (the record's ids
    already travel as the log record's trace and span ids), and without the OpenTelemetry SDK's
    own records: an exporter's "cannot reach the collector" would otherwise be queued for that
    same exporter, and fail again."""
    from opentelemetry.sdk._logs import LoggingHandler

    class BridgeHandler(LoggingHandler):
        def emit(self, record: logging.LogRecord) -> None:
            if not record.name.startswith("opentelemetry"):
                super().emit(record)

        @staticmethod
        def _get_attributes(record: logging.LogRecord):
            attributes = LoggingHandler._get_attributes(record)
            return {k: v for k, v in attributes.items() if not k.startswith("otel")}

    return BridgeHandler


def _log_exporter(exporter: str, dump_dir: str | None, service_name: str | None):
    if exporter == "dump":
        from nemo_telemetry.instrument._log_dump import DumpLogExporter

        return DumpLogExporter(dump_dir or "nemo_telemetry_dump", service_name=service_name)
    from nemo_telemetry.instrument._config import otlp_protocol

    if otlp_protocol() == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    return OTLPLogExporter()


def start_log_export(resource, *, exporter: str, dump_dir: str | None = None, service_name: str | None = None):
    """A LoggerProvider exporting Python ``logging`` records, and its handler on the root logger.

    Returns the provider (None for ``exporter: none`` or when it cannot start: one warning).
    Records keep their logger's level: a logger at WARNING exports nothing below it.
    """
    global _handler
    if exporter == "none":
        return None
    try:
        import warnings

        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_log_record_processor(BatchLogRecordProcessor(_log_exporter(exporter, dump_dir, service_name)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the SDK handler is the bridge asked for
            handler = _bridge_handler_class()(logger_provider=provider)
    except Exception:
        logging.getLogger("nemo_telemetry").warning(
            "could not start log export; logging records are not exported", exc_info=True)
        return None
    with _lock:
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
        _handler = handler
        logging.getLogger().addHandler(handler)
    return provider


def stop_log_export() -> None:
    """Take the bridge's handler off the root logger (the provider is shut down by the lifecycle)."""
    global _handler
    with _lock:
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
            _handler = None
