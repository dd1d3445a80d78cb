"""Starting and stopping telemetry in the driver and in every worker.

The driver resolves its ``telemetry:`` block into environment variables *before* Ray starts,
so workers inherit them, then starts telemetry for itself; a worker reads those variables in
``init_telemetry_worker``. Flush and shutdown are bounded: they run on a daemon thread that is
abandoned at the deadline, so a dead collector cannot hold a finished run hostage.

    cfg = init_telemetry_driver("config.yaml", algorithm="grpo")   # before ray.init()
    try:
        train()
    finally:
        shutdown_telemetry()
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import uuid
from typing import Any, Callable, Mapping

from opentelemetry import trace as trace_api

from nemo_telemetry.errors import SpecError
from nemo_telemetry.instrument import _gate, _logging
from nemo_telemetry.instrument import environment_variables as env
from nemo_telemetry.instrument._config import (
    TelemetryConfig,
    otlp_protocol,
    read_run_config,
    resolve_telemetry_config,
)
from nemo_telemetry.instrument._registry import REGISTRY
from nemo_telemetry.instrument._slices import hurried

__all__ = [
    "init_telemetry_driver",
    "init_telemetry_worker",
    "flush_telemetry",
    "shutdown_telemetry",
    "current_telemetry_config",
    "current_fleet",
    "declare_fleet",
    "warn_worker_without_settings",
    "DEFAULT_DUMP_DIR",
]

_log = logging.getLogger("nemo_telemetry")

DEFAULT_DUMP_DIR = "nemo_telemetry_dump"
DEFAULT_TIMEOUT_S = 5.0
# The fewest spans an OTLP request carries when a batch is sent in slices: fewer would cost more
# in per-request HTTP work than it saves in encoding stretches.
OTLP_MIN_SLICE_SPANS = 64


@dataclasses.dataclass
class _Runtime:
    provider: Any = None
    exporter: Any = None
    config: TelemetryConfig | None = None
    meter_provider: Any = None
    logger_provider: Any = None
    host_memory: Any = None
    span_processor: Any = None
    fleet: str | None = None


_runtime = _Runtime()
_lock = threading.RLock()
_atexit_registered = False


def current_telemetry_config() -> TelemetryConfig | None:
    """The resolved config this process started telemetry with (None before init / after shutdown)."""
    return _runtime.config


def current_fleet() -> str | None:
    """This process's ``rl.fleet`` (given at init or declared by ``traced_worker_init``), else None."""
    return _runtime.fleet


# -- driver -----------------------------------------------------------------------------------


