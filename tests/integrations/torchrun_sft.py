"""One rank of a 2-process ``torchrun`` SFT run (gloo, CPU), traced by ``instrument_trl()`` alone.

``python -m torch.distributed.run --nproc-per-node 2 torchrun_sft.py MODEL_DIR OUTPUT_DIR``: the
ranks export their own rank and agree on one run id without anything exported by hand.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(model_dir: str, output_dir: str) -> None:
    from nemo_telemetry.demo.tiny_hf import load_tokenizer, prompts
    from nemo_telemetry.integrations.trl import instrument_trl

    instrument_trl()
    import trl
    from datasets import Dataset

    config = trl.SFTConfig(output_dir=output_dir, max_steps=3, per_device_train_batch_size=2, max_length=16,
                           logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", use_cpu=True,
                           seed=0, disable_tqdm=True, bf16=False)
    trainer = trl.SFTTrainer(model=model_dir, args=config, train_dataset=Dataset.from_dict({"text": prompts(40)}),
                             processing_class=load_tokenizer(model_dir))
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
