"""Tests of ``nemo_telemetry.integrations`` against the real TRL, transformers and torch (CPU).

They run in ``.venv-vllm``, the environment with CPU torch (``make test`` runs this directory
there, beside ``tests/vllm_engine``); where ``trl`` is not importable (the main ``.venv``) this
directory is not collected. Each run trains a tiny random Qwen2 with a word-level tokenizer made
in the test (:mod:`tiny_hf`): nothing comes from a hub.

A run is one real trainer's ``train()`` in this process, with the test's own timers around the
calls the integration traces (:class:`PhaseTimers`), so its spans can be held against times the
integration did not measure. Each module-scoped run fixture shuts telemetry down when its run
ends, which flushes the dump files the tests read.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if importlib.util.find_spec("trl") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # One torch thread: torch's spinning pool threads would take cores from the training thread at
    # random moments, between the test's clocks and the spans', on a 2-core machine.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # As tests/vllm_engine: this environment's numba keeps its own kernel cache.
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))
    sys.path.insert(0, str(HERE))

CLI = str(Path(sys.executable).with_name("nemo-telemetry"))


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=timeout)


def goodput_json(source: Path) -> dict:
    done = run_cli("goodput", str(source), "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def read_spans(source: Path) -> list[dict]:
    """Every span of the dump files as a dict (name, bucket, iteration, times, status, ids, attributes)."""
    spans = []
    for path in sorted(Path(source).glob("traces-*.jsonl")):
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", []):
                resource = {a["key"]: _value(a["value"]) for a in resource_spans["resource"].get("attributes", [])}
                for scope in resource_spans.get("scopeSpans", []):
                    for span in scope.get("spans", []):
                        attributes = {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}
                        spans.append({
                            "name": span["name"], "trace_id": span["traceId"], "span_id": span["spanId"],
                            "parent_span_id": span.get("parentSpanId") or None,
                            "start_ns": int(span["startTimeUnixNano"]), "end_ns": int(span["endTimeUnixNano"]),
                            "status": (span.get("status") or {}).get("code", 0),
                            "status_message": (span.get("status") or {}).get("message", ""),
                            "bucket": attributes.get("rl.bucket"), "iteration": attributes.get("rl.iteration"),
                            "attributes": attributes, "resource": resource,
                        })
    return spans


def _value(value: dict):
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    return value


@dataclass
class PhaseTimers:
    """The test's own clocks around the calls the integration traces, summed per step and phase.

    A phase is timed where its call happens: inside ``evaluate`` it is an evaluation phase
    (``eval:<phase>``). The step is the one in progress (``global_step + 1``).
    """

    trainer: object = None
    seconds: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    in_eval: int = 0
    in_loss: int = 0
    optimizer_started: float | None = None

    current: int = 0  # the step whose batches were fetched last: logging, evaluation and saves follow it

    def step(self) -> int:
        return self.current

    def add(self, phase: str, elapsed: float) -> None:
        key = f"eval:{phase}" if self.in_eval else phase
        self.seconds[self.step()][key] += elapsed

    def timed(self, phase: str, original, *, loss: bool = False, skip_in_loss: bool = False,
              opens_step: bool = False):
        timers = self

        def wrapper(*args, **kwargs):
            if opens_step:
                timers.current = int(timers.trainer.state.global_step) + 1
            if skip_in_loss and timers.in_loss:
                return original(*args, **kwargs)
            timers.in_loss += loss
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.add(phase, time.perf_counter() - start)
                timers.in_loss -= loss

        return wrapper

    def install(self, monkeypatch, trainer_class) -> None:
        """Timers on the classes (the integration wraps the instance, outside them)."""
        import accelerate

        timers = self
        monkeypatch.setattr(trainer_class, "get_batch_samples",
                            self.timed("data_processing", trainer_class.get_batch_samples,
                                                         opens_step=True))
        monkeypatch.setattr(trainer_class, "compute_loss", self.timed("forward", trainer_class.compute_loss, loss=True))
        monkeypatch.setattr(accelerate.Accelerator, "backward", self.timed("backward", accelerate.Accelerator.backward))
        monkeypatch.setattr(trainer_class, "_save_checkpoint",
                            self.timed("checkpointing", trainer_class._save_checkpoint))
        original_evaluate = trainer_class.evaluate

        def evaluate(*args, **kwargs):
            timers.in_eval += 1
            try:
                return original_evaluate(*args, **kwargs)
            finally:
                timers.in_eval -= 1

        monkeypatch.setattr(trainer_class, "evaluate", evaluate)
        monkeypatch.setattr(trainer_class, "evaluation_loop",
                            self.timed("evaluation_loop", trainer_class.evaluation_loop))
        original_step = trainer_class.training_step

        def training_step(trainer, *args, **kwargs):
            result = original_step(trainer, *args, **kwargs)
            if trainer.accelerator.sync_gradients:
                timers.optimizer_started = time.perf_counter()
            return result

        monkeypatch.setattr(trainer_class, "training_step", training_step)

    def install_block_timers(self, monkeypatch) -> None:
        """Clocks on the blocks TRL times itself (``ProfilingContext``): generation, rewards, log-probs.

        Put on after ``instrument_trl()``, so they sit right outside the integration's spans."""
        from trl.extras.profiling import ProfilingContext

        timers = self
        phases = {"transformers.generate": "generate", "_calculate_rewards": "reward_calculation",
                  "_get_per_token_logps_and_entropies": "logprobs"}
        enter, exit_ = ProfilingContext.__enter__, ProfilingContext.__exit__

        def timed_enter(context):
            context.test_started = time.perf_counter()
            return enter(context)

        def timed_exit(context, *exc):
            result = exit_(context, *exc)
            phase = phases.get(context.name.split(".", 1)[-1])
            if phase is not None and not (phase == "logprobs" and timers.in_loss):
                timers.add(phase, time.perf_counter() - context.test_started)
            return result

        monkeypatch.setattr(ProfilingContext, "__enter__", timed_enter)
        monkeypatch.setattr(ProfilingContext, "__exit__", timed_exit)

    def callback(self):
        from transformers import TrainerCallback

        timers = self

        class StepEnd(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if timers.optimizer_started is not None:
                    # global_step is already the finished step here
                    timers.seconds[int(state.global_step)]["optimizer_step"] += (
                        time.perf_counter() - timers.optimizer_started)
                    timers.optimizer_started = None

        return StepEnd()


@dataclass
class Run:
    """One traced training run: where its spans went, the test's timers, and what train() said."""

    dump_dir: Path
    timers: PhaseTimers
    metrics: dict
    model: str
    error: BaseException | None = None
    kind: str = ""

    @property
    def spans(self) -> list[dict]:
        return read_spans(self.dump_dir)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from nemo_telemetry.demo.tiny_hf import build_tiny_model

    # Wide enough that a step's compute, not the trainer loop's fixed costs, fills its window (as in
    # any real run): a 16-wide model's 20 ms steps leave evaluation's loop overhead over 20% of one.
    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-qwen2")), hidden_size=128)


def common_args(output_dir: Path) -> dict:
    """5 steps, evaluation at step 3, a checkpoint every 2 steps, everything logged."""
    return dict(output_dir=str(output_dir), max_steps=5, eval_strategy="steps", eval_steps=3,
                save_strategy="steps", save_steps=2, logging_steps=1, report_to="none", use_cpu=True,
                seed=0, dataloader_num_workers=0, disable_tqdm=True)


def train_traced(kind: str, tiny_model: str, out: Path, monkeypatch, *, reward=None) -> Run:
    """Build and train one trainer of ``kind`` (grpo, sft, dpo) with the integration and the test's timers."""
    import trl
    from datasets import Dataset

    from nemo_telemetry.demo.tiny_hf import load_tokenizer, prompts
    from nemo_telemetry.instrument import shutdown_telemetry
    from nemo_telemetry.integrations.trl import instrument_trl, uninstrument_trl

    trainer_class = {"grpo": trl.GRPOTrainer, "sft": trl.SFTTrainer, "dpo": trl.DPOTrainer}[kind]
    timers = PhaseTimers()
    timers.install(monkeypatch, trainer_class)
    instrument_trl()
    block_timers = pytest.MonkeyPatch()
    if kind == "grpo":
        timers.install_block_timers(block_timers)
    tokenizer = load_tokenizer(tiny_model)
    args = common_args(out / "run")
    if kind == "grpo":
        config = trl.GRPOConfig(per_device_train_batch_size=4, num_generations=4, max_completion_length=8,
                                per_device_eval_batch_size=4, beta=0.1, bf16=True, **args)
        trainer = trl.GRPOTrainer(model=tiny_model, reward_funcs=reward or reward_words, args=config,
                                  train_dataset=Dataset.from_dict({"prompt": prompts(40)}),
                                  eval_dataset=Dataset.from_dict({"prompt": prompts(4, seed=1)}),
                                  processing_class=tokenizer, callbacks=[timers.callback()])
    elif kind == "sft":
        config = trl.SFTConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_length=32,
                               per_device_eval_batch_size=2, bf16=False, **args)
        trainer = trl.SFTTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_dict({"text": prompts(40, words=24)}),
                                 eval_dataset=Dataset.from_dict({"text": prompts(4, seed=1, words=24)}),
                                 processing_class=tokenizer, callbacks=[timers.callback()])
    else:
        chosen, rejected = prompts(40, seed=2, words=16), prompts(40, seed=3, words=16)
        asked = prompts(40, words=8)
        data = {"prompt": asked, "chosen": chosen, "rejected": rejected}
        config = trl.DPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_length=32,
                               per_device_eval_batch_size=2, bf16=False, **args)
        trainer = trl.DPOTrainer(model=tiny_model, args=config, train_dataset=Dataset.from_dict(data),
                                 eval_dataset=Dataset.from_dict({k: v[:4] for k, v in data.items()}),
                                 processing_class=tokenizer, callbacks=[timers.callback()])
    timers.trainer = trainer
    error, metrics = None, {}
    # A cyclic collection between the test's clock and the span's would put tens of ms on one side.
    gc.collect()
    gc.disable()
    try:
        metrics = trainer.train().metrics
    except Exception as exc:  # the error test's reward raises: the run's spans must still be there
        error = exc
    finally:
        gc.enable()
        block_timers.undo()
        shutdown_telemetry()
        uninstrument_trl()
    return Run(dump_dir=out / "run" / "telemetry", timers=timers, metrics=metrics, model=tiny_model,
               error=error, kind=kind)


def reward_words(completions, **kwargs):
    """Reward: the number of words of each completion."""
    return [float(len(str(c).split())) for c in completions]


@pytest.fixture(scope="module")
def module_monkeypatch():
    with pytest.MonkeyPatch.context() as patch:
        yield patch
