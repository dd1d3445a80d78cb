"""The ``nemo_gym`` namespace: span groups of a rollout-serving (NeMo-Gym-shaped) process.

``server`` and ``http_client`` are the two halves of cross-process propagation: the client
writes ``traceparent`` and the server reads it, so both sit in every preset. With ``rollout``
they form the cross-process spine. ``default`` is the spine plus ``job``; ``per_rollout`` is
the spine plus ``verify``, ``agent`` and ``model_call``, without ``job`` (which would nest
thousands of rollouts under one span). ``sandbox`` is opt-in. There is no ``tool_call`` group
(a tool call is already a SERVER span named after its route) and no ``dataset`` group (dataset
code is offline tooling, not a runtime path).

Every Gym group is an umbrella: rollouts, requests and tool calls run concurrently by the
hundreds, so any bucket on them would sum past the wall clock. The training-side leaf spans
that enclose them carry the buckets. ``job`` and ``rollout`` are shared with ``nemo_rl``.
"""

from __future__ import annotations

from typing import ClassVar, Final

from nemo_telemetry.instrument._groups import GroupName, group
from nemo_telemetry.instrument._registry import REGISTRY
from nemo_telemetry.instrument.span_groups import RLSpanGroup

__all__ = ["NAMESPACE", "GymSpanGroup", "PRESETS", "register_span_groups"]

NAMESPACE: Final = "nemo_gym"


class GymSpanGroup:
    """Span group names for a Gym-shaped rollout service."""

    SERVER = group("server", umbrella=True, spans=("<METHOD> <route>", "<METHOD>"),
                   description="SERVER spans of the HTTP servers (FastAPI), named after the route; reads traceparent.")
    HTTP_CLIENT = group("http_client", umbrella=True, spans=("<METHOD>", "<METHOD> <route>"),
                        description="CLIENT spans of outgoing HTTP requests (aiohttp); writes traceparent.")
    ROLLOUT = RLSpanGroup.ROLLOUT
    JOB = RLSpanGroup.JOB
    VERIFY = group("verify", umbrella=True, spans=("gym.verify",),
                   description="Verifier / reward scoring of one rollout on a resources server.")
    AGENT = group("agent", umbrella=True, spans=("gym.agent.<phase>",),
                  description="Agent turns of one rollout.")
    MODEL_CALL = group("model_call", umbrella=True, spans=("gym.model_call",),
                       description="Calls from the agent to the policy model server.")
    SANDBOX = group("sandbox", umbrella=True, spans=("gym.sandbox.<op>",),
                    description="Sandboxed code execution; opt-in, high volume.")

    ALL_GROUPS: ClassVar[frozenset[str]]


GymSpanGroup.ALL_GROUPS = frozenset(v for k, v in vars(GymSpanGroup).items() if isinstance(v, GroupName))

_G = GymSpanGroup
_SPINE = (_G.SERVER, _G.HTTP_CLIENT, _G.ROLLOUT)
PRESETS: Final[dict[str, tuple[str, ...]]] = {
    "default": (*_SPINE, _G.JOB),
    "per_rollout": (*_SPINE, _G.VERIFY, _G.AGENT, _G.MODEL_CALL),
}


def register_span_groups(*, allow_override: bool = True) -> None:
    """Declare the nemo_gym groups and presets; idempotent, called at import."""
    REGISTRY.register(NAMESPACE, sorted(GymSpanGroup.ALL_GROUPS), PRESETS, allow_override=allow_override)


register_span_groups()
