"""The ``telemetry:`` config block: a frozen dataclass, read from a dict or a YAML file.

Precedence for every setting: explicit argument > raw environment > config file > default.
A bad value never ends a run: it is warned about once and its default is used instead.

    telemetry:
      enabled: true
      span_groups: per_step        # preset, group names, or a mix
      exporter: dump               # otlp | dump | none
      dump_dir: /scratch/run42/telemetry
      logs_enabled: false          # export Python logging records with their trace and span ids
      host_memory_metrics: false   # rl.host.memory.* sampled on every node
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlparse

from nemo_telemetry.instrument import environment_variables as env

__all__ = [
    "TelemetryConfig", "load_telemetry_config", "resolve_telemetry_config", "read_run_config", "otlp_protocol",
    "EXPORTERS",
]

_log = logging.getLogger("nemo_telemetry")

EXPORTERS = ("otlp", "dump", "none")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class TelemetryConfig:
    """The run's reproducible telemetry settings (endpoints belong in ``OTEL_EXPORTER_OTLP_*``)."""

    enabled: bool = False
    span_groups: str = "default"
    namespace: str = "nemo_rl"
    exporter: str = "otlp"
    dump_dir: str | None = None
    logs_enabled: bool = False
    host_memory_metrics: bool = False
    service_name: str | None = None
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None


_FIELDS = {f.name: f for f in dataclasses.fields(TelemetryConfig)}
_DEFAULTS = TelemetryConfig()


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"telemetry.{key}: {value!r} is not a boolean (use true or false)")


def _as_spec(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise ValueError(f"telemetry.{key}: {value!r} is not a span-group spec (a string such as 'per_step')")


def _as_choice(choices: tuple[str, ...]):
    def check(key: str, value: Any) -> str:
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"telemetry.{key}: {value!r} is not one of {', '.join(choices)}")
        return text

    return check


def _as_optional_str(key: str, value: Any) -> str | None:
    if value is None or isinstance(value, (str, os.PathLike)):
        return os.fspath(value) if value is not None else None
    raise ValueError(f"telemetry.{key}: {value!r} is not a string")


