"""Adapters for trainers nemo-telemetry does not own, each enabled in one line.

- :mod:`nemo_telemetry.integrations.transformers`: any ``transformers.Trainer``
  (``instrument_transformers()``), TRL's offline trainers (``SFTTrainer``, ``DPOTrainer``,
  ``RewardTrainer``) included.
- :mod:`nemo_telemetry.integrations.trl`: TRL's online trainers (``GRPOTrainer`` and those of
  its shape): ``instrument_trl()`` adds generation, reward and log-prob phases read from TRL's own
  timing seam.
- :mod:`nemo_telemetry.integrations.launch`: rank, world size and one shared run id from the
  launcher (``torchrun``, ``accelerate launch``, Slurm).

Importing this package imports no trainer library; each adapter imports its library when called.
"""
