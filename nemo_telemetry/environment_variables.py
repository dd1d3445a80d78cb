"""Every environment variable nemo-telemetry reads, as a named constant with a docstring (also
exported as ``nemo_telemetry.instrument.environment_variables``; this module imports nothing heavy).

Precedence for each setting: explicit argument > raw environment > ``telemetry:`` config > default.
``init_telemetry_driver`` writes the resolved values into these variables *before* Ray starts,
so every worker inherits the driver's decisions and ``init_telemetry_worker`` only reads them; on a
cluster the driver attaches to, they travel in the job's ``runtime_env`` (``telemetry_runtime_env``).
The ``OTEL_*`` names are the standard OpenTelemetry ones; the OTLP exporters read them too.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "NEMO_TELEMETRY_ENABLED",
    "NEMO_TELEMETRY_SPAN_GROUPS",
    "NEMO_TELEMETRY_NAMESPACE",
    "NEMO_TELEMETRY_EXPORTER",
    "NEMO_TELEMETRY_DUMP_DIR",
    "NEMO_TELEMETRY_RUN_ID",
    "NEMO_TELEMETRY_ALGORITHM",
    "NEMO_TELEMETRY_LOGS_ENABLED",
    "NEMO_TELEMETRY_RESOURCE_ATTRIBUTES",
    "NEMO_TELEMETRY_HOST_MEMORY_METRICS",
    "NEMO_TELEMETRY_COMPILED",
    "NEMO_TELEMETRY_KERNEL_CACHE_DIR",
    "NEMO_TELEMETRY_KERNEL_FAULT",
    "NEMO_TELEMETRY_THREADS",
    "NEMO_TELEMETRY_MEMORY_BUDGET",
    "NEMO_TELEMETRY_PROCESS_TUNING",
    "OPENBLAS_NUM_THREADS",
    "NPY_ENABLE_CPU_FEATURES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "NEMO_TELEMETRY_VARIABLES",
]

NEMO_TELEMETRY_ENABLED: Final = "NEMO_TELEMETRY_ENABLED"
"""``1``/``true``/``yes``/``on`` turns telemetry on in this process; anything else (or unset) leaves it off."""

NEMO_TELEMETRY_SPAN_GROUPS: Final = "NEMO_TELEMETRY_SPAN_GROUPS"
"""The raw ``span_groups`` spec (e.g. ``per_step,per_prompt``); each process resolves it against its own
registry, so a group registered by a library only a worker imports still turns on there."""

NEMO_TELEMETRY_NAMESPACE: Final = "NEMO_TELEMETRY_NAMESPACE"
"""Registry namespace whose presets the spec names (default ``nemo_rl``)."""

NEMO_TELEMETRY_EXPORTER: Final = "NEMO_TELEMETRY_EXPORTER"
"""Where spans go: ``otlp`` (the ``OTEL_EXPORTER_OTLP_*`` endpoint), ``dump`` (JSON-lines files) or ``none``."""

NEMO_TELEMETRY_DUMP_DIR: Final = "NEMO_TELEMETRY_DUMP_DIR"
"""Directory the dump exporter writes ``traces-<service>-<pid>-<random>.jsonl`` files into."""

NEMO_TELEMETRY_RUN_ID: Final = "NEMO_TELEMETRY_RUN_ID"
"""``nemo.run.id`` shared by every process of a run; the driver generates it, workers read it."""

NEMO_TELEMETRY_ALGORITHM: Final = "NEMO_TELEMETRY_ALGORITHM"
"""``rl.algorithm`` resource attribute (``grpo``, ``ppo``, ``sft`` ...)."""

NEMO_TELEMETRY_LOGS_ENABLED: Final = "NEMO_TELEMETRY_LOGS_ENABLED"
"""``1``/``true``: stamp the active trace and span ids on every Python ``logging`` record and export the
records (OTLP logs, or ``logs-*.jsonl`` dump files beside the traces): the log bridge."""

NEMO_TELEMETRY_RESOURCE_ATTRIBUTES: Final = "NEMO_TELEMETRY_RESOURCE_ATTRIBUTES"
"""JSON object of the run's resource attributes (``rl.model``, ``nv.dl.topology.size.*`` ...) the driver
derived from the trainer's config; workers add them to their resource."""

NEMO_TELEMETRY_HOST_MEMORY_METRICS: Final = "NEMO_TELEMETRY_HOST_MEMORY_METRICS"
"""``1``/``true``: one process per node samples ``rl.host.memory.*`` (every 15 s)."""

NEMO_TELEMETRY_COMPILED: Final = "NEMO_TELEMETRY_COMPILED"
"""Analysis side: ``0`` sends every input through the reference paths (orjson, upb, numpy), as a
machine without numba does; ``1`` takes the compiled (numba) kernels for every input, however
small; unset (or ``auto``) takes them from a few MiB of input, where they beat their load time."""

