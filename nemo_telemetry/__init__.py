"""nemo-telemetry: where did the wall clock of an RL post-training run go?

Two halves share this distribution:

- :mod:`nemo_telemetry.instrument` — imported by trainers and workers; cheap at import.
- :mod:`nemo_telemetry.analysis` — reads OTLP dumps into Arrow tables and computes goodput.

The command-line tool ``nemo-telemetry`` (:mod:`nemo_telemetry.cli`) renders the analysis.
"""

__version__ = "0.1.0"
