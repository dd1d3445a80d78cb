"""The ``rl.*`` metric series: one registry of rows, teed from logger dicts or recorded directly.

A series is declared once, next to the code that produces it, as a :class:`TeedMetric` row::

    MY_KEY = "my_logger_key"
    register_teed_metrics((TeedMetric(MY_KEY, "rl.my.metric", "gauge", "1", "What it measures"),))

The trainer's logger dict is then teed with ``tee_metrics("train", metrics)`` (only registered
keys with non-None values are recorded); values that never pass through the logger go through
``record_metrics({"rl.my.metric": value})``. A row with ``logger_key=None`` is record-only.

Names are application-scope ``rl.<subsystem>.<metric>``, never ``dl.*`` (see
:data:`DL_PREFIX_REASON`). A label set that can grow is an attribute of one dimensioned series,
not a series per label: ``rl.efficiency.seconds{rl.efficiency.category, rl.efficiency.measurement}``
and ``rl.setup.duration{phase}`` are the worked examples. Keep attribute cardinality bounded: a
per-step or per-request value belongs on a span.

Rules: a bad registration (duplicate logger key or series name, a name outside ``rl.``, an
unknown kind) raises :class:`~nemo_telemetry.errors.RegistryError` at start-up; recording never
raises into a training run (a bad value is warned about once per series and skipped).

Instruments come from the meter provider given to :func:`set_meter_provider`, else from the
global OpenTelemetry one (a no-op until an application installs one). Gauges and counters are
exported at *collection* time, so call :func:`flush_metrics` once per step after teeing that
step's dict when the analysis should attribute the values to the step (``efficiency_by_step``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from nemo_telemetry.errors import RegistryError
from nemo_telemetry.instrument.span_groups import COLLECTOR_LOOP_CATEGORIES

__all__ = [
    "TeedMetric",
    "MetricRegistry",
    "METRICS",
    "METRIC_KINDS",
    "DL_PREFIX_REASON",
    "register_teed_metrics",
    "tee_metrics",
    "record_metrics",
    "map_efficiency_seconds",
    "efficiency_measurement",
    "record_efficiency_seconds",
    "record_setup_durations",
    "record_host_memory",
    "read_host_memory",
    "VllmCounterDeltas",
    "VLLM_COUNTER_SERIES",
    "set_meter_provider",
    "get_meter",
    "flush_metrics",
    "build_meter_provider",
    "EFFICIENCY_SECONDS",
    "SETUP_DURATION",
]

_log = logging.getLogger("nemo_telemetry")

METER_NAME = "nemo_telemetry"
METRIC_KINDS = frozenset({"gauge", "counter", "up_down_counter", "histogram"})
# rl.* is the application scope; gen_ai.* are OpenTelemetry's GenAI semantic-convention series.
_NAME_RE = re.compile(r"^(rl|gen_ai)(\.[a-z0-9_]+)+$")

DL_PREFIX_REASON = (
    "dl.* is the series namespace of the trainer that owns the step: a co-resident Megatron "
    "trainer registers dl.* series, so an RL job publishing e.g. dl.grad_norm would write into "
    "that trainer's series. RL metrics use the application scope rl.<subsystem>.<metric> "
    "(rl.grad_norm, rl.learning_rate are the deliberate spellings)"
)

EFFICIENCY_SECONDS = "rl.efficiency.seconds"
SETUP_DURATION = "rl.setup.duration"
CATEGORY_KEY = "rl.efficiency.category"
MEASUREMENT_KEY = "rl.efficiency.measurement"

# Efficiency categories whose Timer sums several batch-worker threads (can exceed wall time).
THREAD_SECONDS_CATEGORIES = frozenset({"idle/buffer_full_backoff", "wasted/failed_trajectory"})


@dataclass(frozen=True)
class TeedMetric:
    """One ``rl.*`` series, and the logger key it is teed from (None: ``record_metrics`` only)."""

    logger_key: str | None
    name: str
    kind: str = "gauge"
    unit: str = "1"
    description: str = ""


def _check_row(row: TeedMetric) -> None:
    if not isinstance(row, TeedMetric):
        raise RegistryError(f"register_teed_metrics: expected TeedMetric rows, got {row!r}")
    name = row.name
    if not isinstance(name, str) or name.startswith("dl."):
        raise RegistryError(f"metric {name!r} is refused: {DL_PREFIX_REASON}.")
    if not _NAME_RE.match(name):
        raise RegistryError(f"metric {name!r} must be named rl.<subsystem>.<metric> "
                            "(lowercase, dot-separated, starting with 'rl.'; or an OpenTelemetry gen_ai.* series)")
    if row.kind not in METRIC_KINDS:
        raise RegistryError(f"metric {name!r}: kind {row.kind!r} is not one of {sorted(METRIC_KINDS)}")
    if row.logger_key is not None and (not isinstance(row.logger_key, str) or not row.logger_key):
        raise RegistryError(f"metric {name!r}: logger_key must be a non-empty string or None")


class MetricRegistry:
    """Rows by series name and by logger key; replaced (never mutated) on registration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, TeedMetric] = {}
        self._by_key: dict[str, TeedMetric] = {}

    def register(self, rows: Iterable[TeedMetric]) -> None:
        """Add ``rows`` all or nothing; re-registering an identical row is a no-op (module reloads)."""
        rows = tuple(rows)
        with self._lock:
            by_name, by_key = dict(self._by_name), dict(self._by_key)
            for row in rows:
                _check_row(row)
                if by_name.get(row.name) == row:
                    continue
                if row.name in by_name:
                    raise RegistryError(f"metric series {row.name!r} is already registered as "
                                        f"{by_name[row.name]!r}; one name, one row")
                if row.logger_key is not None and row.logger_key in by_key:
                    raise RegistryError(f"logger key {row.logger_key!r} is already teed to "
                                        f"{by_key[row.logger_key].name!r}; a key feeds one series")
                by_name[row.name] = row
                if row.logger_key is not None:
                    by_key[row.logger_key] = row
            self._by_name, self._by_key = by_name, by_key

    def row(self, name: str) -> TeedMetric | None:
        return self._by_name.get(name)

    def row_for_key(self, key: str) -> TeedMetric | None:
        return self._by_key.get(key)

    def rows(self) -> tuple[TeedMetric, ...]:
        return tuple(self._by_name.values())

    def unregister(self, names: Iterable[str]) -> None:
        """Remove series (tests, and libraries that reload their declarations)."""
        drop = set(names)
        with self._lock:
            self._by_name = {n: r for n, r in self._by_name.items() if n not in drop}
            self._by_key = {k: r for k, r in self._by_key.items() if r.name not in drop}