NEMO_TELEMETRY_KERNEL_CACHE_DIR: Final = "NEMO_TELEMETRY_KERNEL_CACHE_DIR"
"""Analysis side: where the compiled kernels are cached (one sub-directory per digest of their
sources); default ``NUMBA_CACHE_DIR``, else ``$XDG_CACHE_HOME/nemo-telemetry/kernels``, else
``~/.cache/nemo-telemetry/kernels``, else the temporary directory: the first one writable."""

NEMO_TELEMETRY_KERNEL_FAULT: Final = "NEMO_TELEMETRY_KERNEL_FAULT"
"""Test hook: ``import``, ``compile`` or ``call`` makes every compiled kernel fail that way, to
check that the reference paths take over with one warning. Never set it in production."""

NEMO_TELEMETRY_THREADS: Final = "NEMO_TELEMETRY_THREADS"
"""Analysis side: worker threads one analysis call may use (what ``--threads`` sets for one command).
Unset: the CPUs this process may run on (its affinity mask, e.g. ``taskset``), fewer where its
cgroup's CPU quota allows fewer (``nemo_telemetry.analysis.settings.machine.available_cpus``)."""

NEMO_TELEMETRY_MEMORY_BUDGET: Final = "NEMO_TELEMETRY_MEMORY_BUDGET"
"""Analysis side: bytes (or ``512M``, ``4G``) the in-memory path may take before ``goodput`` streams
the dataset in batches (what ``--memory-budget`` sets for one command). Unset: a quarter of the
memory available, the tighter of the host's ``MemAvailable`` and the room left under the cgroup's
memory limit; where neither can be told, a quarter of the physical memory (macOS)."""

NEMO_TELEMETRY_PROCESS_TUNING: Final = "NEMO_TELEMETRY_PROCESS_TUNING"
"""Console script only: ``0`` turns off the settings the ``nemo-telemetry`` command applies to its
own process (:data:`OPENBLAS_NUM_THREADS` and :data:`NPY_ENABLE_CPU_FEATURES` while numpy is
imported, pyarrow's pandas probe answered without pandas in ``goodput`` and ``check``, and
the collector's objects frozen once the command is done).
None of them reaches the library's callers or a child process."""

OPENBLAS_NUM_THREADS: Final = "OPENBLAS_NUM_THREADS"
"""OpenBLAS's own variable. The ``nemo-telemetry`` command sets it to ``1`` while it imports numpy
(where the process may use more than one CPU and neither it nor ``OMP_NUM_THREADS`` is set), and
removes it right after: OpenBLAS reads it once when numpy loads it, so that process starts no BLAS
thread per core (the analysis does no linear algebra), and no child process inherits it."""

NPY_ENABLE_CPU_FEATURES: Final = "NPY_ENABLE_CPU_FEATURES"
"""numpy's own variable. The ``nemo-telemetry`` command sets it to ``X86_V2 X86_V3`` while it imports
numpy where the CPU is AMD Zen 4 (family 19h with AVX-512, AVX2, FMA, BMI2), numpy is 2.4 or later
and neither it nor ``NPY_DISABLE_CPU_FEATURES`` is set, and removes it right after: numpy then sorts
with its AVX2 code, as Zen 4 runs the AVX-512 sort's compressed stores in microcode. Listing
features numpy has in its baseline is allowed, so no numpy build fails to import."""

OTEL_EXPORTER_OTLP_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
"""Standard OTLP endpoint for all signals (``http://collector:4318`` or ``http://collector:4317``)."""

OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
"""Standard OTLP endpoint for traces only; wins over :data:`OTEL_EXPORTER_OTLP_ENDPOINT`."""

OTEL_EXPORTER_OTLP_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""``grpc`` or ``http/protobuf``. Unset: ``grpc`` when the endpoint's port is 4317, else ``http/protobuf``."""

OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: Final = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
"""Protocol for traces only; wins over :data:`OTEL_EXPORTER_OTLP_PROTOCOL`."""

OTEL_SERVICE_NAME: Final = "OTEL_SERVICE_NAME"
"""Standard ``service.name``; an explicit ``service_name=`` argument wins over it."""

NEMO_TELEMETRY_VARIABLES: Final[tuple[str, ...]] = (
    NEMO_TELEMETRY_ENABLED,
    NEMO_TELEMETRY_SPAN_GROUPS,
    NEMO_TELEMETRY_NAMESPACE,
    NEMO_TELEMETRY_EXPORTER,
    NEMO_TELEMETRY_DUMP_DIR,
    NEMO_TELEMETRY_RUN_ID,
    NEMO_TELEMETRY_ALGORITHM,
    NEMO_TELEMETRY_LOGS_ENABLED,
    NEMO_TELEMETRY_RESOURCE_ATTRIBUTES,
    NEMO_TELEMETRY_HOST_MEMORY_METRICS,
)
"""The variables ``init_telemetry_driver`` writes for its workers."""
