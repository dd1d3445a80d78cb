"""Startup conventions as helpers: the traced Ray start and the worker's model-load span (seed 000).

``traced_ray_init`` opens ``rl.setup.ray_init`` (setup group) around ``ray.init`` and sets
``rl.ray.cluster_source`` on it, because attaching to a running cluster and booting one differ by
tens of seconds, the usual reason two otherwise identical runs disagree on time-to-first-step.
``traced_worker_init`` opens ``rl.<role>.load_model`` (model_init group) with ``rl.backend`` in a
worker's ``__init__``; Ray carries no trace context into ``__init__``, so the span is a root unless
the constructor is handed the driver's carrier. Ray is imported only when ``traced_ray_init`` runs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Mapping

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument._primitives import NOOP_SPAN, setup_span, umbrella_span
from nemo_telemetry.instrument.propagation import remote_trace_context
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["CLUSTER_SOURCES", "CLUSTER_SOURCE_KEY", "BACKEND_KEY", "traced_ray_init", "traced_worker_init"]

CLUSTER_SOURCE_KEY = "rl.ray.cluster_source"
BACKEND_KEY = "rl.backend"
CLUSTER_SOURCES = ("attached_external", "reused_local", "started_local")
"""``attached_external``: a cluster that was already running elsewhere (``address`` / ``RAY_ADDRESS``);
``reused_local``: the cluster this process is already connected to; ``started_local``: booted here."""

_MODEL_INIT = str(RLSpanGroup.MODEL_INIT)


def traced_ray_init(address: str | None = None, *, local_options: Mapping[str, Any] | None = None,
                    **init_kwargs: Any) -> str:
    """Start or join Ray inside ``rl.setup.ray_init``; returns the ``rl.ray.cluster_source`` it set.

    Already connected in this process: nothing is started (``reused_local``). ``address`` or
    ``RAY_ADDRESS`` given: ``ray.init(address=..., **init_kwargs)`` joins that cluster
    (``attached_external``). Otherwise ``ray.init(**init_kwargs, **local_options)``
    (``started_local``; ``local_options`` such as ``num_cpus`` only apply here, since Ray refuses
    them when joining a cluster). Ray may join a cluster it finds recorded in its temp dir, which
    then reads as started here. A failing ``ray.init`` raises, recorded on the span. Call it
    inside ``startup_span()`` so the phase sits in the startup waterfall.
    """
    with setup_span("ray_init") as span:
        import ray

        if ray.is_initialized():
            source = "reused_local"
        else:
            target = address or os.environ.get("RAY_ADDRESS") or None
            if target:
                ray.init(address=target, **init_kwargs)
                source = "attached_external"
            else:
                ray.init(**init_kwargs, **dict(local_options or {}))
                source = "started_local"
        if span is not None:
            span.set_attribute(CLUSTER_SOURCE_KEY, source)
        return source


def traced_worker_init(role: str, *, backend: str, trace_carrier: Mapping[str, str] | None = None,
                       **attributes: Any):
    """``with traced_worker_init("policy", backend="megatron"):`` around a worker's model build.

    Opens ``rl.<role>.load_model`` in the ``model_init`` group (unbucketed) with ``rl.backend``;
    ``role`` is ``policy``, ``value`` or ``vllm`` for the spans the catalogue declares. With
    ``trace_carrier`` (the driver's ``current_trace_carrier()``) the span joins the run's trace.
    Yields the span, or None while ``model_init`` is off (the body runs either way).
    """
    if _MODEL_INIT not in _gate.enabled:
        return NOOP_SPAN
    return _worker_init(role, backend, trace_carrier, attributes)


@contextlib.contextmanager
def _worker_init(role: str, backend: str, trace_carrier: Mapping[str, str] | None,
                 attributes: dict[str, Any]) -> Iterator[Any]:
    with remote_trace_context(trace_carrier):
        with umbrella_span(_MODEL_INIT, f"rl.{role}.load_model", **{BACKEND_KEY: backend, **attributes}) as span:
            yield span
