"""How much of the machine one analysis call may use: threads, memory, rows per batch.

One immutable object, built from the machine the process runs on (its CPU affinity, and the
cgroup limits of the container it runs in) unless the caller says otherwise. The read seam and
the engines take it; nothing else sizes threads or memory on its own.

Each value comes from, first to last: the explicit argument (the CLI's ``--threads`` /
``--memory-budget``), the environment (:data:`~nemo_telemetry.environment_variables.NEMO_TELEMETRY_THREADS`,
:data:`~nemo_telemetry.environment_variables.NEMO_TELEMETRY_MEMORY_BUDGET`), the machine.

The machine is read under ``root`` (``/`` unless a test hands a fixture tree): ``proc/self/cgroup``
names this process's cgroup, ``proc/self/mountinfo`` where each hierarchy is mounted, and the
limits are the files of that cgroup and of its ancestors (the tightest wins): cgroup v2
``cpu.max`` and ``memory.max`` / ``memory.current``, cgroup v1 ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us`` and ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``. A container's
memory use counts its page cache, which the kernel reclaims before it kills anything: the
inactive file pages (``memory.stat``) are counted as free, as the kubelet counts them.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from nemo_telemetry.environment_variables import NEMO_TELEMETRY_MEMORY_BUDGET, NEMO_TELEMETRY_THREADS
from nemo_telemetry.errors import SettingsError

__all__ = ["ReadSettings", "available_cpus", "memory_limit_bytes", "cpu_quota", "cgroup_memory_available",
           "host_memory_available", "parse_bytes", "FALLBACK_MEMORY_BYTES"]

_DEFAULT_BATCH_ROWS = 1 << 17
_BUDGET_SHARE = 4  # the in-memory path may take a quarter of the memory available
FALLBACK_MEMORY_BYTES = 4 << 30
"""What :meth:`ReadSettings.from_machine` takes as the memory available where neither the cgroup,
``/proc/meminfo``, nor the platform's page counts tell it (with a warning naming the knob)."""
# A v1 memory.limit_in_bytes at or above this is "no limit" (the kernel writes 2**63 rounded down to a page).
_V1_NO_LIMIT = 1 << 60
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def available_cpus(*, root: str | os.PathLike = "/") -> int:
    """CPUs this process may use, at least 1: the CPUs its affinity mask allows (``taskset``,
    a container's cpuset), fewer where a cgroup CPU quota allows fewer (rounded down: a thread more
    than the quota is throttled, not faster)."""
    try:
        cpus = len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        cpus = os.cpu_count() or 1
    quota = cpu_quota(root=root)
    if quota is not None:
        cpus = min(cpus, math.floor(quota))
    return max(1, cpus)


