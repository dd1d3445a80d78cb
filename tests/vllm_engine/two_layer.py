"""One instrumented run against the real vLLM engine: what the vLLM tests check and the bench prints.

A GRPO-like driver (``init_telemetry_driver``, dump exporter, ``per_step`` groups) loads the
engine with :func:`~nemo_telemetry.instrument.vllm.load_vllm`, vLLM's own OTLP tracing pointed at
a :class:`~nemo_telemetry.analysis.CollectorServer` on 127.0.0.1, and runs a few steps. Each step
generates from token prompts and from text prompts (productive), then a validation batch inside
``bucket_scope(OVERHEAD)``, and records the ``rl.vllm.*`` counter deltas; the engine's busy time goes
to ``rl.fleet.busy.seconds`` (:func:`~nemo_telemetry.instrument.vllm.track_vllm_busy`). Afterwards our dump and
the receiver's dataset are read and joined into one spans table. ``bench/gpu_vllm_check.py``
runs it (on a GPU or the CPU); ``tests/vllm_engine`` runs that script once per session, in its own
process, and reads what it left with :func:`read_two_layer`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

PROMPTS_PER_CALL = 4
VALIDATION_PROMPTS = 2
MAX_TOKENS = 8
STEP_SPAN = "rl.grpo.step"
RUN_FILE = "run.json"
BUSY_FLEET = "generation"


@dataclass(frozen=True)
class GenerateCall:
    """One ``llm.generate`` call as the driver saw it: its step, kind and what came back."""

    step: int
    kind: str  # "tokens", "text" or "validation"
    prompts: int
    prompt_tokens: int
    generated_tokens: int


@dataclass
class TwoLayerRun:
    """What one run left: the joined spans (stitched where needed), per-step metrics and the calls."""

    spans: Any  # pa.Table: our dump and vLLM's spans, stitch_vllm_spans applied
    by_step: Any  # pa.Table: metrics_by_step of our metrics dump
    calls: list[GenerateCall]
    trace_path: str
    vllm_version: str
    load_seconds: float
    steps: int
    received: Any = None  # pa.Table: what vLLM's own exporter sent our receiver (None: nothing)
    metrics: Any = None  # pa.Table: read_metrics of our metrics dump


def _generate(llm: Any, prompts: list, params: Any, step: int, kind: str) -> GenerateCall:
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return GenerateCall(step, kind, len(prompts), sum(len(o.prompt_token_ids) for o in outputs),
                        sum(len(c.token_ids) for o in outputs for c in o.outputs))


def _drive(model: str, work: Path, steps: int, engine_kwargs: dict[str, Any],
           settle: Callable[[], None]) -> tuple[list[GenerateCall], str, float]:
    from vllm import SamplingParams

    from nemo_telemetry.instrument import (
        Bucket,
        RLSpanGroup,
        bucket_scope,
        flush_telemetry,
        init_telemetry_driver,
        iteration_scope,
        shutdown_telemetry,
        umbrella_span,
    )
    from nemo_telemetry.instrument.metrics import VllmCounterDeltas, flush_metrics
    from nemo_telemetry.instrument.vllm import load_vllm, record_vllm_engine_counters, track_vllm_busy

    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(work / "dump")}, algorithm="grpo")
    calls: list[GenerateCall] = []
    try:
        started = time.perf_counter()
        llm = load_vllm(model, disable_log_stats=False, enforce_eager=True, **engine_kwargs)
        load_seconds = time.perf_counter() - started
        try:
            track_vllm_busy(llm, fleet=BUSY_FLEET)  # rl.fleet.busy.seconds from the engine's request stats
            deltas = VllmCounterDeltas()
            record_vllm_engine_counters(llm, deltas)  # baseline: whatever start-up did
            flush_metrics()
            params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
            for step in range(1, steps + 1):
                with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, STEP_SPAN):
                    tokens = [{"prompt_token_ids": [1, 2, 3 + i + step]} for i in range(PROMPTS_PER_CALL)]
                    texts = [f"the number {i} is" for i in range(PROMPTS_PER_CALL)]
                    calls.append(_generate(llm, tokens, params, step, "tokens"))
                    calls.append(_generate(llm, texts, params, step, "text"))
                    with bucket_scope(Bucket.OVERHEAD):
                        validation = [f"the answer of step {step} {i}" for i in range(VALIDATION_PROMPTS)]
                        calls.append(_generate(llm, validation, params, step, "validation"))
                record_vllm_engine_counters(llm, deltas)
                flush_metrics()
            trace_path = getattr(llm, "_nemo_telemetry_trace_path", "?")
            settle()
        finally:
            _shut_down(llm)
        flush_telemetry()
    finally:
        shutdown_telemetry()
    return calls, trace_path, load_seconds


def _shut_down(llm: Any) -> None:
    """Stop the engine processes now: they export their last spans as they exit, before the receiver stops."""
    engine_core = getattr(llm.llm_engine, "engine_core", None)
    if engine_core is not None and hasattr(engine_core, "shutdown"):
        engine_core.shutdown()


def cpu_engine_kwargs() -> dict[str, Any]:
    """Engine arguments for vLLM's CPU build: float32 (bfloat16 killed the CPU worker on the machines
    tested, in its first forward pass) and a context no longer than the tiny model's."""
    return {"dtype": "float32", "max_model_len": 128}


