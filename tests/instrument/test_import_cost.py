"""Importing the instrument package in a training process stays cheap."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("pandas", "pyarrow", "typer", "rich", "ray", "vllm", "yaml", "grpc")


def test_import_does_not_load_heavy_packages():
    code = (
        "import sys, json\n"
        "import nemo_telemetry.instrument as ti\n"
        "with ti.managed_span(ti.RLSpanGroup.GENERATION, 'rl.vllm.generate'): pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == []
