"""Settings the ``nemo-telemetry`` command applies to its own process, and to nothing else.

The console script's :func:`~nemo_telemetry.cli.app.main` calls :func:`console_script_process`
and, once its command is done, :func:`freeze_for_exit`;
a library caller, or an application that runs the Typer app in its own process, gets none of them.
Each one detects the condition it fixes, cannot make numpy or pyarrow fail on another build, and
stays inside the process: numpy's variables are in ``os.environ`` only while numpy imports, so no
child process (the local Ray cluster of ``demo`` and ``--engine ray``) inherits them.
``NEMO_TELEMETRY_PROCESS_TUNING=0`` turns them all off.

Imports nothing heavy: ``--help`` loads this module too.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import re
import sys
import warnings
from pathlib import Path

from nemo_telemetry.environment_variables import NEMO_TELEMETRY_PROCESS_TUNING

__all__ = ["console_script_process", "prepare_numpy", "numpy_import_settings", "prefer_small_pages",
           "prefer_avx2_sort", "no_blas_threads", "skip_pyarrow_pandas_probe", "freeze_for_exit",
           "ZEN4_DISABLED_NUMPY_FEATURES", "ZEN4_ENABLED_NUMPY_FEATURES"]

ZEN4_DISABLED_NUMPY_FEATURES = "X86_V4 AVX512_ICL AVX512_SPR"
"""numpy's AVX-512 dispatch targets (their names since numpy 2.4), left off on AMD Zen 4 by
:func:`prefer_avx2_sort`."""
ZEN4_ENABLED_NUMPY_FEATURES = "X86_V2 X86_V3"
"""What :func:`prefer_avx2_sort` enables instead (``NPY_ENABLE_CPU_FEATURES``): numpy accepts a
feature of its baseline in that list, where naming one in ``NPY_DISABLE_CPU_FEATURES`` makes
``import numpy`` raise, so a numpy built for x86-64-v3 or v4 imports as it would have."""
_FEATURE_NAMES_SINCE = (2, 4)  # numpy names its x86 dispatch targets X86_V3 / X86_V4 from this version
_ZEN_3_4_FAMILY = "25"  # AMD family 19h: Zen 3 (no AVX-512) and Zen 4; Zen 5 is 1Ah
# X86_V3's features, which NPY_ENABLE_CPU_FEATURES makes numpy require of the machine, and AVX-512
_ZEN4_FLAGS = frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm", "avx512f"})
_CPUINFO_HEAD_LINES = 64  # the first processor's fields are in its first few dozen lines
_NUMPY_CPU_VARIABLES = ("NPY_DISABLE_CPU_FEATURES", "NPY_ENABLE_CPU_FEATURES")
_BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")

_own_process = False  # set by console_script_process: this process runs one command and nothing else


def console_script_process() -> None:
    """Mark this process as the ``nemo-telemetry`` command's own and apply its settings
    (:func:`prepare_numpy`; :func:`skip_pyarrow_pandas_probe` in the commands that call it), unless
    ``NEMO_TELEMETRY_PROCESS_TUNING`` is ``0``."""
    global _own_process
    if os.environ.get(NEMO_TELEMETRY_PROCESS_TUNING, "").strip() == "0":
        return
    _own_process = True
    prepare_numpy()


def prepare_numpy(settings: dict[str, str] | None = None) -> None:
    """Have the first ``import numpy`` of this process run with ``settings`` (default:
    :func:`numpy_import_settings`) in the environment, each removed (or given back its value) as
    soon as numpy is imported: numpy and OpenBLAS read them once, then. Nothing is imported here
    (``--help`` imports no numpy), and nothing changes where numpy is imported already or no
    setting applies."""
    if "numpy" in sys.modules or any(isinstance(f, _NumpyImport) for f in sys.meta_path):
        return
    settings = numpy_import_settings() if settings is None else settings
    if settings:
        sys.meta_path.insert(0, _NumpyImport(settings))


def numpy_import_settings(*, cpuinfo: str | None = None,
                          numpy_version: tuple[int, int] | None = None) -> dict[str, str]:
    """The environment numpy should import under in the command's process (:func:`no_blas_threads`,
    :func:`prefer_avx2_sort`, :func:`prefer_small_pages`); the arguments stand in for the machine."""
    return {**prefer_small_pages(), **no_blas_threads(),
            **prefer_avx2_sort(cpuinfo=cpuinfo, numpy_version=numpy_version)}


def no_blas_threads() -> dict[str, str]:
    """``OPENBLAS_NUM_THREADS=1`` while numpy imports.

    OpenBLAS starts a thread per CPU when numpy loads it, and its idle threads spin before they
    sleep, taking CPU from the reader's threads; the analysis does no linear algebra. On one CPU it
    changes nothing. Nothing where the user set ``OPENBLAS_NUM_THREADS`` or ``OMP_NUM_THREADS``.
    """
    if any(name in os.environ for name in _BLAS_THREAD_VARIABLES):
        return {}
    return {"OPENBLAS_NUM_THREADS": "1"}


def prefer_small_pages() -> dict[str, str]:
    """Nothing: numpy keeps asking for transparent huge pages.

    Small pages (``NUMPY_MADVISE_HUGEPAGE=0``) help only where the kernel compacts memory on request
    (THP ``defrag`` = ``madvise``) and free memory is fragmented, which cannot be told before the
    allocations stall; where it is not fragmented, huge pages allocate faster. A user on a host that
    stalls sets ``NUMPY_MADVISE_HUGEPAGE=0`` themselves (numpy's own variable).
    """
    return {}


def prefer_avx2_sort(*, cpuinfo: str | None = None, numpy_version: tuple[int, int] | None = None) -> dict[str, str]:
    """On AMD Zen 4, have numpy sort with its AVX2 code instead of its AVX-512 code.

    numpy's AVX-512 quicksort (x86-simd-sort) stores with ``vpcompressq`` to memory, which Zen 4
    runs in microcode, and ``check`` sorts two arrays of one key per span. Zen 5 fixed the
    instruction, and Intel's AVX-512 is fast, so only Zen 4 (AMD family 19h with AVX-512) asks,
    only where numpy's dispatch names are known (2.4 and later) and the user set neither
    ``NPY_DISABLE_CPU_FEATURES`` nor ``NPY_ENABLE_CPU_FEATURES``. numpy's other loops lose little:
    Zen 4 runs AVX-512 as two 256-bit halves.
    """
    if any(name in os.environ for name in _NUMPY_CPU_VARIABLES):
        return {}
    version = _numpy_version() if numpy_version is None else numpy_version
    if version >= _FEATURE_NAMES_SINCE and _is_zen4(_cpuinfo_head() if cpuinfo is None else cpuinfo):
        return {"NPY_ENABLE_CPU_FEATURES": ZEN4_ENABLED_NUMPY_FEATURES}
    return {}


class _ScopedEnvironmentLoader:
    """numpy's own loader, run with ``settings`` in ``os.environ`` and the environment as it was
    right after; ``done`` is called once numpy's import has run. A loader by its methods alone:
    ``importlib.abc`` would import ``importlib.resources``, ``tempfile`` and more at every start."""

    def __init__(self, loader, settings: dict[str, str], done) -> None:
        self._loader, self._settings, self._done = loader, settings, done

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        saved = {name: os.environ.get(name) for name in self._settings}
        os.environ.update(self._settings)
        try:
            with warnings.catch_warnings():  # numpy warns of a feature name it does not dispatch
                warnings.simplefilter("ignore", ImportWarning)
                self._loader.exec_module(module)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._done()

    def __getattr__(self, name):  # resources, source, ...: numpy's loader answers
        return getattr(self._loader, name)


class _NumpyImport:
    """Finds numpy as the other finders do, with :class:`_ScopedEnvironmentLoader` as its loader,
    until numpy is imported (a mere ``find_spec("numpy")`` of some library imports nothing)."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings
        self._finding = False

    def find_spec(self, name, path=None, target=None):
        if name != "numpy" or self._finding:
            return None
        self._finding = True  # the other finders answer the search below
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ScopedEnvironmentLoader(spec.loader, self.settings, self._remove)
        return spec

    def _remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _numpy_version() -> tuple[int, int]:
    """(major, minor) of the numpy that would be imported, read from its ``version.py`` without
    importing it; (0, 0) when it cannot be told."""
    try:
        spec = importlib.util.find_spec("numpy")
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        return (0, 0)
    found = re.search(r"^version\s*=\s*[\"'](\d+)\.(\d+)", text, re.MULTILINE)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _cpuinfo_head() -> str:
    """The first processor's lines of ``/proc/cpuinfo`` (empty where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            lines: list[str] = []
            for line in f:
                if not line.strip() or len(lines) >= _CPUINFO_HEAD_LINES:
                    break
                lines.append(line)
            return "".join(lines)
    except OSError:
        return ""


def _is_zen4(cpuinfo: str) -> bool:
    """Whether ``/proc/cpuinfo``'s first processor is AMD family 19h with AVX-512 (Zen 4) and every
    feature of numpy's X86_V3 target."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == _ZEN_3_4_FAMILY
            and _ZEN4_FLAGS <= set(fields.get("flags", "").split()))


