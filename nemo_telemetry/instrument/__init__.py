"""The emitting half of nemo-telemetry, imported by trainers, Ray actors and GPU workers.

Importing this package is cheap: it loads the group registry, the span-group declarations and
the metric registry; every other public name loads its module on first use (the OpenTelemetry
SDK's exporters and resources among them). Nothing heavy (pandas, pyarrow, ray, vllm) is
imported here or at call time on a disabled site. The public API is listed once, in ``__all__`` below, and pinned by
``tests/instrument/test_public_api.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from nemo_telemetry.errors import RegistryError, SpecError
from nemo_telemetry.instrument._groups import Bucket, GroupName, group, span_name_regex
from nemo_telemetry.instrument._registry import REGISTRY, SpanGroupInfo, SpanRegistry
from nemo_telemetry.instrument.gym_span_groups import GymSpanGroup
from nemo_telemetry.instrument.span_groups import (
    COLLECTOR_LOOP_CATEGORIES,
    EFFICIENCY_CATEGORY_BUCKET,
    UNBUCKETED_SPAN_CATEGORIES,
    RLSpanGroup,
)
from nemo_telemetry.instrument.span_groups import TIMER_ONLY_CATEGORIES
# The metrics modules register their teed series into METRICS when imported: loaded with the
# package, so every series is known whichever of them a caller touches first.
from nemo_telemetry.instrument.metrics import (
    METRICS,
    TeedMetric,
    VllmCounterDeltas,
    flush_metrics,
    record_host_memory,
    record_metrics,
    record_setup_durations,
    register_teed_metrics,
    set_meter_provider,
    tee_metrics,
)
from nemo_telemetry.instrument.generation_metrics import record_generation
from nemo_telemetry.instrument.training_metrics import TRAIN_PREFIX, TRAINING_METRICS

# Everything else is loaded on first use, so importing the package (a trainer, a Ray worker, or
# the analysis reading the catalogue above) does not load the OpenTelemetry SDK's exporters,
# resources and propagators until something needs them.
_LAZY_MODULES = {
    "_gate": ("enabled_span_groups", "get_tracer", "get_tracer_provider", "is_span_group_enabled",
              "set_enabled_span_groups", "set_tracer_provider", "telemetry_active"),
    "_primitives": ("NOOP_SPAN", "SPAN_GROUP_KEY", "managed_span", "setup_span", "span_cm", "startup_span", "trace_fn",
                    "umbrella_span", "umbrella_trace_fn"),
    "_handles": ("NOOP_HANDLE", "SpanHandle", "start_span", "start_step_span", "start_umbrella_span"),
    "_scopes": ("bucket_scope", "current_bucket_scope", "current_iteration", "in_per_prompt_scope",
                "iteration_scope", "per_prompt_scope"),
    "_checkpoint": ("CheckpointFinalize", "begin_checkpoint_finalize", "checkpoint_span"),
    "_config": ("TelemetryConfig", "load_telemetry_config", "resolve_telemetry_config"),
    "_dump": ("DumpSpanExporter",),
    "_log_dump": ("DumpLogExporter",),
    "_efficiency": ("EfficiencyWait", "efficiency_span", "start_efficiency_span"),
    "_lifecycle": ("current_telemetry_config", "flush_telemetry", "init_telemetry_driver", "init_telemetry_worker",
                   "shutdown_telemetry"),
    "_resources": ("run_resource_attributes",),
    "_handle": ("TelemetryHandle", "get_telemetry_handle"),
    "http": ("instrument_aiohttp_client", "instrument_fastapi", "uninstrument_aiohttp_client"),
    "vllm": ("instrument_vllm", "load_vllm", "record_vllm_engine_counters", "track_vllm_busy", "vllm_trace_headers",
             "vllm_tracing_engine_args", "vllm_tracing_env"),
    "busy": ("BUSY_SECONDS", "BusyScope", "BusyUnion", "busy_union", "fleet_busy"),
    "propagation": ("TRACE_CARRIER_KWARG", "TraceCarrierThread", "current_trace_carrier", "remote_trace_context",
                    "run_with_carrier", "trace_context_kwargs"),
    "data_plane": ("DATA_PLANE_OPS", "TracedDataPlaneClient"),
    "startup": ("CLUSTER_SOURCES", "telemetry_runtime_env", "traced_ray_init", "traced_worker_init"),
    "ray_actors": ("TelemetryFlushMixin", "accepts_trace_context", "dispatch_with_trace_context",
                   "flush_actors_telemetry"),
}
_LAZY_NAMES = {name: module for module, names in _LAZY_MODULES.items() for name in names}

# What a type checker reads for the names __getattr__ below loads on first use: the same modules as
# _LAZY_MODULES (tests/test_typing.py keeps the two in step). Never executed, so importing stays light.
if TYPE_CHECKING:
    from nemo_telemetry.instrument._gate import (
        enabled_span_groups, get_tracer, get_tracer_provider, is_span_group_enabled, set_enabled_span_groups,
        set_tracer_provider, telemetry_active,
    )
    from nemo_telemetry.instrument._primitives import (
        NOOP_SPAN, SPAN_GROUP_KEY, managed_span, setup_span, span_cm, startup_span, trace_fn, umbrella_span,
        umbrella_trace_fn,
    )
    from nemo_telemetry.instrument._handles import (
        NOOP_HANDLE, SpanHandle, start_span, start_step_span, start_umbrella_span,
    )
    from nemo_telemetry.instrument._scopes import (
        bucket_scope, current_bucket_scope, current_iteration, in_per_prompt_scope, iteration_scope,
        per_prompt_scope,
    )
    from nemo_telemetry.instrument._checkpoint import CheckpointFinalize, begin_checkpoint_finalize, checkpoint_span
    from nemo_telemetry.instrument._config import TelemetryConfig, load_telemetry_config, resolve_telemetry_config
    from nemo_telemetry.instrument._dump import DumpSpanExporter
    from nemo_telemetry.instrument._log_dump import DumpLogExporter
    from nemo_telemetry.instrument._efficiency import EfficiencyWait, efficiency_span, start_efficiency_span
    from nemo_telemetry.instrument._lifecycle import (
        current_telemetry_config, flush_telemetry, init_telemetry_driver, init_telemetry_worker, shutdown_telemetry,
    )
    from nemo_telemetry.instrument._resources import run_resource_attributes
    from nemo_telemetry.instrument._handle import TelemetryHandle, get_telemetry_handle
    from nemo_telemetry.instrument.http import (
        instrument_aiohttp_client, instrument_fastapi, uninstrument_aiohttp_client,
    )
    from nemo_telemetry.instrument.vllm import (
        instrument_vllm, load_vllm, record_vllm_engine_counters, track_vllm_busy, vllm_trace_headers,
        vllm_tracing_engine_args, vllm_tracing_env,
    )
    from nemo_telemetry.instrument.busy import BUSY_SECONDS, BusyScope, BusyUnion, busy_union, fleet_busy
    from nemo_telemetry.instrument.propagation import (
        TRACE_CARRIER_KWARG, TraceCarrierThread, current_trace_carrier, remote_trace_context, run_with_carrier,
        trace_context_kwargs,
    )
    from nemo_telemetry.instrument.data_plane import DATA_PLANE_OPS, TracedDataPlaneClient
    from nemo_telemetry.instrument.startup import (
        CLUSTER_SOURCES, telemetry_runtime_env, traced_ray_init, traced_worker_init,
    )
    from nemo_telemetry.instrument.ray_actors import (
        TelemetryFlushMixin, accepts_trace_context, dispatch_with_trace_context, flush_actors_telemetry,
    )


def __getattr__(name: str):
    """A public name of a module loaded on first use (:data:`_LAZY_MODULES`), kept here afterwards."""
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def resolve(spec, *, namespace: str | None = None, strict: bool = False) -> frozenset[str]:
    """Groups a ``span_groups`` spec selects in the process-wide registry."""
    return REGISTRY.resolve(spec, namespace=namespace, strict=strict)


def resolve_with_pending(spec, *, namespace: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """``(enabled, pending)`` for a spec in the process-wide registry."""
    return REGISTRY.resolve_with_pending(spec, namespace=namespace)


def register_span_groups(namespace: str, groups, presets=None, *, allow_override: bool = True) -> None:
    """Register a library's own groups and presets into the process-wide registry."""
    REGISTRY.register(namespace, groups, presets, allow_override=allow_override)


