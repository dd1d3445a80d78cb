"""The choices and defaults the CLI shows in ``--help``: input formats, engines, severities, the
waterfall's collapse threshold and the receiver's bounds.

They live in a module that imports nothing, so that defining the CLI's options (and so
``nemo-telemetry --help``) loads no numpy, pyarrow or pandas; the modules that use them import
them from here.
"""

from __future__ import annotations

__all__ = [
    "FORMATS",
    "ENGINES",
    "SEVERITIES",
    "DEFAULT_COLLAPSE_THRESHOLD",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_READ_TIMEOUT_S",
]

FORMATS = ("jsonl", "proto", "json")
"""Input formats ``ingest --format`` forces: Collector JSON lines, length-prefixed protobuf, one OTLP/JSON document."""

ENGINES = ("local", "ray")
"""Where ``goodput``, ``check`` and ``ingest`` run: this process, or Ray tasks."""

SEVERITIES = ("error", "warning", "info")
"""Finding severities, worst first."""

DEFAULT_COLLAPSE_THRESHOLD = 20
"""A waterfall folds more than this many same-name siblings into one line."""

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
"""Largest request, after decompression: a request body ``collect`` takes (larger: 413), and a line,
protobuf record or JSON document that ``ingest`` and ``monitor --follow`` hold (larger: rejected
and named). ``--max-request-mib`` changes it."""

DEFAULT_MAX_CONNECTIONS = 256
"""Connections the receiver serves at once; more get 503 with Retry-After."""

DEFAULT_READ_TIMEOUT_S = 10.0
"""Longest wait of one socket read in the receiver; also how long an idle keep-alive connection stays."""
