"""Typed errors shared by both halves of nemo-telemetry.

Kept free of heavy imports so :mod:`nemo_telemetry.instrument` can raise them cheaply::

    NemoTelemetryError
     ├── SpecError        a span_groups spec or telemetry config that cannot be resolved
     ├── RegistryError    a span-group registration that conflicts with an existing one
     ├── IngestError      an input that is not OTLP, or a dataset that cannot be read
     │    ├── DatasetLockedError   a second writer on a dataset another writer holds
     │    ├── DamagedDatasetError  a committed file of a dataset that is missing or damaged
     │    └── DatasetFormatError   a dataset of a format (layout) this version does not read
     ├── UnknownRunError  a --run / run_id that none of the spans carry
     ├── ListenError      a receiver that cannot bind its address
     ├── ReceiverSecurityError  a receiver beyond loopback without a token, or a token / TLS file it cannot use
     ├── WaterfallError   a waterfall or critical path asked for a run, trace or step not there
     ├── LintError        a path given to lint that does not exist, or a file that does not parse
     ├── DemoError        a demo asked for a bad mode, step count or output directory
     └── MonitorError     a monitor asked for a bad source, threshold or period

    IncompleteDatasetWarning  (a UserWarning) a dataset an ingest began writing and did not finish
    IngestWarning             (a UserWarning) records rejected while raw files were read on the fly
    CompiledPathWarning       (a UserWarning) the compiled kernels compile first, or one fell back
"""

from __future__ import annotations

__all__ = [
    "NemoTelemetryError",
    "SpecError",
    "RegistryError",
    "IngestError",
    "DatasetLockedError",
    "DamagedDatasetError",
    "DatasetFormatError",
    "UnknownRunError",
    "ListenError",
    "ReceiverSecurityError",
    "WaterfallError",
    "LintError",
    "DemoError",
    "MonitorError",
    "SettingsError",
    "IncompleteDatasetWarning",
    "IngestWarning",
    "CompiledPathWarning",
]


class NemoTelemetryError(Exception):
    """Root of every error nemo-telemetry raises on purpose."""


class SpecError(NemoTelemetryError, ValueError):
    """A ``span_groups`` spec or ``telemetry:`` config value cannot be resolved."""


class RegistryError(NemoTelemetryError, ValueError):
    """A span-group registration conflicts with what is already registered."""


class IngestError(NemoTelemetryError):
    """An input file or dataset cannot be read; the message names it and the fix."""


class DatasetLockedError(IngestError):
    """A writer (``ingest``, ``collect``, ``monitor --port``, ``repair``) found the dataset held by
    another; the message names the holder (pid, host, command, since when). ``holder`` is its record."""

    def __init__(self, message: str, holder: dict | None = None) -> None:
        super().__init__(message)
        self.holder = dict(holder or {})


class DamagedDatasetError(IngestError):
    """A committed file of a dataset is missing, truncated, overwritten or not the dataset's own;
    the message names each file and the fix. ``damaged`` holds (relative path, what is wrong)."""

    def __init__(self, message: str, damaged: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.damaged = tuple(damaged)


class DatasetFormatError(IngestError):
    """A dataset (or one of its spans files) of a format this nemo-telemetry does not read: one
    written before format versions in a layout since retired, or by a newer version. The message
    names the format and says to re-run ``nemo-telemetry ingest`` into a new folder. ``version`` is
    the dataset's format (0: unversioned, in a retired layout); ``supported`` the formats read."""

    def __init__(self, message: str, version: int, supported: tuple[int, ...]) -> None:
        super().__init__(message)
        self.version = version
        self.supported = tuple(supported)


class UnknownRunError(NemoTelemetryError):
    """A ``--run`` / ``run_id`` that none of the spans carry; the message lists the runs present.

    Every engine raises it through :meth:`unless_present`, so the words are the same on each."""

    def __init__(self, run_id: str, runs) -> None:
        present = ", ".join(repr(r) for r in runs if r is not None) or "none"
        super().__init__(f"no run {run_id!r} in these spans (runs present: {present}); "
                         "pass one of them as --run / run_id")
        self.run_id = run_id

    @classmethod
    def unless_present(cls, run_id: str | None, runs) -> None:
        """Raise for a ``run_id`` that is not one of ``runs`` (None selects every run)."""
        if run_id is not None and run_id not in runs:
            raise cls(run_id, runs)


class ListenError(NemoTelemetryError):
    """A receiver cannot bind its address (the port is taken, or not ours to use)."""


class ReceiverSecurityError(NemoTelemetryError, ValueError):
    """A receiver refuses to start as asked: on an address beyond loopback without a bearer token
    (unless told ``insecure``), or with a token file or TLS certificate / key it cannot use."""


class WaterfallError(NemoTelemetryError, ValueError):
    """A waterfall or critical path was asked for a run, trace or step the spans do not hold."""


class LintError(NemoTelemetryError):
    """A path given to lint does not exist or a file in it cannot be read or parsed."""


class DemoError(NemoTelemetryError, ValueError):
    """The demo was asked for something it cannot run (a bad mode, step count or output directory)."""


class MonitorError(NemoTelemetryError, ValueError):
    """A monitor was asked for something it cannot do (no source or two, a bad threshold or period)."""


class SettingsError(NemoTelemetryError, ValueError):
    """A thread count or memory budget (``--threads``, ``--memory-budget``, or their environment
    variables) that cannot be read; the message names the value and the forms accepted."""


class IncompleteDatasetWarning(UserWarning):
    """A dataset is read whose ingest began and did not finish: the spans of that ingest are
    not in it. The message names the ingest's inputs and the command that finishes it."""


class IngestWarning(UserWarning):
    """Records were rejected while reading raw files on the fly (details in the message)."""


class CompiledPathWarning(UserWarning):
    """The compiled ingest kernels must compile before a large input (once per cache), or one
    failed and the reference path took its batch (same results, slower)."""
