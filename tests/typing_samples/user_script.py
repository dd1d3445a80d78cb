"""A trainer and its analysis as a user writes them: a type checker must accept every line."""

from __future__ import annotations

from pathlib import Path

from nemo_telemetry.analysis import (
    CheckReport,
    IngestSummary,
    RunGoodput,
    check_run,
    check_with_engine,
    goodput_with_engine,
    ingest,
    read_for_analysis,
    run_goodput,
)
from nemo_telemetry.instrument import (
    RLSpanGroup,
    TelemetryConfig,
    init_telemetry_driver,
    iteration_scope,
    managed_span,
    shutdown_telemetry,
    trace_fn,
    umbrella_trace_fn,
)


@trace_fn(RLSpanGroup.GENERATION, "rl.grpo.generation")
def generate(prompts: list[str], max_tokens: int = 16) -> list[str]:
    return [p[:max_tokens] for p in prompts]


@umbrella_trace_fn(RLSpanGroup.U_STEP, "rl.grpo.step")
def train_step(step: int) -> float:
    with iteration_scope(step):
        with managed_span(RLSpanGroup.REWARD, "rl.grpo.reward_calculation", batch=8) as span:
            if span is not None:
                span.set_attribute("rl.reward.mean", 0.5)
            completions: list[str] = generate(["a prompt"], max_tokens=4)
    return float(len(completions))


def train(dump_dir: Path) -> None:
    config: TelemetryConfig = init_telemetry_driver({"enabled": True, "dump_dir": str(dump_dir)}, algorithm="grpo")
    try:
        for step in range(3):
            train_step(step)
    finally:
        done: bool = shutdown_telemetry(timeout_s=5.0)
    print(config, done)


def analyse(dump_dir: Path, dataset: Path) -> tuple[int, float, bool]:
    summary: IngestSummary = ingest(dump_dir, out=dataset)
    runs: tuple[RunGoodput, ...] = run_goodput(read_for_analysis(dataset), by="step")
    report: CheckReport = check_run(read_for_analysis(dataset), unattributed_threshold=0.3)
    streamed: tuple[RunGoodput, ...] = goodput_with_engine(dataset, engine="local", memory_budget=1 << 30)
    print(check_with_engine(dataset, engine="local"), streamed)
    wall: float | None = runs[0].job_wall_s
    return summary.spans, wall or 0.0, report.has("error")
