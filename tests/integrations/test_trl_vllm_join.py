"""TRL's colocated vLLM engine joins ``instrument_vllm``: ``rl.vllm.generate`` is the leaf, TRL's block its parent.

A fast unit test on the vLLM stand-in (``tests/instrument/fake_vllm.py``). The real path is not run
end to end here: TRL 1.16 supports vLLM up to 0.31, and with the CPU build this environment has
(0.32) TRL's own weight sync into the engine fails (``'Parameter' object has no attribute
'weight_loader'``) before any span of ours is involved; see docs/limitations.md.
"""

from __future__ import annotations

from types import SimpleNamespace

from conftest import read_spans
from trl.extras.profiling import ProfilingContext

from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry
from nemo_telemetry.integrations.transformers import TrainerTelemetry
from nemo_telemetry.integrations.trl import instrument_trl, join_vllm_engine, uninstrument_trl
from tests.instrument import fake_vllm as fake


class GRPOTrainer:
    """What the join reads of a GRPOTrainer in colocate mode: its engine, and a step counter."""

    def __init__(self) -> None:
        self.vllm_generation = SimpleNamespace(llm=fake.LLM("tiny-model"))
        self.state = SimpleNamespace(global_step=0)


def test_the_colocated_engine_is_instrumented_and_not_counted_twice(tmp_path):
    instrument_trl()
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path), "span_groups": "per_step"})
    trainer = GRPOTrainer()
    telemetry = TrainerTelemetry(trainer)
    telemetry.on_train_start.append(join_vllm_engine)

    def train():
        telemetry.open_step()
        with ProfilingContext(name="GRPOTrainer.vLLM.generate", report_to=[]):
            trainer.vllm_generation.llm.generate([{"prompt_token_ids": [1, 2]}], fake.SamplingParams(max_tokens=2))

    try:
        telemetry.traced_train(train)()
    finally:
        shutdown_telemetry()
        uninstrument_trl()
    assert telemetry.vllm_instrumented
    spans = {s["name"]: s for s in read_spans(tmp_path)}
    generate, block = spans["rl.vllm.generate"], spans["rl.grpo.generate"]
    assert generate["bucket"] == "productive" and block["bucket"] is None
    assert generate["parent_span_id"] == block["span_id"]
    assert generate["iteration"] == 1
