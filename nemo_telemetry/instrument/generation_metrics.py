"""The driver-side ``gen_ai.*`` generation series, in OpenTelemetry's GenAI semantic conventions.

The driver sees every generation call return, whichever engine ran it and wherever it ran, so
it records them: ``gen_ai.client.token.usage`` (a histogram of tokens per request, split by
``gen_ai.token.type`` = ``input`` / ``output``) and ``gen_ai.client.operation.duration`` (a
histogram of seconds per call). The engine's own counters are ``rl.vllm.*`` (deltas per step)::

    start = time.monotonic()
    outputs = policy_generation.generate(batch)
    record_generation(input_tokens=prompt_lengths, output_tokens=generated_lengths,
                      duration_s=time.monotonic() - start, model="Qwen/Qwen2.5-1.5B")

Labels stay bounded (model, system, operation, token type): per-request values are observations
of the histograms, never labels.
"""

from __future__ import annotations

import logging
from typing import Any

from nemo_telemetry.instrument.metrics import TeedMetric, record_metrics, register_teed_metrics

__all__ = ["GENERATION_METRICS", "TOKEN_USAGE", "OPERATION_DURATION", "record_generation"]

_log = logging.getLogger("nemo_telemetry")

TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"

GENERATION_METRICS = (
    TeedMetric(None, TOKEN_USAGE, "histogram", "{token}",
               "Tokens per generation request, by gen_ai.token.type (input or output)"),
    TeedMetric(None, OPERATION_DURATION, "histogram", "s", "Seconds each generation call took, seen by the driver"),
)
register_teed_metrics(GENERATION_METRICS)


def _observations(values: Any) -> list:
    """A count, or an iterable of counts (one per request), as a list of observations."""
    if values is None:
        return []
    if isinstance(values, (str, bytes)):
        return [values]  # not a count: record_metrics warns about it
    try:
        return list(values)
    except TypeError:
        return [values]


def record_generation(*, input_tokens: Any = None, output_tokens: Any = None, duration_s: float | None = None,
                      model: str | None = None, system: str = "vllm", operation: str = "text_completion") -> int:
    """Record one generation call; returns how many values were recorded. Never raises.

    ``input_tokens`` / ``output_tokens``: a count, or one count per request of the call.
    """
    try:
        labels = {"gen_ai.system": system, "gen_ai.operation.name": operation}
        if model:
            labels["gen_ai.request.model"] = model
        recorded = 0
        for token_type, values in (("input", input_tokens), ("output", output_tokens)):
            attributes = {**labels, "gen_ai.token.type": token_type}
            for value in _observations(values):
                recorded += record_metrics({TOKEN_USAGE: value}, attributes=attributes)
        if duration_s is not None:
            recorded += record_metrics({OPERATION_DURATION: duration_s}, attributes=labels)
        return recorded
    except Exception:
        _log.warning("record_generation failed; the values are dropped", exc_info=True)
        return 0