METRICS = MetricRegistry()
"""The process-wide registry every ``rl.*`` series is declared in."""


def register_teed_metrics(rows: Iterable[TeedMetric]) -> None:
    """Declare ``rows`` process-wide; raises RegistryError on a conflict (at import, i.e. start-up)."""
    METRICS.register(rows)


# -- meter and instruments --------------------------------------------------------------------

_meter_lock = threading.Lock()
_provider: Any = None  # set by set_meter_provider; None: the global OpenTelemetry provider
_meter: Any = None
_instruments: dict[str, Any] = {}
_warned: set[str] = set()


def set_meter_provider(provider: Any) -> None:
    """Record ``rl.*`` series through ``provider`` from now on (None: the global provider)."""
    global _provider, _meter, _instruments
    with _meter_lock:
        _provider, _meter, _instruments = provider, None, {}


def get_meter() -> Any:
    """The meter ``rl.*`` series are recorded with (created on first use)."""
    global _meter
    meter = _meter
    if meter is None:
        with _meter_lock:
            if _meter is None:
                from opentelemetry import metrics as metrics_api

                provider = _provider if _provider is not None else metrics_api.get_meter_provider()
                _meter = provider.get_meter(METER_NAME)
            meter = _meter
    return meter


def _instrument(row: TeedMetric) -> Any:
    instrument = _instruments.get(row.name)
    if instrument is None:
        meter = get_meter()
        create = {
            "gauge": meter.create_gauge,
            "counter": meter.create_counter,
            "up_down_counter": meter.create_up_down_counter,
            "histogram": meter.create_histogram,
        }[row.kind]
        instrument = create(row.name, unit=row.unit, description=row.description)
        with _meter_lock:
            instrument = _instruments.setdefault(row.name, instrument)
    return instrument


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        _log.warning(message, *args)


