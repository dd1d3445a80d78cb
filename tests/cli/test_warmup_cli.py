"""``nemo-telemetry warmup``: every kernel compiled (or loaded) into the cache, what and where printed."""

from __future__ import annotations

import os
import subprocess
import sys

from nemo_telemetry.analysis.kernels import compiled as _compiled


def test_warmup_names_every_kernel_and_the_cache_and_exits_0():
    env = {k: v for k, v in os.environ.items() if k != "NEMO_TELEMETRY_COMPILED"}
    command = [sys.executable, "-c", "from nemo_telemetry.cli.app import app; app()", "warmup"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    for name in _compiled.KERNEL_MODULES:
        assert f"{name}: " in result.stdout
    assert "kernel cache: " in result.stdout and str(_compiled.cache_dir()) in result.stdout.replace("\n", "")
    assert "not compiled" not in result.stdout
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "kernel cache: " in again.stdout  # idempotent
