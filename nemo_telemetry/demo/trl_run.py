"""``nemo-telemetry demo --trainer trl``: a tiny GRPO run with Hugging Face TRL, traced by ``instrument_trl()``.

The trainer is TRL's own ``GRPOTrainer`` on the CPU, training a 2-layer random Qwen2 with a
word-level tokenizer made on the spot (:mod:`nemo_telemetry.demo.tiny_hf`; nothing comes from a
hub), rewarded by the length of its completions, evaluated every 3 steps and checkpointed every
2. The only telemetry code is the one line a user writes, :func:`instrument_trl`; the dumps go to
``<out>/dumps`` and are analysed as the toy demo's are. Needs the ``[trl]`` extra and torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from nemo_telemetry.demo.trainer import TrainSummary
from nemo_telemetry.errors import DemoError

__all__ = ["CHECKPOINT_EVERY", "EVALUATE_EVERY", "train_trl"]

CHECKPOINT_EVERY = 2
EVALUATE_EVERY = 3


def _reward_words(completions, **kwargs) -> list[float]:
    """Reward: the number of words in each completion (a task the random model can learn a little)."""
    return [float(len(str(completion).split())) for completion in completions]


def _quiet(trainer) -> None:
    """The demo prints its own report: not TRL's per-step log dicts (this trainer's printer only)."""
    from transformers import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)


def train_trl(root: Path, *, steps: int, seed: int) -> tuple[TrainSummary, str]:
    """Train the tiny GRPO run under ``root``; returns what the loop saw and the run id."""
    try:
        import trl
        from datasets import Dataset
    except ImportError as exc:
        raise DemoError(f"demo --trainer trl needs TRL and torch ({exc.name} is missing): "
                        "pip install 'nemo-telemetry[trl]' torch") from exc
    from nemo_telemetry.demo.tiny_hf import build_tiny_model, load_tokenizer, prompts
    from nemo_telemetry.instrument import shutdown_telemetry
    from nemo_telemetry.instrument.environment_variables import NEMO_TELEMETRY_RUN_ID
    from nemo_telemetry.integrations.trl import instrument_trl, uninstrument_trl

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = build_tiny_model(str(root / "model"), seed=seed)
    instrument_trl({"exporter": "dump", "dump_dir": str(root / "dumps")})
    try:
        config = trl.GRPOConfig(
            output_dir=str(root / "checkpoints"), max_steps=steps, per_device_train_batch_size=4,
            num_generations=4, max_completion_length=8, per_device_eval_batch_size=4, beta=0.1,
            eval_strategy="steps", eval_steps=EVALUATE_EVERY, save_strategy="steps", save_steps=CHECKPOINT_EVERY,
            logging_steps=1, report_to="none", use_cpu=True, bf16=False, seed=seed, disable_tqdm=True)
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=_reward_words, args=config, processing_class=load_tokenizer(model),
            train_dataset=Dataset.from_dict({"prompt": prompts(8 * steps, seed=seed)}),
            eval_dataset=Dataset.from_dict({"prompt": prompts(4, seed=seed + 1)}))
        _quiet(trainer)
        trainer.train()
        rewards = tuple(float(entry["reward"]) for entry in trainer.state.log_history if "reward" in entry)
        checkpoints = tuple(sorted(str(p) for p in (root / "checkpoints").glob("checkpoint-*")))
        run_id = os.environ.get(NEMO_TELEMETRY_RUN_ID, "")
    finally:
        shutdown_telemetry()
        uninstrument_trl()
    return TrainSummary(steps=steps, mean_reward=rewards, checkpoints=checkpoints,
                        ray_cluster_source="none"), run_id
