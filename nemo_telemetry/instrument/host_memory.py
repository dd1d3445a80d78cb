"""``rl.host.memory.*``: the memory of each node, sampled by one process per node.

Switched on by ``telemetry.host_memory_metrics: true`` (off by default). Every process of the run
tries to take a per-node, per-run lock file in the temporary directory; the one that gets it
samples ``/proc/meminfo`` every :data:`SAMPLE_INTERVAL_S` seconds on a daemon thread (and once at
start and once at stop), so a node reports once however many workers it hosts. Values are bytes,
labelled with ``host.name``. Linux only: elsewhere one warning, and nothing is sampled.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import threading
from typing import Any, Mapping

from nemo_telemetry.instrument.metrics import TeedMetric, record_metrics, register_teed_metrics

__all__ = ["HostMemorySampler", "read_host_memory", "record_host_memory", "SAMPLE_INTERVAL_S", "HOST_MEMORY_METRICS"]

_log = logging.getLogger("nemo_telemetry")

SAMPLE_INTERVAL_S = 15.0
_MEMINFO = "/proc/meminfo"
_STATM = "/proc/self/statm"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

HOST_MEMORY_METRICS = (
    TeedMetric(None, "rl.host.memory.used", "gauge", "By", "Memory in use on this node (total - available)"),
    TeedMetric(None, "rl.host.memory.available", "gauge", "By", "Memory available on this node"),
    TeedMetric(None, "rl.host.memory.total", "gauge", "By", "Total memory of this node"),
    TeedMetric(None, "rl.host.memory.process_rss", "gauge", "By", "Resident memory of the recording process"),
)
register_teed_metrics(HOST_MEMORY_METRICS)


def read_host_memory(meminfo: str = _MEMINFO, statm: str = _STATM) -> dict[str, int]:
    """``{series name: bytes}`` from ``/proc/meminfo`` and ``/proc/self/statm``; raises OSError/ValueError."""
    fields: dict[str, int] = {}
    with open(meminfo, encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    total, available = fields["MemTotal"], fields["MemAvailable"]
    values = {"rl.host.memory.total": total, "rl.host.memory.available": available,
              "rl.host.memory.used": total - available}
    try:
        with open(statm, encoding="ascii") as fh:
            values["rl.host.memory.process_rss"] = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    return values


def record_host_memory(*, attributes: Mapping[str, Any] | None = None) -> int:
    """One sample of this node's memory as ``rl.host.memory.*`` (bytes), labelled with ``host.name``.

    Returns how many values were recorded; never raises (unreadable: one warning, 0).
    """
    try:
        values = read_host_memory()
    except (OSError, ValueError, KeyError) as exc:
        _log.warning("rl.host.memory.*: cannot read %s (%s); this sample is skipped", _MEMINFO, exc)
        return 0
    return record_metrics(values, attributes={"host.name": socket.gethostname(), **(attributes or {})})


class HostMemorySampler:
    """Samples this node's memory on a daemon thread until :meth:`stop`."""

    def __init__(self, *, interval_s: float = SAMPLE_INTERVAL_S, attributes: Mapping[str, Any] | None = None,
                 lock: Any = None) -> None:
        self.interval_s = interval_s
        self.attributes = dict(attributes or {})
        self._lock_file = lock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemo-telemetry-host-memory", daemon=True)

    @classmethod
    def start_for_node(cls, run_id: str, *, interval_s: float = SAMPLE_INTERVAL_S) -> "HostMemorySampler | None":
        """A started sampler when this process is the first of ``run_id`` on this node, else None."""
        if not os.path.exists(_MEMINFO):
            _log.warning("host_memory_metrics: %s is not readable on this platform; rl.host.memory.* is not "
                         "recorded", _MEMINFO)
            return None
        lock = _node_lock(run_id)
        if lock is False:
            return None
        sampler = cls(interval_s=interval_s, lock=lock)
        sampler.sample()
        sampler._thread.start()
        return sampler

    def sample(self) -> int:
        """Record one sample now; the number of values recorded."""
        return record_host_memory(attributes=self.attributes)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        """Take a last sample and release the node lock (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.sample()
        if self._lock_file is not None:
            try:
                self._lock_file.close()
            except OSError:
                pass
            self._lock_file = None


def _node_lock(run_id: str):
    """An open, exclusively locked file (held while sampling), None without fcntl, False when taken."""
    try:
        import fcntl
    except ImportError:
        return None
    path = os.path.join(tempfile.gettempdir(), f"nemo-telemetry-host-memory-{_UNSAFE.sub('_', run_id)}.lock")
    try:
        handle = open(path, "a+")
    except OSError:
        return None  # cannot coordinate: sample anyway rather than not at all
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    return handle
