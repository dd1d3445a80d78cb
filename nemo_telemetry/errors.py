"""Typed errors shared by both halves of nemo-telemetry.

Kept free of heavy imports so :mod:`nemo_telemetry.instrument` can raise them cheaply::

    NemoTelemetryError
     ├── SpecError        a span_groups spec or telemetry config that cannot be resolved
     ├── RegistryError    a span-group registration that conflicts with an existing one
     ├── IngestError      an input that is not OTLP, or a dataset that cannot be read
     └── ListenError      a receiver that cannot bind its address

    IncompleteDatasetWarning  (a UserWarning) a dataset an ingest began writing and did not finish
"""

from __future__ import annotations

__all__ = ["NemoTelemetryError", "SpecError", "RegistryError", "IngestError", "ListenError", "IncompleteDatasetWarning"]


class NemoTelemetryError(Exception):
    """Root of every error nemo-telemetry raises on purpose."""


class SpecError(NemoTelemetryError, ValueError):
    """A ``span_groups`` spec or ``telemetry:`` config value cannot be resolved."""


class RegistryError(NemoTelemetryError, ValueError):
    """A span-group registration conflicts with what is already registered."""


class IngestError(NemoTelemetryError):
    """An input file or dataset cannot be read; the message names it and the fix."""


class ListenError(NemoTelemetryError):
    """A receiver cannot bind its address (the port is taken, or not ours to use)."""


class IncompleteDatasetWarning(UserWarning):
    """A dataset is read whose ingest began and did not finish: the spans of that ingest are
    not in it. The message names the ingest's inputs and the command that finishes it."""


class CompiledPathWarning(UserWarning):
    """The compiled ingest kernels must compile before a large input (once per cache), or one
    failed and the reference path took its batch (same results, slower)."""