def init_telemetry_driver(config: TelemetryConfig | Mapping[str, Any] | str | os.PathLike | None = None, *,
                          algorithm: str | None = None, service_name: str | None = None,
                          run_config: Mapping[str, Any] | None = None,
                          resource_attributes: Mapping[str, Any] | None = None,
                          rank: int = 0, world_size: int = 1, local_rank: int = 0,
                          fleet: str | None = None, gpus: int | None = None) -> TelemetryConfig:
    """Resolve ``config`` (dict, YAML path or TelemetryConfig) into the environment, then start telemetry.

    Call it before ``ray.init()``: the resolved ``NEMO_TELEMETRY_*`` (and ``OTEL_EXPORTER_OTLP_*``
    from the config, where the environment has none) variables and a fresh ``nemo.run.id`` are
    written to ``os.environ``, which Ray copies into every worker. Pending span-group names are
    reported with a did-you-mean. The driver reports itself as rank 0 of 1 unless told otherwise.

    ``run_config`` is the trainer's whole config (NeMo-RL's shape); the run's resource attributes
    (``rl.model``, ``nv.dl.topology.size.*`` ...) are derived from it and written for the workers
    too. Without it, a ``config`` that is a whole config holding a ``telemetry:`` block (a dict or a
    YAML path) serves as the run config.

    ``resource_attributes`` are set on every span beside (and over) those derived from
    ``run_config``; an integration that reads a trainer's own config passes them here. ``rank``,
    ``world_size`` and ``local_rank`` are this process's place in a launcher's world (``torchrun``
    ranks that each run the driver code); a driver alone keeps the defaults.

    ``fleet`` (``rl.fleet``) defaults to ``driver``, whose ``nv.dl.gpu.count`` is 0 unless ``gpus``
    says otherwise; a driver that trains itself (a ``torchrun`` rank) passes ``fleet="policy"``,
    and its GPU count then resolves as :func:`init_telemetry_worker`'s does.

    Raises :class:`SpecError` (before anything is written) for a ``span_groups`` spec that would
    not mean what it says: a subtraction (``per_step,-job``; the message lists the groups to write
    instead), or an unknown name in a namespace that refuses them (``nemo_gym``). Nothing else
    raises.
    """
    cfg = resolve_telemetry_config(config, environ=_raw_environment())
    if service_name:
        cfg = dataclasses.replace(cfg, service_name=service_name)
    if cfg.exporter == "dump":
        cfg = dataclasses.replace(cfg, dump_dir=os.path.abspath(cfg.dump_dir or DEFAULT_DUMP_DIR))
    if cfg.enabled:
        check_span_groups(cfg)
    run_attributes = _run_attributes(cfg, config, run_config, algorithm)
    if cfg.enabled and resource_attributes:
        run_attributes = {**run_attributes, **resource_attributes}
    _export_environment(cfg, algorithm, run_attributes)
    if cfg.enabled:
        warn_missing_otlp_endpoint(cfg)
    from nemo_telemetry.instrument._resources import DRIVER_FLEET

    fleet = _fleet_word(fleet) or DRIVER_FLEET
    gpus = 0 if gpus is None and fleet == DRIVER_FLEET else gpus
    _start(cfg, rank=int(rank), world_size=int(world_size), local_rank=int(local_rank),
           default_service=f"{cfg.namespace}-driver", fleet=fleet, gpus=gpus)
    return cfg


# What this process's driver init wrote, so a second init in the same process (a notebook, a
# test) does not mistake its own earlier output for the user's raw environment.
_written_env: dict[str, str] = {}


def _raw_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if _written_env.get(k) != v}


def _run_attributes(cfg: TelemetryConfig, config: Any, run_config: Mapping[str, Any] | None,
                    algorithm: str | None) -> dict[str, Any]:
    """The run's resource attributes from the trainer's config (none while telemetry is off)."""
    if not cfg.enabled:
        return {}
    from nemo_telemetry.instrument._resources import run_resource_attributes

    if run_config is None and isinstance(config, Mapping) and "telemetry" in config:
        run_config = config
    elif run_config is None and isinstance(config, (str, os.PathLike)):
        run_config = read_run_config(config)
    try:
        return run_resource_attributes(run_config, algorithm=algorithm)
    except Exception:
        _log.warning("could not derive resource attributes from the run config; spans go without them",
                     exc_info=True)
        return {}


def _export_environment(cfg: TelemetryConfig, algorithm: str | None, run_attributes: Mapping[str, Any]) -> None:
    from nemo_telemetry.instrument._resources import encode_run_attributes

    resolved = {
        env.NEMO_TELEMETRY_ENABLED: "1" if cfg.enabled else "0",
        env.NEMO_TELEMETRY_SPAN_GROUPS: cfg.span_groups,
        env.NEMO_TELEMETRY_NAMESPACE: cfg.namespace,
        env.NEMO_TELEMETRY_EXPORTER: cfg.exporter,
        env.NEMO_TELEMETRY_LOGS_ENABLED: "1" if cfg.logs_enabled else "0",
        env.NEMO_TELEMETRY_HOST_MEMORY_METRICS: "1" if cfg.host_memory_metrics else "0",
        env.NEMO_TELEMETRY_RESOURCE_ATTRIBUTES: encode_run_attributes(run_attributes),
    }
    if cfg.dump_dir:
        resolved[env.NEMO_TELEMETRY_DUMP_DIR] = cfg.dump_dir
    os.environ.update(resolved)
    _written_env.update(resolved)
    os.environ.setdefault(env.NEMO_TELEMETRY_RUN_ID, uuid.uuid4().hex)
    if algorithm:
        os.environ[env.NEMO_TELEMETRY_ALGORITHM] = algorithm
    if cfg.otlp_endpoint and not (os.environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT)
                                  or os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)):
        os.environ[env.OTEL_EXPORTER_OTLP_ENDPOINT] = cfg.otlp_endpoint
    if cfg.otlp_protocol and not (os.environ.get(env.OTEL_EXPORTER_OTLP_PROTOCOL)
                                  or os.environ.get(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)):
        os.environ[env.OTEL_EXPORTER_OTLP_PROTOCOL] = cfg.otlp_protocol