__all__ = [
    # registry and catalogue
    "Bucket",
    "GroupName",
    "group",
    "span_name_regex",
    "SpanGroupInfo",
    "SpanRegistry",
    "REGISTRY",
    "RLSpanGroup",
    "GymSpanGroup",
    "EFFICIENCY_CATEGORY_BUCKET",
    "COLLECTOR_LOOP_CATEGORIES",
    "UNBUCKETED_SPAN_CATEGORIES",
    "TIMER_ONLY_CATEGORIES",
    "resolve",
    "resolve_with_pending",
    "register_span_groups",
    "SpecError",
    "RegistryError",
    # the gate and the tracer
    "is_span_group_enabled",
    "enabled_span_groups",
    "set_enabled_span_groups",
    "get_tracer",
    "get_tracer_provider",
    "set_tracer_provider",
    "telemetry_active",
    # span primitives
    "NOOP_SPAN",
    "SPAN_GROUP_KEY",
    "managed_span",
    "umbrella_span",
    "trace_fn",
    "umbrella_trace_fn",
    "span_cm",
    "startup_span",
    "setup_span",
    # span handles: started in one callback, ended in another
    "SpanHandle",
    "NOOP_HANDLE",
    "start_span",
    "start_umbrella_span",
    "start_step_span",
    # scopes
    "bucket_scope",
    "current_bucket_scope",
    "iteration_scope",
    "current_iteration",
    "per_prompt_scope",
    "in_per_prompt_scope",
    # efficiency and checkpoint spans
    "efficiency_span",
    "start_efficiency_span",
    "EfficiencyWait",
    "checkpoint_span",
    "begin_checkpoint_finalize",
    "CheckpointFinalize",
    # lifecycle, config, exporters
    "TelemetryConfig",
    "load_telemetry_config",
    "resolve_telemetry_config",
    "init_telemetry_driver",
    "init_telemetry_worker",
    "flush_telemetry",
    "shutdown_telemetry",
    "current_telemetry_config",
    "get_telemetry_handle",
    "TelemetryHandle",
    "DumpSpanExporter",
    # startup helpers and the data-plane client
    "traced_ray_init",
    "telemetry_runtime_env",
    "CLUSTER_SOURCES",
    "traced_worker_init",
    "TracedDataPlaneClient",
    "DATA_PLANE_OPS",
    "DumpLogExporter",
    "run_resource_attributes",
    # trace context across threads, Ray actors and HTTP
    "TRACE_CARRIER_KWARG",
    "current_trace_carrier",
    "remote_trace_context",
    "trace_context_kwargs",
    "run_with_carrier",
    "TraceCarrierThread",
    "dispatch_with_trace_context",
    "accepts_trace_context",
    "TelemetryFlushMixin",
    "flush_actors_telemetry",
    "instrument_aiohttp_client",
    "uninstrument_aiohttp_client",
    "instrument_fastapi",
    # rl.* metrics
    "TeedMetric",
    "METRICS",
    "register_teed_metrics",
    "tee_metrics",
    "record_metrics",
    "record_setup_durations",
    "record_host_memory",
    "record_generation",
    "TRAIN_PREFIX",
    "TRAINING_METRICS",
    "VllmCounterDeltas",
    "set_meter_provider",
    "flush_metrics",
    # rl.fleet.busy.seconds: busy time where no span says it
    "fleet_busy",
    "busy_union",
    "BusyScope",
    "BusyUnion",
    "BUSY_SECONDS",
    # vLLM two-layer tracing
    "instrument_vllm",
    "load_vllm",
    "vllm_trace_headers",
    "vllm_tracing_engine_args",
    "vllm_tracing_env",
    "record_vllm_engine_counters",
    "track_vllm_busy",
]
