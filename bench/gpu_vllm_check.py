"""GPU check: the real vLLM, our instrumentation, and the joined two-layer waterfall.

Run on a machine with a GPU and vLLM installed (it cannot run on the CPU-only CI machines)::

    python bench/gpu_vllm_check.py --model facebook/opt-125m      # or a local model directory
    python bench/gpu_vllm_check.py --model tiny-random            # no network: a 2-layer random Llama made here

What it does, all on 127.0.0.1 and under a temporary directory:

1. starts nemo-telemetry as a GRPO driver would (``init_telemetry_driver``, dump exporter,
   ``per_step`` groups) and an OTLP/HTTP receiver (``CollectorServer``) for vLLM's own spans;
2. builds the engine with ``load_vllm`` (``rl.vllm.load_model``; vLLM's ``otlp_traces_endpoint``
   pointed at the receiver; ``disable_log_stats=False`` for the engine counters);
3. runs two training-like steps (``rl.grpo.step`` with ``iteration_scope``), each generating
   from token prompts and text prompts, and records the ``rl.vllm.*`` counter deltas per step;
4. reads our dumps and the receiver's dataset, stitches what needs stitching, and prints the
   joined waterfall, then the per-step vLLM counters from the metrics dump;
5. checks itself: every ``llm_request`` must sit under an ``rl.vllm.generate``/``_generate_text``
   span of the same step (through headers or stitching), one per prompt, and the counters must
   add up to the tokens generated. Exit 0 when all checks pass, 1 when one fails, 2 when vLLM
   is not importable.

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
import time
from pathlib import Path

PROMPTS_PER_CALL = 4
MAX_TOKENS = 8
TINY_RANDOM = "tiny-random"


def build_tiny_random_model(directory: Path) -> Path:
    """A 2-layer Llama with random weights and a small byte-level BPE tokenizer, written to ``directory``.

    GPU machines without network access cannot download a model; the check needs real engine work
    (prefill, decode, scheduling, tracing), not meaningful text, so random weights are enough.
    Uses only transformers and tokenizers, which every vLLM install brings.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator((f"The number {i} is {i * i}." for i in range(2000)), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(directory)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="facebook/opt-125m",
                        help=f"HF model id, local directory, or {TINY_RANDOM!r} (built here, for machines with no network)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--wait-s", type=float, default=20.0, help="how long to wait for vLLM's spans")
    return parser.parse_args()


def main() -> int:
    args = _parse()
    try:
        import vllm
    except ImportError as exc:
        print(f"vLLM is not importable here ({exc}); run this on a GPU machine with vLLM installed.")
        return 2
    print(f"vLLM {vllm.__version__}")

    from nemo_telemetry.analysis.collect import CollectorServer

    work = Path(tempfile.mkdtemp(prefix="nemo-vllm-check-"))
    if args.model == TINY_RANDOM:
        args.model = str(build_tiny_random_model(work / "tiny-random-llama"))
        print(f"model: tiny random Llama in {args.model}")
    collector = CollectorServer(work / "vllm-dataset", port=0).start()  # each 200 is committed
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = collector.traces_url
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # vLLM's BatchSpanProcessor: export within 0.2 s
    try:
        totals = _run(args, work)
    finally:
        time.sleep(1.0)
        collector.stop()
    return _report(work, totals, args)


