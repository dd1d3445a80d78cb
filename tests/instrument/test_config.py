"""The telemetry: block from a dict or YAML, its precedence against the environment, and bad values."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from nemo_telemetry.instrument import TelemetryConfig, load_telemetry_config, resolve_telemetry_config
from nemo_telemetry.instrument import environment_variables as env


def test_defaults_are_off():
    cfg = load_telemetry_config(None)
    assert cfg == TelemetryConfig()
    assert (cfg.enabled, cfg.span_groups, cfg.exporter, cfg.namespace) == (False, "default", "otlp", "nemo_rl")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.enabled = True


def test_block_whole_config_and_yaml_file_read_alike(tmp_path):
    block = {"enabled": True, "span_groups": ["per_step", "per_prompt"], "exporter": "dump",
             "dump_dir": "/scratch/t", "logs_enabled": "yes"}
    path = tmp_path / "run.yaml"
    path.write_text("policy:\n  lr: 1.0e-6\ntelemetry:\n  enabled: true\n  span_groups: [per_step, per_prompt]\n"
                    "  exporter: dump\n  dump_dir: /scratch/t\n  logs_enabled: yes\n")
    expected = TelemetryConfig(enabled=True, span_groups="per_step,per_prompt", exporter="dump",
                               dump_dir="/scratch/t", logs_enabled=True)
    assert load_telemetry_config(block) == expected
    assert load_telemetry_config({"telemetry": block, "policy": {}}) == expected
    assert load_telemetry_config(path) == expected
    assert load_telemetry_config(str(path)) == expected


def test_bad_value_warns_once_uses_the_default_and_keeps_the_rest(caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        cfg = load_telemetry_config({"enabled": True, "exporter": "kafka", "span_groups": 5})
    assert cfg == TelemetryConfig(enabled=True)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert any("exporter" in m and "otlp, dump, none" in m for m in messages)


def test_unknown_setting_is_reported_with_a_did_you_mean(caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        cfg = load_telemetry_config({"enabled": True, "span_group": "all"})
    assert cfg.span_groups == "default"
    assert "did you mean 'span_groups'" in caplog.text


def test_unreadable_or_invalid_file_warns_and_leaves_telemetry_off(tmp_path, caplog):
    bad = tmp_path / "bad.yaml"
    bad.write_text("telemetry: [unclosed\n")
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        assert load_telemetry_config(tmp_path / "missing.yaml") == TelemetryConfig()
        assert load_telemetry_config(bad) == TelemetryConfig()
    assert "missing.yaml" in caplog.text and "not valid YAML" in caplog.text


def test_raw_environment_wins_over_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("telemetry:\n  enabled: false\n  span_groups: default\n  exporter: otlp\n")
    environ = {env.NEMO_TELEMETRY_ENABLED: "true", env.NEMO_TELEMETRY_SPAN_GROUPS: "per_step",
               env.NEMO_TELEMETRY_EXPORTER: "dump", env.NEMO_TELEMETRY_DUMP_DIR: "/d",
               env.OTEL_SERVICE_NAME: "svc"}
    cfg = resolve_telemetry_config(path, environ=environ)
    assert (cfg.enabled, cfg.span_groups, cfg.exporter, cfg.dump_dir, cfg.service_name) == (
        True, "per_step", "dump", "/d", "svc")
    assert resolve_telemetry_config(path, environ={}).enabled is False


def test_bad_environment_value_falls_back_to_the_file(caplog):
    with caplog.at_level(logging.WARNING, logger="nemo_telemetry"):
        cfg = resolve_telemetry_config({"exporter": "dump"}, environ={env.NEMO_TELEMETRY_EXPORTER: "zipkin"})
    assert cfg.exporter == "dump"
    assert "NEMO_TELEMETRY_EXPORTER" in caplog.text


def test_every_environment_variable_is_documented():
    import nemo_telemetry.environment_variables as module

    source = open(module.__file__).read()
    assert "NEMO_TELEMETRY_COMPILED" in module.__all__
    for name in module.__all__:
        if name == "NEMO_TELEMETRY_VARIABLES":
            continue
        assert getattr(module, name) == name
        assert f'{name}: Final = "{name}"\n"""' in source, f"{name} needs a docstring"
