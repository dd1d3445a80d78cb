"""Scopes that reclassify or stamp every span opened inside them: bucket, iteration, per-prompt.

Each travels on a ContextVar, so it reaches nested calls and coroutines (tasks copy the context
when they are created) but not raw threads or other processes; a span opened on a thread started
inside a scope is unaffected, which is the documented behaviour, not an accident.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from nemo_telemetry.instrument._groups import Bucket

__all__ = [
    "bucket_scope",
    "current_bucket_scope",
    "iteration_scope",
    "current_iteration",
    "per_prompt_scope",
    "in_per_prompt_scope",
]

_log = logging.getLogger("nemo_telemetry")

# Read directly by the primitives' hot paths.
BUCKET: ContextVar[str | None] = ContextVar("nemo_telemetry_bucket_scope", default=None)
ITERATION: ContextVar[int | None] = ContextVar("nemo_telemetry_iteration", default=None)
PER_PROMPT: ContextVar[bool] = ContextVar("nemo_telemetry_per_prompt", default=False)
# Becomes True the first time any per-prompt scope is entered; until then the data-plane client
# skips the ContextVar read. Sticky, because a task created inside a scope can outlive it.
per_prompt_used = False


class _VarScope:
    """Set a ContextVar for the duration of a ``with`` block; restores the outer value on exit."""

    __slots__ = ("_var", "_value", "_token")

    def __init__(self, var: ContextVar, value) -> None:
        self._var = var
        self._value = value
        self._token = None

    def __enter__(self):
        self._token = self._var.set(self._value)
        return self._value

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._token is not None:
            self._var.reset(self._token)
            self._token = None


def bucket_scope(bucket: Bucket | str) -> _VarScope:
    """Tag every *leaf* span opened inside with ``bucket`` instead of its group default.

    An explicit ``rl.bucket=`` still wins, umbrellas stay unbucketed, and efficiency spans keep
    their category's bucket. A value that is not a bucket is warned about and ignored.
    """
    try:
        value = Bucket(bucket).value
    except ValueError:
        _log.warning("bucket_scope(%r): not a bucket (use one of %s); the scope is ignored",
                     bucket, ", ".join(b.value for b in Bucket))
        value = BUCKET.get()
    return _VarScope(BUCKET, value)


def current_bucket_scope() -> Bucket | None:
    """The bucket the innermost ``bucket_scope`` imposes here, or None."""
    value = BUCKET.get()
    return Bucket(value) if value is not None else None


def iteration_scope(iteration: int) -> _VarScope:
    """Stamp ``rl.iteration = iteration`` on every span opened inside (a caller's own value wins)."""
    return _VarScope(ITERATION, int(iteration))


def current_iteration() -> int | None:
    """The training step the innermost ``iteration_scope`` stamps here, or None."""
    return ITERATION.get()


def per_prompt_scope() -> _VarScope:
    """Mark a per-prompt region (the rollout path) for sites that cannot see their caller.

    Only sites that consult :func:`in_per_prompt_scope` change inside it: the data-plane client
    (:class:`~nemo_telemetry.instrument.TracedDataPlaneClient`) gates its spans on ``per_prompt``
    instead of ``data_plane`` and leaves them unbucketed, since rollouts overlap each other and
    training. Every other span keeps its group and bucket (seed 000, "Per-prompt spans").
    """
    global per_prompt_used
    per_prompt_used = True
    return _VarScope(PER_PROMPT, True)


def in_per_prompt_scope() -> bool:
    """Whether the code runs inside a ``per_prompt_scope`` (in this context)."""
    return PER_PROMPT.get()
