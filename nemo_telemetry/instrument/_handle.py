"""``get_telemetry_handle()``: the tracer, meter and config of a process whose telemetry is on.

Code ported from NeMo-RL reaches for it at cold, top-level sites::

    telemetry = get_telemetry_handle()
    if telemetry is not None:
        with span_cm("rl.grpo.job", tracer=telemetry.tracer):
            ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry import trace as trace_api

from nemo_telemetry.instrument import _gate
from nemo_telemetry.instrument._config import TelemetryConfig
from nemo_telemetry.instrument._lifecycle import current_telemetry_config

__all__ = ["TelemetryHandle", "get_telemetry_handle"]


@dataclass(frozen=True)
class TelemetryHandle:
    """What a started process emits with: its tracer, the ``rl.*`` meter and the resolved config."""

    tracer: trace_api.Tracer
    meter: Any
    config: TelemetryConfig


def get_telemetry_handle() -> TelemetryHandle | None:
    """The handle while ``init_telemetry_driver`` / ``init_telemetry_worker`` has telemetry on, else None."""
    config = current_telemetry_config()
    if config is None or _gate.provider is None:
        return None
    from nemo_telemetry.instrument.metrics import get_meter

    return TelemetryHandle(tracer=_gate.tracer, meter=get_meter(), config=config)
