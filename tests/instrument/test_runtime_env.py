"""The driver's settings reach workers of a cluster it attaches to (issue 31, item 1), without a cluster.

The real external cluster is in ``tests/integration/test_external_cluster.py``; here a stand-in
``ray`` module records what ``traced_ray_init`` asks of it, so each decision is checked on its own.
"""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest

from nemo_telemetry.instrument import (
    accepts_trace_context,
    init_telemetry_driver,
    init_telemetry_worker,
    telemetry_runtime_env,
    traced_ray_init,
)
from nemo_telemetry.instrument import environment_variables as env

CARRIER = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.fixture()
def driver(tmp_path):
    init_telemetry_driver({"enabled": True, "span_groups": "per_step", "exporter": "dump",
                           "dump_dir": str(tmp_path), "logs_enabled": True}, algorithm="grpo",
                          run_config={"policy": {"model_name": "m"}})
    return tmp_path


def test_every_setting_the_driver_resolved_goes_into_env_vars(driver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=token")
    monkeypatch.setenv("UNRELATED", "x")
    got = telemetry_runtime_env()
    env_vars = got["env_vars"]
    assert set(got) == {"env_vars"}
    assert env_vars[env.NEMO_TELEMETRY_ENABLED] == "1"
    assert env_vars[env.NEMO_TELEMETRY_SPAN_GROUPS] == "per_step"
    assert env_vars[env.NEMO_TELEMETRY_NAMESPACE] == "nemo_rl"
    assert env_vars[env.NEMO_TELEMETRY_EXPORTER] == "dump"
    assert env_vars[env.NEMO_TELEMETRY_DUMP_DIR] == str(driver)
    assert env_vars[env.NEMO_TELEMETRY_LOGS_ENABLED] == "1"
    assert env_vars[env.NEMO_TELEMETRY_ALGORITHM] == "grpo"
    assert len(env_vars[env.NEMO_TELEMETRY_RUN_ID]) == 32
    assert json.loads(env_vars[env.NEMO_TELEMETRY_RESOURCE_ATTRIBUTES])["rl.model"] == "m"
    assert env_vars["OTEL_EXPORTER_OTLP_HEADERS"] == "authorization=token"
    assert "UNRELATED" not in env_vars and "PATH" not in env_vars


def test_the_callers_env_vars_win_and_its_other_keys_are_kept(driver):
    mine = {"env_vars": {env.NEMO_TELEMETRY_SPAN_GROUPS: "all", "HF_HOME": "/data"}, "working_dir": "."}
    got = telemetry_runtime_env(mine)
    assert got["working_dir"] == "."
    assert got["env_vars"][env.NEMO_TELEMETRY_SPAN_GROUPS] == "all"
    assert got["env_vars"]["HF_HOME"] == "/data"
    assert got["env_vars"][env.NEMO_TELEMETRY_ENABLED] == "1"
    assert mine == {"env_vars": {env.NEMO_TELEMETRY_SPAN_GROUPS: "all", "HF_HOME": "/data"}, "working_dir": "."}


def test_before_the_driver_starts_nothing_is_added():
    assert telemetry_runtime_env(environ={}) is None
    mine = {"env_vars": {"A": "1"}}
    got = telemetry_runtime_env(mine, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert got == mine and got is not mine


def test_the_otlp_endpoint_and_protocol_go_along(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_PROTOCOL", raising=False)
    init_telemetry_driver({"enabled": True, "exporter": "otlp", "otlp_endpoint": "http://collector:4317",
                           "otlp_protocol": "grpc"})
    env_vars = telemetry_runtime_env()["env_vars"]
    assert env_vars["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"
    assert env_vars["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"


# -- traced_ray_init's decisions, against a stand-in ray ----------------------------------------


class _FakeRay(types.ModuleType):
    """``ray`` as traced_ray_init sees it: ``init`` records its keywords; ``boots`` says whether the
    call starts a head node (False: it joins a cluster Ray found recorded on the machine)."""

    def __init__(self, *, initialized: bool = False, boots: bool = True) -> None:
        super().__init__("ray")
        self.calls: list[dict] = []
        self._initialized = initialized
        self._boots = boots
        self._private = types.SimpleNamespace(worker=types.SimpleNamespace(_global_node=None))

    def is_initialized(self) -> bool:
        return self._initialized

    def init(self, **kwargs):
        self.calls.append(kwargs)
        head = self._boots and kwargs.get("address") in (None, "local")
        self._private.worker._global_node = types.SimpleNamespace(head=head)
        self._initialized = True


@pytest.fixture()
def fake_ray(monkeypatch):
    def install(**kwargs) -> _FakeRay:
        fake = _FakeRay(**kwargs)
        monkeypatch.setitem(sys.modules, "ray", fake)
        return fake

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return install


def test_an_address_or_ray_address_attaches_and_the_job_gets_the_settings(driver, fake_ray, monkeypatch):
    ray = fake_ray()
    assert traced_ray_init(address="auto", runtime_env={"env_vars": {"MINE": "1"}}) == "attached_external"
    call = ray.calls[-1]
    assert call["address"] == "auto"
    assert call["runtime_env"]["env_vars"]["MINE"] == "1"
    assert call["runtime_env"]["env_vars"][env.NEMO_TELEMETRY_ENABLED] == "1"

    ray = fake_ray()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert traced_ray_init(local_options={"num_cpus": 2}) == "attached_external"
    assert ray.calls[-1]["address"] == "10.0.0.1:6379" and "num_cpus" not in ray.calls[-1]
    assert ray.calls[-1]["runtime_env"]["env_vars"][env.NEMO_TELEMETRY_RUN_ID]


def test_no_address_boots_a_cluster_or_reuses_the_one_ray_finds_recorded(driver, fake_ray):
    ray = fake_ray(boots=True)
    assert traced_ray_init(local_options={"num_cpus": 2}) == "started_local"
    assert ray.calls[-1]["num_cpus"] == 2 and env.NEMO_TELEMETRY_ENABLED in ray.calls[-1]["runtime_env"]["env_vars"]
    fake_ray(boots=False)
    assert traced_ray_init() == "reused_local"
    ray = fake_ray(boots=True)
    assert traced_ray_init(address="local") == "started_local"  # Ray's "always start a new one"
    assert ray.calls[-1]["address"] == "local"


def test_a_process_already_connected_is_reused_and_ray_init_is_not_called(driver, fake_ray):
    ray = fake_ray(initialized=True)
    assert traced_ray_init(address="auto") == "reused_local"
    assert ray.calls == []


def test_without_telemetry_the_callers_runtime_env_goes_unchanged(fake_ray):
    ray = fake_ray()
    traced_ray_init(address="auto", runtime_env={"env_vars": {"MINE": "1"}})
    assert ray.calls[-1]["runtime_env"] == {"env_vars": {"MINE": "1"}}
    ray = fake_ray()
    traced_ray_init(address="auto")
    assert "runtime_env" not in ray.calls[-1]


# -- a worker the settings never reached -----------------------------------------------------


@pytest.fixture()
def no_settings(monkeypatch):
    """A worker process of an attached cluster: no telemetry variable, and no warning given yet."""
    from nemo_telemetry.instrument import _lifecycle, ray_actors

    for key in env.NEMO_TELEMETRY_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(_lifecycle, "_warned_without_settings", False)
    monkeypatch.setattr(ray_actors, "_settings_checked", False)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "telemetry_runtime_env" in r.getMessage()]


def test_a_worker_handed_the_drivers_carrier_without_settings_warns_once(no_settings, caplog):
    caplog.set_level(logging.WARNING, logger="nemo_telemetry")
    assert init_telemetry_worker(rank=0, world_size=1, trace_carrier=CARRIER) is False
    assert init_telemetry_worker(rank=0, world_size=1, trace_carrier=CARRIER) is False
    (message,) = _warnings(caplog)
    assert env.NEMO_TELEMETRY_ENABLED in message and "traced_ray_init" in message


def test_no_warning_without_evidence_or_with_telemetry_off_on_purpose(no_settings, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="nemo_telemetry")
    assert init_telemetry_worker(rank=0, world_size=1) is False  # no carrier: nothing says the driver records
    assert init_telemetry_worker(rank=0, world_size=1, trace_carrier={}) is False  # the driver's is off
    monkeypatch.setenv(env.NEMO_TELEMETRY_ENABLED, "0")
    assert init_telemetry_worker(rank=0, world_size=1, trace_carrier=CARRIER) is False
    assert _warnings(caplog) == []


def test_the_first_carried_actor_call_in_such_a_worker_warns_once(no_settings, caplog):
    caplog.set_level(logging.WARNING, logger="nemo_telemetry")

    @accepts_trace_context
    def method(x):
        return x + 1

    assert method(1, trace_carrier=CARRIER) == 2
    assert method(2, trace_carrier=CARRIER) == 3
    assert len(_warnings(caplog)) == 1
