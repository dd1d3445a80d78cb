"""What ``instrument_trl()`` costs a real TRL run: plain against traced ``train_runtime``, same seeds.

    .venv-vllm/bin/python bench/trl_overhead.py [--steps 20] [--repeats 3] [--trainer grpo|sft]

Each run is a fresh process training the tiny random Qwen2 of ``nemo_telemetry.demo.tiny_hf`` on
the CPU (GRPO: 4 prompts x 4 generations of 8 tokens per step; SFT: 4 sequences of 16 tokens),
with nothing else changed between the two sides but the one ``instrument_trl()`` line (spans to
dump files), and one torch thread (``OMP_NUM_THREADS=1`` unless set) on both. Plain and traced runs alternate, so load from other processes falls on both alike;
the figure is the median of the per-pair ratios traced / plain of TRL's own ``train_runtime``.
Needs the ``[trl]`` extra and torch (``make install-vllm`` builds such an environment).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
out, traced, steps, trainer_kind, exporter = (sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4],
                                              sys.argv[5])
from nemo_telemetry.demo.tiny_hf import build_tiny_model, load_tokenizer, prompts
model = build_tiny_model(os.path.join(out, "model"))
if traced:
    from nemo_telemetry.integrations.trl import instrument_trl
    instrument_trl({"exporter": exporter, "dump_dir": os.path.join(out, "dumps")})
import trl
from datasets import Dataset
from transformers import PrinterCallback
common = dict(output_dir=os.path.join(out, "run"), max_steps=steps, logging_steps=1, save_strategy="no",
              eval_strategy="no", report_to="none", use_cpu=True, bf16=False, seed=0, disable_tqdm=True)
if trainer_kind == "grpo":
    config = trl.GRPOConfig(per_device_train_batch_size=4, num_generations=4, max_completion_length=8, beta=0.1,
                            **common)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [float(len(c.split()))
                              for c in completions], args=config, processing_class=load_tokenizer(model),
                              train_dataset=Dataset.from_dict({"prompt": prompts(8 * steps)}))
else:
    config = trl.SFTConfig(per_device_train_batch_size=4, max_length=16, **common)
    trainer = trl.SFTTrainer(model=model, args=config, processing_class=load_tokenizer(model),
                             train_dataset=Dataset.from_dict({"text": prompts(8 * steps)}))
trainer.remove_callback(PrinterCallback)
metrics = trainer.train().metrics
print(json.dumps({"train_runtime": metrics["train_runtime"]}))
"""


def _child_environment() -> dict[str, str]:
    """No inherited telemetry settings; one torch thread, so the figure is not torch's thread contention."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEMO_TELEMETRY_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def one_run(traced: bool, steps: int, trainer: str, exporter: str) -> float:
    with tempfile.TemporaryDirectory(prefix="trl-overhead-") as out:
        done = subprocess.run([sys.executable, "-c", CHILD, out, "1" if traced else "0", str(steps), trainer,
                               exporter],
                              capture_output=True, text=True, timeout=1800,
                              env=_child_environment())
        if done.returncode != 0:
            raise SystemExit(f"run failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])["train_runtime"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trainer", choices=("grpo", "sft"), default="grpo")
    parser.add_argument("--exporter", choices=("dump", "none"), default="dump",
                        help="where the traced side's spans go (none: made and dropped, the spans' own cost)")
    options = parser.parse_args()
    plain, traced, ratios = [], [], []
    for repeat in range(options.repeats):
        first_traced = repeat % 2 == 1  # alternate which side runs first
        pair = {}
        for side in (first_traced, not first_traced):
            pair[side] = one_run(side, options.steps, options.trainer, options.exporter)
        plain.append(pair[False])
        traced.append(pair[True])
        ratios.append(pair[True] / pair[False])
        print(f"pair {repeat + 1}: plain {pair[False]:.3f} s, traced {pair[True]:.3f} s, "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"{options.trainer}, {options.steps} steps, exporter {options.exporter}, {options.repeats} pairs: "
          f"train_runtime plain median "
          f"{statistics.median(plain):.3f} s, traced median {statistics.median(traced):.3f} s; "
          f"traced / plain median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
