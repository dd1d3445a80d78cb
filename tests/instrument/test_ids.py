"""Span and trace ids do not follow the program's seeding of ``random`` (ranks seed it alike)."""

from __future__ import annotations

import os
import random

from nemo_telemetry.instrument import RLSpanGroup, init_telemetry_driver, managed_span


def _trace_and_span_id() -> tuple[int, int]:
    with managed_span(RLSpanGroup.GENERATION, "rl.grpo.generate") as span:
        context = span.get_span_context()
        return context.trace_id, context.span_id


def test_ids_differ_when_the_program_seeds_random_the_same_way():
    init_telemetry_driver({"enabled": True, "exporter": "none", "span_groups": "per_step"})
    random.seed(0)
    first = _trace_and_span_id()
    random.seed(0)
    second = _trace_and_span_id()
    assert first[0] != second[0] and first[1] != second[1]


def test_a_forked_child_does_not_repeat_its_parents_ids():
    init_telemetry_driver({"enabled": True, "exporter": "none", "span_groups": "per_step"})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, written back to the parent
        os.close(read)
        os.write(write, str(_trace_and_span_id()[0]).encode())
        os._exit(0)
    os.close(write)
    parent = _trace_and_span_id()[0]
    child = int(os.read(read, 64).decode())
    os.waitpid(pid, 0)
    assert child != parent
