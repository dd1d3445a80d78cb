"""Contract: TRL still times, through ``ProfilingContext``, every block the integration maps.

A TRL release that stops timing a block (a rename of ``_calculate_rewards``, generation moved out of
``transformers.generate``) fails here; at run time the same change gives one warning and an
unbucketed span, never a silently lost phase.
"""

from __future__ import annotations

import inspect
import logging
import re

import pytest
import trl
from trl.extras import profiling

from nemo_telemetry.integrations.trl import TRL_BLOCKS, TRL_UNMAPPED_BLOCKS, instrument_trl


def _timed_blocks(module) -> set[str]:
    source = inspect.getsource(module)
    named = set(re.findall(r'profiling_context\(\s*self,\s*"([^"]+)"', source))
    decorated = set(re.findall(r"@profiling_decorator\s+(?:async\s+)?def\s+(\w+)", source))
    return named | decorated


def test_every_mapped_block_is_timed_by_grpo():
    from trl.trainer import grpo_trainer

    timed = _timed_blocks(grpo_trainer)
    missing = (set(TRL_BLOCKS) | TRL_UNMAPPED_BLOCKS) - timed
    assert not missing, f"GRPOTrainer no longer times {sorted(missing)}"


def test_profiling_context_keeps_its_shape():
    context = profiling.ProfilingContext
    assert "__enter__" in context.__dict__ and "__exit__" in context.__dict__
    assert list(inspect.signature(context.__init__).parameters)[:2] == ["self", "name"]
    source = inspect.getsource(profiling.profiling_context)
    assert "trainer.__class__.__name__" in source and "ProfilingContext(" in source
    assert "profiling_context(self, func.__name__)" in inspect.getsource(profiling.profiling_decorator)


def test_an_unknown_block_is_warned_about_and_recorded_unbucketed(tiny_model, tmp_path, caplog):
    import transformers

    from nemo_telemetry.instrument import init_telemetry_driver, shutdown_telemetry
    from nemo_telemetry.integrations.transformers import instrument_trainer
    from nemo_telemetry.integrations.trl import uninstrument_trl

    instrument_trl()
    init_telemetry_driver({"enabled": True, "exporter": "dump", "dump_dir": str(tmp_path / "dump"),
                           "span_groups": "per_step"})
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    trainer = transformers.Trainer(model=model, args=transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none"))
    telemetry = instrument_trainer(trainer)

    def train():
        with profiling.ProfilingContext(name="Trainer._a_block_from_a_newer_trl", report_to=[]):
            pass
        with profiling.ProfilingContext(name="Trainer._a_block_from_a_newer_trl", report_to=[]):
            pass

    try:
        with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
            telemetry.traced_train(train)()
    finally:
        shutdown_telemetry()
        uninstrument_trl()
    warned = [r.getMessage() for r in caplog.records if "_a_block_from_a_newer_trl" in r.getMessage()]
    assert len(warned) == 1 and "unattributed" in warned[0]
    from conftest import read_spans

    blocks = [s for s in read_spans(tmp_path / "dump") if s["name"].endswith("._a_block_from_a_newer_trl")]
    assert len(blocks) == 2 and all(s["bucket"] is None for s in blocks)
    assert all(s["attributes"]["rl.trl.unmapped"] is True for s in blocks)


@pytest.mark.parametrize("name", ["GRPOTrainer", "SFTTrainer", "DPOTrainer"])
def test_trl_trainers_are_trainers(name):
    import transformers

    assert issubclass(getattr(trl, name), transformers.Trainer)
