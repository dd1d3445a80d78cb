"""The log bridge: every ``logging`` record carries the trace and span ids active when it was made.

Installed as a LogRecord factory (not a handler), so it works with whatever handlers and
formatters the trainer already has: use ``%(otelTraceID)s`` / ``%(otelSpanID)s`` in a format
string, or read the attributes in a handler. Ids are lowercase hex, ``0`` when no span is active
(the names match opentelemetry-instrumentation-logging, so existing formats keep working).
"""

from __future__ import annotations

import logging
import threading

from opentelemetry import trace as trace_api

__all__ = ["install_log_bridge", "uninstall_log_bridge", "log_bridge_installed"]

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