def _run(args: argparse.Namespace, work: Path) -> dict[str, float]:
    from nemo_telemetry.instrument import (
        RLSpanGroup,
        flush_telemetry,
        init_telemetry_driver,
        iteration_scope,
        shutdown_telemetry,
        umbrella_span,
    )
    from nemo_telemetry.instrument import metrics as m
    from nemo_telemetry.instrument._resources import build_resource
    from nemo_telemetry.instrument.vllm import load_vllm, record_vllm_engine_counters

    cfg = init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                                 "dump_dir": str(work / "dump")}, algorithm="grpo")
    resource = build_resource(service_name="gpu-vllm-check", run_id=os.environ["NEMO_TELEMETRY_RUN_ID"],
                              algorithm="grpo", rank=0, world_size=1, local_rank=0, span_groups=())
    meters = m.build_meter_provider(resource, exporter="dump", dump_dir=cfg.dump_dir,
                                    export_interval_ms=3_600_000)
    m.set_meter_provider(meters)
    generated = 0.0
    try:
        from vllm import SamplingParams

        llm = load_vllm(args.model, gpu_memory_utilization=args.gpu_memory_utilization,
                        disable_log_stats=False, enforce_eager=True)
        print(f"trace path taken: {getattr(llm, '_nemo_telemetry_trace_path', '?')}")
        deltas = m.VllmCounterDeltas()
        record_vllm_engine_counters(llm, deltas)  # baseline: whatever start-up generated
        m.flush_metrics()
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        for step in range(1, args.steps + 1):
            with iteration_scope(step), umbrella_span(RLSpanGroup.U_STEP, "rl.grpo.step"):
                tokens = [{"prompt_token_ids": [1, 2, 3, 4 + i]} for i in range(PROMPTS_PER_CALL)]
                texts = [f"The number {i} is" for i in range(PROMPTS_PER_CALL)]
                for outputs in (llm.generate(tokens, params, use_tqdm=False),
                                llm.generate(texts, params, use_tqdm=False)):
                    generated += sum(len(c.token_ids) for o in outputs for c in o.outputs)
            record_vllm_engine_counters(llm, deltas)
            m.flush_metrics()
        flush_telemetry()
    finally:
        m.set_meter_provider(None)
        meters.shutdown()
        shutdown_telemetry()
    return {"generated": generated}


def _read_spans(work: Path, wait_s: float):
    import pyarrow as pa

    from nemo_telemetry.analysis import read_spans

    ours = read_spans(sorted((work / "dump").glob("traces-*.jsonl")))
    vllm_spans = None
    deadline = time.time() + wait_s
    while time.time() < deadline:
        dataset = work / "vllm-dataset"
        if dataset.exists() and any(dataset.rglob("*.parquet")):
            vllm_spans = read_spans(dataset)
            break
        time.sleep(0.5)
    parts = [ours] + ([vllm_spans] if vllm_spans is not None else [])
    common = [c for c in ours.column_names if all(c in p.column_names for p in parts)]
    return pa.concat_tables([p.select(common) for p in parts], promote_options="permissive")


def _print_tree(spans) -> None:
    from nemo_telemetry.analysis.tree import parent_indices

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


def _report(work: Path, totals: dict[str, float], args: argparse.Namespace) -> int:
    from nemo_telemetry.analysis.metrics import metrics_by_step, read_metrics, step_windows
    from nemo_telemetry.analysis.stitch import STITCHED_KEY, stitch_vllm_spans

    spans = stitch_vllm_spans(_read_spans(work, args.wait_s))
    print(f"\nstitched llm_request spans: {spans.schema.metadata[STITCHED_KEY].decode()}\n")
    _print_tree(spans)

    by_step = metrics_by_step(read_metrics(work / "dump"), step_windows(spans))
    print("\nrl.vllm.* per step:")
    for r in by_step.to_pylist():
        if r["name"].startswith("rl.vllm."):
            print(f"  step {r['iteration']}  {r['name']:<32} {r['value']:10.0f}")
    return _check(spans, by_step, totals, args)


def _check(spans, by_step, totals: dict[str, float], args: argparse.Namespace) -> int:
    from nemo_telemetry.analysis.tree import attributed_iterations, parent_indices

    rows = spans.to_pylist()
    parents = parent_indices(spans).tolist()
    iterations = attributed_iterations(spans).to_pylist()
    requests = [i for i, r in enumerate(rows) if r["name"] == "llm_request"]
    expected = 2 * PROMPTS_PER_CALL * args.steps
    under_generate = [i for i in requests if parents[i] >= 0
                      and rows[parents[i]]["name"] in ("rl.vllm.generate", "rl.vllm.generate_text")]
    in_steps = {iterations[i] for i in under_generate}
    counted = sum(r["value"] for r in by_step.to_pylist() if r["name"] == "rl.vllm.generation_tokens")
    checks = [
        (f"one llm_request per prompt ({len(requests)} of {expected})", len(requests) == expected),
        (f"every llm_request under a generate span ({len(under_generate)} of {len(requests)})",
         len(under_generate) == len(requests) and requests),
        (f"requests attributed to steps {sorted(x for x in in_steps if x is not None)}",
         in_steps == set(range(1, args.steps + 1))),
        (f"rl.vllm.generation_tokens per step add up ({counted:.0f} of {totals['generated']:.0f})",
         counted == totals["generated"]),
    ]
    print()
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
