"""The public names as a type checker sees them from a user's script.

``nemo_telemetry.analysis`` and ``nemo_telemetry.instrument`` load most names on first use through a
module ``__getattr__``, which a checker reads as ``Any``; each package therefore imports the same
names under ``TYPE_CHECKING``. The samples in ``tests/typing_samples/`` are checked with mypy and
pyright (both pinned in the ``test`` extra): the user's script passes clean, and every line marked
``# type error`` in the other is reported, which it would not be with ``Any``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = Path(__file__).resolve().parent / "typing_samples"
GOOD = SAMPLES / "user_script.py"
BAD = SAMPLES / "user_script_errors.py"


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def marked_lines(path: Path) -> set[int]:
    return {i for i, line in enumerate(path.read_text().splitlines(), 1) if line.rstrip().endswith("# type error")}


def mypy_errors(scripts: list[Path], tmp_path: Path) -> dict[Path, dict[int, list[str]]]:
    """Script -> line -> messages of mypy's errors (the package's own modules are read, not judged)."""
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-error-summary", "--hide-error-context",
         "--python-version", "3.11", "--cache-dir", str(tmp_path / "mypy-cache"), "--python-executable",
         sys.executable, *map(str, scripts)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 2: mypy itself failed
    errors: dict[Path, dict[int, list[str]]] = {script: {} for script in scripts}
    for line in run.stdout.splitlines():
        match = re.match(r"(.*?):(\d+): error: (.*)", line)
        if match:
            errors[Path(match.group(1))].setdefault(int(match.group(2)), []).append(match.group(3))
    assert run.returncode == (1 if any(errors.values()) else 0), run.stdout + run.stderr
    return errors


def pyright_errors(scripts: list[Path], tmp_path: Path) -> dict[Path, dict[int, list[str]]]:
    """Script -> line -> messages of pyright's errors, the package found on ``extraPaths``."""
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps({"extraPaths": [str(ROOT)], "pythonVersion": "3.11", "typeCheckingMode": "standard"}))
    env = {**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"}
    run = subprocess.run(
        [_tool("pyright"), "--outputjson", "--project", str(config), "--pythonpath", sys.executable, *map(str, scripts)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert run.returncode in (0, 1), run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["summary"]["filesAnalyzed"] >= len(scripts)
    errors: dict[Path, dict[int, list[str]]] = {script: {} for script in scripts}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            errors[Path(diagnostic["file"])].setdefault(diagnostic["range"]["start"]["line"] + 1, []).append(
                diagnostic["message"])
    return errors


CHECKERS = {"mypy": mypy_errors, "pyright": pyright_errors}


@pytest.fixture(scope="module", params=sorted(CHECKERS))
def errors(request, tmp_path_factory) -> dict[Path, dict[int, list[str]]]:
    """Both samples, checked in one run of each checker."""
    return CHECKERS[request.param]([GOOD, BAD], tmp_path_factory.mktemp(request.param))


def test_a_users_script_type_checks_clean(errors):
    assert errors[GOOD] == {}


def test_every_mistake_in_a_users_script_is_reported(errors):
    expected = marked_lines(BAD)
    assert len(expected) >= 5
    assert set(errors[BAD]) == expected, errors[BAD]


def _type_checking_imports(init: Path) -> dict[str, str]:
    """Name -> module of the ``from m import n`` statements under ``if TYPE_CHECKING:``."""
    found = {}
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom)
                found.update({alias.name: statement.module for alias in statement.names})
    return found


def test_the_type_checking_imports_are_the_lazily_loaded_names():
    """Each package's ``TYPE_CHECKING`` imports name the same modules its ``__getattr__`` loads from."""
    import nemo_telemetry.analysis as analysis
    import nemo_telemetry.instrument as instrument

    assert _type_checking_imports(ROOT / "nemo_telemetry/analysis/__init__.py") == analysis._HOMES
    lazy = {name: f"nemo_telemetry.instrument.{module}" for name, module in instrument._LAZY_NAMES.items()}
    assert _type_checking_imports(ROOT / "nemo_telemetry/instrument/__init__.py") == lazy


def test_the_package_says_it_is_typed():
    """PEP 561: without ``py.typed`` in the installed package, checkers ignore its annotations."""
    assert (ROOT / "nemo_telemetry" / "py.typed").is_file()
