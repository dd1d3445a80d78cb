"""Byte-compile the nemo_telemetry packages a benchmark measures, before it measures them.

pip compiles an installed package's modules when it installs them, so a user's first import
reads bytecode; an editable checkout gets its ``__pycache__`` from its first run, unless
``PYTHONDONTWRITEBYTECODE`` is set (as in some sandboxes and CI images), and then every process
compiles every module it imports again: 0.1 s of ``check``'s start-up. Compiling first measures
start-up as an installed package has it, wherever the benchmark runs.
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def compile_measured_packages() -> list[Path]:
    """Byte-compile ``nemo_telemetry`` in this checkout and in each ``PYTHONPATH`` entry that holds one
    (another checkout measured on the same data); the packages compiled."""
    roots = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [CHECKOUT]
    packages = [root / "nemo_telemetry" for root in roots if (root / "nemo_telemetry").is_dir()]
    for package in packages:
        compileall.compile_dir(str(package), quiet=1)
    return packages
