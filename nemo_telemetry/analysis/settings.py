"""How much of the machine one analysis call may use: threads, memory, rows per batch.

One immutable object, built from the machine the process runs on (its CPU affinity, and the
cgroup limits of the container it runs in) unless the caller says otherwise. The read seam and
the engines take it; nothing else sizes threads or memory on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["ReadSettings", "available_cpus", "memory_limit_bytes"]

_DEFAULT_BATCH_ROWS = 1 << 17


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the platform has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def memory_limit_bytes() -> int | None:
    """Memory available to this process now, in bytes; None where it cannot be told."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


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
    def from_machine(cls, *, threads: int | None = None, memory_budget: int | None = None,
                     batch_rows: int | None = None) -> ReadSettings:
        """Settings sized from this process's machine, each overridden by an explicit value."""
        if threads is None:
            threads = available_cpus()
        if memory_budget is None:
            limit = memory_limit_bytes()
            memory_budget = limit // 4 if limit is not None else 4 << 30
        return cls(threads=max(1, int(threads)), memory_budget=max(0, int(memory_budget)),
                   batch_rows=int(batch_rows) if batch_rows else _DEFAULT_BATCH_ROWS)
