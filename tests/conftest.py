"""Shared fixtures for the whole suite."""

from __future__ import annotations

import os

import pytest

_TELEMETRY_ENV_PREFIXES = ("NEMO_TELEMETRY_", "OTEL_")


@pytest.fixture(autouse=True)
def _reset_telemetry_state():
    """Every test starts and ends with telemetry off: no provider, no groups, no telemetry env vars."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(_TELEMETRY_ENV_PREFIXES)}
    yield
    from nemo_telemetry.instrument import set_enabled_span_groups, set_tracer_provider, shutdown_telemetry

    shutdown_telemetry(timeout_s=2.0)
    set_enabled_span_groups(())
    set_tracer_provider(None)
    for key in [k for k in os.environ if k.startswith(_TELEMETRY_ENV_PREFIXES)]:
        del os.environ[key]
    os.environ.update(saved)
