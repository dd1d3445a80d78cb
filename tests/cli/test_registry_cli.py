"""`nemo-telemetry resolve` and `groups`: the JSON contract, exit codes and help examples."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from nemo_telemetry.cli.app import app

runner = CliRunner()


def test_resolve_json_contract():
    result = runner.invoke(app, ["resolve", "per_step,per_prompt", "--namespace", "nemo_rl", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert list(payload) == ["spec", "groups", "pending"]
    assert payload["spec"] == "per_step,per_prompt"
    assert payload["groups"] == sorted(payload["groups"])
    assert "per_prompt" in payload["groups"] and "job" in payload["groups"]
    assert payload["pending"] == []


def test_resolve_pending_exits_2_with_valid_names_and_closest_match():
    result = runner.invoke(app, ["resolve", "default,genration", "--json"])
    assert result.exit_code == 2
    payload = json.loads(result.stdout)
    assert payload["pending"] == ["genration"]
    assert "did you mean 'generation'?" in result.stderr
    assert "valid options: all, default" in result.stderr


def test_resolve_subtraction_exits_2_and_prints_the_explicit_list():
    result = runner.invoke(app, ["resolve", "per_step,-job", "--namespace", "nemo_rl"])
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert "no subtraction" in message
    assert "advantage,checkpoint,data_plane,data_processing,efficiency,evaluate,generation," in message.replace(" ", "")


def test_resolve_table_lists_groups_with_bucket():
    result = runner.invoke(app, ["resolve", "default", "--namespace", "nemo_rl"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("job", "checkpoint", "evaluate", "setup", "model_init"):
        assert name in result.stdout
    assert "overhead" in result.stdout and "umbrella" in result.stdout


def test_groups_json_has_the_contract_fields():
    result = runner.invoke(app, ["groups", "--json"])
    assert result.exit_code == 0
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    for row in rows.values():
        assert {"name", "namespaces", "umbrella", "bucket", "presets", "spans"} <= row.keys()
        assert (row["bucket"] is None) == row["umbrella"]
    assert rows["generation"]["bucket"] == "productive"
    assert rows["generation"]["spans"][:2] == ["rl.vllm.generate", "rl.vllm.generate_text"]
    assert "rl.<algo>.generate" in rows["generation"]["spans"]  # a trainer's own generation (TRL)
    assert rows["per_prompt"]["presets"] == []
    assert "nemo_rl:per_step" in rows["job"]["presets"]
    assert rows["server"]["namespaces"] == ["nemo_gym"]


def test_groups_table_renders_presets():
    result = runner.invoke(app, ["groups"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "nemo_rl:per_step =" in result.stdout
    assert "all = every registered group" in result.stdout


def test_every_command_help_has_an_example():
    assert {"goodput", "check", "ingest"} <= {c.name or c.callback.__name__ for c in app.registered_commands}
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, name
        assert "Example" in result.stdout or "example" in result.stdout, f"{name} --help has no example"
