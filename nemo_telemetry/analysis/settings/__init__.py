"""What the analysis is told and sized by, below every other layer: the CLI's choices and defaults
(:mod:`~nemo_telemetry.analysis.settings.choices`, which imports nothing, so ``--help`` loads no
numpy, pyarrow or pandas) and the read settings sized from the machine it runs on
(:mod:`~nemo_telemetry.analysis.settings.machine`: threads from the affinity and cgroup CPU quota,
the memory budget from the cgroup limit). This ``__init__`` imports neither.
"""
