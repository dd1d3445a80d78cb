"""The emitting half of nemo-telemetry, imported by trainers, Ray actors and GPU workers.

Importing this package is cheap: it loads only the OpenTelemetry API/SDK-free group registry
and declarations; nothing heavy (pandas, pyarrow, ray, vllm) is imported here or at call time
on a disabled site. The public API is listed once, in ``__all__`` below, and pinned by
``tests/instrument/test_public_api.py``.
"""

from __future__ import annotations

from nemo_telemetry.errors import RegistryError, SpecError
from nemo_telemetry.instrument._groups import Bucket, GroupName, group, span_name_regex
from nemo_telemetry.instrument._registry import REGISTRY, SpanGroupInfo, SpanRegistry
from nemo_telemetry.instrument.gym_span_groups import GymSpanGroup
from nemo_telemetry.instrument.span_groups import (
    COLLECTOR_LOOP_CATEGORIES,
    EFFICIENCY_CATEGORY_BUCKET,
    UNBUCKETED_SPAN_CATEGORIES,
    RLSpanGroup,
)


def resolve(spec, *, namespace: str | None = None, strict: bool = False) -> frozenset[str]:
    """Groups a ``span_groups`` spec selects in the process-wide registry."""
    return REGISTRY.resolve(spec, namespace=namespace, strict=strict)


def resolve_with_pending(spec, *, namespace: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """``(enabled, pending)`` for a spec in the process-wide registry."""
    return REGISTRY.resolve_with_pending(spec, namespace=namespace)


def register_span_groups(namespace: str, groups, presets=None, *, allow_override: bool = True) -> None:
    """Register a library's own groups and presets into the process-wide registry."""
    REGISTRY.register(namespace, groups, presets, allow_override=allow_override)


__all__ = [
    # registry and catalogue
    "Bucket",
    "GroupName",
    "group",
    "span_name_regex",
    "SpanGroupInfo",
    "SpanRegistry",
    "REGISTRY",
    "RLSpanGroup",
    "GymSpanGroup",
    "EFFICIENCY_CATEGORY_BUCKET",
    "COLLECTOR_LOOP_CATEGORIES",
    "UNBUCKETED_SPAN_CATEGORIES",
    "resolve",
    "resolve_with_pending",
    "register_span_groups",
    "SpecError",
    "RegistryError",
]
