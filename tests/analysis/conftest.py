"""tests/analysis/ is laid out like nemo_telemetry/analysis/: one folder per sub-package.

Tests share helpers by module name across those folders (``from _hand_traces import ...``,
``from test_streaming import ...``), so this folder and each of its sub-folders is on ``sys.path``
whichever of the tests run, as pytest's default import mode puts a test's own folder there.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent

for _folder in (_HERE, *sorted(p for p in _HERE.iterdir() if p.is_dir() and (p.name[0].isalpha()))):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
