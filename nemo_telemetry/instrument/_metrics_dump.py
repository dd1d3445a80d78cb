"""The metrics dump exporter: OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them.

One file per process, ``<dir>/metrics-<service>-<pid>-<random>.jsonl``; each line is one
``ExportMetricsServiceRequest`` in OTLP/JSON (``{"resourceMetrics": [...]}``: camelCase keys,
64-bit integers as strings, enums as integers, exemplar trace and span ids as lowercase hex),
so the same reader handles a collector's output and ours. The companion of
:class:`~nemo_telemetry.instrument.DumpSpanExporter`.

Gauges are exported with delta temporality: a line carries a gauge only when it was recorded
since the previous collection, so a value logged at step 3 is not exported again, stamped with a
later collection time, as if step 4 had logged it (the analysis attributes points by time).
Counters stay cumulative, which survives a lost line.

An unwritable directory is warned about once; the run goes on and the metrics are dropped.
"""

from __future__ import annotations

import base64
import logging
import os

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from nemo_telemetry.instrument._dump import DumpFile, load_encoder

__all__ = ["DumpMetricExporter", "metrics_to_otlp_json", "fresh_gauges_temporality"]

_log = logging.getLogger("nemo_telemetry")
_POINT_LISTS = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")


def fresh_gauges_temporality() -> dict:
    """``preferred_temporality`` exporting each gauge value once (delta), everything else as the SDK does."""
    from opentelemetry.sdk.metrics import _Gauge as SyncGauge  # the SDK's synchronous gauge class
    from opentelemetry.sdk.metrics.export import AggregationTemporality

    return {SyncGauge: AggregationTemporality.DELTA}


def _exemplar_ids_to_hex(request: dict) -> dict:
    for resource_metrics in request.get("resourceMetrics", ()):
        for scope_metrics in resource_metrics.get("scopeMetrics", ()):
            for metric in scope_metrics.get("metrics", ()):
                for kind in _POINT_LISTS:
                    for point in metric.get(kind, {}).get("dataPoints", ()):
                        for exemplar in point.get("exemplars", ()):
                            for key in ("traceId", "spanId"):
                                if exemplar.get(key):
                                    exemplar[key] = base64.b64decode(exemplar[key]).hex()
    return request


def metrics_to_otlp_json(metrics_data: MetricsData) -> dict:
    """One ``ExportMetricsServiceRequest`` as the Collector's OTLP/JSON."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    request = MessageToDict(encode_metrics(metrics_data), use_integers_for_enums=True)
    return _exemplar_ids_to_hex(request)


def _service_of(metrics_data: MetricsData) -> str:
    for resource_metrics in metrics_data.resource_metrics:
        return str(resource_metrics.resource.attributes.get("service.name", "unknown"))
    return "unknown"


class DumpMetricExporter(MetricExporter):
    """Append each collection as one OTLP/JSON line to this process's ``metrics-*.jsonl`` file."""

    def __init__(self, directory: str | os.PathLike, *, service_name: str | None = None,
                 preferred_temporality: dict | None = None) -> None:
        super().__init__(preferred_temporality=fresh_gauges_temporality() if preferred_temporality is None
                         else preferred_temporality)
        self._dump = DumpFile(directory, prefix="metrics", service_name=service_name, what="metrics dumps")
        self.directory = self._dump.directory
        load_encoder("opentelemetry.exporter.otlp.proto.common.metrics_encoder")

    @property
    def path(self) -> str | None:
        return self._dump.path

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        if not metrics_data.resource_metrics:
            return MetricExportResult.SUCCESS
        try:
            document = metrics_to_otlp_json(metrics_data)
        except Exception:
            _log.warning("metrics dump exporter: could not encode a collection; it is dropped", exc_info=True)
            return MetricExportResult.FAILURE
        ok = self._dump.write(document, service=_service_of(metrics_data))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._dump.flush()

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._dump.close()
