"""Startup conventions as helpers: the traced Ray start and the worker's model-load span (seed 000).

``traced_ray_init`` opens ``rl.setup.ray_init`` (setup group) around ``ray.init`` and sets
``rl.ray.cluster_source`` on it, because attaching to a running cluster and booting one differ by
tens of seconds, the usual reason two otherwise identical runs disagree on time-to-first-step.
``traced_worker_init`` opens ``rl.<role>.load_model`` (model_init group) with ``rl.backend`` in a
worker's ``__init__``; Ray carries no trace context into ``__init__``, so the span is a root unless
the constructor is handed the driver's carrier. Ray is imported only when ``traced_ray_init`` runs.

Workers get their telemetry settings from the environment. A cluster this process boots inherits
the driver's; one it attaches to (``ray start``, ``ray.sub``, KubeRay) started with its own, so
``traced_ray_init`` hands the driver's settings to the job through Ray's ``runtime_env``
(:func:`telemetry_runtime_env`), which every actor and task of the job inherits.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Mapping

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument import environment_variables as env
from nemo_telemetry.instrument._primitives import NOOP_SPAN, setup_span, umbrella_span
from nemo_telemetry.instrument.propagation import remote_trace_context
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["CLUSTER_SOURCES", "CLUSTER_SOURCE_KEY", "BACKEND_KEY", "telemetry_runtime_env", "traced_ray_init",
           "traced_worker_init"]

CLUSTER_SOURCE_KEY = "rl.ray.cluster_source"
BACKEND_KEY = "rl.backend"
CLUSTER_SOURCES = ("attached_external", "reused_local", "started_local")
"""``attached_external``: a running cluster named by ``address`` (``"auto"`` or ``host:port``) or
``RAY_ADDRESS``; ``reused_local``: one left behind by an earlier run, the connection this process
already has or the cluster Ray finds recorded on this machine when given no address;
``started_local``: booted by this call."""

_MODEL_INIT = str(RLSpanGroup.MODEL_INIT)


def telemetry_runtime_env(runtime_env: Mapping[str, Any] | None = None, *,
                          environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """``runtime_env`` with the driver's telemetry settings added to its ``env_vars``.

    The settings are every ``NEMO_TELEMETRY_*`` variable :func:`init_telemetry_driver` resolved
    (enabled, span groups, namespace, exporter, dump dir, run id, algorithm, logs, host memory,
    the run's resource attributes) and every ``OTEL_*`` variable of the driver (endpoints,
    protocol, headers): what a worker of a cluster this process booted would inherit. The
    caller's own ``env_vars`` win on conflict and its other keys are kept; the argument is not
    modified. Before ``init_telemetry_driver`` (no ``NEMO_TELEMETRY_ENABLED`` in ``environ``,
    default ``os.environ``) nothing is added: a copy of ``runtime_env`` (None for None) comes back.

        ray.init(address="auto", runtime_env=telemetry_runtime_env())
        Actor.options(runtime_env=telemetry_runtime_env({"env_vars": {"HF_HOME": "/data"}})).remote()

    ``traced_ray_init`` applies it for the whole job; pass it yourself where Ray is already
    initialised by other code (the job's ``runtime_env`` is fixed by then) or around ``ray.init``
    called directly. A dump dir must be a path every node can write (a shared file system).
    """
    environ = os.environ if environ is None else environ
    kept = dict(runtime_env) if runtime_env is not None else None
    if env.NEMO_TELEMETRY_ENABLED not in environ:
        return kept
    settings = {k: environ[k] for k in env.NEMO_TELEMETRY_VARIABLES if k in environ}
    settings.update({k: v for k, v in environ.items() if k.startswith("OTEL_")})
    merged = dict(kept or {})
    own = merged.get("env_vars") or {}
    merged["env_vars"] = {**settings, **dict(own)}
    return merged


def traced_ray_init(address: str | None = None, *, local_options: Mapping[str, Any] | None = None,
                    **init_kwargs: Any) -> str:
    """Start or join Ray inside ``rl.setup.ray_init``; returns the ``rl.ray.cluster_source`` it set.

    Already connected in this process: nothing is started (``reused_local``; the job's
    ``runtime_env`` is fixed, so pass :func:`telemetry_runtime_env` to the actors whose cluster did
    not inherit the driver's environment). ``address`` (``"auto"``, ``host:port``) or
    ``RAY_ADDRESS`` given: ``ray.init(address=..., **init_kwargs)`` joins that cluster
    (``attached_external``). Otherwise ``ray.init(**init_kwargs, **local_options)`` boots one
    (``started_local``; ``local_options`` such as ``num_cpus`` only apply here, since Ray refuses
    them when joining a cluster), or joins the cluster Ray finds recorded on this machine
    (``reused_local``). Whenever ``ray.init`` runs, its ``runtime_env`` is
    ``telemetry_runtime_env(init_kwargs.get("runtime_env"))``: every actor and task of the job
    inherits the driver's telemetry settings, and an actor's own ``runtime_env`` adds to them
    (Ray merges a job's and an actor's ``env_vars``). A failing ``ray.init`` raises, recorded on
    the span. Call it inside ``startup_span()`` so the phase sits in the startup waterfall.
    """
    with setup_span("ray_init") as span:
        import ray

        if ray.is_initialized():
            source = "reused_local"
        else:
            target = address or os.environ.get("RAY_ADDRESS") or None
            options = dict(init_kwargs)
            runtime_env = telemetry_runtime_env(options.get("runtime_env"))
            if runtime_env is not None:
                options["runtime_env"] = runtime_env
            if target and target != "local":
                ray.init(address=target, **options)
                source = "attached_external"
            else:
                if target:
                    options["address"] = target
                ray.init(**options, **dict(local_options or {}))
                source = "started_local" if _booted_here(ray) else "reused_local"
        if span is not None:
            span.set_attribute(CLUSTER_SOURCE_KEY, source)
        return source


def _booted_here(ray: Any) -> bool:
    """Whether the ``ray.init`` just made started the head node (else it joined a recorded cluster).

    Ray says so only on its node object (``head``); a Ray without it reads as booted here.
    """
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    head = getattr(node, "head", None)
    return True if head is None else bool(head)


def traced_worker_init(role: str, *, backend: str, trace_carrier: Mapping[str, str] | None = None,
                       **attributes: Any):
    """``with traced_worker_init("policy", backend="megatron"):`` around a worker's model build.

    Opens ``rl.<role>.load_model`` in the ``model_init`` group (unbucketed) with ``rl.backend``;
    ``role`` is ``policy``, ``value`` or ``vllm`` for the spans the catalogue declares. With
    ``trace_carrier`` (the driver's ``current_trace_carrier()``) the span joins the run's trace.
    Yields the span, or None while ``model_init`` is off (the body runs either way).

    A process whose telemetry started without a fleet (``init_telemetry_worker(fleet=None)``) takes
    ``rl.fleet`` from the role here (``vllm`` is ``generation``), whether ``model_init`` is on or not.
    """
    if _gate.provider is not None:
        _declare_fleet(role)
    if _MODEL_INIT not in _gate.enabled:
        return NOOP_SPAN
    return _worker_init(role, backend, trace_carrier, attributes)


def _declare_fleet(role: str) -> None:
    from nemo_telemetry.instrument._lifecycle import declare_fleet
    from nemo_telemetry.instrument._resources import fleet_for_role

    declare_fleet(fleet_for_role(role))


@contextlib.contextmanager
def _worker_init(role: str, backend: str, trace_carrier: Mapping[str, str] | None,
                 attributes: dict[str, Any]) -> Iterator[Any]:
    with remote_trace_context(trace_carrier):
        with umbrella_span(_MODEL_INIT, f"rl.{role}.load_model", **{BACKEND_KEY: backend, **attributes}) as span:
            yield span