def _number(row: TeedMetric, value: Any) -> float | None:
    """``value`` as a finite float fit for ``row``'s kind, else None (warned once per series)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        _warn_once(f"type:{row.name}", "metric %s: value %r is not a number; skipped", row.name, value)
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        _warn_once(f"type:{row.name}", "metric %s: value %r is not a number; skipped", row.name, value)
        return None
    if not math.isfinite(number):
        _warn_once(f"finite:{row.name}", "metric %s: value %r is not finite; skipped", row.name, value)
        return None
    if row.kind == "counter" and number < 0:
        _warn_once(f"neg:{row.name}", "metric %s is a counter; negative increment %r skipped", row.name, value)
        return None
    return number


def _record(row: TeedMetric, value: Any, attributes: Mapping[str, Any] | None) -> bool:
    number = _number(row, value)
    if number is None:
        return False
    try:
        instrument = _instrument(row)
        if row.kind in ("counter", "up_down_counter"):
            instrument.add(number, attributes)
        elif row.kind == "histogram":
            instrument.record(number, attributes)
        else:
            instrument.set(number, attributes)
    except Exception:
        _warn_once(f"sdk:{row.name}", "metric %s: could not record %r", row.name, value)
        return False
    return True


# -- recording --------------------------------------------------------------------------------


_NOT_GIVEN: Any = object()


def record_metrics(values: Any, group: Any = _NOT_GIVEN, series: Any = _NOT_GIVEN, *,
                   attributes: Mapping[str, Any] | None = None) -> int:
    """Record ``{series name: value}`` for registered series; None values are skipped. Never raises.

    Two forms: ``record_metrics(values)`` and, for code ported from NeMo-RL,
    ``record_metrics(meter, group, values)``: ``meter`` is the one ``get_telemetry_handle().meter``
    gives (series are recorded with nemo-telemetry's meter either way) and ``group`` the registry
    the rows are declared in (a :class:`MetricRegistry`; anything else means :data:`METRICS`).
    Returns how many values were recorded. An unregistered name is warned about once.
    """
    registry = METRICS
    if group is not _NOT_GIVEN or series is not _NOT_GIVEN:
        if series is _NOT_GIVEN:
            _warn_once("form", "record_metrics takes (values) or (meter, group, values); nothing recorded")
            return 0
        registry = group if isinstance(group, MetricRegistry) else METRICS
        values = series
    recorded = 0
    try:
        for name, value in values.items():
            if value is None:
                continue
            row = registry.row(name)
            if row is None:
                _warn_once(f"unknown:{name}", "record_metrics: %r is not a registered series "
                           "(declare it with register_teed_metrics); skipped", name)
                continue
            recorded += _record(row, value, attributes)
    except Exception:
        _log.warning("record_metrics failed; the values are dropped", exc_info=True)
    return recorded


def tee_metrics(prefix: str, logger_dict: Mapping[str, Any], *,
                attributes: Mapping[str, Any] | None = None) -> int:
    """Record the teed keys of a logger dict logged under ``prefix``; returns how many. Never raises.

    A key matches the row registered for ``"<prefix>/<key>"`` first, then for the bare key, so
    a row can be specific to one prefix (``validation/accuracy``) or shared. Two prefixes are
    dispatched to dimensioned series instead: ``efficiency`` (and any ``efficiency/<category>``
    key) to ``rl.efficiency.seconds``, ``timing/setup`` to ``rl.setup.duration{phase}``.
    Only non-None values are recorded.
    """
    try:
        if prefix == "timing/setup":
            return record_setup_durations(logger_dict, attributes=attributes)
        recorded = record_efficiency_seconds(
            map_efficiency_seconds(logger_dict, all_categories=prefix == "efficiency"), attributes=attributes)
        if prefix == "efficiency":
            return recorded
        for key, value in logger_dict.items():
            if value is None:
                continue
            row = METRICS.row_for_key(f"{prefix}/{key}") or METRICS.row_for_key(key)
            if row is not None:
                recorded += _record(row, value, attributes)
        return recorded
    except Exception:
        _log.warning("tee_metrics(%r) failed; the values are dropped", prefix, exc_info=True)
        return 0


def efficiency_measurement(category: str) -> str:
    """What an efficiency category's seconds are: whose clock, and whether they can overlap.

    ``driver_wall_clock`` (the driver's sequential waits), ``collector_wall_clock`` (the
    collector's loop thread: real durations on a concurrent timeline), ``thread_seconds`` (summed
    over batch-worker threads: may exceed wall time). Always filter on it before adding values.
    """
    if category in COLLECTOR_LOOP_CATEGORIES:
        return "collector_wall_clock"
    if category in THREAD_SECONDS_CATEGORIES:
        return "thread_seconds"
    return "driver_wall_clock"


def map_efficiency_seconds(logger_dict: Mapping[str, Any], *,
                           all_categories: bool = False) -> list[tuple[Any, dict[str, str]]]:
    """``(seconds, attributes)`` for the efficiency keys of a logger dict (a pure function).

    Keys ``efficiency/<category>`` are efficiency timers; with ``all_categories`` (the dict was
    logged under the ``efficiency`` prefix) every key is a category. None values are left out.
    """
    out = []
    for key, value in logger_dict.items():
        if value is None or not isinstance(key, str):
            continue
        if key.startswith("efficiency/"):
            category = key[len("efficiency/"):]
        elif all_categories:
            category = key
        else:
            continue
        out.append((value, {CATEGORY_KEY: category, MEASUREMENT_KEY: efficiency_measurement(category)}))
    return out


def record_efficiency_seconds(pairs: Iterable[tuple[Any, Mapping[str, str]]], *,
                              attributes: Mapping[str, Any] | None = None) -> int:
    """Record ``map_efficiency_seconds`` output on ``rl.efficiency.seconds``; returns how many."""
    row = METRICS.row(EFFICIENCY_SECONDS)
    extra = dict(attributes or {})
    return sum(_record(row, value, {**extra, **attrs}) for value, attrs in pairs)


def record_setup_durations(phases: Mapping[str, Any], *, attributes: Mapping[str, Any] | None = None) -> int:
    """``rl.setup.duration{phase}`` for each startup phase (seconds); ``total_setup`` is the flat total."""
    row = METRICS.row(SETUP_DURATION)
    extra = dict(attributes or {})
    try:
        return sum(_record(row, value, {**extra, "phase": str(phase)})
                   for phase, value in phases.items() if value is not None)
    except Exception:
        _log.warning("record_setup_durations failed; the values are dropped", exc_info=True)
        return 0


def read_host_memory(meminfo: str = "/proc/meminfo", statm: str = "/proc/self/statm") -> dict[str, int]:
    """``{rl.host.memory.* series: bytes}`` from ``/proc/meminfo`` (and this process's ``statm``).

    Raises OSError / ValueError / KeyError when the files cannot be read (not Linux).
    """
    fields: dict[str, int] = {}
    with open(meminfo, encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    total, available = fields["MemTotal"], fields["MemAvailable"]
    values = {"rl.host.memory.used": total - available, "rl.host.memory.available": available,
              "rl.host.memory.total": total}
    try:
        with open(statm, encoding="ascii") as fh:
            values["rl.host.memory.process_rss"] = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    return values


def record_host_memory(*, attributes: Mapping[str, Any] | None = None) -> int:
    """This node's memory as ``rl.host.memory.*`` (bytes), labelled with ``host.name``. Never raises.

    Read from ``/proc`` (Linux); elsewhere one warning and nothing. Returns how many values were
    recorded. :class:`~nemo_telemetry.instrument.host_memory.HostMemorySampler` calls it periodically.
    """
    try:
        values = read_host_memory()
    except (OSError, ValueError, KeyError) as exc:
        _warn_once("host-memory", "record_host_memory: cannot read /proc/meminfo (%s); rl.host.memory.* is "
                   "not recorded", exc)
        return 0
    return record_metrics(values, attributes={"host.name": socket.gethostname(), **(attributes or {})})


# -- vLLM engine counters as deltas between steps ---------------------------------------------

VLLM_COUNTER_SERIES: dict[str, str] = {
    "vllm:prompt_tokens": "rl.vllm.prompt_tokens",
    "vllm:generation_tokens": "rl.vllm.generation_tokens",
    "vllm:request_success": "rl.vllm.requests_finished",
    "vllm:num_preemptions": "rl.vllm.preemptions",
    "vllm:prefix_cache_queries": "rl.vllm.prefix_cache_queries",
    "vllm:prefix_cache_hits": "rl.vllm.prefix_cache_hits",
}
"""vLLM's Prometheus counter (as ``LLM.get_metrics()`` names it) -> the ``rl.vllm.*`` series."""


class VllmCounterDeltas:
    """Turns successive totals of vLLM's engine counters into per-step increments.

    ``record(totals)`` adds, to each ``rl.vllm.*`` counter, how much the vLLM counter grew since
    the previous call (since engine start on the first call). A total that went down means the
    engine restarted: its new total is the increment. Returns the increments recorded.
    """

    def __init__(self, series: Mapping[str, str] | None = None) -> None:
        self.series = dict(VLLM_COUNTER_SERIES if series is None else series)
        self._last: dict[str, float] = {}

    def deltas(self, totals: Mapping[str, float]) -> dict[str, float]:
        out = {}
        for vllm_name, series in self.series.items():
            total = totals.get(vllm_name)
            if total is None:
                continue
            previous = self._last.get(vllm_name, 0.0)
            out[series] = total - previous if total >= previous else total
            self._last[vllm_name] = total
        return out

    def record(self, totals: Mapping[str, float], *, attributes: Mapping[str, Any] | None = None) -> dict[str, float]:
        try:
            deltas = self.deltas(totals)
        except Exception:
            _log.warning("vLLM counter deltas failed; nothing recorded", exc_info=True)
            return {}
        record_metrics(deltas, attributes=attributes)
        return deltas


# -- provider plumbing (for the lifecycle) ----------------------------------------------------


def flush_metrics(timeout_s: float = 5.0) -> bool:
    """Collect and export every series now (bounded); True on success. Never raises.

    Data points carry their collection time, so flushing once per step, after the step's dict
    is teed, is what lets the analysis attribute gauge values to that step.
    """
    provider = _provider
    if provider is None:
        from opentelemetry import metrics as metrics_api

        provider = metrics_api.get_meter_provider()
    flush = getattr(provider, "force_flush", None)
    if flush is None:
        return True
    try:
        return bool(flush(timeout_millis=int(timeout_s * 1000)))
    except Exception:
        _log.warning("flush_metrics failed", exc_info=True)
        return False


def build_meter_provider(resource: Any, *, exporter: str, dump_dir: str | None = None,
                         service_name: str | None = None, export_interval_ms: int = 60_000) -> Any:
    """A MeterProvider exporting to ``exporter`` (``dump``, ``otlp`` or ``none``) every interval.

    For the lifecycle: ``set_meter_provider(build_meter_provider(resource, exporter=cfg.exporter,
    dump_dir=cfg.dump_dir))`` beside the tracer provider, and ``provider.shutdown()`` at the end.
    """
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if exporter == "none":
        return MeterProvider(resource=resource, shutdown_on_exit=False)
    if exporter == "dump":
        from nemo_telemetry.instrument._metrics_dump import DumpMetricExporter

        metric_exporter = DumpMetricExporter(dump_dir or "nemo_telemetry_dump", service_name=service_name)
    else:
        from nemo_telemetry.instrument._config import otlp_protocol

        if otlp_protocol() == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from nemo_telemetry.instrument._metrics_dump import fresh_gauges_temporality

        metric_exporter = OTLPMetricExporter(preferred_temporality=fresh_gauges_temporality())
    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=export_interval_ms)
    return MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)


