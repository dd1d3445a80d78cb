"""Stitching vLLM request spans, and the instrumented generate call, against baselines in one run.

    python bench/stitch.py [--requests 1000000] [--per-generate 256] [--calls 20000]

1. ``stitch_vllm_spans`` over a synthetic run: one ``rl.vllm.generate`` span per step holding
   ``--per-generate`` root ``llm_request`` spans, against a hand-written per-span loop (rows to
   Python dicts, generates sorted per run, ``bisect`` per request: matching only, no rewrite)
   and against one Arrow sort of the same table (the floor any join needs).
2. ``instrument_vllm``'s ``generate`` wrapper on the stand-in engine with a zero-cost step:
   generation group disabled (one membership test) and enabled (a span, headers routed to the
   engine), each as a ratio of the bare call.

Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _synthetic(requests: int, per_generate: int):
    import numpy as np
    import pyarrow as pa

    from nemo_telemetry.analysis.model.schema import SPANS_SCHEMA

    steps = max(1, -(-requests // per_generate))
    gen_start = np.arange(steps, dtype=np.int64) * 10_000_000
    gen_end = gen_start + 9_000_000
    step_of = np.repeat(np.arange(steps), per_generate)[:requests]
    offset = np.tile(np.arange(per_generate, dtype=np.int64) * 30_000, steps)[:requests]
    req_start = gen_start[step_of] + 100_000 + offset
    req_end = req_start + 50_000
    n = steps + requests
    ids = np.arange(1, n + 1)
    columns = {
        "trace_id": pa.array([f"{i:032x}" for i in np.r_[np.zeros(steps, dtype=np.int64) + 1, ids[steps:] + 10]]),
        "span_id": pa.array([f"{i:016x}" for i in ids]),
        "parent_span_id": pa.nulls(n, pa.string()),
        "name": pa.array(["rl.vllm.generate"] * steps + ["llm_request"] * requests).dictionary_encode(),
        "start_ns": pa.array(np.r_[gen_start, req_start]),
        "end_ns": pa.array(np.r_[gen_end, req_end]),
        "run_id": pa.array(["run-1"] * n).dictionary_encode(),
    }
    columns["duration_ns"] = pa.array(np.r_[gen_end - gen_start, req_end - req_start])
    table = pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in SPANS_SCHEMA}, schema=SPANS_SCHEMA)
    return table.set_column(table.schema.get_field_index("attributes"), SPANS_SCHEMA.field("attributes"),
                            pa.array([[]] * n, SPANS_SCHEMA.field("attributes").type))


def _loop_stitch(rows: list[dict]) -> int:
    """The per-span loop one writes by hand: generates sorted per run, ``bisect`` for each request."""
    import bisect

    by_run: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        if r["name"] == "rl.vllm.generate":
            by_run.setdefault(r["run_id"], []).append((r["start_ns"], r["end_ns"]))
    starts = {run: [g[0] for g in sorted(gs)] for run, gs in by_run.items()}
    ends = {run: [g[1] for g in sorted(gs)] for run, gs in by_run.items()}
    matched = 0
    for r in rows:
        if r["name"] != "llm_request" or r["parent_span_id"] is not None or r["run_id"] not in starts:
            continue
        i = bisect.bisect_right(starts[r["run_id"]], r["start_ns"]) - 1
        matched += i >= 0 and ends[r["run_id"]][i] >= r["end_ns"]
    return matched


def bench_stitch(requests: int, per_generate: int) -> None:
    from nemo_telemetry.analysis.views.stitch import STITCHED_KEY, stitch_vllm_spans

    table = _synthetic(requests, per_generate)
    t = time.perf_counter()
    table.sort_by([("start_ns", "ascending")])
    sort_s = time.perf_counter() - t
    t = time.perf_counter()
    out = stitch_vllm_spans(table)
    stitch_s = time.perf_counter() - t
    t = time.perf_counter()
    matched = _loop_stitch(table.to_pylist())  # to_pylist included: a loop needs Python rows
    loop_s = time.perf_counter() - t
    print(f"stitch: {table.num_rows:,} spans ({requests:,} llm_request, {-(-requests // per_generate):,} generate)")
    print(f"  stitch_vllm_spans      {stitch_s:8.3f} s   stitched {out.schema.metadata[STITCHED_KEY].decode()}")
    print(f"  arrow sort (floor)     {sort_s:8.3f} s   stitch / sort = {stitch_s / sort_s:6.1f}x")
    print(f"  per-span bisect loop   {loop_s:8.3f} s   loop / stitch = {loop_s / stitch_s:6.1f}x "
          f"({matched:,} matched; finds the container only, re-parents nothing)")


def bench_generate(calls: int) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    from nemo_telemetry.instrument import resolve, set_enabled_span_groups, set_tracer_provider
    from nemo_telemetry.instrument.vllm import instrument_vllm
    from tests.instrument import fake_vllm as fake

    fake.DECODE_SECONDS = 0.0
    prompts = [{"prompt_token_ids": [1, 2, 3]}]

    def run(llm) -> float:
        t = time.perf_counter()
        for _ in range(calls):
            llm.generate(prompts)
        return (time.perf_counter() - t) / calls

    bare = run(fake.LLM("m"))
    set_tracer_provider(TracerProvider())  # no processor: the span's own cost only
    set_enabled_span_groups(resolve("all") - {"generation"})
    disabled = run(instrument_vllm(fake.LLM("m")))
    set_enabled_span_groups(resolve("all"))
    enabled = run(instrument_vllm(fake.LLM("m")))
    set_enabled_span_groups(())
    set_tracer_provider(None)
    print(f"generate wrapper on a zero-cost stand-in step ({calls:,} calls, one prompt each)")
    print(f"  bare                   {bare * 1e6:8.2f} us/call")
    print(f"  group disabled         {disabled * 1e6:8.2f} us/call   ratio {disabled / bare:5.2f}")
    print(f"  group enabled          {enabled * 1e6:8.2f} us/call   ratio {enabled / bare:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--per-generate", type=int, default=256)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    bench_stitch(args.requests, args.per_generate)
    bench_generate(args.calls)


if __name__ == "__main__":
    main()