class _HiddenPandas:
    """An import finder under which ``import pandas`` fails, for one question pyarrow asks."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is hidden while pyarrow probes for it", name=name)
        return None


def skip_pyarrow_pandas_probe() -> None:
    """In the console script's process (:func:`console_script_process`), keep pyarrow from importing
    pandas (0.2-0.3 s) in a command that holds no pandas object; elsewhere, nothing.

    pyarrow imports pandas on its first array conversion (and on importing ``pyarrow.dataset``)
    only to ask whether a value is a pandas object. Answered once with pandas hidden, pyarrow
    takes it as absent from then on: a pandas Series it is handed later converts as a plain
    sequence (NaN stays NaN, not null), until a call that needs pandas (``to_pandas``,
    ``from_pandas``) imports it for real, as ``goodput`` does where a dataset has metrics. The
    answer cannot be taken back, so it is asked only in a process that runs the one command and
    holds no other code's pandas objects. Nothing changes where pandas is loaded already.
    """
    if not _own_process or "pandas" in sys.modules:
        return
    finder = _HiddenPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow as pa  # --help loads this module, and no pyarrow

        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


def freeze_for_exit() -> None:
    """In the console script's process (:func:`console_script_process`), once the command is done:
    move every object to the collector's permanent generation (``gc.freeze``), so that the
    collections the interpreter runs while it shuts down skip the many objects the imports made
    (numpy, pyarrow and pandas modules, their functions and types), none of which can be garbage
    then; elsewhere, nothing. Shutdown still runs every ``atexit`` handler and finalizer."""
    if _own_process:
        gc.freeze()
