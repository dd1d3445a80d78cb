"""The two checkpoint spans: staging (blocks the loop, overhead) and finalize (the durable tail).

``rl.<algo>.checkpointing`` covers what the step pays. ``rl.checkpoint.finalize`` opens inside
it, when the background writers take over, and closes when ``tmp_step_N`` becomes ``step_N``:
a child of staging that may end long after its parent, on another thread. It carries no
bucket (it overlaps the next steps' work) and reads ``rl.iteration`` from the directory name,
because the thread that ends it is out of reach of any ``iteration_scope``.

Instrumentation never decides whether a checkpoint becomes resumable: failing to open or end
the finalize span is warned about and the checkpoint proceeds untraced.

    with checkpoint_span("grpo"):
        stage_weights(tmp_dir)
        finalize = begin_checkpoint_finalize(tmp_dir)
        threading.Thread(target=drain_and_rename, args=(finalize,)).start()

    def drain_and_rename(finalize):
        with finalize:          # current in this thread; error status if the body raises
            wait_for_writers(); os.rename(tmp_dir, final_dir)
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from nemo_telemetry.instrument import _gate, _scopes
from nemo_telemetry.instrument._primitives import (
    BUCKET_KEY,
    ITERATION_KEY,
    NOOP_SPAN,
    SPAN_GROUP_KEY,
    managed_span,
    record_error,
)
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["checkpoint_span", "begin_checkpoint_finalize", "CheckpointFinalize", "FINALIZE_SPAN_NAME"]

_log = logging.getLogger("nemo_telemetry")

FINALIZE_SPAN_NAME = "rl.checkpoint.finalize"
CHECKPOINT_GROUP = str(RLSpanGroup.CHECKPOINT)
_STEP_DIR = re.compile(r"^(?:tmp_)?step_(\d+)$")


def checkpoint_span(algo: str, *, tracer: trace_api.Tracer | None = None, **attributes: Any):
    """``with checkpoint_span("grpo"):`` -- ``rl.grpo.checkpointing``, the blocking staging span (overhead)."""
    if CHECKPOINT_GROUP not in _gate.enabled:
        return NOOP_SPAN
    return managed_span(CHECKPOINT_GROUP, f"rl.{algo}.checkpointing", tracer=tracer, **attributes)


def iteration_from_checkpoint_dir(checkpoint_dir: str | os.PathLike) -> int | None:
    """``.../tmp_step_7`` (or ``step_7``) -> 7; None when the name carries no step."""
    match = _STEP_DIR.match(os.path.basename(os.path.normpath(os.fspath(checkpoint_dir))))
    return int(match.group(1)) if match else None


class CheckpointFinalize:
    """Handle on an open ``rl.checkpoint.finalize`` span; hand it to the finalizing thread.

    ``end(error=None)`` closes it (error status when ``error`` is given), once. ``with handle:``
    makes it current in the calling thread, so spans opened there nest under it, and ends it
    on exit, recording an exception from the body (which is re-raised).
    """

    __slots__ = ("span", "context", "_token")

    def __init__(self, span: trace_api.Span | None) -> None:
        self.span = span
        self.context = trace_api.set_span_in_context(span) if span is not None else None
        self._token = None

    def end(self, error: BaseException | None = None) -> None:
        span, self.span = self.span, None
        if span is None:
            return
        try:
            if error is not None:
                record_error(span, error)
            span.end()
        except Exception:
            _log.warning("could not end the %s span; the checkpoint is unaffected", FINALIZE_SPAN_NAME,
                         exc_info=True)

    def __enter__(self) -> trace_api.Span | None:
        if self.context is not None:
            try:
                self._token = context_api.attach(self.context)
            except Exception:
                self._token = None
        return self.span

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._token is not None:
            try:
                context_api.detach(self._token)
            except Exception:
                pass
            self._token = None
        self.end(exc if isinstance(exc, Exception) else None)


NOOP_FINALIZE = CheckpointFinalize(None)
"""What ``begin_checkpoint_finalize`` returns while the checkpoint group is off (or on failure)."""


def begin_checkpoint_finalize(checkpoint_dir: str | os.PathLike, *, tracer: trace_api.Tracer | None = None,
                              **attributes: Any) -> CheckpointFinalize:
    """Open ``rl.checkpoint.finalize`` as a child of the current (staging) span; never raises.

    Call it inside ``checkpoint_span`` where finalization is handed off. ``rl.iteration`` is
    read from ``tmp_step_N`` (else the current ``iteration_scope``); a caller's own value wins.
    """
    if CHECKPOINT_GROUP not in _gate.enabled:
        return NOOP_FINALIZE
    try:
        attributes.pop(BUCKET_KEY, None)  # overlaps the next steps' bucketed work
        attributes[SPAN_GROUP_KEY] = CHECKPOINT_GROUP
        attributes.setdefault("rl.checkpoint.dir", os.fspath(checkpoint_dir))
        if ITERATION_KEY not in attributes:
            iteration = iteration_from_checkpoint_dir(checkpoint_dir)
            if iteration is None:
                iteration = _scopes.ITERATION.get()
            if iteration is not None:
                attributes[ITERATION_KEY] = iteration
        # the primitive itself, already gated and bucketed above: not a raw span for lint
        span = (tracer or _gate.tracer).start_span(FINALIZE_SPAN_NAME, attributes=attributes)  # nemo-telemetry-lint: allow raw-otel-span
        return CheckpointFinalize(span)
    except Exception:
        _log.warning("could not open the %s span; the checkpoint proceeds untraced", FINALIZE_SPAN_NAME,
                     exc_info=True)
        return NOOP_FINALIZE
