"""The same calls with one mistake on each line marked ``# type error``: a checker that sees the
real signatures (not ``Any`` from the packages' lazy ``__getattr__``) reports each of them."""

from __future__ import annotations

from pathlib import Path

from nemo_telemetry.analysis import CheckReport, check_run, ingest, read_for_analysis, run_goodput
from nemo_telemetry.instrument import RLSpanGroup, iteration_scope, shutdown_telemetry, trace_fn


@trace_fn(RLSpanGroup.GENERATION, "rl.grpo.generation")
def generate(prompts: list[str], max_tokens: int = 16) -> list[str]:
    return [p[:max_tokens] for p in prompts]


def mistakes(dataset: Path) -> None:
    generate(["a prompt"], max_tokens="4")  # type error
    with iteration_scope("three"):  # type error
        pass
    done: str = shutdown_telemetry()  # type error
    ingest(dataset)  # type error
    run_goodput(read_for_analysis(dataset), by=2)  # type error
    report: CheckReport = check_run(read_for_analysis(dataset), unattributed=0.3)  # type error
    report.findings_by_code  # type error
    print(done, report)
