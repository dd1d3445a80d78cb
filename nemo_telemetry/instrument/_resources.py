"""Resource attributes: what every span of a process says about where it came from.

``nemo.run.id`` joins the processes of one run; ``nemo.telemetry.span_groups`` records what this
process was asked to emit, so the analysis can tell "nothing happened" from "nothing was enabled".
"""

from __future__ import annotations

import os
import socket
from typing import Iterable

from opentelemetry.sdk.resources import Resource

__all__ = ["build_resource", "RUN_ID_KEY", "SPAN_GROUPS_KEY"]

RUN_ID_KEY = "nemo.run.id"
SPAN_GROUPS_KEY = "nemo.telemetry.span_groups"


def build_resource(*, service_name: str, run_id: str, algorithm: str | None, rank: int, world_size: int,
                   local_rank: int, span_groups: Iterable[str]) -> Resource:
    """The process's resource; these values win over ``OTEL_RESOURCE_ATTRIBUTES``."""
    attributes: dict[str, object] = {
        "service.name": service_name,
        RUN_ID_KEY: run_id,
        "nv.dl.rank": int(rank),
        "nv.dl.world_size": int(world_size),
        "nv.dl.local_rank": int(local_rank),
        "process.pid": os.getpid(),
        "host.name": socket.gethostname(),
        SPAN_GROUPS_KEY: ",".join(sorted(span_groups)),
    }
    if algorithm:
        attributes["rl.algorithm"] = algorithm
    return Resource.create(attributes)
