"""The monitor's ``rl.goodput.*`` series: a Prometheus ``/metrics`` endpoint and/or an OTLP metrics push.

One list of series (``MONITOR_SERIES``), read from one snapshot of the state, feeds both: Prometheus names
are the OpenTelemetry names with dots as underscores (``rl.goodput.step.ratio`` ->
``rl_goodput_step_ratio``; counters get ``_total``). Per-step series carry ``run_id`` and
``iteration`` labels for the last ``metric_steps`` steps of each run only, so the number of series
stays bounded however long the run. The OTLP push uses the SDK's exporter, which reads the standard
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` variables.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

from nemo_telemetry.analysis.goodput.steps import BUCKETS
from nemo_telemetry.errors import ListenError

__all__ = ["MONITOR_SERIES", "metrics_snapshot", "PrometheusEndpoint", "OtlpMetricsPush"]

# name -> (kind, description)
MONITOR_SERIES: dict[str, tuple[str, str]] = {
    "rl.goodput.step.seconds": ("gauge", "Seconds of a reported step by bucket (and unattributed, double_counted)"),
    "rl.goodput.step.wall_seconds": ("gauge", "Wall clock of a reported step, seconds"),
    "rl.goodput.step.ratio": ("gauge", "Goodput of a reported step: productive_s / wall_s"),
    "rl.goodput.rolling.ratio": ("gauge", "Goodput of the run's last rolling steps"),
    "rl.goodput.run.ratio": ("gauge", "Goodput of the run's reported steps: sum productive / sum wall"),
    "rl.goodput.steps": ("counter", "Steps reported"),
    "rl.goodput.findings": ("counter", "Findings by code in the spans received"),
    "rl.goodput.spans": ("counter", "Spans received"),
    "rl.goodput.late_spans": ("counter", "Spans of a step already folded into the totals, not applied"),
}
_STEP_PARTS = (*BUCKETS, "unattributed", "double_counted")

Snapshot = dict[str, list[tuple[dict[str, str], float]]]


def metrics_snapshot(state, findings: dict[str, int], *, metric_steps: int = 10) -> Snapshot:
    """Every series' (labels, value) pairs from a :class:`MonitorState` and findings by code."""
    out: Snapshot = {name: [] for name in MONITOR_SERIES}
    for run in state.runs():
        run_label = {"run_id": run.run_id or ""}
        for step in state.recent_steps(run.run_id, metric_steps):
            labels = {**run_label, "iteration": str(step.iteration)}
            for part in _STEP_PARTS:
                out["rl.goodput.step.seconds"].append(({**labels, "bucket": part}, step.figures[f"{part}_s"]))
            out["rl.goodput.step.wall_seconds"].append((labels, step.figures["wall_s"]))
            if step.figures["goodput"] is not None:
                out["rl.goodput.step.ratio"].append((labels, step.figures["goodput"]))
        if run.rolling_goodput is not None:
            out["rl.goodput.rolling.ratio"].append((run_label, run.rolling_goodput))
        if run.total["goodput"] is not None:
            out["rl.goodput.run.ratio"].append((run_label, run.total["goodput"]))
        out["rl.goodput.steps"].append((run_label, float(run.steps)))
    out["rl.goodput.findings"] = [({"code": code}, float(n)) for code, n in sorted(findings.items())]
    out["rl.goodput.spans"] = [({}, float(state.spans))]
    out["rl.goodput.late_spans"] = [({}, float(state.late_spans))]
    return out


class _Latest:
    """The newest snapshot, swapped whole (readers on other threads see one or the other)."""

    def __init__(self) -> None:
        self.snapshot: Snapshot = {name: [] for name in MONITOR_SERIES}


class PrometheusEndpoint:
    """``/metrics`` on ``host:port`` (``port=0``: a free one) through ``prometheus_client``."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 9464) -> None:
        from prometheus_client import CollectorRegistry, start_http_server  # monitor only

        self._latest = _Latest()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_PrometheusCollector(self._latest))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ListenError(f"cannot serve /metrics on {host}:{port} ({exc.strerror or exc}); "
                              "choose another --metrics-port") from None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def update(self, snapshot: Snapshot) -> None:
        self._latest.snapshot = snapshot

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _PrometheusCollector:
    def __init__(self, latest: _Latest) -> None:
        self._latest = latest

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshot = self._latest.snapshot
        for name, (kind, description) in MONITOR_SERIES.items():
            points = snapshot.get(name, [])
            keys = sorted(points[0][0]) if points else []
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name.replace(".", "_"), description, labels=keys)
            for labels, value in points:
                family.add_metric([labels[k] for k in keys], value)
            yield family


class OtlpMetricsPush:
    """The series pushed every ``interval_s`` over OTLP/HTTP by the OpenTelemetry SDK."""

    def __init__(self, *, interval_s: float = 10.0, resource_attributes: dict[str, str] | None = None) -> None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        self._latest = _Latest()
        self._lock = threading.Lock()
        reader = PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=int(interval_s * 1000))
        resource = Resource.create({"service.name": "nemo-telemetry-monitor", **(resource_attributes or {})})
        self._provider = MeterProvider(resource=resource, metric_readers=[reader])
        meter = self._provider.get_meter("nemo_telemetry.monitor")

        def observe(name: str):
            def callback(_options):
                return [Observation(value, labels) for labels, value in self._latest.snapshot.get(name, [])]
            return callback

        for name, (kind, description) in MONITOR_SERIES.items():
            make = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
            make(name, callbacks=[observe(name)], description=description)

    def update(self, snapshot: Snapshot) -> None:
        self._latest.snapshot = snapshot

    def close(self) -> None:
        """Push the last snapshot, then stop."""
        try:
            self._provider.force_flush(timeout_millis=5000)
        finally:
            self._provider.shutdown(timeout_millis=5000)