def _as_str(key: str, value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value.strip()
    raise ValueError(f"telemetry.{key}: {value!r} is not a non-empty string")


_PARSERS = {
    "enabled": _as_bool,
    "span_groups": _as_spec,
    "namespace": _as_str,
    "exporter": _as_choice(EXPORTERS),
    "dump_dir": _as_optional_str,
    "logs_enabled": _as_bool,
    "host_memory_metrics": _as_bool,
    "service_name": _as_optional_str,
    "otlp_endpoint": _as_optional_str,
    "otlp_protocol": _as_choice(OTLP_PROTOCOLS),
}


def _parse_block(block: Mapping[str, Any], origin: str) -> TelemetryConfig:
    values: dict[str, Any] = {}
    for key, raw in block.items():
        if key not in _FIELDS:
            close = difflib.get_close_matches(str(key), list(_FIELDS), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _log.warning("%s: unknown telemetry setting %r%s; it is ignored. Known settings: %s",
                         origin, key, hint, ", ".join(_FIELDS))
            continue
        if raw is None and key == "otlp_protocol":
            continue
        try:
            values[key] = _PARSERS[key](key, raw)
        except ValueError as exc:
            _log.warning("%s: %s; using the default %r and carrying on", origin, exc, getattr(_DEFAULTS, key))
    return TelemetryConfig(**values)


def load_telemetry_config(source: TelemetryConfig | Mapping[str, Any] | str | os.PathLike | None = None
                          ) -> TelemetryConfig:
    """Parse a ``telemetry:`` block: a dict (the block, or a whole config holding one) or a YAML path.

    Environment variables are *not* applied here (see :func:`resolve_telemetry_config`).
    An unreadable file or a bad value is warned about once; telemetry then uses the defaults.
    """
    if source is None:
        return TelemetryConfig()
    if isinstance(source, TelemetryConfig):
        return source
    origin = "telemetry config"
    if isinstance(source, (str, os.PathLike)):
        origin = os.fspath(source)
        source = _read_yaml(origin)
        if source is None:
            return TelemetryConfig()
    if not isinstance(source, Mapping):
        _log.warning("%s: expected a mapping with telemetry settings, got %s; telemetry stays off",
                     origin, type(source).__name__)
        return TelemetryConfig()
    block = source.get("telemetry", source) if "telemetry" in source else source
    if block is None:
        return TelemetryConfig()
    if not isinstance(block, Mapping):
        _log.warning("%s: 'telemetry' must be a mapping, got %s; telemetry stays off", origin, type(block).__name__)
        return TelemetryConfig()
    return _parse_block(block, origin)


def read_run_config(path: str | os.PathLike) -> Mapping[str, Any] | None:
    """The whole YAML config file at ``path`` (the trainer's config), or None when it cannot be read."""
    document = _read_yaml(os.fspath(path))
    return document if isinstance(document, Mapping) else None


def _read_yaml(path: str) -> Any:
    try:
        import yaml  # lazily: only a driver reading a config file pays for it

        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh) or {}
    except ImportError:
        _log.warning("%s: PyYAML is not installed (pip install pyyaml); telemetry stays off", path)
    except OSError as exc:
        _log.warning("%s: cannot read the telemetry config (%s); telemetry stays off", path, exc)
    except Exception as exc:  # yaml.YAMLError, without importing yaml at module level
        _log.warning("%s: not valid YAML (%s); telemetry stays off", path, exc)
    return None


# Environment variable -> config field; the raw environment wins over the file.
_ENV_FIELDS = {
    env.NEMO_TELEMETRY_ENABLED: "enabled",
    env.NEMO_TELEMETRY_SPAN_GROUPS: "span_groups",
    env.NEMO_TELEMETRY_NAMESPACE: "namespace",
    env.NEMO_TELEMETRY_EXPORTER: "exporter",
    env.NEMO_TELEMETRY_DUMP_DIR: "dump_dir",
    env.NEMO_TELEMETRY_LOGS_ENABLED: "logs_enabled",
    env.NEMO_TELEMETRY_HOST_MEMORY_METRICS: "host_memory_metrics",
    env.OTEL_SERVICE_NAME: "service_name",
}


def resolve_telemetry_config(config: TelemetryConfig | Mapping[str, Any] | str | os.PathLike | None = None, *,
                             environ: Mapping[str, str] | None = None) -> TelemetryConfig:
    """The config with every setting the environment provides taking its place (env > file > default)."""
    base = load_telemetry_config(config)
    environ = os.environ if environ is None else environ
    overrides: dict[str, Any] = {}
    for var, key in _ENV_FIELDS.items():
        raw = environ.get(var)
        if raw is None:
            continue
        try:
            overrides[key] = _PARSERS[key](key, raw)
        except ValueError as exc:
            _log.warning("environment %s: %s; using %r from the config instead", var, exc, getattr(base, key))
    return dataclasses.replace(base, **overrides)


def otlp_protocol(environ: Mapping[str, str] | None = None) -> str:
    """``grpc`` or ``http/protobuf`` from the standard variables (traces-specific first).

    Unset, the endpoint's port decides: 4317 is the collector's gRPC port, anything else HTTP.
    """
    environ = os.environ if environ is None else environ
    protocol = (environ.get(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
                or environ.get(env.OTEL_EXPORTER_OTLP_PROTOCOL) or "").strip().lower()
    if protocol in ("grpc", "http/protobuf"):
        return protocol
    if protocol:
        _log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%r is not supported (use grpc or http/protobuf); "
                     "using http/protobuf", protocol)
        return "http/protobuf"
    endpoint = environ.get(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or environ.get(env.OTEL_EXPORTER_OTLP_ENDPOINT)
    try:
        port = urlparse(endpoint).port if endpoint else None
    except ValueError:
        port = None
    return "grpc" if port == 4317 else "http/protobuf"