# Namespaces whose unknown span-group names are an error at driver init (seed 003: a typo would
# otherwise look identical to telemetry being broken); elsewhere they are warned about.
REFUSE_PENDING_NAMESPACES = frozenset({"nemo_gym"})


def check_span_groups(cfg: TelemetryConfig) -> frozenset[str]:
    """The groups the driver enables; raises :class:`SpecError` or warns about pending names.

    A subtraction raises in every namespace; an unknown name raises in
    :data:`REFUSE_PENDING_NAMESPACES` and is warned about (with "did you mean") elsewhere.
    """
    enabled, pending = REGISTRY.resolve_with_pending(cfg.span_groups, namespace=cfg.namespace)
    if pending:
        message = f"telemetry.span_groups {cfg.span_groups!r}: " + REGISTRY.describe_pending(
            pending, namespace=cfg.namespace)
        if cfg.namespace.strip().lower() in REFUSE_PENDING_NAMESPACES:
            raise SpecError(message)
        _log.warning("%s", message)
    return enabled


_warned_no_endpoint = False


def warn_missing_otlp_endpoint(cfg: TelemetryConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Warn once per process when the ``otlp`` exporter has no endpoint configured; True if it warned.

    The SDK would then send to its default (localhost:4318 or :4317) and, with no collector there,
    print a connection error per export attempt for the rest of the run.
    """
    global _warned_no_endpoint
    environ = os.environ if environ is None else environ
    if cfg.exporter != "otlp" or _warned_no_endpoint:
        return False
    if environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT) or environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT):
        return False
    _warned_no_endpoint = True
    _log.warning(
        "telemetry exporter 'otlp' has no endpoint: neither %s nor %s is set (nor telemetry.otlp_endpoint), "
        "so spans go to the OpenTelemetry default on localhost and fail to export if no collector listens there. "
        "Set %s=http://<collector>:4318, or write files instead with exporter: dump (and dump_dir: DIR)",
        env.OTEL_EXPORTER_OTLP_ENDPOINT, env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, env.OTEL_EXPORTER_OTLP_ENDPOINT)
    return True


# -- worker -----------------------------------------------------------------------------------


def init_telemetry_worker(*, rank: int | None = None, world_size: int | None = None,
                          local_rank: int | None = None, service_name: str | None = None,
                          fleet: str | None = None, gpus: int | None = None,
                          trace_carrier: Mapping[str, str] | None = None) -> bool:
    """Start telemetry in a worker from the environment the driver set; True when it is on.

    Rank, world size and local rank default to ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (else
    0, 1, 0); pass them explicitly for singleton actors, whose inherited ``RANK`` is the driver's.

    ``fleet`` is ``rl.fleet``: ``policy``, ``generation``, ``value``, ``reference``, ``collector``,
    ``gym`` or a word of the caller's own (unset, :func:`traced_worker_init` sets it from its role).
    ``gpus`` is ``nv.dl.gpu.count``; unset, it is the count in ``CUDA_VISIBLE_DEVICES``, else
    ``len(ray.get_gpu_ids())`` inside a Ray worker, else 0.

    A worker whose environment holds no telemetry settings returns False. Handed the driver's
    ``trace_carrier`` (as the actor's constructor often is), it also knows the driver records,
    and warns once that the settings did not arrive (``telemetry_runtime_env`` carries them).
    """
    if env.NEMO_TELEMETRY_ENABLED not in os.environ and trace_carrier:
        warn_worker_without_settings(trace_carrier)
    cfg = resolve_telemetry_config(None)
    if service_name:
        cfg = dataclasses.replace(cfg, service_name=service_name)
    rank = _int_or(rank, "RANK", 0)
    return _start(cfg, rank=rank, world_size=_int_or(world_size, "WORLD_SIZE", 1),
                  local_rank=_int_or(local_rank, "LOCAL_RANK", 0), default_service=f"{cfg.namespace}-worker",
                  fleet=_fleet_word(fleet), gpus=gpus)


def _fleet_word(fleet: str | None) -> str | None:
    if fleet is None:
        return None
    word = str(fleet).strip().lower()
    if not word:
        _log.warning("nemo_telemetry: fleet=%r names no fleet; rl.fleet is left unset", fleet)
        return None
    return word


_warned_without_settings = False


def warn_worker_without_settings(trace_carrier: Mapping[str, str] | None) -> bool:
    """Warn once per process that the driver records but this worker got no settings; True if it warned.

    The evidence is a non-empty carrier: a driver whose telemetry is off sends ``{}``. Nothing is
    said when this process's environment has ``NEMO_TELEMETRY_ENABLED`` (off on purpose, or on).
    """
    global _warned_without_settings
    if _warned_without_settings or not trace_carrier or env.NEMO_TELEMETRY_ENABLED in os.environ:
        return False
    _warned_without_settings = True
    _log.warning(
        "nemo_telemetry: this worker (pid %d) received the driver's trace context, so the driver records telemetry, "
        "but its environment has no %s: its spans are not recorded. On a Ray cluster this process did not start "
        "(ray start, ray.sub, KubeRay), workers see only what the job's runtime_env gives them: start Ray with "
        "traced_ray_init(...), or pass runtime_env=telemetry_runtime_env() to ray.init or to the actor's options",
        os.getpid(), env.NEMO_TELEMETRY_ENABLED)
    return True


def _int_or(value: int | None, variable: str, default: int) -> int:
    if value is not None:
        return int(value)
    try:
        return int(os.environ[variable])
    except (KeyError, ValueError):
        return default


# -- starting ---------------------------------------------------------------------------------


def _resolve_groups(cfg: TelemetryConfig) -> frozenset[str]:
    try:
        return REGISTRY.resolve(cfg.span_groups, namespace=cfg.namespace)
    except SpecError as exc:  # the driver refuses such a spec; a worker started by hand only warns
        _log.warning("telemetry.span_groups: %s. No span group is enabled in this process.", exc)
        return frozenset()


def _start(cfg: TelemetryConfig, *, rank: int, world_size: int, local_rank: int, default_service: str,
           fleet: str | None = None, gpus: int | None = None) -> bool:
    with _lock:
        shutdown_telemetry()
        if not cfg.enabled:
            return False
        try:
            _start_provider(cfg, rank=rank, world_size=world_size, local_rank=local_rank,
                            service=cfg.service_name or default_service, fleet=fleet, gpus=gpus)
        except Exception:
            _log.warning("could not start telemetry; the run goes on without it", exc_info=True)
            _gate.set_enabled_span_groups(())
            _gate.set_tracer_provider(None)
            return False
        return True


def _start_provider(cfg: TelemetryConfig, *, rank: int, world_size: int, local_rank: int, service: str,
                    fleet: str | None, gpus: int | None) -> None:
    global _atexit_registered
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from nemo_telemetry.instrument._resources import build_resource, decode_run_attributes, resolve_gpu_count

    groups = _resolve_groups(cfg)
    run_id = os.environ.get(env.NEMO_TELEMETRY_RUN_ID) or uuid.uuid4().hex
    resource = build_resource(
        service_name=service,
        run_id=run_id,
        algorithm=os.environ.get(env.NEMO_TELEMETRY_ALGORITHM),
        rank=rank, world_size=world_size, local_rank=local_rank, span_groups=groups,
        run_attributes=decode_run_attributes(os.environ.get(env.NEMO_TELEMETRY_RESOURCE_ATTRIBUTES)),
        fleet=fleet, gpus=resolve_gpu_count(gpus),
        namespace=cfg.namespace,
    )
    provider = TracerProvider(resource=resource, shutdown_on_exit=False,  # our atexit is bounded
                              id_generator=_id_generator())
    exporter = make_span_exporter(cfg, service_name=service)
    processor = BatchSpanProcessor(exporter) if exporter is not None else None
    if processor is not None:
        provider.add_span_processor(processor)
    if isinstance(trace_api.get_tracer_provider(), trace_api.ProxyTracerProvider):
        trace_api.set_tracer_provider(_gate.GLOBAL_TRACER_PROVIDER)  # settable once; it follows ours
    _runtime.provider, _runtime.exporter, _runtime.config = provider, exporter, cfg
    _runtime.span_processor, _runtime.fleet = processor, fleet
    _runtime.meter_provider = _start_meter_provider(cfg, resource, service)
    _gate.set_tracer_provider(provider)
    _gate.set_enabled_span_groups(groups)
    if cfg.logs_enabled:
        _logging.install_log_bridge(service)
        _runtime.logger_provider = _logging.start_log_export(resource, exporter=cfg.exporter, dump_dir=cfg.dump_dir,
                                                             service_name=service)
    if cfg.host_memory_metrics and _runtime.meter_provider is not None:
        _runtime.host_memory = _start_host_memory(run_id)
    if not _atexit_registered:
        atexit.register(shutdown_telemetry)
        _atexit_registered = True


def declare_fleet(fleet: str) -> bool:
    """Give this process's spans ``rl.fleet=fleet`` when telemetry runs without one; True if it did.

    The resource of a provider cannot change, so a provider with the amended resource takes over
    the same span processor (one exporter, one file): spans already open end normally, spans started
    from here on carry the fleet. Metrics and log records keep the resource they started with;
    ``init_telemetry_worker(fleet=...)`` puts the fleet on those too.
    """
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    from nemo_telemetry.instrument._resources import FLEET_KEY

    word = _fleet_word(fleet)
    with _lock:
        provider = _runtime.provider
        if provider is None or _runtime.fleet is not None or word is None:
            return False
        amended = TracerProvider(resource=provider.resource.merge(Resource({FLEET_KEY: word})),
                                 shutdown_on_exit=False, id_generator=_id_generator())
        if _runtime.span_processor is not None:
            amended.add_span_processor(_runtime.span_processor)
        _runtime.provider, _runtime.fleet = amended, word
        _gate.set_tracer_provider(amended)
        return True


_ids: Any = None


def _id_generator() -> Any:
    """One private id generator per process (its fork hook is registered once)."""
    global _ids
    if _ids is None:
        from nemo_telemetry.instrument._ids import PrivateRandomIdGenerator

        _ids = PrivateRandomIdGenerator()
    return _ids


def _start_host_memory(run_id: str) -> Any:
    """This node's ``rl.host.memory.*`` sampler, if this process is the node's first; a failure only warns."""
    from nemo_telemetry.instrument.host_memory import HostMemorySampler

    try:
        return HostMemorySampler.start_for_node(run_id)
    except Exception:
        _log.warning("could not start the rl.host.memory.* sampler; spans and other metrics are unaffected",
                     exc_info=True)
        return None


def _start_meter_provider(cfg: TelemetryConfig, resource: Any, service: str) -> Any:
    """The ``rl.*`` metrics go where the spans go (dump files or OTLP); a failure only warns."""
    from nemo_telemetry.instrument import metrics

    try:
        provider = metrics.build_meter_provider(resource, exporter=cfg.exporter, dump_dir=cfg.dump_dir,
                                                service_name=service)
    except Exception:
        _log.warning("could not start the rl.* metrics; spans are unaffected", exc_info=True)
        return None
    metrics.set_meter_provider(provider)
    return provider


def make_span_exporter(cfg: TelemetryConfig, *, service_name: str | None = None):
    """The exporter ``cfg.exporter`` names, or None (``none``, or a missing package: one warning)."""
    if cfg.exporter == "none":
        return None
    if cfg.exporter == "dump":
        from nemo_telemetry.instrument._dump import DumpSpanExporter

        return DumpSpanExporter(cfg.dump_dir or os.path.abspath(DEFAULT_DUMP_DIR), service_name=service_name)
    protocol = otlp_protocol()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        package = "grpc" if protocol == "grpc" else "http"
        _log.warning("OTLP %s exporter unavailable (%s); spans are not exported. "
                     "pip install opentelemetry-exporter-otlp-proto-%s", protocol, exc, package)
        return None
    from nemo_telemetry.instrument._slices import sliced_span_exporter

    return sliced_span_exporter(OTLPSpanExporter, min_items=OTLP_MIN_SLICE_SPANS)()


# -- flushing and stopping --------------------------------------------------------------------


def _bounded(action: Callable[[], Any], timeout_s: float, what: str) -> bool:
    """Run ``action`` on a daemon thread; True if it finished (truthy or None) within the bound."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(action())
        except Exception:
            _log.warning("telemetry %s failed", what, exc_info=True)
            outcome.append(False)

    thread = threading.Thread(target=run, name=f"nemo-telemetry-{what}", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout_s))
    if thread.is_alive():
        _log.warning("telemetry %s did not finish within %.1f s (is the OTLP endpoint reachable?); "
                     "continuing without waiting", what, timeout_s)
        return False
    return outcome[0] is not False


def flush_telemetry(timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Export every ended span now; returns within ``timeout_s``. True when all were exported.

    Call it before ``ray.kill`` on an actor: a killed process runs no atexit handler.
    """
    provider, meter_provider, logger_provider = _runtime.provider, _runtime.meter_provider, _runtime.logger_provider
    if provider is None:
        return True

    def flush_both() -> bool:
        with hurried():  # an export in progress stops resting between its slices
            spans_ok = provider.force_flush(int(timeout_s * 1000))
            metrics_ok = meter_provider is None or meter_provider.force_flush(int(timeout_s * 1000))
            logs_ok = logger_provider is None or logger_provider.force_flush(int(timeout_s * 1000))
        return bool(spans_ok) and bool(metrics_ok) and bool(logs_ok)

    return _bounded(flush_both, timeout_s, "flush")


def shutdown_telemetry(timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Turn every site off, flush and shut the provider down within ``timeout_s``; idempotent.

    Registered with ``atexit`` by the first init; safe to call from a ``finally`` as well.
    """
    with _lock:
        provider, meter_provider, logger_provider = _runtime.provider, _runtime.meter_provider, _runtime.logger_provider
        host_memory = _runtime.host_memory
        _gate.set_enabled_span_groups(())
        _runtime.provider, _runtime.exporter, _runtime.config = None, None, None
        _runtime.meter_provider = _runtime.logger_provider = _runtime.host_memory = None
        _runtime.span_processor = _runtime.fleet = None
        if host_memory is not None:
            host_memory.stop()  # its last sample is in the final collection below
        if meter_provider is not None:
            from nemo_telemetry.instrument import metrics

            metrics.set_meter_provider(None)
        if _gate.provider is provider:
            _gate.set_tracer_provider(None)
        _logging.uninstall_log_bridge()
        _logging.stop_log_export()
    if provider is None:
        return True

    def shutdown_both() -> bool:
        with hurried():
            if meter_provider is not None:
                meter_provider.shutdown(timeout_millis=timeout_s * 1000)
            if logger_provider is not None:
                logger_provider.shutdown()
            return provider.shutdown()

    return _bounded(shutdown_both, timeout_s, "shutdown")
