"""The one seam in front of the compiled (numba) kernels: every kernel module is loaded here.

A compiled path pays for itself only past some input size: importing numba and loading the
kernels from the cache takes a fixed time, compiling them on a fresh install much longer,
while the reference paths (orjson, upb, numpy) start at once. So :func:`kernels` answers, per call
site and per amount of work, whether the compiled path is worth taking:

* ``NEMO_TELEMETRY_COMPILED=0``: never (every input takes the reference paths);
  ``NEMO_TELEMETRY_COMPILED=1``: always (tests of the compiled paths, ``warmup``);
  unset or ``auto``: when the work reaches :data:`SMALL_BYTES` (:data:`SMALL_JSON_BYTES`,
  :data:`SMALL_ROWS`), or the module is already loaded in this process (then it costs
  nothing more).
* A failure to import or to compile a kernel, or an exception raised by one, costs only the
  batch at hand: :func:`run` takes the reference path for it and warns once
  (:class:`~nemo_telemetry.errors.CompiledPathWarning`); that module stays off in this process.
* When the compiled path must compile first (nothing cached for these kernel sources), one
  warning line says so before it starts.
* While :func:`deferred` holds some modules (another process compiles them into the cache, as
  the receivers do at start-up), ``auto`` takes their reference paths whatever the work, so that
  no request waits for a compiler.

The cache lives in a directory per digest of every kernel source and the numba version
(:func:`cache_dir`), so an edit to any kernel source (the :data:`KERNEL_HELPERS`, such as
``_words.py``, are compiled into the others) never runs stale code; it is outside the install, so a read-only install caches too.
``NEMO_TELEMETRY_KERNEL_CACHE_DIR`` (else ``NUMBA_CACHE_DIR``, else ``$XDG_CACHE_HOME`` or
``~/.cache``, then the temporary directory: the first one writable) says where.

``NEMO_TELEMETRY_KERNEL_FAULT`` (``import``, ``compile`` or ``call``) is a test hook: it makes
every kernel module fail that way, through the same code a real failure takes.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import tempfile
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator, TypeVar

from nemo_telemetry.errors import CompiledPathWarning
from nemo_telemetry.environment_variables import (
    NEMO_TELEMETRY_COMPILED,
    NEMO_TELEMETRY_KERNEL_CACHE_DIR,
    NEMO_TELEMETRY_KERNEL_FAULT,
)

__all__ = ["KERNEL_MODULES", "KERNEL_HELPERS", "SMALL_BYTES", "SMALL_JSON_BYTES", "SMALL_ROWS", "cache_dir", "kernels", "run", "mode", "broken", "compiling", "source_digest", "warm_up_targets", "cached", "deferred"]

KERNEL_MODULES = ("_json_kernel", "_strings_kernel", "_wire_kernel", "_flatten_kernel", "_dedup_kernel")
"""Every compiled module; the :data:`KERNEL_HELPERS` are compiled into them."""
KERNEL_HELPERS = ("_words", "_json_layout", "_json_lex", "_json_objects")
"""The modules compiled into the kernel modules (never loaded by name): their sources key the cache too."""
_SOURCES = KERNEL_MODULES + KERNEL_HELPERS

SMALL_BYTES = 4 << 20
"""Protobuf bytes below which the walk takes upb's path when the kernels are not loaded yet:
about where ``bench/ingest.py --crossover`` finds the compiled path's load paid back. Below the
16 MiB blocks and 8 MiB batches ingest reads, so a large input has whole batches past it."""

SMALL_JSON_BYTES = 8 << 20
"""JSON-lines bytes below which the scan leaves every line to orjson when the kernels are not
loaded yet: the same crossover for JSON lines; half a block."""

SMALL_ROWS = 20_000
"""Spans (or attribute entries) below which dedup and attribute promotion take their
reference paths when the kernels are not loaded yet: half the spans at the crossover, since the
reference set's Python probes per key stay cheaper than the kernels' load below it."""

_THRESHOLDS = {"bytes": SMALL_BYTES, "json-bytes": SMALL_JSON_BYTES, "rows": SMALL_ROWS}

T = TypeVar("T")
_lock = threading.RLock()
_loaded: dict[str, ModuleType] = {}
_broken: dict[str, str] = {}  # module -> why it is off in this process
_compiling: set[str] = set()  # modules imported with nothing cached, until their first call returns
_deferred: dict[str, int] = {}  # module -> holders of deferred(): auto takes its reference path meanwhile
_announced = False


def mode() -> str:
    """``off``, ``on`` or ``auto`` from ``NEMO_TELEMETRY_COMPILED``."""
    value = os.environ.get(NEMO_TELEMETRY_COMPILED, "auto").strip().lower()
    return {"0": "off", "false": "off", "no": "off", "off": "off", "1": "on", "true": "on", "yes": "on", "on": "on"}.get(value, "auto")


def source_digest(here: Path = Path(__file__).parent) -> str:
    """sha256 of every kernel source (in ``here``) and the numba version: one cache directory
    per digest."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update(name.encode() + b"\0" + (here / f"{name}.py").read_bytes())
    try:
        from importlib.metadata import version

        digest.update(f"numba {version('numba')} llvmlite {version('llvmlite')}".encode())
    except Exception:  # metadata missing: the sources still key the directory
        pass
    return digest.hexdigest()[:16]


