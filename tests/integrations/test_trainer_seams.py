"""Contract: every transformers / accelerate seam the integration wraps exists with the shape it expects.

When a release renames or reshapes one of these, this test fails here, loudly, instead of a phase
silently turning into unattributed time in users' runs.
"""

from __future__ import annotations

import logging

import accelerate
import pytest
import transformers
import trl

from nemo_telemetry.integrations.transformers import (
    TRAINER_SEAMS,
    TrainerTelemetry,
    instrument_trainer,
    seam_matches,
)

TRAINERS = [transformers.Trainer, trl.SFTTrainer, trl.DPOTrainer, trl.GRPOTrainer, trl.RewardTrainer]


@pytest.mark.parametrize("trainer_class", TRAINERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seam", sorted(TRAINER_SEAMS))
def test_trainer_seam_exists_with_its_shape(trainer_class, seam):
    method = getattr(trainer_class, seam, None)
    assert callable(method), f"{trainer_class.__name__}.{seam} is gone"
    assert seam_matches(method, TRAINER_SEAMS[seam]), (
        f"{trainer_class.__name__}.{seam} no longer takes {TRAINER_SEAMS[seam]}")


def test_accelerate_and_callback_seams_exist():
    assert callable(accelerate.Accelerator.backward)
    assert isinstance(accelerate.Accelerator.__dict__.get("sync_gradients"), property)
    for event in ("on_step_end", "on_train_end"):
        assert callable(getattr(transformers.TrainerCallback, event))


def test_a_missing_seam_is_warned_about_once_naming_its_phase(tiny_model, tmp_path, caplog):
    class NoSaves(transformers.Trainer):
        _save_checkpoint = None

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        instrument_trainer(NoSaves(model=model, args=args))
        instrument_trainer(NoSaves(model=model, args=args))
    warned = [r.getMessage() for r in caplog.records if "_save_checkpoint" in r.getMessage()]
    assert len(warned) == 1 and "checkpoint saves go unattributed" in warned[0]


def test_a_seam_of_another_shape_is_warned_about(tiny_model, tmp_path, caplog):
    class OtherShape(transformers.Trainer):
        def compute_loss(self, inputs, model):  # parameters swapped
            return super().compute_loss(model, inputs)

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        telemetry = instrument_trainer(OtherShape(model=model, args=args))
    assert isinstance(telemetry, TrainerTelemetry)
    assert any("compute_loss" in r.getMessage() and "not the shape" in r.getMessage() for r in caplog.records)
