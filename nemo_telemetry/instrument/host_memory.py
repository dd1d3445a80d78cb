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
import tempfile
import threading
from typing import Any, Mapping

from nemo_telemetry.instrument.metrics import record_host_memory

__all__ = ["HostMemorySampler", "SAMPLE_INTERVAL_S"]

_log = logging.getLogger("nemo_telemetry")

SAMPLE_INTERVAL_S = 15.0
_MEMINFO = "/proc/meminfo"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


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
            try:  # the run's next process on this node creates its own
                os.unlink(self._lock_file.name)
            except OSError:
                pass
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