def _candidates() -> list[Path]:
    chosen = [os.environ.get(NEMO_TELEMETRY_KERNEL_CACHE_DIR), os.environ.get("NUMBA_CACHE_DIR")]
    xdg = os.environ.get("XDG_CACHE_HOME")
    home = os.environ.get("HOME")
    places = [Path(p) for p in chosen if p]
    if xdg:
        places.append(Path(xdg) / "nemo-telemetry" / "kernels")
    if home:
        places.append(Path(home) / ".cache" / "nemo-telemetry" / "kernels")
    places.append(Path(tempfile.gettempdir()) / f"nemo-telemetry-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}")
    return places


def writable_dir(path: Path) -> bool:
    """Whether ``path`` is (or can be made) a directory this process can write files in."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def cache_dir(candidates: list[Path] | None = None) -> Path | None:
    """The kernel cache of these sources: ``<first writable candidate>/<source digest>``; None
    when no candidate is writable (then nothing is cached and each process compiles)."""
    digest = source_digest()
    for place in candidates if candidates is not None else _candidates():
        if writable_dir(place / digest):
            return place / digest
    return None


def _cached(directory: Path | None, name: str) -> bool:
    return directory is not None and any(directory.glob(f"*/{name}.*.nbi"))


def cached(*names: str) -> bool:
    """Whether each of the kernel modules ``names`` has compiled code in :func:`cache_dir`
    (it is then loaded, not compiled); False when nothing is writable."""
    directory = cache_dir()
    return directory is not None and all(_cached(directory, name) for name in names)


@contextlib.contextmanager
def deferred(*names: str) -> Iterator[None]:
    """While inside, ``auto`` takes the reference paths of ``names`` that are not loaded yet,
    whatever the work: for a server that compiles them elsewhere (another process, into the
    cache) and serves meanwhile. ``on`` still loads them (tests of the compiled paths)."""
    with _lock:
        for name in names:
            _deferred[name] = _deferred.get(name, 0) + 1
    try:
        yield
    finally:
        with _lock:
            for name in names:
                _deferred[name] -= 1
                if not _deferred[name]:
                    del _deferred[name]


def _announce(directory: Path | None) -> None:
    """One line before the first compilation of this process."""
    global _announced
    if _announced:
        return
    _announced = True
    where = f"cached in {directory}" if directory else "nothing cached: no writable cache directory"
    warnings.warn(
        f"compiling the ingest kernels for this large input first (once; {where}); "
        "`nemo-telemetry warmup` does it ahead of time", CompiledPathWarning, stacklevel=3,
    )


def _import(name: str) -> ModuleType:
    """Import one kernel module with numba's cache pointed at :func:`cache_dir`."""
    fault = os.environ.get(NEMO_TELEMETRY_KERNEL_FAULT, "")
    if fault == "import":
        raise ImportError(f"{NEMO_TELEMETRY_KERNEL_FAULT}=import (test hook)")
    import numba

    directory = cache_dir()
    if not _cached(directory, name):
        _announce(directory)
        _compiling.add(name)
    previous = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(directory) if directory else ""  # read as each kernel is decorated
    try:
        module = importlib.import_module(f"nemo_telemetry.analysis.kernels.{name}")
    finally:
        numba.config.CACHE_DIR = previous
    if fault in ("compile", "call"):
        return _Faulty(module, fault)
    return module


