"""The report of ``check``: finding codes, severities, one finding, and the counts.

Every engine's findings end here: :func:`report` orders them (errors first) and counts each code
in full, past the per-code cap on what is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nemo_telemetry.analysis.settings.choices import SEVERITIES
from nemo_telemetry.errors import NemoTelemetryError

if TYPE_CHECKING:
    from nemo_telemetry.analysis.goodput.census import SpanCensus

__all__ = ["SEVERITIES", "FINDING_CODES", "DEFAULT_OVERLAP_TOLERANCE_S", "Finding", "CheckReport", "report",
           "overlap_tolerance_ns"]

FINDING_CODES: dict[str, str] = {  # code -> severity (missing-group-spans is info for a known gap)
    "bucketed-overlap": "error",
    "nested-bucket": "error",
    "umbrella-bucket": "error",
    "bucket-exceeds-wall": "error",
    "unknown-bucket": "error",
    "invalid-interval": "error",
    "unstamped-span": "warning",
    "orphan-span": "warning",
    "detached-trace": "warning",
    "unattributed-step-time": "warning",
    "missing-group-spans": "warning",
    "step-time-outlier": "info",
    "step-without-iteration": "info",  # warning where the process stamps its other step spans
    "failed-step": "warning",
    # what the source holds (goodput.census): data that is not an RL run, said instead of "consistent"
    "no-spans": "warning",
    "no-rl-attributes": "warning",
    "no-step-spans": "warning",
    "remote-parent": "info",
}
# Overlaps of bucketed spans up to this long are clock granularity (the OpenTelemetry JS SDK records
# start times in whole milliseconds), reported at info severity.
DEFAULT_OVERLAP_TOLERANCE_S = 0.001


@dataclass(frozen=True)
class Finding:
    """One reason the breakdown might be wrong, and what to do about it."""

    code: str
    severity: str
    message: str
    trace_id: str | None
    span_ids: tuple[str, ...]
    iteration: int | None
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message, "trace_id": self.trace_id,
                "span_ids": list(self.span_ids), "iteration": self.iteration, "run_id": self.run_id}


@dataclass(frozen=True)
class CheckReport:
    """Every finding (at most ``max_findings_per_code`` written per code) and the full counts;
    ``census``: what the source held (spans, RL spans, step spans per run), where the engine read it."""

    findings: tuple[Finding, ...]
    counts: dict[str, Any]  # {"error": n, "warning": n, "info": n, "by_code": {code: n}}
    census: SpanCensus | None = None

    def has(self, severity: str) -> bool:
        """Whether a finding at ``severity`` or worse exists."""
        worse = SEVERITIES[: SEVERITIES.index(severity) + 1]
        return any(self.counts[s] for s in worse)

    def to_dict(self) -> dict[str, Any]:
        out = {"findings": [f.to_dict() for f in self.findings], "counts": self.counts}
        if self.census is not None:
            out["data"] = self.census.to_dict()
        return out


def overlap_tolerance_ns(overlap_tolerance_s: float) -> int:
    """The tolerance in ns; a negative or non-finite value is a clear error, not a silent zero."""
    if not (overlap_tolerance_s >= 0 and np.isfinite(overlap_tolerance_s)):
        raise NemoTelemetryError(f"overlap tolerance {overlap_tolerance_s!r} s: give a finite number of seconds >= 0 "
                                 f"(default {DEFAULT_OVERLAP_TOLERANCE_S})")
    return int(round(overlap_tolerance_s * 1e9))


def report(findings: list[Finding], counted: dict[str, Any], census: SpanCensus | None = None) -> CheckReport:
    """The report from each code's findings as written and its full count (errors first).

    ``counted[code]`` is ``{severity: number}``, the code's findings at each severity, written or
    past the per-code cap. A bare number is the code's total: its written findings count at their
    own severities and only the rest (past the cap) at the code's default. A severity's count is
    never below the findings written at it, so the counts equal the findings listed whenever
    nothing is capped.
    """
    findings = sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
    written: dict[str, dict[str, int]] = {}
    for f in findings:
        per_code = written.setdefault(f.code, {})
        per_code[f.severity] = per_code.get(f.severity, 0) + 1
    counts: dict[str, Any] = {s: 0 for s in SEVERITIES}
    by_code: dict[str, int] = {code: 0 for code in FINDING_CODES}
    for code in {**written, **counted}:
        shown = written.get(code, {})
        n = counted.get(code, 0)
        if isinstance(n, dict):
            per_severity = {s: max(int(n.get(s, 0)), shown.get(s, 0)) for s in SEVERITIES}
        else:
            per_severity = {s: shown.get(s, 0) for s in SEVERITIES}
            per_severity[FINDING_CODES.get(code, "warning")] += max(0, int(n) - sum(shown.values()))
        by_code[code] = sum(per_severity.values())
        for severity, total in per_severity.items():
            counts[severity] += total
    counts["by_code"] = by_code
    return CheckReport(findings=tuple(findings), counts=counts, census=census)
