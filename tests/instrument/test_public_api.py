"""The public names other code is written against, importable from ``nemo_telemetry.instrument``."""

from __future__ import annotations

import nemo_telemetry.instrument as instrument

PINNED = {
    "is_span_group_enabled", "enabled_span_groups", "set_enabled_span_groups", "get_tracer",
    "managed_span", "umbrella_span", "trace_fn", "umbrella_trace_fn", "span_cm", "startup_span", "setup_span",
    "Bucket", "bucket_scope", "current_bucket_scope", "iteration_scope", "current_iteration",
    "per_prompt_scope", "in_per_prompt_scope", "efficiency_span", "start_efficiency_span",
    "checkpoint_span", "begin_checkpoint_finalize", "TelemetryConfig", "load_telemetry_config",
    "init_telemetry_driver", "init_telemetry_worker", "flush_telemetry", "shutdown_telemetry",
    "DumpSpanExporter",
}
# issue 19, names porting users reach for and the helpers the seeds describe
PINNED |= {"get_telemetry_handle", "TelemetryHandle", "TIMER_ONLY_CATEGORIES", "TracedDataPlaneClient",
           "DATA_PLANE_OPS", "traced_ray_init", "CLUSTER_SOURCES", "traced_worker_init"}
# resource attributes, training and generation series, log export (issue 19, items 3-5)
PINNED |= {"run_resource_attributes", "TRAIN_PREFIX", "TRAINING_METRICS", "record_generation", "record_host_memory",
           "DumpLogExporter"}
# settings reach the workers of a cluster the driver attaches to (issue 31, item 1)
PINNED |= {"telemetry_runtime_env"}
# busy time where no span can say it (issue 31, item 3)
PINNED |= {"fleet_busy", "busy_union", "BusyUnion", "BusyScope", "BUSY_SECONDS", "track_vllm_busy"}


def test_pinned_names_are_public():
    assert PINNED <= set(instrument.__all__)


def test_every_public_name_resolves_and_is_listed_once():
    assert len(instrument.__all__) == len(set(instrument.__all__))
    for name in instrument.__all__:
        assert getattr(instrument, name) is not None, name


def test_rl_span_group_resolves_with_the_nemo_rl_presets():
    assert instrument.RLSpanGroup.resolve("default") == instrument.resolve("default", namespace="nemo_rl")
    enabled, pending = instrument.RLSpanGroup.resolve_with_pending("per_step,genration")
    assert "generation" in enabled and "server" not in enabled
    assert pending == frozenset({"genration"})
