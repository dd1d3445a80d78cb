"""What an instrumentation site costs, against baselines measured in the same run.

    .venv/bin/python bench/overhead.py [--loops 20000] [--repeats 60]

Prints ns per call (min and median over repeats) and the ratios the instrument side is held to,
each the median of per-repeat ratios (the cases run back to back within a repeat, so load from
other processes hits both sides of a pair alike):

- disabled ``with managed_span(...)``     vs ``with contextlib.nullcontext()``   target <= 1.0x
- ``if is_span_group_enabled(...)``         vs ``with contextlib.nullcontext()``   target <= 0.2x
- enabled leaf ``managed_span`` (bucket)  vs the SDK's ``tracer.start_as_current_span(name,
  attributes={"rl.bucket": ...})`` on the same provider and a no-op processor   target <= 1.10x
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import timeit

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from nemo_telemetry.instrument import (
    RLSpanGroup,
    get_tracer,
    is_span_group_enabled,
    managed_span,
    set_enabled_span_groups,
    set_tracer_provider,
)

GROUP = RLSpanGroup.GENERATION
NAME = "rl.vllm.generate"


class _DropProcessor(SpanProcessor):
    """Receives every span and keeps none, so exporting does not dominate the figures."""

    def on_start(self, span, parent_context=None) -> None:
        return None

    def on_end(self, span) -> None:
        return None


def _statements(raw_tracer) -> tuple[dict[str, str], dict]:
    """Each site inline in timeit's loop (no wrapper function diluting the ratios)."""
    namespace = {
        "nullcontext": contextlib.nullcontext,
        "managed_span": managed_span,
        "is_span_group_enabled": is_span_group_enabled,
        "raw_tracer": raw_tracer,
        "GROUP": GROUP,
        "NAME": NAME,
    }
    statements = {
        "nullcontext": "with nullcontext(): pass",
        "managed_span": "with managed_span(GROUP, NAME): pass",
        "guarded": "if is_span_group_enabled(GROUP): pass",
        "raw_sdk": "with raw_tracer.start_as_current_span(NAME, attributes={'rl.bucket': 'productive'}): pass",
    }
    return statements, namespace


def _measure(statements: dict[str, str], namespace: dict, loops: int, repeats: int) -> dict[str, list[float]]:
    """ns per call, one sample per repeat and case; cases alternate within a repeat (paired samples)."""
    timers = {name: timeit.Timer(stmt, globals=namespace) for name, stmt in statements.items()}
    samples: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(repeats):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(number=loops) / loops * 1e9)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()

    provider = TracerProvider()
    provider.add_span_processor(_DropProcessor())
    raw_tracer = provider.get_tracer("bench")
    statements, namespace = _statements(raw_tracer)

    set_tracer_provider(None)
    set_enabled_span_groups(())
    disabled = _measure({k: statements[k] for k in ("nullcontext", "managed_span", "guarded")}, namespace,
                        args.loops, args.repeats)

    set_tracer_provider(provider)
    set_enabled_span_groups([GROUP])
    assert get_tracer() is not None
    enabled_loops = max(1, args.loops // 20)
    enabled = _measure({k: statements[k] for k in ("raw_sdk", "managed_span")}, namespace, enabled_loops,
                       args.repeats)
    set_enabled_span_groups(())
    set_tracer_provider(None)

    def row(label: str, samples: list[float]) -> None:
        print(f"  {label:<58} min {min(samples):9.1f} ns   median {statistics.median(samples):9.1f} ns")

    def ratio(label: str, num: list[float], den: list[float], target: float) -> None:
        # The verdict uses the median of per-repeat ratios: each pair ran back to back, so load
        # from other processes hits both sides of a pair alike; the ratio of mins is shown too.
        paired = statistics.median(n / d for n, d in zip(num, den))
        of_mins = min(num) / min(den)
        verdict = "ok" if paired <= target else "OVER TARGET"
        print(f"  {label:<58} {paired:5.2f}x (paired median)  {of_mins:5.2f}x (of mins)   "
              f"target <= {target:.2f}x  {verdict}")

    print(f"loops={args.loops} (enabled: {enabled_loops}), repeats={args.repeats}")
    print("disabled site (telemetry off):")
    row("with contextlib.nullcontext()", disabled["nullcontext"])
    row("with managed_span(GENERATION, name)", disabled["managed_span"])
    row("if is_span_group_enabled(GENERATION)", disabled["guarded"])
    print("enabled leaf span (no-op span processor):")
    row("with tracer.start_as_current_span(name, attributes=bucket)", enabled["raw_sdk"])
    row("with managed_span(GENERATION, name)", enabled["managed_span"])
    print("ratios:")
    ratio("disabled managed_span / nullcontext", disabled["managed_span"], disabled["nullcontext"], 1.0)
    ratio("guarded site / nullcontext", disabled["guarded"], disabled["nullcontext"], 0.2)
    ratio("enabled managed_span / raw SDK start_as_current_span", enabled["managed_span"], enabled["raw_sdk"], 1.10)


if __name__ == "__main__":
    main()
