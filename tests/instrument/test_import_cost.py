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


def test_reading_the_catalogue_does_not_load_the_sdk():
    """The analysis (check's findings, lint) reads only the registry: no OpenTelemetry SDK, exporter or
    propagator is loaded for it, while every other public name still resolves on first use."""
    code = (
        "import sys, json\n"
        "from nemo_telemetry.instrument import REGISTRY, span_name_regex, UNBUCKETED_SPAN_CATEGORIES\n"
        "names = [info.name for info in REGISTRY.catalogue()]\n"
        "before = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "from nemo_telemetry.instrument import DumpSpanExporter, init_telemetry_driver\n"
        "after = 'opentelemetry.sdk.trace' in sys.modules\n"
        "print(json.dumps([before, after, 'generation' in names]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [[], True, True]


def test_importing_the_trainer_integrations_loads_no_trainer_library():
    """instrument_trl() imports TRL when called; importing the module (to read its tables) does not."""
    import subprocess
    import sys

    code = ("import sys, nemo_telemetry.integrations.trl, nemo_telemetry.integrations.transformers\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'accelerate', 'pyarrow', 'pandas') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
