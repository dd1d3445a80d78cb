"""What a driver's span_groups spec enables, and what it warns about at init (issue 19, items 6, 7, 10)."""

from __future__ import annotations

import json
import logging
import os

import pytest
from typer.testing import CliRunner

from nemo_telemetry.analysis import read_metrics, read_spans
from nemo_telemetry.cli.app import app
from nemo_telemetry.instrument import (
    METRICS,
    SpecError,
    enabled_span_groups,
    get_telemetry_handle,
    init_telemetry_driver,
    record_metrics,
    resolve,
    shutdown_telemetry,
    span_cm,
    telemetry_active,
)
from nemo_telemetry.instrument import _lifecycle
from nemo_telemetry.instrument import environment_variables as env


def _dump_config(tmp_path, **extra) -> dict:
    return {"enabled": True, "span_groups": "per_step", "exporter": "dump", "dump_dir": str(tmp_path), **extra}


def test_subtraction_is_refused_at_driver_init_with_the_explicit_list(tmp_path):
    with pytest.raises(SpecError) as raised:
        init_telemetry_driver(_dump_config(tmp_path, span_groups="per_step,-job"))
    message = str(raised.value)
    assert "no subtraction syntax" in message
    explicit = message.rsplit("List the groups explicitly instead: ", 1)[1]
    assert frozenset(explicit.split(",")) == resolve("per_step", namespace="nemo_rl") - {"job"}
    assert os.environ.get(env.NEMO_TELEMETRY_SPAN_GROUPS) != "per_step,-job"  # refused before it is written
    assert not telemetry_active()


def test_resolve_refuses_the_same_spec():
    result = CliRunner().invoke(app, ["resolve", "per_step,-job"])
    assert result.exit_code == 2
    assert "no subtraction syntax" in result.stderr


def test_unknown_name_in_nemo_gym_is_refused_with_the_valid_options(tmp_path):
    with pytest.raises(SpecError) as raised:
        init_telemetry_driver(_dump_config(tmp_path, span_groups="default,tool_call", namespace="nemo_gym"))
    message = str(raised.value)
    assert "unknown span group 'tool_call'" in message
    assert "valid options: all, default, per_rollout" in message
    assert not telemetry_active()


def test_unknown_name_in_nemo_rl_is_warned_with_did_you_mean_and_the_run_goes_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        cfg = init_telemetry_driver(_dump_config(tmp_path, span_groups="per_step,genration"))
    assert cfg.enabled and telemetry_active()
    assert "did you mean 'generation'" in caplog.text
    assert enabled_span_groups() == resolve("per_step", namespace="nemo_rl")


@pytest.mark.parametrize("spec", ["default", "per_step"])
def test_resolve_without_namespace_answers_what_the_driver_enables(tmp_path, spec):
    init_telemetry_driver(_dump_config(tmp_path, span_groups=spec))
    answer = CliRunner().invoke(app, ["resolve", spec, "--json"])
    assert answer.exit_code == 0
    assert json.loads(answer.stdout)["groups"] == sorted(enabled_span_groups())


def test_resolve_namespace_all_is_the_union_over_namespaces():
    answer = CliRunner().invoke(app, ["resolve", "default", "--namespace", "all", "--json"])
    assert answer.exit_code == 0
    expected = resolve("default", namespace="nemo_rl") | resolve("default", namespace="nemo_gym")
    assert json.loads(answer.stdout)["groups"] == sorted(expected)
    gym = CliRunner().invoke(app, ["resolve", "default", "--namespace", "nemo_gym", "--json"])
    assert json.loads(gym.stdout)["groups"] == ["http_client", "job", "rollout", "server"]


def test_resolve_an_unknown_namespace_is_bad_usage():
    result = CliRunner().invoke(app, ["resolve", "default", "--namespace", "nemo_rll"])
    assert result.exit_code == 2
    assert "nemo_gym" in result.stderr and "nemo_rl" in result.stderr


# -- get_telemetry_handle and record_metrics(meter, group, values) ------------------------------


def test_handle_is_none_while_telemetry_is_off(tmp_path):
    assert get_telemetry_handle() is None
    init_telemetry_driver({"enabled": False, "exporter": "dump", "dump_dir": str(tmp_path)})
    assert get_telemetry_handle() is None


def test_handle_gives_the_tracer_meter_and_config_a_ported_trainer_uses(tmp_path):
    cfg = init_telemetry_driver(_dump_config(tmp_path, span_groups="default"), algorithm="grpo")
    telemetry = get_telemetry_handle()
    assert telemetry is not None and telemetry.config == cfg
    with span_cm("rl.grpo.job", tracer=telemetry.tracer):
        pass
    assert record_metrics(telemetry.meter, METRICS, {"rl.setup.duration": 2.5}, attributes={"phase": "total_setup"}) == 1
    assert record_metrics({"rl.setup.duration": 1.0}, attributes={"phase": "ray_init"}) == 1
    shutdown_telemetry(timeout_s=10)
    assert get_telemetry_handle() is None
    assert read_spans(tmp_path).column("name").to_pylist() == ["rl.grpo.job"]
    setup = {dict(r["attributes"])["phase"]: r["value"] for r in read_metrics(tmp_path).to_pylist()
             if r["name"] == "rl.setup.duration"}
    assert setup == {"total_setup": 2.5, "ray_init": 1.0}


# -- the otlp exporter without an endpoint -------------------------------------------------------


def test_otlp_without_an_endpoint_warns_once_at_init_naming_the_variable(monkeypatch, caplog):
    monkeypatch.setattr(_lifecycle, "_warned_no_endpoint", False)
    for var in (env.OTEL_EXPORTER_OTLP_ENDPOINT, env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT):
        monkeypatch.delenv(var, raising=False)
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        init_telemetry_driver({"enabled": True, "span_groups": "default"})
        init_telemetry_driver({"enabled": True, "span_groups": "default"})
    warnings = [r.getMessage() for r in caplog.records if "has no endpoint" in r.getMessage()]
    assert len(warnings) == 1
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in warnings[0] and "exporter: dump" in warnings[0]


def test_otlp_with_an_endpoint_or_dump_does_not_warn(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_lifecycle, "_warned_no_endpoint", False)
    monkeypatch.delenv(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, raising=False)
    monkeypatch.setenv(env.OTEL_EXPORTER_OTLP_ENDPOINT, "http://127.0.0.1:9")
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        init_telemetry_driver({"enabled": True, "span_groups": "default"})
        shutdown_telemetry(timeout_s=1)
        monkeypatch.delenv(env.OTEL_EXPORTER_OTLP_ENDPOINT)
        init_telemetry_driver(_dump_config(tmp_path))
    assert "has no endpoint" not in caplog.text
