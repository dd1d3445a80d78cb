"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os
import sys

import pytest

_TELEMETRY_ENV_PREFIXES = ("NEMO_TELEMETRY_", "OTEL_")

# The telemetry variables as the session found them. Each test restores these, not what it found
# at its own start: a module-scoped fixture that starts a driver writes NEMO_TELEMETRY_* into the
# environment, and a per-test snapshot would carry that into every later test of the session.
_SESSION_TELEMETRY_ENV = {k: v for k, v in os.environ.items() if k.startswith(_TELEMETRY_ENV_PREFIXES)}


@pytest.fixture(autouse=True)
def _reset_telemetry_state():
    """Every test ends with telemetry off: no provider, no groups, the session's telemetry env vars."""
    saved = _SESSION_TELEMETRY_ENV
    yield
    from nemo_telemetry.instrument import set_enabled_span_groups, set_tracer_provider, shutdown_telemetry

    shutdown_telemetry(timeout_s=2.0)
    set_enabled_span_groups(())
    set_tracer_provider(None)
    for key in [k for k in os.environ if k.startswith(_TELEMETRY_ENV_PREFIXES)]:
        del os.environ[key]
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _kernels_as_a_new_process_finds_them():
    """Each test starts with no compiled kernel module loaded or turned off, as a new process does,
    so in the default mode (auto) a small input takes the reference path whichever tests ran before
    it (a module loaded by an earlier test would otherwise take every later input)."""
    seam = sys.modules.get("nemo_telemetry.analysis.kernels.compiled")
    if seam is not None:
        seam._reset_for_tests()


@pytest.fixture()
def compiled_kernels(monkeypatch):
    """The compiled decoders on whatever input the test gives: by default (``auto``) only inputs of
    a few MiB take them (nemo_telemetry/analysis/kernels/compiled.py), and the suite otherwise runs
    in that default. Tests of the kernels themselves use this (``pytest.mark.usefixtures``)."""
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", "1")


@pytest.fixture(params=["1", "0"], ids=["compiled", "reference"])
def kernel_path(request, monkeypatch) -> str:
    """Each path in turn, on the test's small inputs: ``1`` the compiled kernels, ``0``
    the reference paths (what ``auto`` takes below its thresholds)."""
    monkeypatch.setenv("NEMO_TELEMETRY_COMPILED", request.param)
    return request.param



class SmallFilesystem:
    """A mounted 4 MiB tmpfs: ``root`` to write in, ``fill()`` it to the last byte, ``free()`` it."""

    def __init__(self, root) -> None:
        self.root = root
        self._filler = root / "filler"

    def fill(self) -> None:
        with open(self._filler, "ab", buffering=0) as out:
            for size in (65536, 512, 1):
                try:
                    while True:
                        out.write(b"\0" * size)
                except OSError:
                    pass

    def free(self) -> None:
        self._filler.unlink()


@pytest.fixture()
def tmpfs(tmp_path):
    """``tmpfs(size)``: a folder with a tmpfs of ``size`` (``"4m"``) mounted on it for the test, unmounted
    after it. Mounting needs root, as CI has; elsewhere the test is skipped with that reason."""
    import subprocess

    mounted = []

    def mount(size: str):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (CI runs as root)")
        folder = tmp_path / f"tmpfs-{len(mounted)}"
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.fixture()
def small_filesystem(tmpfs):
    """A 4 MiB tmpfs mounted for the test (needs root, as CI has), unmounted after it."""
    return SmallFilesystem(tmpfs("4m"))