def cpu_quota(*, root: str | os.PathLike = "/") -> float | None:
    """The CPUs the cgroup quota of this process allows (``cpu.max`` 150000 100000: 1.5), the
    tightest of its cgroup and their ancestors'; None where no quota is set or there is no cgroup."""
    quotas: list[float] = []
    for version, folder in _cgroup_folders(Path(root), "cpu"):
        if version == 2:
            fields = _read(folder / "cpu.max").split()
            quota = _ratio(fields[0], fields[1]) if len(fields) == 2 and fields[0] != "max" else None
        else:
            quota = _ratio(_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us"))
        if quota is not None:
            quotas.append(quota)
    return min(quotas) if quotas else None


def cgroup_memory_available(*, root: str | os.PathLike = "/") -> int | None:
    """Bytes this process's cgroup may still allocate before its memory limit (its limit less its
    use, inactive page cache counted as free), the tightest of its cgroup and their ancestors';
    None where no limit is set or there is no cgroup."""
    room: list[int] = []
    for version, folder in _cgroup_folders(Path(root), "memory"):
        if version == 2:
            limit, used, cache = _read(folder / "memory.max"), _read(folder / "memory.current"), "inactive_file"
        else:
            limit, used, cache = (_read(folder / "memory.limit_in_bytes"), _read(folder / "memory.usage_in_bytes"),
                                  "total_inactive_file")
        if not limit.isdigit() or (version == 1 and int(limit) >= _V1_NO_LIMIT):
            continue  # "max", unreadable, or v1's "no limit"
        in_use = int(used) if used.isdigit() else 0
        in_use -= min(in_use, _stat(folder / "memory.stat", cache))
        room.append(max(0, int(limit) - in_use))
    return min(room) if room else None


def host_memory_available(*, root: str | os.PathLike = "/") -> int | None:
    """Bytes the host can give without swapping: ``MemAvailable`` of ``/proc/meminfo`` (free pages
    and the cache the kernel can drop), else the platform's free page count; None where neither is
    there (macOS has no count of available pages)."""
    for line in _read(Path(root) / "proc/meminfo", whole=True).splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            if len(fields) >= 2 and fields[1].isdigit():
                return int(fields[1]) << 10  # kB
    if Path(root) != Path("/"):
        return None  # a fixture tree stands for the whole machine
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit_bytes(*, root: str | os.PathLike = "/") -> int | None:
    """Memory available to this process now, in bytes: the host's available memory, or less where
    the process's cgroup has less room before its limit; None where neither can be told."""
    known = [m for m in (cgroup_memory_available(root=root), host_memory_available(root=root)) if m is not None]
    return min(known) if known else None


def parse_bytes(text: str | int) -> int:
    """``"4G"``, ``"512MiB"``, ``"1.5g"`` or a number of bytes, as bytes (binary units: 1G = 2**30).
    Raises :class:`~nemo_telemetry.errors.SettingsError` for anything else."""
    value: float
    if isinstance(text, int):
        value, unit = text, ""
    else:
        match = _SIZE.match(text)
        if match is None or match.group(2).lower() not in _UNITS:
            raise SettingsError(f"memory budget {text!r}: give bytes, or a size such as 512M, 4G or 1.5GiB")
        value, unit = float(match.group(1)), match.group(2).lower()
    if value < 0:
        raise SettingsError(f"memory budget {text!r}: give a size of 0 or more")
    return int(value * _UNITS[unit])


@dataclass(frozen=True)
class ReadSettings:
    """What one analysis call may use. Build it with :meth:`from_machine`; every field may be set
    explicitly instead (the CLI's knobs do)."""

    threads: int
    """Worker threads for decoding and for the rules' independent work."""
    memory_budget: int
    """Bytes the in-memory path may take before the engine streams the dataset in batches."""
    batch_rows: int = _DEFAULT_BATCH_ROWS
    """Rows per record batch when streaming."""

    @classmethod
    def from_machine(cls, *, threads: int | None = None, memory_budget: int | str | None = None,
                     batch_rows: int | None = None, root: str | os.PathLike = "/") -> ReadSettings:
        """Settings sized from this process's machine, each overridden by an explicit value, else by
        its environment variable (``NEMO_TELEMETRY_THREADS``, ``NEMO_TELEMETRY_MEMORY_BUDGET``).

        ``threads``: :func:`available_cpus`. ``memory_budget``: a quarter of
        :func:`memory_limit_bytes`; where that cannot be told, a quarter of the physical memory
        (macOS), else a quarter of :data:`FALLBACK_MEMORY_BYTES`, with a warning that names the knob.
        """
        if threads is None:
            threads = _threads_from_env()
        if threads is None:
            threads = available_cpus(root=root)
        if memory_budget is None:
            memory_budget = os.environ.get(NEMO_TELEMETRY_MEMORY_BUDGET) or None
        if memory_budget is None:
            memory_budget = _memory_known(root) // _BUDGET_SHARE
        return cls(threads=max(1, int(threads)), memory_budget=max(0, parse_bytes(memory_budget)),
                   batch_rows=int(batch_rows) if batch_rows else _DEFAULT_BATCH_ROWS)


def _threads_from_env() -> int | None:
    text = os.environ.get(NEMO_TELEMETRY_THREADS, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise SettingsError(f"{NEMO_TELEMETRY_THREADS}={text!r}: give a whole number of threads, 1 or more")
    return int(text)


def _memory_known(root) -> int:
    """:func:`memory_limit_bytes`, else the physical memory, else :data:`FALLBACK_MEMORY_BYTES`
    (the last with a warning: the budget is then a guess)."""
    known = memory_limit_bytes(root=root)
    if known is not None:
        return known
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        warnings.warn(f"cannot tell this machine's memory: the analysis assumes {FALLBACK_MEMORY_BYTES >> 30} GiB "
                      f"(set {NEMO_TELEMETRY_MEMORY_BUDGET} or --memory-budget to choose)", stacklevel=3)
        return FALLBACK_MEMORY_BYTES


def _cgroup_folders(root: Path, controller: str) -> list[tuple[int, Path]]:
    """(cgroup version, folder) of this process's cgroup for ``controller`` and of each ancestor up
    to its hierarchy's mount, innermost first; empty where there is no cgroup (not Linux)."""
    mounts = _cgroup_mounts(root)
    found = []
    for line in _read(root / "proc/self/cgroup", whole=True).splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        version = 2 if hierarchy == "0" and controllers == "" else 1
        if version == 1 and controller not in controllers.split(","):
            continue
        for mount_root, mount_point in mounts.get(2 if version == 2 else controller, ()):
            # the cgroup path is relative to the hierarchy's root; a container's mount shows its own
            # cgroup as the mount's root (or, with a cgroup namespace, as "/")
            relative = os.path.relpath(path, mount_root) if _under(path, mount_root) else "."
            folder = (root / mount_point.lstrip("/") / relative).resolve()
            top = (root / mount_point.lstrip("/")).resolve()
            while True:
                found.append((version, folder))
                if folder == top or top not in folder.parents:
                    break
                folder = folder.parent
            break
    return found


def _cgroup_mounts(root: Path) -> dict:
    """Where each cgroup hierarchy is mounted, from ``mountinfo``: ``{2: [(root, mount point)],
    "cpu": [...], "memory": [...]}`` (v1 keyed by controller)."""
    mounts: dict = {}
    for line in _read(root / "proc/self/mountinfo", whole=True).splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        entry = (_unescape(fields[3]), _unescape(fields[4]))
        if tail[0] == "cgroup2":
            mounts.setdefault(2, []).append(entry)
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                mounts.setdefault(option, []).append(entry)
    return mounts


def _under(path: str, parent: str) -> bool:
    return parent == "/" or path == parent or path.startswith(parent.rstrip("/") + "/")


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # v1 writes -1 for no quota


def _stat(path: Path, key: str) -> int:
    for line in _read(path, whole=True).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _read(path: Path, *, whole: bool = False) -> str:
    try:
        text = path.read_text()
    except (OSError, ValueError):
        return ""
    return text if whole else text.strip()