register_teed_metrics((
    TeedMetric(None, EFFICIENCY_SECONDS, "gauge", "s",
               "Seconds an efficiency timer measured in the last step, by rl.efficiency.category; "
               "filter on rl.efficiency.measurement before adding values"),
    TeedMetric(None, SETUP_DURATION, "gauge", "s",
               "Seconds each startup phase took, by phase; phase=total_setup is the flat total"),
    TeedMetric(None, "rl.host.memory.used", "gauge", "By", "Memory in use on this node"),
    TeedMetric(None, "rl.host.memory.available", "gauge", "By", "Memory available on this node"),
    TeedMetric(None, "rl.host.memory.total", "gauge", "By", "Total memory of this node"),
    TeedMetric(None, "rl.host.memory.process_rss", "gauge", "By", "Resident memory of the recording process"),
    TeedMetric(None, "rl.vllm.prompt_tokens", "counter", "{token}", "Prompt tokens vLLM processed"),
    TeedMetric(None, "rl.vllm.generation_tokens", "counter", "{token}", "Tokens vLLM generated"),
    TeedMetric(None, "rl.vllm.requests_finished", "counter", "{request}", "Requests vLLM finished"),
    TeedMetric(None, "rl.vllm.preemptions", "counter", "{preemption}", "Requests vLLM preempted"),
    TeedMetric(None, "rl.vllm.prefix_cache_queries", "counter", "{token}", "Tokens looked up in the prefix cache"),
    TeedMetric(None, "rl.vllm.prefix_cache_hits", "counter", "{token}", "Prefix-cache lookups that hit"),
))
