"""Where this process sits in a launcher's world, and the run id every rank shares.

``torchrun`` and ``accelerate launch`` (which runs ``torchrun``'s launcher) start one process per
rank, each running the same script, so each rank's telemetry starts on its own; the ranks must
still agree on one ``nemo.run.id`` with nothing exported by hand. In order:

1. ``NEMO_TELEMETRY_RUN_ID`` when set (by the user, or by a driver that started these processes);
2. ``TORCHELASTIC_RUN_ID`` when it names a rendezvous (``--standalone`` and ``c10d`` rendezvous
   give each launch a fresh one; a static rendezvous says ``none``);
3. rank 0's fresh id handed to the others through the launcher's own key-value store (the
   ``torchrun`` agent's ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``, which every worker may use
   when ``TORCHELASTIC_USE_AGENT_STORE`` is ``True``), waited for at most ``timeout_s``;
4. Slurm's job and step ids (``srun`` launches);
5. a fresh id (a process on its own).
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from nemo_telemetry.instrument import environment_variables as env

__all__ = ["RUN_ID_STORE_KEY", "LaunchInfo", "launch_info", "shared_run_id"]

_log = logging.getLogger("nemo_telemetry")

RUN_ID_STORE_KEY = "nemo_telemetry/run_id"
"""The key rank 0 writes its run id under in the launcher's store."""


@dataclass(frozen=True)
class LaunchInfo:
    """This process's rank, world size and local rank, and the launcher that set them (or None)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launcher: str | None = None


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return default


def launch_info(environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size and local rank from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (else Slurm's)."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ or "WORLD_SIZE" in environ:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in environ or "GROUP_RANK" in environ else "env"
        return LaunchInfo(_int(environ, "RANK", 0), _int(environ, "WORLD_SIZE", 1), _int(environ, "LOCAL_RANK", 0),
                          launcher)
    if "SLURM_PROCID" in environ:
        return LaunchInfo(_int(environ, "SLURM_PROCID", 0), _int(environ, "SLURM_NTASKS", 1),
                          _int(environ, "SLURM_LOCALID", 0), "slurm")
    return LaunchInfo()


def shared_run_id(environ: Mapping[str, str] | None = None, *, timeout_s: float = 60.0) -> str:
    """The run id all ranks of this launch share (module docstring: where it comes from)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(env.NEMO_TELEMETRY_RUN_ID)
    if explicit:
        return explicit
    elastic = environ.get("TORCHELASTIC_RUN_ID", "")
    if elastic and elastic.lower() != "none":
        return f"torchrun-{elastic}"
    info = launch_info(environ)
    if info.world_size > 1 and environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        from_store = _run_id_from_agent_store(environ, info, timeout_s)
        if from_store:
            return from_store
    if environ.get("SLURM_JOB_ID"):
        return f"slurm-{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', '0')}"
    if info.world_size > 1:
        _log.warning("telemetry: rank %d of %d found no run id shared by the launcher (set %s to one value on "
                     "every rank); this rank's spans get a run id of their own", info.rank, info.world_size,
                     env.NEMO_TELEMETRY_RUN_ID)
    return uuid.uuid4().hex


def _run_id_from_agent_store(environ: Mapping[str, str], info: LaunchInfo, timeout_s: float) -> str | None:
    """Rank 0's id through the ``torchrun`` agent's store; None (with a warning) when unreachable."""
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore

        store = TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), is_master=False,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        key = f"{RUN_ID_STORE_KEY}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        if info.rank == 0:
            run_id = uuid.uuid4().hex
            store.set(key, run_id)
            return run_id
        return store.get(key).decode()
    except Exception as exc:  # no torch, no store, a timeout: the rank keeps an id of its own
        _log.warning("telemetry: could not share rank 0's run id through the launcher's store (%s); "
                     "set %s on every rank", exc, env.NEMO_TELEMETRY_RUN_ID)
        return None
