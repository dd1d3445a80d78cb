"""Shared fixtures for the integration tests: one real local Ray cluster per test session.

Starting Ray costs tens of seconds on a small machine, so every integration test that needs Ray
takes ``ray_cluster`` and shares one. The cluster starts with no ``NEMO_TELEMETRY_*`` / ``OTEL_*``
variables in its environment, so a worker sees telemetry settings only when a test hands them to
its actors (``make_actor_env`` below, through ``runtime_env={"env_vars": ...}``): tests cannot leak
telemetry configuration into each other's workers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from nemo_telemetry.instrument.environment_variables import NEMO_TELEMETRY_VARIABLES

_STRIPPED_PREFIXES = ("NEMO_TELEMETRY_", "OTEL_")
_TESTS_DIR = Path(__file__).resolve().parent.parent


def _worker_pythonpath() -> str:
    """PYTHONPATH for workers: the test directories pytest put on ``sys.path``, so an actor class
    defined in a test module (pickled by reference) imports on the worker too."""
    test_dirs = [p for p in sys.path if p and Path(p).resolve().is_relative_to(_TESTS_DIR)]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys([*test_dirs, str(_TESTS_DIR.parent), *inherited]))


def _without_telemetry_variables() -> dict[str, str]:
    """Remove telemetry variables from ``os.environ``; return what was removed, to put back."""
    removed = {k: v for k, v in os.environ.items() if k.startswith(_STRIPPED_PREFIXES)}
    for key in removed:
        del os.environ[key]
    return removed


def _init_ray(ray) -> None:
    """``ray.init`` for tests, tried twice: on an overloaded 2-core machine the raylet can miss its
    fixed 30 s registration window once (a start-up timeout, not a behaviour under test)."""
    options = dict(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        namespace="nemo-telemetry-tests",
        runtime_env={"env_vars": {"PYTHONPATH": _worker_pythonpath()}},
        log_to_driver=True,
        configure_logging=False,
    )
    try:
        ray.init(**options)
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
        ray.shutdown()
        ray.init(**options)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A local Ray cluster (2 CPUs, no dashboard) for the whole session; yields the ``ray`` module."""
    import ray

    if ray.is_initialized():  # someone else's session-wide cluster: share it, do not shut it down
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    removed = _without_telemetry_variables()
    try:
        _init_ray(ray)
    finally:
        os.environ.update(removed)
    try:
        yield ray
    finally:
        ray.shutdown()


def make_actor_env(environ: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The telemetry variables a worker would inherit from this driver, plus ``extra``.

    Use as ``Actor.options(runtime_env={"env_vars": make_actor_env()})``: in a real run the driver
    sets them before ``ray.init``; the shared test cluster started before this test's driver did.
    """
    environ = os.environ if environ is None else environ
    env = {k: environ[k] for k in NEMO_TELEMETRY_VARIABLES if k in environ}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def actor_env():
    """:func:`make_actor_env`, for tests (conftest modules are not imported by name)."""
    return make_actor_env


@pytest.fixture()
def telemetry_environment() -> Iterator[None]:
    """Restores ``os.environ`` after a test whose driver calls ``init_telemetry_driver`` (which writes it)."""
    saved = dict(os.environ)
    _without_telemetry_variables()  # the config a test passes must win over leftovers
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _attr_value(value: dict):
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        return int(value["intValue"])
    return value


def _attributes(items: list) -> dict:
    return {a["key"]: _attr_value(a["value"]) for a in items or ()}


def dump_spans(directory: Path) -> list[dict]:
    """Every span in the dump files, flattened: ids, name, attributes and its process's resource."""
    spans = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for resource_spans in json.loads(line).get("resourceSpans", ()):
                resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
                for scope_spans in resource_spans.get("scopeSpans", ()):
                    for span in scope_spans.get("spans", ()):
                        spans.append({
                            "trace_id": span["traceId"],
                            "span_id": span["spanId"],
                            "parent": span.get("parentSpanId") or None,
                            "name": span["name"],
                            "kind": int(span.get("kind", 0)),  # OTLP enum: 2 SERVER, 3 CLIENT
                            "attributes": _attributes(span.get("attributes")),
                            "rank": resource["nv.dl.rank"],
                            "pid": resource["process.pid"],
                            "service": resource.get("service.name"),
                        })
    return spans


@pytest.fixture(scope="session")
def read_dump_spans():
    """:func:`dump_spans`: read a dump directory back as flat span dicts (no analysis code involved)."""
    return dump_spans
