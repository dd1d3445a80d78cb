"""Start-up settings of a command's process that its libraries would otherwise pick on their own.

Imports nothing heavy: ``--help`` loads this module too.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.util import find_spec
from pathlib import Path

__all__ = ["prepare_numpy", "prefer_small_pages", "prefer_avx2_sort", "no_blas_threads", "skip_pyarrow_pandas_probe",
           "ZEN4_DISABLED_NUMPY_FEATURES"]

ZEN4_DISABLED_NUMPY_FEATURES = "X86_V4 AVX512_ICL AVX512_SPR"
"""numpy's AVX-512 dispatch targets (their names since numpy 2.4), turned off on AMD Zen 4 by
:func:`prefer_avx2_sort`."""
_FEATURE_NAMES_SINCE = (2, 4)  # numpy names its x86 dispatch targets X86_V3 / X86_V4 from this version
_ZEN_3_4_FAMILY = "25"  # AMD family 19h: Zen 3 (no AVX-512) and Zen 4; Zen 5 is 1Ah
_CPUINFO_HEAD_LINES = 64  # the first processor's fields are in its first few dozen lines


def prepare_numpy() -> None:
    """numpy's settings for a command's process, applied before numpy is imported (it reads them
    once, then): what :func:`prefer_small_pages`, :func:`prefer_avx2_sort` and
    :func:`no_blas_threads` ask for."""
    prefer_small_pages()
    prefer_avx2_sort()
    no_blas_threads()


def no_blas_threads() -> None:
    """Keep numpy's OpenBLAS from starting a thread per core when it is imported.

    The analysis does no linear algebra, and OpenBLAS's idle threads spin before they sleep: on
    2 cores, ``import numpy`` took 0.13 s of wall and 0.2 s of CPU against 0.09 s and 0.08 s with
    one thread, CPU the reader's threads want at that moment. A value the user set in
    ``OPENBLAS_NUM_THREADS`` is kept.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def prefer_small_pages() -> None:
    """Ask numpy (imported later, by the commands that compute) for ordinary 4 KiB pages.

    numpy asks the kernel for transparent huge pages on every large array. Where the kernel
    defragments on request (``defrag`` = ``madvise``, a common default) and free memory is
    fragmented, each such allocation stalls in compaction: 1 s per 400 MB against 0.14 s with
    small pages, measured on the project's 2-core VMs, and ``check`` allocates about 1 GB of
    arrays. A value the user set in ``NUMPY_MADVISE_HUGEPAGE`` is kept.
    """
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")


def prefer_avx2_sort() -> None:
    """On AMD Zen 4, have numpy sort with its AVX2 code instead of its AVX-512 code.

    numpy's AVX-512 quicksort (x86-simd-sort) stores with ``vpcompressq`` to memory, which Zen 4
    runs in microcode: 10M uint64 keys sort in 0.75-0.8 s there, against 0.16 s with the AVX2
    path (numpy 2.4.6 on the project's Zen 4 VMs), and ``check`` sorts two such arrays. Zen 5 fixed
    the instruction, and Intel's AVX-512 is fast, so only Zen 4 (AMD family 19h with AVX-512)
    is changed, and only where numpy's dispatch names are known (2.4 and later) and the user set
    neither ``NPY_DISABLE_CPU_FEATURES`` nor ``NPY_ENABLE_CPU_FEATURES``. numpy's other loops lose
    little: Zen 4 runs AVX-512 as two 256-bit halves.
    """
    if "numpy" in sys.modules or "NPY_DISABLE_CPU_FEATURES" in os.environ or "NPY_ENABLE_CPU_FEATURES" in os.environ:
        return
    if _numpy_version() >= _FEATURE_NAMES_SINCE and _is_zen4(_cpuinfo_head()):
        os.environ["NPY_DISABLE_CPU_FEATURES"] = ZEN4_DISABLED_NUMPY_FEATURES


def _numpy_version() -> tuple[int, int]:
    """(major, minor) of the numpy that would be imported, read from its ``version.py`` without
    importing it; (0, 0) when it cannot be told."""
    try:
        spec = find_spec("numpy")
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        return (0, 0)
    found = re.search(r"^version\s*=\s*[\"'](\d+)\.(\d+)", text, re.MULTILINE)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def _cpuinfo_head() -> str:
    """The first processor's lines of ``/proc/cpuinfo`` (empty where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            lines = []
            for line in f:
                if not line.strip() or len(lines) >= _CPUINFO_HEAD_LINES:
                    break
                lines.append(line)
            return "".join(lines)
    except OSError:
        return ""


def _is_zen4(cpuinfo: str) -> bool:
    """Whether ``/proc/cpuinfo``'s first processor is AMD family 19h with AVX-512 (Zen 4)."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return (fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == _ZEN_3_4_FAMILY
            and "avx512f" in fields.get("flags", "").split())


class _HiddenPandas:
    """An import finder under which ``import pandas`` fails, for one question pyarrow asks."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is hidden while pyarrow probes for it", name=name)
        return None


def skip_pyarrow_pandas_probe() -> None:
    """Keep pyarrow from importing pandas (0.2-0.3 s) in a command that holds no pandas object.

    pyarrow imports pandas on its first array conversion (and on importing ``pyarrow.dataset``)
    only to ask whether a value is a pandas object. Answered once with pandas hidden, pyarrow
    takes it as absent from then on, until a call that needs it (``to_pandas``, ``from_pandas``)
    imports it for real, as ``goodput`` does where a dataset has metrics. Nothing changes where
    pandas is loaded already. For the console script's commands only: a library user's process
    may hand pyarrow pandas objects before any such call.
    """
    if "pandas" in sys.modules:
        return
    finder = _HiddenPandas()
    sys.meta_path.insert(0, finder)
    try:
        import pyarrow as pa  # noqa: PLC0415 (--help loads this module, and no pyarrow)

        pa.array([0])
    finally:
        sys.meta_path.remove(finder)
