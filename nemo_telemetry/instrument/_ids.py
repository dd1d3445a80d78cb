"""Trace and span ids from a generator of the telemetry's own, not Python's shared ``random``.

The SDK's default ``RandomIdGenerator`` draws from the ``random`` module, which trainers seed
(``transformers.set_seed``, ``random.seed``) identically on every rank: two ranks of one run
then make the same trace and span ids, span for span, and one rank's spans overwrite the other's
in any store keyed by id. This generator owns a ``random.Random`` seeded from ``os.urandom`` and
reseeds it in a forked child, so no seeding by the program and no fork repeats an id.
"""

from __future__ import annotations

import os
import random

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = ["PrivateRandomIdGenerator"]


class PrivateRandomIdGenerator(IdGenerator):
    """Uniformly random ids from a private, urandom-seeded ``random.Random`` (reseeded after fork)."""

    def __init__(self) -> None:
        self._random = random.Random(os.urandom(32))
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._random.seed(os.urandom(32))

    def generate_span_id(self) -> int:
        span_id = self._random.getrandbits(64)
        while span_id == trace_api.INVALID_SPAN_ID:
            span_id = self._random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._random.getrandbits(128)
        while trace_id == trace_api.INVALID_TRACE_ID:
            trace_id = self._random.getrandbits(128)
        return trace_id

    def is_trace_id_random(self) -> bool:
        return True