def _wait_until_quiet(collector: Any, wait_s: float, quiet_s: float = 1.0) -> None:
    """Until the receiver has taken no new span for ``quiet_s`` (the engine processes' last batches);
    at most ``wait_s``."""
    deadline = time.monotonic() + wait_s
    last, quiet_since = -1, time.monotonic()
    while time.monotonic() < deadline:
        spans = collector.summary().spans
        if spans != last:
            last, quiet_since = spans, time.monotonic()
        elif spans and time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.2)


def _joined_spans(work: Path) -> tuple[Any, Any]:
    import pyarrow as pa

    from nemo_telemetry.analysis import read_spans, stitch_vllm_spans

    ours = read_spans(sorted((work / "dump").glob("traces-*.jsonl")))
    dataset = work / "vllm-dataset"
    theirs = read_spans(dataset) if dataset.exists() and any(dataset.rglob("*.parquet")) else None
    parts = [ours] + ([theirs] if theirs is not None else [])
    common = [c for c in ours.column_names if all(c in p.column_names for p in parts)]
    joined = pa.concat_tables([p.select(common) for p in parts], promote_options="permissive")
    return stitch_vllm_spans(joined), theirs


def run_two_layer(model: str, work: Path, *, steps: int = 2, engine_kwargs: dict[str, Any] | None = None,
                  wait_s: float = 20.0) -> TwoLayerRun:
    """Run the steps against ``model`` with everything under ``work``; vLLM's errors propagate.

    Sets the OTLP variables vLLM's exporter reads in ``os.environ`` and restores them afterwards.
    ``wait_s`` bounds how long the receiver is given for vLLM's last batch of spans.
    """
    import vllm

    from nemo_telemetry.analysis import CollectorServer

    collector = CollectorServer(work / "vllm-dataset", port=0).start()
    environment = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.traces_url,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # vLLM's BatchSpanProcessor: export within 0.2 s
    }
    saved = {k: os.environ.get(k) for k in environment}
    os.environ.update(environment)
    try:
        # The engine processes export from a background thread, and vLLM kills them soon after
        # asking them to stop: let their exports land while they idle, then take whatever exit sends.
        calls, trace_path, load_seconds = _drive(model, work, steps, dict(engine_kwargs or {}),
                                                 settle=lambda: _wait_until_quiet(collector, wait_s))
        _wait_until_quiet(collector, wait_s)
    finally:
        collector.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    (work / RUN_FILE).write_text(json.dumps({
        "calls": [asdict(c) for c in calls], "trace_path": trace_path, "vllm_version": vllm.__version__,
        "load_seconds": load_seconds, "steps": steps}, indent=1))
    return read_two_layer(work)


def read_two_layer(work: Path) -> TwoLayerRun:
    """The run that :func:`run_two_layer` (or ``bench/gpu_vllm_check.py --out``) left under ``work``."""
    from nemo_telemetry.analysis import metrics_by_step, read_metrics, step_windows

    run = json.loads((work / RUN_FILE).read_text())
    spans, received = _joined_spans(work)
    metrics = read_metrics(work / "dump")
    by_step = metrics_by_step(metrics, step_windows(spans))
    return TwoLayerRun(spans=spans, by_step=by_step, calls=[GenerateCall(**c) for c in run["calls"]],
                       trace_path=run["trace_path"], vllm_version=run["vllm_version"],
                       load_seconds=run["load_seconds"], steps=run["steps"], received=received, metrics=metrics)