class _Faulty:
    """The test hook's kernel module: each function fails to compile (a real numba typing
    error) or raises when called."""

    def __init__(self, module: ModuleType, fault: str) -> None:
        self._module, self._fault = module, fault

    def __getattr__(self, attr: str):
        value = getattr(self._module, attr)
        if not callable(value):
            return value
        if self._fault == "call":
            def raising(*args, **kwargs):
                raise RuntimeError(f"{NEMO_TELEMETRY_KERNEL_FAULT}=call (test hook)")
            return raising
        import numba

        @numba.njit
        def untypable(x):
            return x + "text"  # no int + str: numba's typing fails here

        return lambda *args, **kwargs: untypable(1)


def kernels(*names: str, work: int, unit: str = "bytes") -> tuple | None:
    """The kernel modules ``names`` when the compiled path should take ``work`` (protobuf bytes;
    JSON bytes with ``unit="json-bytes"``; rows with ``unit="rows"``); None for the reference path. A module that fails to import or
    compile warns once and stays off in this process."""
    how = mode()
    if how == "off":
        return None
    with _lock:
        if any(name in _broken for name in names):
            return None
        loaded = all(name in _loaded for name in names)
        small = work < _THRESHOLDS[unit] or any(name in _deferred for name in names)
        if how == "auto" and small and not loaded:
            return None
        try:
            for name in names:
                if name not in _loaded:
                    _loaded[name] = _import(name)
        except Exception as exc:  # numba missing or broken: the reference path works
            _fail(names, exc)
            return None
        return tuple(_loaded[name] for name in names)


def _fail(names: tuple[str, ...], exc: BaseException) -> None:
    reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    with _lock:
        for name in names:
            _broken.setdefault(name, reason)
    warnings.warn(
        f"compiled {'/'.join(names)} failed ({reason}); this batch and the rest take the reference path "
        f"(same results, slower; {NEMO_TELEMETRY_COMPILED}=0 silences this)", CompiledPathWarning, stacklevel=3,
    )


def run(names: tuple[str, ...], work: int, compiled: Callable[..., T], reference: Callable[[], T], *,
        unit: str = "bytes", passes: tuple[type[BaseException], ...] = ()) -> T:
    """``compiled(*modules)`` when :func:`kernels` says so, else ``reference()``; any exception
    of the compiled call (a compile error, a kernel's own error) except those in ``passes``
    (a caller's own signals) turns that module off with one warning and runs ``reference()``."""
    modules = kernels(*names, work=work, unit=unit)
    if modules is None:
        return reference()
    try:
        return compiled(*modules)
    except passes:
        raise
    except Exception as exc:  # telemetry analysis never ends on a broken kernel
        _fail(names, exc)
    finally:
        _compiling.difference_update(names)
    return reference()


def compiling() -> bool:
    """Whether a kernel with nothing cached is being compiled now (for a progress display)."""
    return bool(_compiling)


def warm_up_targets() -> list[tuple[str, list[str]]]:
    """(module, its compiled functions with their signatures) of every loaded kernel module,
    for ``warmup``'s report."""
    report = []
    for name in KERNEL_MODULES:
        module = _loaded.get(name)
        if module is None:
            continue
        compiled = []
        for attr in sorted(vars(module)):
            signatures = getattr(getattr(module, attr), "signatures", None)
            if signatures:
                compiled.append(f"{attr} ({len(signatures)} signature{'s' if len(signatures) > 1 else ''})")
        report.append((name, compiled))
    return report


def broken() -> dict[str, str]:
    """The kernel modules turned off in this process, and why."""
    with _lock:
        return dict(_broken)


def _reset_for_tests() -> None:
    """Forget what this process loaded and turned off (tests that switch the fault hook)."""
    global _announced
    with _lock:
        _loaded.clear()
        _broken.clear()
        _compiling.clear()
        _announced = False

