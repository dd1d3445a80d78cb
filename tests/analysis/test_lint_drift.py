"""The project's own drift test: our package, demo included, lints clean (seed 002, "drift test")."""

from __future__ import annotations

from pathlib import Path

import nemo_telemetry
from nemo_telemetry.analysis.lint import lint_paths


def test_the_package_lints_clean():
    root = Path(nemo_telemetry.__file__).resolve().parent
    assert lint_paths([root]) == []
