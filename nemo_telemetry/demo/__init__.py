"""``nemo-telemetry demo``: a small GRPO-shaped run, instrumented end to end, then analysed.

Importing this package is light; Ray, FastAPI and the analysis load when :func:`run_demo` runs.
"""

from __future__ import annotations

from nemo_telemetry.demo.run import DEFAULT_SPAN_GROUPS, DemoError, DemoResult, run_demo
from nemo_telemetry.demo.workload import PhaseTimes

__all__ = ["run_demo", "DemoResult", "DemoError", "DEFAULT_SPAN_GROUPS", "PhaseTimes"]
