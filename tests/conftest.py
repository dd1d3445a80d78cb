"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os

import pytest

_TELEMETRY_ENV_PREFIXES = ("NEMO_TELEMETRY_", "OTEL_")

# The suite tests the compiled decoders on small inputs too: outside tests only inputs of a few
# MiB take them (nemo_telemetry/analysis/kernels/compiled.py). Tests of that choice set "auto" themselves.
os.environ.setdefault("NEMO_TELEMETRY_COMPILED", "1")


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
